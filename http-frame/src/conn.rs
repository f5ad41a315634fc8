//! Connections: the accept loop shared by the station and moonshine's gateway, and the limits
//! that keep it up under slow, idle and numerous clients.
//!
//! - At most [`ConnLimits::max_connections`] are open. At the bound a newcomer closes the
//!   connection idle the longest (no request in flight); when every connection is busy the
//!   newcomer is answered `503` with `Retry-After` and closed.
//! - A new connection has [`ConnLimits::header_timeout`] to deliver its first request's headers,
//!   and so has every later request from its first byte on (nginx `client_header_timeout`);
//!   between requests a keep-alive connection may sit idle [`ConnLimits::idle_timeout`]
//!   (nginx `keepalive_timeout`). A connection with a request in flight (handler running or
//!   response body still being sent) is not timed out by those two; instead, once the client
//!   stops taking the response (a write that cannot proceed) it has
//!   [`ConnLimits::send_timeout`] to take more before the connection is closed (nginx
//!   `send_timeout`), so a client that never reads cannot hold a slot and its response's memory.
//! - When `accept` fails for want of file descriptors (EMFILE, ENFILE) the loop closes the
//!   connection idle the longest, backs off (10 ms doubling to 1 s) and reports at most once
//!   every 5 s, so it neither spins nor floods the log.
//! - [`read_body`] reads a request body incrementally under a size bound checked before
//!   reading (`Content-Length`) and while reading (chunked), with a timeout between reads
//!   (nginx `client_body_timeout`), into one buffer that goes back to the system when dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// Default `--max-connections` before the open-file limit is considered.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// File descriptors kept free of connections (model file, logs, hops, blocking work).
const FD_RESERVE: usize = 64;
/// Default `--header-timeout`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--send-timeout`: the longest a response write may wait for the client to read.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--body-timeout`: the longest wait for the next piece of a request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections answered `503` at once while every slot is busy; beyond it a newcomer is
/// closed without an answer.
const MAX_REFUSING: usize = 64;
/// Seconds between two reports of failing accepts.
const ACCEPT_REPORT_EVERY: Duration = Duration::from_secs(5);

/// Bounds on the connections an accept loop keeps.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// Most open connections.
    pub max_connections: usize,
    /// Time from a connection's start, or a later request's first byte, to the end of the
    /// request's headers.
    pub header_timeout: Duration,
    /// Time a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Time a response write may stay blocked on a client that does not read.
    pub send_timeout: Duration,
    /// After the shutdown signal: how long the requests in flight may take to finish once the
    /// listener is closed (connections with none are not waited for).
    pub shutdown_grace: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: default_max_connections(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            shutdown_grace: Duration::ZERO,
        }
    }
}

/// [`DEFAULT_MAX_CONNECTIONS`], lowered so that connections leave 64 file descriptors free
/// under the process's open-file limit (`ulimit -n`); at least 8.
pub fn default_max_connections() -> usize {
    match open_file_limit() {
        Some(n) => DEFAULT_MAX_CONNECTIONS
            .min(n.saturating_sub(FD_RESERVE))
            .max(8),
        None => DEFAULT_MAX_CONNECTIONS,
    }
}

/// The soft `RLIMIT_NOFILE`, if it is finite.
fn open_file_limit() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    usize::try_from(r.rlim_cur).ok()
}

/// One open connection as the accept loop sees it.
struct Conn {
    /// Requests whose handler runs or whose response body is still being sent.
    in_flight: AtomicUsize,
    /// Milliseconds (since the registry's epoch) the connection has been idle since.
    idle_since_ms: AtomicU64,
    /// Milliseconds (since the epoch, plus one) of the start of the head being read; 0 when
    /// no head is pending.
    head_since_ms: AtomicU64,
    /// Milliseconds (since the epoch, plus one) since a write to the client has been blocked
    /// (its receive window full); 0 while writes go through.
    send_blocked_since_ms: AtomicU64,
    /// Asks the connection's task to close it.
    close: Notify,
}

/// Why a connection was closed by its watchdog.
#[derive(Debug, PartialEq)]
enum Expired {
    Header,
    Idle,
    Send,
}

impl Conn {
    /// The timeout a connection has run past at `now_ms`, if any.
    fn expired(&self, limits: &ConnLimits, now_ms: u64) -> Option<Expired> {
        let blocked = self.send_blocked_since_ms.load(Ordering::Acquire);
        if blocked != 0 {
            let waited = now_ms.saturating_sub(blocked - 1);
            if waited >= limits.send_timeout.as_millis() as u64 {
                return Some(Expired::Send);
            }
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_since_ms.load(Ordering::Acquire);
        if head != 0 {
            let waited = now_ms.saturating_sub(head - 1);
            return (waited >= limits.header_timeout.as_millis() as u64).then_some(Expired::Header);
        }
        let idle = now_ms.saturating_sub(self.idle_since_ms.load(Ordering::Acquire));
        (idle >= limits.idle_timeout.as_millis() as u64).then_some(Expired::Idle)
    }

    /// Since when the connection has not served anything (ms since the epoch); `None` while
    /// a request is in flight.
    fn idle_from(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_since_ms.load(Ordering::Acquire);
        let idle = self.idle_since_ms.load(Ordering::Acquire);
        Some(if head != 0 {
            (head - 1).min(idle)
        } else {
            idle
        })
    }
}

/// The open connections of one accept loop.
struct Registry {
    epoch: Instant,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    refusing: AtomicUsize,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn len(&self) -> usize {
        self.conns.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Connections with a request in flight.
    fn busy(&self) -> usize {
        self.conns
            .lock()
            .map(|m| {
                m.values()
                    .filter(|c| c.in_flight.load(Ordering::Acquire) > 0)
                    .count()
            })
            .unwrap_or(0)
    }

    fn add(&self) -> (u64, Arc<Conn>) {
        let now = self.now_ms();
        let c = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(now),
            // A new connection owes its first request's headers from the start.
            head_since_ms: AtomicU64::new(now + 1),
            send_blocked_since_ms: AtomicU64::new(0),
            close: Notify::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.conns.lock() {
            m.insert(id, c.clone());
        }
        (id, c)
    }

    fn remove(&self, id: u64) {
        if let Ok(mut m) = self.conns.lock() {
            m.remove(&id);
        }
    }

    /// Closes the connection idle the longest; false when every connection is busy.
    fn evict_idle(&self) -> bool {
        let Ok(mut m) = self.conns.lock() else {
            return false;
        };
        let victim = m
            .iter()
            .filter_map(|(id, c)| c.idle_from().map(|t| (t, *id)))
            .min()
            .map(|(_, id)| id);
        match victim.and_then(|id| m.remove(&id)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request in flight on its connection from the handler's start to the end (or
/// drop) of its response body.
struct InFlight {
    conn: Arc<Conn>,
    epoch: Instant,
}

impl InFlight {
    fn new(conn: Arc<Conn>, epoch: Instant) -> InFlight {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        conn.head_since_ms.store(0, Ordering::Release);
        InFlight { conn, epoch }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.conn.idle_since_ms.store(now, Ordering::Release);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted in flight until it is sent or dropped.
pub struct Tracked<B> {
    inner: Pin<Box<B>>,
    _in_flight: InFlight,
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.get_mut().inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, noting when the bytes of a new request head start to arrive and since when a
/// write has been waiting for the client to read.
struct Watched {
    stream: TcpStream,
    conn: Arc<Conn>,
    epoch: Instant,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.stream).poll_read(cx, buf);
        if buf.filled().len() > before
            && me.conn.in_flight.load(Ordering::Acquire) == 0
            && me.conn.head_since_ms.load(Ordering::Acquire) == 0
        {
            let now = me.epoch.elapsed().as_millis() as u64;
            me.conn.head_since_ms.store(now + 1, Ordering::Release);
        }
        r
    }
}

impl Watched {
    /// Notes whether a write went through (clears the mark) or is blocked (starts it once).
    fn note_write<T>(&self, r: &Poll<T>) {
        let mark = &self.conn.send_blocked_since_ms;
        if r.is_pending() {
            if mark.load(Ordering::Acquire) == 0 {
                let now = self.epoch.elapsed().as_millis() as u64;
                mark.store(now + 1, Ordering::Release);
            }
        } else {
            mark.store(0, Ordering::Release);
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.stream).poll_write(cx, buf);
        me.note_write(&r);
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.stream).poll_write_vectored(cx, bufs);
        me.note_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The accept loop shared by the station and moonshine's gateway, with [`ConnLimits::default`].
pub async fn serve_connections<S, H, F, B>(
    listener: TcpListener,
    state: Arc<S>,
    handle: H,
    shutdown: impl std::future::Future<Output = ()>,
) where
    S: Send + Sync + 'static,
    H: Fn(Arc<S>, Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_connections_with(listener, state, handle, ConnLimits::default(), shutdown).await
}

/// Accepts on `listener` until `shutdown` resolves (then logs "shutting down" and returns;
/// connections already spawned keep running), within `limits` (see the module's doc). Each
/// connection gets `TCP_NODELAY` and its own task serving HTTP/1.1 with keep-alive, every
/// request going to `handle(state.clone(), req)`; a connection error is logged at debug.
pub async fn serve_connections_with<S, H, F, B>(
    listener: TcpListener,
    state: Arc<S>,
    handle: H,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()>,
) where
    S: Send + Sync + 'static,
    H: Fn(Arc<S>, Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let registry = Arc::new(Registry {
        epoch: Instant::now(),
        conns: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        refusing: AtomicUsize::new(0),
    });
    let limits = Arc::new(limits);
    let mut failures = AcceptFailures::default();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        failures.failed(&e, &registry).await;
                        continue;
                    }
                };
                failures.succeeded();
                if registry.len() >= limits.max_connections.max(1) && !registry.evict_idle() {
                    refuse_busy(stream, &registry);
                    continue;
                }
                spawn_connection(stream, peer, state.clone(), handle.clone(), &registry, &limits);
            }
            _ = &mut shutdown => { info!("shutting down"); break; }
        }
    }
    drop(listener);
    drain(&registry, limits.shutdown_grace).await;
}

/// Waits until no request is in flight, at most `grace`.
async fn drain(registry: &Registry, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        let busy = registry.busy();
        if busy == 0 {
            return;
        }
        if Instant::now() >= deadline {
            if !grace.is_zero() {
                warn!("shutdown grace over; closing {busy} connection(s) with a request in flight");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Failed accepts: backoff and a report at most every [`ACCEPT_REPORT_EVERY`].
#[derive(Default)]
struct AcceptFailures {
    backoff: Option<Duration>,
    unreported: u64,
    last_report: Option<Instant>,
}

impl AcceptFailures {
    async fn failed(&mut self, e: &std::io::Error, registry: &Registry) {
        self.unreported += 1;
        let out_of_fds = matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        );
        if self
            .last_report
            .is_none_or(|t| t.elapsed() >= ACCEPT_REPORT_EVERY)
        {
            warn!(
                "accept failed: {e} ({} failure(s) since the last report){}",
                self.unreported,
                if out_of_fds {
                    "; closing idle connections and backing off"
                } else {
                    ""
                }
            );
            self.unreported = 0;
            self.last_report = Some(Instant::now());
        }
        if out_of_fds {
            // Free a descriptor for the connection waiting in the backlog, then let it go.
            registry.evict_idle();
            let wait = self.backoff.unwrap_or(Duration::from_millis(10));
            tokio::time::sleep(wait).await;
            self.backoff = Some((wait * 2).min(Duration::from_secs(1)));
        }
    }

    fn succeeded(&mut self) {
        self.backoff = None;
    }
}

/// Answers a connection over the bound `503` and closes it.
fn refuse_busy(mut stream: TcpStream, registry: &Arc<Registry>) {
    if registry.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
        registry.refusing.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    debug!("connection refused: every slot is busy");
    let registry = registry.clone();
    tokio::spawn(async move {
        const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 71\r\n\r\n{\"error\":\"too_many_connections\",\"message\":\"every connection is busy\"}\n";
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = stream.write_all(BUSY).await;
            let _ = stream.shutdown().await;
        })
        .await;
        registry.refusing.fetch_sub(1, Ordering::AcqRel);
    });
}

fn spawn_connection<S, H, F, B>(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    state: Arc<S>,
    handle: H,
    registry: &Arc<Registry>,
    limits: &Arc<ConnLimits>,
) where
    S: Send + Sync + 'static,
    H: Fn(Arc<S>, Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = stream.set_nodelay(true);
    let (id, conn) = registry.add();
    let registry = registry.clone();
    let limits = limits.clone();
    tokio::spawn(async move {
        let epoch = registry.epoch;
        let io = Watched {
            stream,
            conn: conn.clone(),
            epoch,
        };
        let c = conn.clone();
        let svc = service_fn(move |req| {
            let in_flight = InFlight::new(c.clone(), epoch);
            let fut = handle(state.clone(), req);
            async move {
                let resp = fut.await?;
                Ok::<_, Infallible>(resp.map(|b| Tracked {
                    inner: Box::pin(b),
                    _in_flight: in_flight,
                }))
            }
        });
        let served = http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), svc);
        tokio::pin!(served);
        let tick = watchdog_tick(&limits);
        loop {
            tokio::select! {
                r = served.as_mut() => {
                    if let Err(e) = r {
                        debug!("connection {peer}: {e}");
                    }
                    break;
                }
                _ = conn.close.notified() => {
                    debug!("connection {peer}: closed for a newer one");
                    break;
                }
                _ = tokio::time::sleep(tick) => {
                    if let Some(why) = conn.expired(&limits, registry.now_ms()) {
                        debug!("connection {peer}: {why:?} timeout");
                        break;
                    }
                }
            }
        }
        registry.remove(id);
    });
}

/// How often a connection checks its timeouts: a quarter of the shortest, 10 ms to 1 s.
fn watchdog_tick(limits: &ConnLimits) -> Duration {
    (limits
        .header_timeout
        .min(limits.idle_timeout)
        .min(limits.send_timeout)
        / 4)
    .clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("body exceeds {max} bytes")]
    TooLarge { max: usize },
    #[error("no body data for {} s", .after.as_secs_f64())]
    Timeout { after: Duration },
    #[error("reading body: {0}")]
    Read(#[from] hyper::Error),
}

/// Reads `req`'s body, at most `max` bytes (a larger `Content-Length` is refused before
/// reading), waiting at most `gap` for each piece, into one buffer.
pub async fn read_body(
    req: Request<Incoming>,
    max: usize,
    gap: Duration,
) -> Result<Bytes, BodyError> {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge { max });
    }
    let mut body = req.into_body();
    // Reserved, not touched: pages become resident only as the bytes arrive.
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    loop {
        let frame = match tokio::time::timeout(gap, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout { after: gap }),
            Ok(None) => break,
            Ok(Some(f)) => f?,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(BodyError::TooLarge { max });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(in_flight: usize, idle: u64, head: u64) -> Conn {
        Conn {
            in_flight: AtomicUsize::new(in_flight),
            idle_since_ms: AtomicU64::new(idle),
            head_since_ms: AtomicU64::new(head),
            send_blocked_since_ms: AtomicU64::new(0),
            close: Notify::new(),
        }
    }

    #[test]
    fn idle_timeouts_spare_busy_connections_but_a_blocked_send_expires() {
        let l = ConnLimits {
            max_connections: 8,
            header_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(1000),
            send_timeout: Duration::from_millis(500),
            shutdown_grace: Duration::ZERO,
        };
        // A head started at 50 ms: closed at 150 ms, not before.
        assert_eq!(conn(0, 0, 51).expired(&l, 149), None);
        assert_eq!(conn(0, 0, 51).expired(&l, 150), Some(Expired::Header));
        // Idle since 0 with no head: closed at 1000 ms.
        assert_eq!(conn(0, 0, 0).expired(&l, 999), None);
        assert_eq!(conn(0, 0, 0).expired(&l, 1000), Some(Expired::Idle));
        // Busy and its writes going through: never.
        assert_eq!(conn(1, 0, 0).expired(&l, 1_000_000), None);
        // Busy with a write blocked since 200 ms: closed at 700 ms.
        let c = conn(1, 0, 0);
        c.send_blocked_since_ms.store(201, Ordering::Release);
        assert_eq!(c.expired(&l, 699), None);
        assert_eq!(c.expired(&l, 700), Some(Expired::Send));
    }

    /// A client that asks for a large response and never reads it: without a send timeout its
    /// connection (and the response's memory) stays until the client goes away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
        use tokio::io::AsyncReadExt;
        const BODY: usize = 64 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limits = ConnLimits {
            max_connections: 8,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            send_timeout: Duration::from_millis(300),
            shutdown_grace: Duration::ZERO,
        };
        let handle = |_: Arc<()>, _: Request<Incoming>| async {
            let body = http_body_util::Full::new(Bytes::from(vec![7u8; BODY]));
            Ok::<_, Infallible>(Response::new(body))
        };
        tokio::spawn(serve_connections_with(
            listener,
            Arc::new(()),
            handle,
            limits,
            std::future::pending(),
        ));
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("request");
        // Not reading: the socket buffers fill within milliseconds, then the write blocks.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                got += n;
            }
        })
        .await;
        assert!(
            drained.is_ok(),
            "the station kept the connection open for a client that stopped reading"
        );
        assert!(
            got < BODY,
            "the whole {BODY}-byte body was sent ({got} bytes): the connection was not cut"
        );
    }

    #[test]
    fn eviction_picks_the_longest_idle_and_spares_busy_connections() {
        let r = Registry {
            epoch: Instant::now(),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refusing: AtomicUsize::new(0),
        };
        let busy = Arc::new(conn(1, 0, 0));
        let old = Arc::new(conn(0, 10, 0));
        let young = Arc::new(conn(0, 500, 0));
        if let Ok(mut m) = r.conns.lock() {
            m.insert(1, busy);
            m.insert(2, young);
            m.insert(3, old);
        }
        assert!(r.evict_idle());
        let left: Vec<u64> = {
            let m = r.conns.lock().expect("lock");
            let mut k: Vec<u64> = m.keys().copied().collect();
            k.sort();
            k
        };
        assert_eq!(
            left,
            vec![1, 2],
            "the connection idle since 10 ms goes first"
        );
        assert!(r.evict_idle());
        assert!(!r.evict_idle(), "a busy connection is never evicted");
    }
}
