//! The station's state and the helpers every handler uses: hyper 1.x over the engine. Routes
//! and encodings come from [`crate::wire`]; the route table is [`crate::station::routes`].
//!
//! One task per connection ([`http_frame::conn`]: connection bound, header/idle timeouts, bodies
//! read under a size bound and a timeout); compute and tokenizer work run on the blocking pool
//! (rayon inside), at most `max_compute` at once with the rest waiting their turn, so a long
//! prefill or a big `/tokenize` never stalls `/health` or other sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use knot_format::Knot;
use tokio::sync::Semaphore;

use crate::mesh::node::{MeshNode, DEFAULT_HOP_TIMEOUT, DEFAULT_REPLAY_WINDOW};
use crate::station::metrics::{Gauges, StationMetrics};
use http_frame::conn::{BodyError, ConnLimits};

use crate::engine::tokenizer::Tokenizer;
use crate::engine::{EngineError, KvDtype, Model, Session};
use crate::wire::{self, Health};

/// Limits and knobs of a station.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most live sessions; the least recently used idle one is evicted beyond it.
    pub max_sessions: usize,
    /// A session unused this long is dropped.
    pub session_idle: Duration,
    /// Most positions one session (or one stateless request) may hold.
    pub max_positions: usize,
    /// Most bytes of KV cache all sessions together may hold; the least recently used idle
    /// sessions are evicted beyond it.
    pub max_session_bytes: usize,
    /// Largest request body accepted (refused before reading when `Content-Length` says so).
    pub max_body: usize,
    /// Longest wait for the next piece of a request body (then `408 body_timeout`).
    pub body_timeout: Duration,
    /// Largest `/tokenize` text, in bytes (tokenizing costs more than linear time).
    pub max_text: usize,
    /// Most compute requests (and tokenizer calls) running at once; the rest wait in turn.
    pub max_compute: usize,
    /// Connection bound and header/idle timeouts.
    pub conn: ConnLimits,
    /// How sessions store keys and values (`--kv-dtype`; f16 halves their memory).
    pub kv_dtype: KvDtype,
    /// Which earlier states a hybrid's recurrent layers keep (`--checkpoint-*`).
    pub checkpoints: crate::engine::Checkpoints,
    /// deepseek2: sessions cache MLA's latent rows (`--mla-latent-cache`).
    pub mla_latent_cache: bool,
    /// Whether the weights are packed into interleaved copies or stay in the mapped file.
    pub pack_weights: super::weight_memory::PackWeights,
    /// Most response bytes held for clients that have not read them yet
    /// ([`super::response_budget`]); beyond it a big answer is `503 responses_busy`.
    pub max_response_bytes: usize,
}

/// Default `--max-body`.
pub const DEFAULT_MAX_BODY: usize = 64 << 20;
/// Default `--max-session-memory`.
pub const DEFAULT_MAX_SESSION_BYTES: usize = 4 << 30;
/// Largest `/tokenize` text: 256 KiB, tens of thousands of tokens.
pub const DEFAULT_MAX_TEXT: usize = 256 << 10;

/// Default `--max-compute`: one per core.
pub fn default_max_compute() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 64,
            session_idle: Duration::from_secs(600),
            max_positions: 4096,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
            max_body: DEFAULT_MAX_BODY,
            body_timeout: http_frame::conn::DEFAULT_BODY_TIMEOUT,
            max_text: DEFAULT_MAX_TEXT,
            max_compute: default_max_compute(),
            conn: ConnLimits::default(),
            kv_dtype: KvDtype::F32,
            checkpoints: Default::default(),
            mla_latent_cache: false,
            pack_weights: Default::default(),
            max_response_bytes: super::response_budget::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

struct SessionSlot {
    session: Arc<Mutex<Session>>,
    last_used: Instant,
    /// KV bytes the session held after its last request.
    bytes: usize,
}

/// Everything a request handler shares.
pub struct Station {
    pub(super) model: Model<'static>,
    tokenizer: OnceLock<Result<Tokenizer, String>>,
    sessions: Mutex<HashMap<String, SessionSlot>>,
    pub(super) limits: Limits,
    /// One permit per compute request running ([`Limits::max_compute`]).
    compute_gate: Arc<Semaphore>,
    started: Instant,
    /// Mesh identity, successor, key and grant check (`--manifest`, `--mesh-key`); set once
    /// before serving, else an open mesh node named after nothing.
    mesh: OnceLock<MeshNode>,
    /// Counters and histograms for `/metrics`.
    pub(crate) metrics: StationMetrics,
    /// Response bytes held for clients that have not read them ([`Limits::max_response_bytes`]).
    pub(super) responses: super::response_budget::ResponseBudget,
}

pub(crate) type Resp = Response<Full<Bytes>>;

/// A request refused, with the status and the machine code the client sees.
pub(crate) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    /// `session_mismatch` from a hybrid's rewind: the positions the session holds now.
    pub(super) held: Option<usize>,
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
        held: None,
    }
}

/// `409 session_mismatch` naming the positions the session holds (`"held"`), where the
/// caller re-sends from.
pub(crate) fn mismatch(held: usize, message: String) -> Refusal {
    Refusal {
        held: Some(held),
        ..refuse(StatusCode::CONFLICT, "session_mismatch", message)
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
            EngineError::BadRows { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
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
            model: model
                .with_kv_dtype(limits.kv_dtype)
                .with_checkpoints(limits.checkpoints)
                .with_mla_latent_cache(limits.mla_latent_cache),
            tokenizer: OnceLock::new(),
            sessions: Mutex::new(HashMap::new()),
            compute_gate: Arc::new(Semaphore::new(limits.max_compute.max(1))),
            responses: super::response_budget::ResponseBudget::new(limits.max_response_bytes),
            limits,
            started: Instant::now(),
            mesh: OnceLock::new(),
            metrics: StationMetrics::default(),
        });
        let packable = st.model.packable_bytes() as u64;
        let budget = super::weight_memory::memory_budget();
        if !st.limits.pack_weights.decide(packable, budget) {
            st.model.keep_weights_in_file();
            // Pin only under a cgroup limit (a budget someone gave this node; `budget` is at
            // most it): pinning up to the system's available memory would starve everything
            // else on the device.
            let pinned = match (super::weight_memory::cgroup_memory_limit(), budget) {
                (Some(_), Some(b)) => st
                    .model
                    .lock_weights(b.saturating_sub(super::weight_memory::PAGED_RESERVE)),
                _ => 0,
            };
            tracing::info!(
                packable_mib = packable >> 20,
                budget_mib = budget.map(|b| b >> 20),
                pinned_mib = pinned >> 20,
                "weights stay in the mapped file (paged: slower, but within the memory limit)"
            );
        }
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
        // RoPE for the sessions' context (Phi-3's long factors beyond its original one).
        let model = Model::load(knot, holdings)?.with_context(limits.max_positions)?;
        Ok(Station::new(model, limits))
    }

    /// Joins a mesh (see [`crate::mesh::relay`]); only the first call takes effect.
    pub fn set_mesh(&self, node: MeshNode) {
        let _ = self.mesh.set(node);
    }

    /// The mesh identity, when one was set.
    pub fn mesh(&self) -> Option<&MeshNode> {
        self.mesh.get()
    }

    /// The mesh identity, an open node named `station` when none was set.
    pub(crate) fn mesh_node(&self) -> &MeshNode {
        self.mesh.get_or_init(|| {
            MeshNode::new(
                "station".into(),
                None,
                None,
                None,
                DEFAULT_HOP_TIMEOUT,
                DEFAULT_REPLAY_WINDOW,
            )
        })
    }

    /// The model served.
    pub fn model(&self) -> &Model<'static> {
        &self.model
    }

    pub(super) fn tokenizer(&self) -> Result<&Tokenizer, Refusal> {
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

    pub(super) fn health(&self) -> Health {
        let h = self.model.holdings();
        let cfg = &self.model.cfg;
        let knot = self.model.knot();
        let role = match (h.embed, h.head) {
            (true, true) => "full",
            (true, false) => "entry",
            (false, true) => "exit",
            (false, false) => "mid",
        };
        let (sessions, session_bytes) = self
            .sessions
            .lock()
            .map(|m| (m.len(), m.values().map(|s| s.bytes).sum()))
            .unwrap_or((0, 0));
        Health {
            status: "ok".into(),
            model_id: knot.header().model_id.clone(),
            model_hash: knot
                .shard()
                .map_or(knot.model_hash(), |s| s.parent_hash.as_str())
                .to_string(),
            shard_hash: knot.shard().map(|_| knot.model_hash().to_string()),
            arch: knot.arch().arch.clone(),
            role: role.into(),
            layers: format!("{}-{}", h.layers.start, h.layers.end),
            n_layers: cfg.n_layers as u32,
            hidden: cfg.hidden as u32,
            vocab: cfg.vocab as u32,
            serves_embed: h.embed,
            serves_lm_head: h.head,
            has_tokenizer: knot.header().tokenizer.is_some(),
            sessions,
            session_bytes,
            uptime_s: self.started.elapsed().as_secs_f64(),
            mesh: Some(self.mesh.get().map(|m| m.mode()).unwrap_or("open").into()),
            node_id: self.mesh.get().map(|m| m.node_id.clone()),
            max_positions: Some(self.limits.max_positions),
            kv_bytes_per_position: Some(self.model.kv_bytes_per_position()),
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
        let expired = expire_idle(&mut map, now, self.limits.session_idle);
        self.metrics
            .evicted
            .fetch_add(expired as u64, Ordering::Relaxed);
        if !map.contains_key(id)
            && map.len() >= self.limits.max_sessions
            && self.evict(&mut map, id).is_none()
        {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_sessions",
                "all sessions are busy",
            ));
        }
        self.trim_sessions(&mut map, id);
        let slot = map.entry(id.to_string()).or_insert_with(|| SessionSlot {
            session: Arc::new(Mutex::new(
                self.model.new_session(self.limits.max_positions),
            )),
            last_used: now,
            bytes: 0,
        });
        slot.last_used = now;
        Ok(Some(slot.session.clone()))
    }
}

impl Station {
    /// [`evict_lru`], counted in the metrics.
    fn evict(&self, map: &mut HashMap<String, SessionSlot>, keep: &str) -> Option<usize> {
        let freed = evict_lru(map, keep);
        if freed.is_some() {
            self.metrics.evicted.fetch_add(1, Ordering::Relaxed);
        }
        freed
    }

    /// `GET /metrics`: Prometheus text.
    pub(super) fn metrics_response(&self) -> Resp {
        let mut r = Response::new(Full::new(Bytes::from(self.metrics_text())));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        r
    }

    /// The `/metrics` text: the counters and histograms with the session gauges read now.
    pub(super) fn metrics_text(&self) -> String {
        let kv_dim = self.model.cfg.kv_dim();
        let first = self.model.holdings().layers.start;
        let (sessions, kv_bytes, kv_tokens) = self
            .sessions
            .lock()
            .map(|m| {
                let tokens = m
                    .values()
                    .filter_map(|s| s.session.try_lock().ok())
                    .map(|s| s.positions(first as usize, kv_dim).unwrap_or(0))
                    .sum();
                (m.len(), m.values().map(|s| s.bytes).sum(), tokens)
            })
            .unwrap_or((0, 0, 0));
        self.metrics.render(&Gauges {
            sessions,
            max_sessions: self.limits.max_sessions,
            kv_bytes,
            max_kv_bytes: self.limits.max_session_bytes,
            kv_tokens,
            uptime_s: self.started.elapsed().as_secs_f64(),
            response_bytes: self.responses.held(),
            max_response_bytes: self.responses.limit(),
        })
    }

    /// Keeps the sessions' KV bytes within [`Limits::max_session_bytes`]: the least recently
    /// used idle sessions other than `keep` go first.
    fn trim_sessions(&self, map: &mut HashMap<String, SessionSlot>, keep: &str) {
        for slot in map.values_mut() {
            if let Ok(s) = slot.session.try_lock() {
                slot.bytes = s.kv_bytes();
            }
        }
        let mut total: usize = map.values().map(|s| s.bytes).sum();
        while total > self.limits.max_session_bytes {
            match self.evict(map, keep) {
                Some(freed) => total -= freed,
                None => break,
            }
        }
    }

    /// [`Station::trim_sessions`] after a request grew a session.
    fn trim_sessions_now(&self) {
        if let Ok(mut map) = self.sessions.lock() {
            self.trim_sessions(&mut map, "");
        }
    }
}

/// Drops the sessions idle for `idle` or longer; returns how many went.
fn expire_idle(map: &mut HashMap<String, SessionSlot>, now: Instant, idle: Duration) -> usize {
    let before = map.len();
    map.retain(|_, s| Arc::strong_count(&s.session) > 1 || now.duration_since(s.last_used) < idle);
    before - map.len()
}

impl Station {
    /// Expires idle sessions now (the sweeper calls it, so memory comes back without waiting
    /// for the next session request) and hands freed heap back to the OS.
    pub fn sweep_sessions(&self) -> usize {
        let gone = match self.sessions.lock() {
            Ok(mut map) => expire_idle(&mut map, Instant::now(), self.limits.session_idle),
            Err(_) => 0,
        };
        self.metrics
            .evicted
            .fetch_add(gone as u64, Ordering::Relaxed);
        if gone > 0 {
            http_frame::heap::return_free_heap();
        }
        gone
    }
}

/// Drops the least recently used session nobody is using, other than `keep`; returns the KV
/// bytes it held, `None` when every other session is busy.
fn evict_lru(map: &mut HashMap<String, SessionSlot>, keep: &str) -> Option<usize> {
    let victim = map
        .iter()
        .filter(|(k, s)| k.as_str() != keep && Arc::strong_count(&s.session) == 1)
        .min_by_key(|(_, s)| s.last_used)
        .map(|(k, _)| k.clone())?;
    map.remove(&victim).map(|s| s.bytes)
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
                    // `held`: a session a peer shipped (or a fresh one, 0) tells the caller
                    // where to re-send from (specs/station-wire.md, "Checkpoints to replicas").
                    return Err(mismatch(
                        have,
                        format!("X-Pos {p} but the session holds {have} positions"),
                    ));
                }
                if p < have {
                    // A hybrid's recurrent state may only go back to an earlier checkpoint:
                    // then the caller re-sends from there (409 names the position).
                    let held = s.truncate(p, kv_dim);
                    if held < p {
                        return Err(mismatch(
                            held,
                            format!(
                                "X-Pos {p} but the session's recurrent state goes back \
                                 only to position {held}; it holds {held} positions now"
                            ),
                        ));
                    }
                }
            }
            let out = f(&st.model, &mut s);
            drop(s);
            // This session is still held by the caller, so only others can go.
            st.trim_sessions_now();
            Ok(out?)
        }
    }
}

/// Refuses (413 `context_full`) a request that would put `adding` positions after `pos` in
/// a session of [`Limits::max_positions`], before any compute: a prompt longer than the
/// context costs nothing but this check.
pub(crate) fn check_context(st: &Station, pos: usize, adding: usize) -> Result<(), Refusal> {
    let max = st.limits.max_positions;
    if pos.saturating_add(adding) > max {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "context_full",
            format!(
                "{adding} positions after position {pos} exceed this station's context of {max}"
            ),
        ));
    }
    Ok(())
}

/// Refuses (503 `responses_busy`, with Retry-After) before compute an answer of `bytes`
/// that the response budget has no room for now ([`super::response_budget`]).
pub(crate) fn check_room(st: &Station, bytes: usize) -> Result<(), Refusal> {
    if st.responses.room_for(bytes) {
        return Ok(());
    }
    st.metrics.responses_refused.fetch_add(1, Ordering::Relaxed);
    Err(busy_responses(st, bytes))
}

/// The refusal of an answer of `bytes` the response budget cannot take.
pub(crate) fn busy_responses(st: &Station, bytes: usize) -> Refusal {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "responses_busy",
        format!(
            "an answer of {bytes} bytes does not fit: {} of the {} bytes for unread answers are held",
            st.responses.held(),
            st.responses.limit()
        ),
    )
}

/// A request's session (none: stateless) and its `X-Pos`.
pub(crate) type SessionAt = (Option<Arc<Mutex<Session>>>, Option<usize>);

pub(crate) fn session_of(
    st: &Station,
    session: Option<&str>,
    pos: Option<&str>,
) -> Result<SessionAt, Refusal> {
    let pos = pos
        .map(|p| wire::parse_index("X-Pos", p))
        .transpose()
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_request", e))?;
    Ok((st.session(session)?, pos))
}

/// Runs `f` on the blocking pool once one of the `max_compute` permits is free (waiting in
/// turn; a client that leaves while waiting leaves the queue).
pub(crate) async fn compute<T: Send + 'static>(
    st: Arc<Station>,
    f: impl FnOnce(&Station) -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    let t = Instant::now();
    let permit = {
        let _waiting = Count::new(&st.metrics.waiting);
        st.compute_gate.clone().acquire_owned().await
    }
    .map_err(|_| {
        refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the compute pool is closed",
        )
    })?;
    st.metrics.queue.observe(t.elapsed().as_secs_f64());
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let _running = Count::new(&st.metrics.running);
        let t = Instant::now();
        let out = f(&st);
        st.metrics.compute.observe(t.elapsed().as_secs_f64());
        out
    })
    .await
    .map_err(|e| {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("compute task failed: {e}"),
        )
    })?
}

/// One in a gauge for as long as it lives (every exit path, a dropped future included).
struct Count<'a>(&'a AtomicUsize);

impl<'a> Count<'a> {
    fn new(a: &'a AtomicUsize) -> Count<'a> {
        a.fetch_add(1, Ordering::Relaxed);
        Count(a)
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Longest wire header value the station reads (`X-Route` with a few hops, `X-Grant`'s hex
/// fit; hyper bounds the whole head anyway).
const MAX_HEADER_VALUE: usize = 8 << 10;

/// A request header's value, `None` when absent. A value that is not visible ASCII (or is
/// over [`MAX_HEADER_VALUE`]) is refused (400), never read as absent: a non-ASCII
/// `X-Session` must not run the request without its session. The value's own syntax is
/// [`crate::wire`]'s to check.
pub(crate) fn header(req: &Request<Incoming>, name: &str) -> Result<Option<String>, Refusal> {
    let Some(v) = req.headers().get(name) else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(s) if s.len() <= MAX_HEADER_VALUE => Ok(Some(s.to_string())),
        _ => Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_header",
            format!("header {name}: the value must be at most {MAX_HEADER_VALUE} bytes of visible ASCII"),
        )),
    }
}

/// A request's `X-Dtype`: true for f16; f32 without the header.
pub(crate) fn dtype_f16(v: Option<&str>) -> Result<bool, Refusal> {
    v.map_or(Ok(false), |v| {
        wire::parse_dtype(v).map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_request", e))
    })
}

/// The request's body within `--max-body` and `--body-timeout` ([`http_frame::conn::read_body`]).
pub(crate) async fn read_body(st: &Station, req: Request<Incoming>) -> Result<Bytes, Refusal> {
    http_frame::conn::read_body(req, st.limits.max_body, st.limits.body_timeout)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { .. } => {
                refuse(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            BodyError::Timeout { .. } => {
                refuse(StatusCode::REQUEST_TIMEOUT, "body_timeout", e.to_string())
            }
            BodyError::Read(_) => refuse(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
        })
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

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Resp {
    let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
