//! A fork-join team for the ~100 short parallel loops of every decoded token.
//!
//! Why not rayon for these: a one-token matmul is 20-700 µs of work, and between two of them
//! (attention, norms, activation quantization) rayon's idle workers go through `sched_yield`
//! and futex sleeps: at 2 threads that was ~10% of decode's CPU time (perf). A [`Team`] keeps
//! `threads - 1` helper threads spinning on one atomic word for a short while after each loop,
//! so the next loop starts in well under a microsecond. Each member owns a contiguous range of
//! the chunks and the others take from its back once theirs is done, so a helper that arrives
//! late (or was descheduled by the VM) only runs fewer chunks. Idle helpers park after
//! [`SPIN`] and cost nothing until the next loop. Measured against rayon in alternating
//! aeon-bench runs at equal bandwidth: 2-thread decode 80-81 against 78-79 tok/s, prefill
//! 501-505 against 490-496.
//!
//! Only one loop runs on a team at a time; a caller that finds it busy (two sessions decoding at
//! once) falls back to rayon, so results never depend on which path ran (each chunk's output is
//! computed the same way either way).

use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks: longer than the gaps inside a decoded token
/// (a few µs between matmuls, tens of µs between tokens), short enough not to take a core
/// from other work for long.
const SPIN: Duration = Duration::from_micros(200);

/// How long an idle helper spins before it starts yielding its core between checks.
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// `state` bits: the loop's epoch in the high 32 bits, [`CLOSED`], and the number of helpers
/// inside the loop in the low bits.
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;
const EPOCH: u64 = 1 << 32;

/// One parallel loop: `body(c)` for every `c < chunks`.
struct Job<'a> {
    body: &'a (dyn Fn(usize) + Sync),
    chunks: usize,
}

/// What the caller and the helpers share.
struct Shared {
    /// Epoch, closed bit and active count (see [`CLOSED`]).
    state: AtomicU64,
    /// Per member (caller first, then helpers): its contiguous range of chunks still to run,
    /// `lo | hi << 32`. A member runs its own range front to back and, when it is empty, takes
    /// chunks off the back of the others'.
    ranges: Vec<AtomicU64>,
    /// The current loop's [`Job`], valid while `state` is open or has active helpers.
    job: AtomicPtr<Job<'static>>,
    /// A helper's body panicked during the current loop.
    panicked: AtomicBool,
    /// Per helper: it is (about to be) parked and needs an unpark.
    parked: Vec<AtomicBool>,
}

/// `threads - 1` helper threads plus the calling thread.
pub struct Team {
    shared: &'static Shared,
    helpers: Vec<Thread>,
    busy: AtomicBool,
}

impl Team {
    /// A team of `threads` (the caller and `threads - 1` new helper threads). Helpers live as
    /// long as the process: teams are made once per thread count by [`for_each_chunk`].
    fn new(threads: usize) -> std::io::Result<Team> {
        let n = threads.saturating_sub(1);
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            state: AtomicU64::new(0),
            ranges: (0..threads.max(1)).map(|_| AtomicU64::new(0)).collect(),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            parked: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }));
        let helpers = (0..n)
            .map(|i| {
                thread::Builder::new()
                    .name(format!("fat-team-{i}"))
                    .spawn(move || helper(shared, i))
                    .map(|h| h.thread().clone())
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Team {
            shared,
            helpers,
            busy: AtomicBool::new(false),
        })
    }

    /// Runs `body(c)` for every `c < chunks` on this thread and the helpers; `false` (and
    /// nothing run) when another loop holds the team.
    fn run(&self, chunks: usize, body: &(dyn Fn(usize) + Sync)) -> bool {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let s = self.shared;
        let job = Job { body, chunks };
        let members = s.ranges.len();
        for (m, r) in s.ranges.iter().enumerate() {
            let (lo, hi) = (chunks * m / members, chunks * (m + 1) / members);
            r.store(lo as u64 | (hi as u64) << 32, Ordering::Relaxed);
        }
        // Lifetime erased: `Close` below keeps `job` alive until no helper can read it.
        s.job
            .store(&job as *const Job as *mut Job<'static>, Ordering::Relaxed);
        let epoch = (s.state.load(Ordering::Relaxed) & !(CLOSED | ACTIVE)).wrapping_add(EPOCH);
        // SeqCst pairs with the helpers' SeqCst store of `parked` then load of `state`: either a
        // helper sees the new epoch, or we see it parked and unpark it.
        s.state.store(epoch, Ordering::SeqCst);
        for (p, t) in s.parked.iter().zip(&self.helpers) {
            if p.load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        let _close = Close(self);
        claim_chunks(s, &job, 0);
        true
    }
}

/// Closes the current loop and waits until no helper is inside it (also when the caller's own
/// chunk panics, so no helper reads the caller's stack after it unwinds); then frees the team
/// and passes a helper's panic on to the caller.
struct Close<'t>(&'t Team);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let s = self.0.shared;
        s.state.fetch_or(CLOSED, Ordering::AcqRel);
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.state.load(Ordering::Acquire) & ACTIVE != 0 {
            // A helper is finishing its last chunk; if the VM descheduled it, let it run (the
            // clock is read every 64 spins: a read per spin showed up at 1% of decode).
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let helper_panicked = s.panicked.swap(false, Ordering::Acquire);
        self.0.busy.store(false, Ordering::Release);
        if helper_panicked && !thread::panicking() {
            panic!("a fork-join helper panicked in a kernel loop");
        }
    }
}

/// Runs member `m`'s range of `job` front to back, then the other members' from the back, until
/// every range is empty.
///
/// Why ranges and not one shared counter: each member then streams one contiguous stretch of
/// the weights, so the kernels' page touches ahead (and the hardware prefetchers) work for the
/// thread that will read those pages; with chunks dealt alternately, 2-thread decode was ~20%
/// slower than rayon's halving.
fn claim_chunks(s: &Shared, job: &Job, m: usize) {
    let n = s.ranges.len();
    for (k, r) in (0..n).map(|k| (k, &s.ranges[(m + k) % n])) {
        let own = k == 0;
        let mut cur = r.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = (cur & u32::MAX as u64, cur >> 32);
            if lo >= hi {
                break;
            }
            let (next, c) = if own {
                (cur + 1, lo)
            } else {
                (cur - (1 << 32), hi - 1)
            };
            match r.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    debug_assert!((c as usize) < job.chunks);
                    (job.body)(c as usize);
                    cur = r.load(Ordering::Relaxed);
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// A helper thread: wait for a new epoch, join the loop unless it is already closed, claim
/// chunks, leave.
fn helper(s: &'static Shared, i: usize) {
    let mut seen = 0u64;
    loop {
        let st = wait_for_epoch(s, i, seen);
        seen = st >> 32;
        let mut cur = st;
        let joined = loop {
            if cur >> 32 != seen || cur & CLOSED != 0 {
                break false;
            }
            match s
                .state
                .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break true,
                Err(now) => cur = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: we joined an open loop (active > 0), and the caller waits for active == 0
        // before its `Job` goes out of scope, so the pointer is valid until we leave.
        let job = unsafe { &*s.job.load(Ordering::Relaxed) };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim_chunks(s, job, i + 1)))
            .is_err()
        {
            s.panicked.store(true, Ordering::Release);
            // Take the remaining chunks off the table so the caller stops too.
            for r in &s.ranges {
                r.store(0, Ordering::Relaxed);
            }
        }
        s.state.fetch_sub(1, Ordering::Release);
    }
}

/// Spins, then parks, until `state`'s epoch differs from `seen`; returns that state.
fn wait_for_epoch(s: &Shared, i: usize, seen: u64) -> u64 {
    let mut t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        let st = s.state.load(Ordering::Acquire);
        if st >> 32 != seen {
            return st;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let idle = t0.elapsed();
        if idle < SPIN {
            // Past the first few µs, let any other runnable thread have this core.
            if idle > YIELD_AFTER {
                thread::yield_now();
            }
            continue;
        }
        s.parked[i].store(true, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) >> 32 == seen {
            thread::park();
        }
        s.parked[i].store(false, Ordering::Relaxed);
        t0 = Instant::now();
    }
}

/// The team for `threads`, made on first use; `None` (remembered, so the hot path does not
/// retry) when its threads cannot be spawned.
fn team(threads: usize) -> Option<&'static Team> {
    type Entry = (usize, Option<&'static Team>);
    static TEAMS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    thread_local! {
        static CACHED: std::cell::Cell<Option<Entry>> = const { std::cell::Cell::new(None) };
    }
    if let Some((n, t)) = CACHED.get() {
        if n == threads {
            return t;
        }
    }
    let mut teams = TEAMS.lock().unwrap_or_else(|e| e.into_inner());
    let t = match teams.iter().find(|(n, _)| *n == threads) {
        Some(&(_, t)) => t,
        None => {
            let t = match Team::new(threads) {
                Ok(t) => Some(&*Box::leak(Box::new(t))),
                Err(e) => {
                    tracing::warn!("no fork-join team of {threads} threads ({e}); using rayon");
                    None
                }
            };
            teams.push((threads, t));
            t
        }
    };
    CACHED.set(Some((threads, t)));
    t
}

/// Whether loops go to a team (`FAT_TEAM=off` keeps them on rayon, for A/B measurements).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FAT_TEAM").map_or(true, |v| v != "off"))
}

/// Runs `body(c)` for every `c < chunks`: on this thread when there is one chunk or the
/// current rayon pool has one thread; else on the team sized to the current rayon pool, or on
/// rayon itself when that team is busy.
pub fn for_each_chunk(chunks: usize, body: impl Fn(usize) + Sync + Send) {
    let threads = rayon::current_num_threads();
    if chunks <= 1 || threads <= 1 {
        (0..chunks).for_each(body);
        return;
    }
    // Ranges hold chunk indices in 32 bits.
    if enabled() && chunks < u32::MAX as usize {
        if let Some(t) = team(threads) {
            if t.run(chunks, &body) {
                return;
            }
        }
    }
    (0..chunks).into_par_iter().for_each(body);
}

/// [`for_each_chunk`] over `data` cut into pieces of `len` elements (the last may be shorter):
/// `body(i, piece i)`.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    len: usize,
    body: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    /// `data`'s start, shared by the chunks (each writes only its own piece).
    struct Base<T>(*mut T);
    // SAFETY: the chunks touch disjoint pieces of `data` (see below), and `T: Send`.
    unsafe impl<T: Send> Sync for Base<T> {}
    impl<T> Base<T> {
        fn get(&self) -> *mut T {
            self.0
        }
    }
    let (total, len) = (data.len(), len.max(1));
    let base = Base(data.as_mut_ptr());
    for_each_chunk(total.div_ceil(len), |i| {
        let start = i * len;
        // SAFETY: piece i is [start, min(start + len, total)) of `data`, disjoint from every
        // other piece; each index runs exactly once, and `data` stays mutably borrowed by this
        // call until every chunk has finished.
        let piece = unsafe {
            std::slice::from_raw_parts_mut(base.get().add(start), len.min(total - start))
        };
        body(i, piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, AtomicUsize};

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    #[test]
    fn every_chunk_runs_exactly_once() {
        for threads in [1, 2, 3] {
            pool(threads).install(|| {
                for chunks in [0, 1, 2, 7, 100] {
                    for _ in 0..50 {
                        let hits: Vec<AtomicU32> = (0..chunks).map(|_| AtomicU32::new(0)).collect();
                        for_each_chunk(chunks, |c| {
                            hits[c].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                    }
                }
            });
        }
    }

    #[test]
    fn mutable_pieces_cover_the_slice_once() {
        pool(2).install(|| {
            for (n, len) in [(0, 3), (1, 3), (10, 3), (64, 64), (65, 8)] {
                let mut v = vec![0usize; n];
                for_each_chunk_mut(&mut v, len, |i, piece| {
                    for (j, x) in piece.iter_mut().enumerate() {
                        *x += i * len + j + 1;
                    }
                });
                assert_eq!(v, (1..=n).collect::<Vec<_>>());
            }
        });
    }

    #[test]
    fn helpers_wake_after_parking() {
        pool(2).install(|| {
            for _ in 0..3 {
                // Longer than SPIN: the helper parks between loops and must be woken.
                thread::sleep(SPIN * 3);
                let sum = AtomicUsize::new(0);
                for_each_chunk(64, |c| {
                    sum.fetch_add(c, Ordering::Relaxed);
                });
                assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
            }
        });
    }

    #[test]
    fn concurrent_callers_fall_back_and_stay_correct() {
        pool(2).install(|| {
            (0..8).into_par_iter().for_each(|i| {
                for _ in 0..200 {
                    let sum = AtomicUsize::new(0);
                    for_each_chunk(16 + i, |c| {
                        sum.fetch_add(c + 1, Ordering::Relaxed);
                    });
                    let n = 16 + i;
                    assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
                }
            });
        });
    }

    #[test]
    fn a_panicking_chunk_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| {
            pool(2).install(|| {
                for_each_chunk(64, |c| {
                    if c == 40 {
                        panic!("chunk 40");
                    }
                    thread::sleep(Duration::from_micros(50));
                })
            })
        });
        assert!(r.is_err());
        // The team is usable afterwards.
        pool(2).install(|| {
            let sum = AtomicUsize::new(0);
            for_each_chunk(10, |c| {
                sum.fetch_add(c, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), 45);
        });
    }
}
