//! The HTTP server: one `async fn` router on the accept loop the station runs on
//! (`http_frame::conn`: a bound on connections, header/idle/send timeouts, a graceful drain).
//!
//! | method | path | answer |
//! |---|---|---|
//! | POST | `/.aeon/model-forward-cache` | 200 [`AdmitResponse`]; 400 bad JSON/record; 408 body not sent within the body timeout; 413 body too large |
//! | GET | `/.aeon/model-forward-cache?key=K` | 200 record + `"cache_hit": true`, or 200 `{"cache_hit": false, "key": K}`; 400 without `key` |
//! | GET | `/.aeon/health` | 200 [`HealthResponse`] |
//!
//! Store work (which fsyncs) runs on tokio's blocking pool, never on the runtime threads.
//! The query string is decoded as `application/x-www-form-urlencoded` (`+` is a space), so
//! clients should percent-encode keys, as [`crate::client`] does.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use http_frame::conn::{serve_connections_with, ConnLimits};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::client::{CACHE_PATH, HEALTH_PATH};
use crate::record::{AdmitResponse, ErrorResponse, HealthResponse, ResidueRecord};
use crate::store::{ErrorChain, Store, StoreError};

/// Server tuning that is not part of the store.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Largest request body accepted; larger requests get 413 before the body is read.
    pub max_body: usize,
    /// Time a client has to send a request head.
    pub header_read_timeout: Duration,
    /// Time a client has to send a whole request body (a chunked body that trickles
    /// forever gets 408 and the connection is closed).
    pub body_read_timeout: Duration,
    /// Time open connections get to finish after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body: 1 << 20,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// State shared by all connections.
pub struct AppState {
    store: Mutex<Store>,
    started: Instant,
    cfg: ServerConfig,
}

impl AppState {
    /// Wraps an opened store.
    pub fn new(store: Store, cfg: ServerConfig) -> Arc<AppState> {
        Arc::new(AppState {
            store: Mutex::new(store),
            started: Instant::now(),
            cfg,
        })
    }
}

type Resp = Response<Full<Bytes>>;

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Resp {
    // Serialising our own plain structs cannot fail; fall back to an empty object anyway.
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error_response(status: StatusCode, error: &str, detail: impl Into<String>) -> Resp {
    json_response(
        status,
        &ErrorResponse {
            error: error.to_string(),
            detail: detail.into(),
        },
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs `f` on the store on the blocking pool. Errors are already answers (500).
async fn with_store<T: Send + 'static>(
    state: &Arc<AppState>,
    f: impl FnOnce(&mut Store) -> T + Send + 'static,
) -> Result<T, Resp> {
    let state = Arc::clone(state);
    let joined = tokio::task::spawn_blocking(move || {
        let mut guard = state
            .store
            .lock()
            .map_err(|_| "store lock poisoned by an earlier panic")?;
        Ok::<T, &'static str>(f(&mut guard))
    })
    .await;
    match joined {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(why)) => {
            tracing::error!(why, "store unavailable");
            Err(error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                why,
            ))
        }
        Err(e) => {
            tracing::error!(error = %e, "store task failed");
            Err(error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "store task failed",
            ))
        }
    }
}

/// Routes one request.
async fn handle(req: Request<Incoming>, state: Arc<AppState>) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = match (&method, path.as_str()) {
        (&Method::POST, CACHE_PATH) => admit(req, &state).await,
        (&Method::GET, CACHE_PATH) => lookup(req.uri().query(), &state).await,
        (&Method::GET, HEALTH_PATH) => health(&state).await,
        (_, CACHE_PATH) => method_not_allowed("GET, POST"),
        (_, HEALTH_PATH) => method_not_allowed("GET"),
        _ => error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {path}"),
        ),
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), "request");
    Ok(resp)
}

fn method_not_allowed(allow: &'static str) -> Resp {
    let mut r = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("allowed: {allow}"),
    );
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

async fn admit(req: Request<Incoming>, state: &Arc<AppState>) -> Resp {
    let max = state.cfg.max_body;
    let too_large = |n: &dyn std::fmt::Display| {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("body of {n} bytes exceeds --max-body {max}"),
        )
    };
    // Check the declared size before reading anything.
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(n) if n > max as u64 => return too_large(&n),
            Some(_) => {}
            None => {
                return error_response(StatusCode::BAD_REQUEST, "bad_request", "bad Content-Length")
            }
        }
    }
    // Chunked bodies have no declared size: cap what is read, and how long it may take.
    let deadline = state.cfg.body_read_timeout;
    let read = tokio::time::timeout(deadline, Limited::new(req.into_body(), max).collect());
    let body = match read.await {
        Err(_elapsed) => {
            let mut r = error_response(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "request body not received within --body-timeout {}s",
                    deadline.as_secs()
                ),
            );
            r.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return too_large(&format!("more than {max}"))
        }
        Ok(Err(e)) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read body: {e}"),
            )
        }
    };
    let record: ResidueRecord = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("body is not a residue record: {e}"),
            )
        }
    };
    let now = unix_now();
    let result = match with_store(state, move |s| s.admit(&record, now)).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match result {
        Ok(a) => {
            tracing::info!(key = %a.record.key, disposition = ?a.disposition, evicted = a.evicted, "admitted");
            json_response(
                StatusCode::OK,
                &AdmitResponse {
                    ok: true,
                    key: a.record.key,
                    disposition: a.disposition,
                    created: a.record.created.unwrap_or(now),
                },
            )
        }
        Err(StoreError::Invalid(e)) => {
            error_response(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
        }
        Err(e @ StoreError::RecordTooLarge { .. }) => error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            e.to_string(),
        ),
        Err(e) => {
            tracing::error!(error = %ErrorChain(&e), "admission failed");
            error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "record not stored: log write failed",
            )
        }
    }
}

/// Decodes one `application/x-www-form-urlencoded` component.
fn form_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The value of `key` in a query string: `Ok(None)` when absent or empty.
fn query_key(query: Option<&str>) -> Result<Option<String>, String> {
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(name).as_deref() == Some("key") {
            let v = form_decode(value)
                .ok_or_else(|| "key is not valid percent-encoded UTF-8".to_string())?;
            return Ok(if v.is_empty() { None } else { Some(v) });
        }
    }
    Ok(None)
}

async fn lookup(query: Option<&str>, state: &Arc<AppState>) -> Resp {
    let key = match query_key(query) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "missing ?key=K (a bare query is refused by design)",
            )
        }
        Err(why) => return error_response(StatusCode::BAD_REQUEST, "bad_request", why),
    };
    let lookup_key = key.clone();
    let found = match with_store(state, move |s| s.get(&lookup_key).cloned()).await {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    match found.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(mut obj))) => {
            obj.insert("cache_hit".into(), serde_json::Value::Bool(true));
            json_response(StatusCode::OK, &obj)
        }
        Some(_) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot encode record",
        ),
        None => json_response(
            StatusCode::OK,
            &serde_json::json!({"cache_hit": false, "key": key}),
        ),
    }
}

async fn health(state: &Arc<AppState>) -> Resp {
    let stats = match with_store(state, |s| s.stats()).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    json_response(
        StatusCode::OK,
        &HealthResponse {
            status: "ok".into(),
            records: stats.records,
            bytes: stats.live_bytes,
            log_bytes: stats.log_bytes,
            evicted: stats.evicted,
            compactions: stats.compactions,
            uptime_s: state.started.elapsed().as_secs(),
        },
    )
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and gives the requests in
/// flight `shutdown_grace` to finish. Every acknowledged admission is already on disk.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    let limits = ConnLimits {
        header_timeout: state.cfg.header_read_timeout,
        shutdown_grace: state.cfg.shutdown_grace,
        ..ConnLimits::default()
    };
    serve_connections_with(listener, state, |st, req| handle(req, st), limits, shutdown).await;
    tracing::info!("no longer serving");
}

/// Resolves on ctrl-c (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_key_decoding() {
        assert_eq!(
            query_key(Some("key=m%3Adense%3A1%2C2")),
            Ok(Some("m:dense:1,2".into()))
        );
        assert_eq!(query_key(Some("x=1&key=a+b")), Ok(Some("a b".into())));
        assert_eq!(
            query_key(Some("key=m:dense:1,2")),
            Ok(Some("m:dense:1,2".into()))
        );
        assert_eq!(query_key(None), Ok(None));
        assert_eq!(query_key(Some("")), Ok(None));
        assert_eq!(query_key(Some("key=")), Ok(None));
        assert_eq!(query_key(Some("other=1")), Ok(None));
        assert!(query_key(Some("key=%zz")).is_err());
        assert!(query_key(Some("key=%ff")).is_err());
    }
}
