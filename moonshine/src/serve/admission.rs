//! Admission before any station call: a slot of `--max-concurrent`, a place in a queue of
//! `--max-queue` (429 beyond), both given back on every exit path (RAII); cancellation on drop.

use super::*;

/// Sets a flag when dropped: the handler future or the response body (and with it the
/// client) went away.
pub(super) struct CancelOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A place in the admission queue, given back on drop whatever way the wait ends: a slot
/// was granted, the client went away (the handler future is dropped), or shutdown.
pub(super) struct QueuePlace<'a>(&'a Metrics);

impl<'a> QueuePlace<'a> {
    /// Takes a place when fewer than `max` requests wait.
    pub(super) fn take(m: &'a Metrics, max: usize) -> Option<QueuePlace<'a>> {
        m.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w < max).then_some(w + 1)
            })
            .ok()
            .map(|_| QueuePlace(m))
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Admission: a free generation slot, else a place in the queue until one frees, else 429.
/// Runs before any station work, so a refused request costs the stations nothing.
pub(super) async fn admit(st: &Arc<AppState>) -> Result<OwnedSemaphorePermit, ApiError> {
    if let Ok(p) = st.gate.clone().try_acquire_owned() {
        return Ok(p);
    }
    let Some(place) = QueuePlace::take(&st.metrics, st.args.max_queue) else {
        st.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_exceeded",
            code: Some("queue_full"),
            param: None,
            message: format!(
                "{} generations running and {} waiting; retry later",
                st.args.max_concurrent, st.args.max_queue
            ),
        });
    };
    let permit = st.gate.clone().acquire_owned().await;
    drop(place);
    permit.map_err(|_| internal("gateway is shutting down".into()))
}
