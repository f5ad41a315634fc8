//! The HTTP station: hyper 1.x over the engine. Routes and encodings come from [`crate::wire`].
//!
//! One task per connection; compute runs on the blocking pool (rayon inside), so a long
//! prefill never stalls `/health` or other sessions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use knot_format::{Knot, LayerRange};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::engine::tokenizer::Tokenizer;
use crate::engine::{EngineError, Model, Session};
use crate::wire::{self, ErrorBody, Health};

/// Limits and knobs of a station.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most live sessions; the least recently used idle one is evicted beyond it.
    pub max_sessions: usize,
    /// A session unused this long is dropped.
    pub session_idle: Duration,
    /// Most positions one session (or one stateless request) may hold.
    pub max_positions: usize,
    /// Largest request body accepted.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 64,
            session_idle: Duration::from_secs(600),
            max_positions: 4096,
            max_body: 64 << 20,
        }
    }
}

struct SessionSlot {
    session: Arc<Mutex<Session>>,
    last_used: Instant,
}

/// Everything a request handler shares.
pub struct Station {
    model: Model<'static>,
    tokenizer: OnceLock<Result<Tokenizer, String>>,
    sessions: Mutex<HashMap<String, SessionSlot>>,
    limits: Limits,
    started: Instant,
    /// Mesh identity, successor, key and grant check (`--manifest`, `--mesh-key`); set once
    /// before serving, else an open mesh node named after nothing.
    mesh: OnceLock<crate::relay::MeshNode>,
}

pub(crate) type Resp = Response<Full<Bytes>>;

/// A request refused, with the status and the machine code the client sees.
pub(crate) struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

pub(crate) fn refuse(
    status: StatusCode,
    code: &'static str,
    message: impl Into<String>,
) -> Refusal {
    Refusal {
        status,
        code,
        message: message.into(),
    }
}

impl From<EngineError> for Refusal {
    fn from(e: EngineError) -> Self {
        let (status, code) = match &e {
            EngineError::NotHeld { .. } => (StatusCode::NOT_FOUND, "not_held"),
            EngineError::BadRange { .. } => (StatusCode::BAD_REQUEST, "bad_range"),
            EngineError::BadResidual { .. } => (StatusCode::BAD_REQUEST, "bad_residual"),
            EngineError::BadToken { .. } => (StatusCode::BAD_REQUEST, "bad_token"),
            EngineError::ContextFull { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "context_full"),
            EngineError::SessionMismatch(_) => (StatusCode::CONFLICT, "session_mismatch"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "engine"),
        };
        refuse(status, code, e.to_string())
    }
}

impl Station {
    /// Wraps a loaded model. The knot must live for the process (stations never unload).
    /// The kernels' weight copies are built on a background thread, so the station answers
    /// at once and a request that comes early waits only for the matrices it needs.
    pub fn new(model: Model<'static>, limits: Limits) -> Arc<Station> {
        let st = Arc::new(Station {
            model,
            tokenizer: OnceLock::new(),
            sessions: Mutex::new(HashMap::new()),
            limits,
            started: Instant::now(),
            mesh: OnceLock::new(),
        });
        let bg = Arc::clone(&st);
        let spawned = std::thread::Builder::new()
            .name("prepare-weights".into())
            .spawn(move || {
                let t = Instant::now();
                bg.model.prepare();
                tracing::debug!(ms = t.elapsed().as_millis() as u64, "weights prepared");
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "could not start the weight preparation thread ({e}); first use builds them"
            );
        }
        st
    }

    /// Opens `knot` for the rest of the process and loads the held part of the model.
    pub fn open(
        knot: Knot,
        holdings: Option<crate::engine::Holdings>,
        limits: Limits,
    ) -> Result<Arc<Station>, EngineError> {
        // Stations serve until the process exits, so the mmap is leaked on purpose: the
        // weights borrow from it with a 'static lifetime and no copies.
        let knot: &'static Knot = Box::leak(Box::new(knot));
        Ok(Station::new(Model::load(knot, holdings)?, limits))
    }

    /// Joins a mesh (see [`crate::relay`]); only the first call takes effect.
    pub fn set_mesh(&self, node: crate::relay::MeshNode) {
        let _ = self.mesh.set(node);
    }

    /// The mesh identity, when one was set.
    pub fn mesh(&self) -> Option<&crate::relay::MeshNode> {
        self.mesh.get()
    }

    /// The mesh identity, an open node named `station` when none was set.
    pub(crate) fn mesh_node(&self) -> &crate::relay::MeshNode {
        self.mesh.get_or_init(|| {
            crate::relay::MeshNode::new(
                "station".into(),
                None,
                None,
                None,
                crate::relay::DEFAULT_HOP_TIMEOUT,
                crate::relay::DEFAULT_REPLAY_WINDOW,
            )
        })
    }

    /// The model served.
    pub fn model(&self) -> &Model<'static> {
        &self.model
    }

    fn tokenizer(&self) -> Result<&Tokenizer, Refusal> {
        let t = self.tokenizer.get_or_init(|| {
            let data = self.model.knot().tokenizer().map_err(|e| e.to_string())?;
            let data = data.ok_or_else(|| "this model file carries no tokenizer".to_string())?;
            Tokenizer::from_data(&data).map_err(|e| e.to_string())
        });
        t.as_ref()
            .map_err(|e| refuse(StatusCode::NOT_FOUND, "no_tokenizer", e.clone()))
    }

    /// What `GET /health` reports.
    pub fn health_report(&self) -> Health {
        self.health()
    }

    fn health(&self) -> Health {
        let h = self.model.holdings();
        let cfg = &self.model.cfg;
        let knot = self.model.knot();
        let role = match (h.embed, h.head) {
            (true, true) => "full",
            (true, false) => "entry",
            (false, true) => "exit",
            (false, false) => "mid",
        };
        Health {
            status: "ok".into(),
            model_id: knot.header().model_id.clone(),
            model_hash: knot.model_hash().to_string(),
            arch: knot.arch().arch.clone(),
            role: role.into(),
            layers: format!("{}-{}", h.layers.start, h.layers.end),
            n_layers: cfg.n_layers as u32,
            hidden: cfg.hidden as u32,
            vocab: cfg.vocab as u32,
            serves_embed: h.embed,
            serves_lm_head: h.head,
            has_tokenizer: knot.header().tokenizer.is_some(),
            sessions: self.sessions.lock().map(|s| s.len()).unwrap_or(0),
            uptime_s: self.started.elapsed().as_secs_f64(),
            mesh: Some(self.mesh.get().map(|m| m.mode()).unwrap_or("open").into()),
            node_id: self.mesh.get().map(|m| m.node_id.clone()),
        }
    }

    /// The session named by the request, created on first use; `None` without a header.
    fn session(&self, id: Option<&str>) -> Result<Option<Arc<Mutex<Session>>>, Refusal> {
        let Some(id) = id else { return Ok(None) };
        if !wire::valid_session_id(id) {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_session",
                "session id must be 1-64 chars of [A-Za-z0-9_.:-]",
            ));
        }
        let mut map = self.sessions.lock().map_err(|_| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "poisoned",
                "session table poisoned",
            )
        })?;
        let now = Instant::now();
        map.retain(|_, s| now.duration_since(s.last_used) < self.limits.session_idle);
        if !map.contains_key(id) && map.len() >= self.limits.max_sessions {
            // Evict the least recently used session nobody is using right now.
            let victim = map
                .iter()
                .filter(|(_, s)| Arc::strong_count(&s.session) == 1)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    map.remove(&k);
                }
                None => {
                    return Err(refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too_many_sessions",
                        "all sessions are busy",
                    ))
                }
            }
        }
        let slot = map.entry(id.to_string()).or_insert_with(|| SessionSlot {
            session: Arc::new(Mutex::new(
                self.model.new_session(self.limits.max_positions),
            )),
            last_used: now,
        });
        slot.last_used = now;
        Ok(Some(slot.session.clone()))
    }
}

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    station: Arc<Station>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_connections(listener, station, handle, shutdown).await
}

/// The accept loop shared by the station and moonshine's gateway: accepts on `listener` until
/// `shutdown` resolves (then logs "shutting down" and returns; connections already spawned
/// keep running). Each connection gets `TCP_NODELAY` and its own task serving HTTP/1.1 with
/// keep-alive, every request going to `handle(state.clone(), req)`; a failed accept is logged
/// at warn and skipped, a connection error at debug.
pub async fn serve_connections<S, H, F, B>(
    listener: TcpListener,
    state: Arc<S>,
    handle: H,
    shutdown: impl std::future::Future<Output = ()>,
) where
    S: Send + Sync + 'static,
    H: Fn(Arc<S>, Request<Incoming>) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => { warn!("accept failed: {e}"); continue; }
                };
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                let handle = handle.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(st.clone(), req));
                    if let Err(e) = http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc).await {
                        debug!("connection {peer}: {e}");
                    }
                });
            }
            _ = &mut shutdown => { info!("shutting down"); break; }
        }
    }
}

/// Binds `addr`; returns the listener and the address actually bound (port 0 picks one).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

async fn handle(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let out = route(st, req).await;
    Ok(match out {
        Ok(r) => r,
        Err(e) => {
            debug!("{method} {path} -> {} {}", e.status, e.message);
            json(
                e.status,
                &ErrorBody {
                    error: e.code.into(),
                    message: e.message,
                },
            )
        }
    })
}

async fn route(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    if let p @ (wire::ROUTE_EMBED | wire::ROUTE_FORWARD | wire::ROUTE_LM_HEAD) = req.uri().path() {
        if let Err(e) = crate::relay::guard_direct(&st, p) {
            // Read the body first so the refusal is delivered, not a reset.
            let _ = read_body(&st, req).await;
            return Err(e);
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, wire::ROUTE_CHAIN) => crate::relay::chain(st, req).await,
        (&Method::GET, wire::ROUTE_HEALTH) => Ok(json(StatusCode::OK, &st.health())),
        (&Method::POST, wire::ROUTE_EMBED) => {
            let body: wire::EmbedRequest = read_json(&st, req).await?;
            if body.tokens.is_empty() {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "tokens must not be empty",
                ));
            }
            // The residual is tokens x hidden floats: bound it like a session before allocating.
            if body.tokens.len() > st.limits.max_positions {
                return Err(refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "context_full",
                    format!(
                        "{} tokens exceed this station's limit of {}",
                        body.tokens.len(),
                        st.limits.max_positions
                    ),
                ));
            }
            compute(move || {
                let t = Instant::now();
                let x = st.model.embed(&body.tokens)?;
                Ok(residual_response(&x, st.model.cfg.hidden, t, false))
            })
            .await
        }
        (&Method::POST, wire::ROUTE_FORWARD) => {
            // Read the body before any refusal: a response sent while the client is still
            // writing would reset the connection instead of delivering the error.
            let range_h = header(&req, wire::H_LAYER_RANGE);
            let f16 = header(&req, wire::H_DTYPE).as_deref() == Some("f16");
            let pos_h = header(&req, wire::H_POS);
            let session_h = header(&req, wire::H_SESSION);
            let bytes = read_body(&st, req).await?;
            let range = range_h.ok_or_else(|| {
                refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "missing header X-Layer-Range: a-b",
                )
            })?;
            let range = LayerRange::parse(&range)
                .filter(|r| !r.is_empty())
                .ok_or_else(|| {
                    refuse(
                        StatusCode::BAD_REQUEST,
                        "bad_range",
                        format!("X-Layer-Range {range:?} is not a non-empty a-b"),
                    )
                })?;
            let held = st.model.holdings().layers;
            if !held.contains_range(&range) {
                return Err(refuse(
                    StatusCode::NOT_FOUND,
                    "not_held",
                    format!(
                        "this station holds layers {}-{}, not {}-{}",
                        held.start, held.end, range.start, range.end
                    ),
                ));
            }
            let (session, pos) = session_of(&st, session_h.as_deref(), pos_h.as_deref())?;
            let mut x = decode_residual(&bytes, f16, st.model.cfg.hidden)?;
            compute(move || {
                let t = Instant::now();
                let start = with_session(&st, session, pos, range.start as usize, |model, s| {
                    model.forward(s, &mut x, range)
                })?;
                let mut r = residual_response(&x, st.model.cfg.hidden, t, f16);
                set(&mut r, wire::H_START_POS, start.to_string());
                Ok(r)
            })
            .await
        }
        (&Method::POST, wire::ROUTE_LM_HEAD) => {
            let f16 = header(&req, wire::H_DTYPE).as_deref() == Some("f16");
            let bytes = read_body(&st, req).await?;
            let x = decode_residual(&bytes, f16, st.model.cfg.hidden)?;
            compute(move || {
                let t = Instant::now();
                let logits = st.model.lm_head(&x)?;
                let mut r = binary(wire::encode_f32(&logits));
                set(&mut r, wire::H_COMPUTE_MS, ms(t));
                Ok(r)
            })
            .await
        }
        (&Method::GET, wire::ROUTE_TOKENIZER) => {
            let tok = st.tokenizer()?;
            let template = st
                .model
                .knot()
                .tokenizer()
                .ok()
                .flatten()
                .and_then(|d| d.chat_template);
            Ok(json(
                StatusCode::OK,
                &wire::TokenizerInfo {
                    vocab: tok.vocab_size() as u32,
                    bos_id: tok.bos_id(),
                    eos_id: tok.eos_id(),
                    eog_ids: (0..tok.vocab_size() as u32)
                        .filter(|&i| tok.is_eog(i))
                        .collect(),
                    add_bos: tok.add_bos_default(),
                    chat_template: template,
                },
            ))
        }
        (&Method::POST, wire::ROUTE_TOKENIZE) => {
            let body: wire::TokenizeRequest = read_json(&st, req).await?;
            let tok = st.tokenizer()?;
            let add_bos = body.add_bos.unwrap_or_else(|| tok.add_bos_default());
            let pieces = body
                .pieces()
                .map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_request", e))?;
            Ok(json(
                StatusCode::OK,
                &wire::Tokens {
                    tokens: tok.encode_parts(&pieces, add_bos),
                },
            ))
        }
        (&Method::POST, wire::ROUTE_DETOKENIZE) => {
            let body: wire::Tokens = read_json(&st, req).await?;
            let tok = st.tokenizer()?;
            if let Some(bad) = body
                .tokens
                .iter()
                .find(|&&t| t as usize >= tok.vocab_size())
            {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_token",
                    format!(
                        "token id {bad} is outside the vocabulary ({})",
                        tok.vocab_size()
                    ),
                ));
            }
            Ok(json(
                StatusCode::OK,
                &wire::Text {
                    text: tok.decode(&body.tokens),
                },
            ))
        }
        (
            _,
            p @ (wire::ROUTE_HEALTH
            | wire::ROUTE_TOKENIZER
            | wire::ROUTE_EMBED
            | wire::ROUTE_FORWARD
            | wire::ROUTE_LM_HEAD
            | wire::ROUTE_TOKENIZE
            | wire::ROUTE_DETOKENIZE
            | wire::ROUTE_CHAIN),
        ) => Err(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on {p}", req.method()),
        )),
        (_, p) => Err(refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {p}"),
        )),
    }
}

/// Runs `f` with the request's session (or a fresh one), honouring `X-Pos`.
pub(crate) fn with_session<T>(
    st: &Station,
    session: Option<Arc<Mutex<Session>>>,
    pos: Option<usize>,
    first_layer: usize,
    f: impl FnOnce(&Model<'static>, &mut Session) -> Result<T, EngineError>,
) -> Result<T, Refusal> {
    let kv_dim = st.model.cfg.kv_dim();
    match session {
        None => {
            if let Some(p) = pos.filter(|&p| p != 0) {
                return Err(refuse(
                    StatusCode::CONFLICT,
                    "unknown_session",
                    format!("X-Pos {p} needs an X-Session holding earlier positions"),
                ));
            }
            let mut s = st.model.new_session(st.limits.max_positions);
            Ok(f(&st.model, &mut s)?)
        }
        Some(s) => {
            let mut s = s.try_lock().map_err(|_| {
                refuse(
                    StatusCode::CONFLICT,
                    "session_busy",
                    "another request is using this session",
                )
            })?;
            if let Some(p) = pos {
                let have = s.positions(first_layer, kv_dim).unwrap_or(0);
                if p > have {
                    return Err(refuse(
                        StatusCode::CONFLICT,
                        "session_mismatch",
                        format!("X-Pos {p} but the session holds {have} positions"),
                    ));
                }
                if p < have {
                    s.truncate(p, kv_dim);
                }
            }
            Ok(f(&st.model, &mut s)?)
        }
    }
}

/// A request's session (none: stateless) and its `X-Pos`.
pub(crate) type SessionAt = (Option<Arc<Mutex<Session>>>, Option<usize>);

pub(crate) fn session_of(
    st: &Station,
    session: Option<&str>,
    pos: Option<&str>,
) -> Result<SessionAt, Refusal> {
    let pos = match pos {
        Some(p) => Some(p.trim().parse::<usize>().map_err(|_| {
            refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("X-Pos {p:?} is not a number"),
            )
        })?),
        None => None,
    };
    Ok((st.session(session)?, pos))
}

pub(crate) async fn compute(
    f: impl FnOnce() -> Result<Resp, Refusal> + Send + 'static,
) -> Result<Resp, Refusal> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("compute task failed: {e}"),
        )
    })?
}

pub(crate) fn header(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

pub(crate) async fn read_body(st: &Station, req: Request<Incoming>) -> Result<Bytes, Refusal> {
    let max = st.limits.max_body;
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("body exceeds {max} bytes"),
        )
    };
    if let Some(len) = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > max {
            return Err(too_large());
        }
    }
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("reading body: {e}"),
        )),
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(
    st: &Station,
    req: Request<Incoming>,
) -> Result<T, Refusal> {
    let b = read_body(st, req).await?;
    serde_json::from_slice(&b).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            "bad_json",
            format!("invalid JSON body: {e}"),
        )
    })
}

fn decode_residual(b: &[u8], f16: bool, hidden: usize) -> Result<Vec<f32>, Refusal> {
    let width = if f16 { 2 } else { 4 };
    let row = hidden * width;
    if b.is_empty() || !b.len().is_multiple_of(row) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_residual",
            format!(
                "residual of {} bytes is not a whole number of rows of {hidden} x {} bytes",
                b.len(),
                width
            ),
        ));
    }
    let x = if f16 {
        wire::decode_f16(b)
    } else {
        wire::decode_f32(b)
    };
    x.ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "bad_residual", "ragged residual"))
}

fn ms(t: Instant) -> String {
    format!("{:.3}", t.elapsed().as_secs_f64() * 1e3)
}

pub(crate) fn set(r: &mut Resp, name: &'static str, v: String) {
    if let Ok(v) = HeaderValue::from_str(&v) {
        r.headers_mut().insert(name, v);
    }
}

pub(crate) fn binary(b: Vec<u8>) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(b)));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

fn residual_response(x: &[f32], hidden: usize, t: Instant, f16: bool) -> Resp {
    let mut r = binary(if f16 {
        wire::encode_f16(x)
    } else {
        wire::encode_f32(x)
    });
    set(&mut r, wire::H_COMPUTE_MS, ms(t));
    set(&mut r, wire::H_SEQ, (x.len() / hidden).to_string());
    set(&mut r, wire::H_HIDDEN, hidden.to_string());
    if f16 {
        set(&mut r, wire::H_DTYPE, "f16".into());
    }
    r
}

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Resp {
    let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
