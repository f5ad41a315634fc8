//! The pool of station KV sessions: each running generation leases the id whose cached tokens
//! share the longest prefix with its prompt, and gives it back when it ends.

use super::*;

/// A leased station session and generation slot; returned to the pool on drop, whatever
/// way the generation ended.
pub(super) struct Lease {
    pub(super) st: Arc<AppState>,
    pub(super) session: Option<KvSession>,
    pub(super) _permit: OwnedSemaphorePermit,
    pub(super) finish: &'static str,
    pub(super) tokens: usize,
}

impl Lease {
    /// Leases the pooled session whose cache shares the longest prefix with `prompt`.
    pub(super) fn new(
        st: &Arc<AppState>,
        permit: OwnedSemaphorePermit,
        prompt: &[u32],
    ) -> Result<Lease, ApiError> {
        let session = {
            let mut pool = st
                .pool
                .lock()
                .map_err(|_| internal("session pool poisoned".into()))?;
            let lcp = |s: &KvSession| {
                s.cached
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            match (0..pool.len()).max_by_key(|&i| lcp(&pool[i])) {
                Some(best) => pool.swap_remove(best),
                // Only after a generation thread panicked and lost its lease.
                None => KvSession::new("gw"),
            }
        };
        st.metrics.active.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            st: st.clone(),
            session: Some(session),
            _permit: permit,
            finish: "error",
            tokens: 0,
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            info!(session = %s.id, finish = self.finish, tokens = self.tokens, "session released");
            if let Ok(mut p) = self.st.pool.lock() {
                p.push(s);
            }
        }
        self.st.metrics.active.fetch_sub(1, Ordering::Relaxed);
    }
}
