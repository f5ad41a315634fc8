//! `moonshine serve`: an OpenAI-compatible gateway over a chain of stations.
//!
//! Routes: `POST /v1/chat/completions` (SSE when `stream: true`), `GET /v1/models`,
//! `GET /metrics` (Prometheus text), `GET /health`. Contract: `specs/openai-api.md`.
//!
//! Shape (hyper 1.x, house style "Servers"): accept loop, one task per connection, an async
//! handler matching `(method, path)`, state in `Arc<AppState>`, generation on the blocking
//! pool. Admission, before any station call: at most `--max-concurrent` generations run; up to
//! `--max-queue` more wait; beyond that 429 (RAII guards give back the queue place and the slot
//! on every exit path, a queued client leaving included). Each running generation leases one station KV session from a pool of
//! `--max-concurrent` ids; the lease goes back when the generation ends, is cancelled or
//! fails, and the next request on that id rewinds or reuses it (the pool prefers the id whose
//! cached tokens share the longest prefix with the new prompt, so a multi-turn chat re-sent
//! whole only prefills its new turn). Cancellation: when the client goes away, the response
//! body (or the handler future) is dropped, and the generation sees it at its next chain step
//! (prefill runs in steps of [`crate::generate::PREFILL_STEP`] tokens) and stops. Reaching
//! the stations' context limit while decoding ends the answer with `finish_reason: "length"`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use crate::chat::{ChatTemplate, Message};
use crate::generate::{
    Backend, Finish, GenError, GenOutcome, GenRequest, Generation, KvSession, Timing,
};
use crate::sampling::SamplingParams;
use crate::target::TargetArgs;

/// `moonshine serve` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Generations running at once (each holds one station KV session).
    #[arg(long, default_value_t = 4)]
    pub max_concurrent: usize,
    /// Requests waiting for a free slot; beyond this a request gets 429.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// `max_tokens` when a request gives none.
    #[arg(long, default_value_t = 512)]
    pub default_max_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_limit: usize,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds to wait for the next piece of a request body before answering 408.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub body_timeout: u64,
}

/// Prometheus counters and gauges of the gateway.
#[derive(Default)]
pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    active: AtomicUsize,
    waiting: AtomicUsize,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    prompt_tokens_reused: AtomicU64,
    prefill_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Station compute, microseconds, summed over hops.
    compute_us: AtomicU64,
    /// (hop index, url, layers) -> compute microseconds.
    hop_us: Mutex<BTreeMap<(usize, String, String), u64>>,
    generation_us: AtomicU64,
}

impl Metrics {
    fn request(&self, route: &str, status: StatusCode) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), status.as_u16())).or_default() += 1;
        }
    }

    fn timing(&self, t: &Timing) {
        self.compute_us
            .fetch_add((t.compute_ms() * 1e3) as u64, Ordering::Relaxed);
        if let Ok(mut m) = self.hop_us.lock() {
            for (i, (url, layers, ms)) in t.hops.iter().enumerate() {
                *m.entry((i, url.clone(), layers.clone())).or_default() += (ms * 1e3) as u64;
            }
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self, sessions_total: usize) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, String)>| {
            s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in lines {
                s.push_str(&format!("{name}{labels} {v}\n"));
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        let reqs = self
            .requests
            .lock()
            .map(|m| {
                m.iter()
                    .map(|((r, c), n)| (format!("{{route=\"{r}\",code=\"{c}\"}}"), n.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        metric(
            "moonshine_requests_total",
            "counter",
            "HTTP requests by route and status.",
            reqs,
        );
        metric(
            "moonshine_generations_active",
            "gauge",
            "Generations running now (each holds a station KV session).",
            one(self.active.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_sessions_busy",
            "gauge",
            "Station KV sessions leased to a running generation.",
            one(self.active.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_sessions_total",
            "gauge",
            "Station KV session ids in the pool.",
            one(sessions_total.to_string()),
        );
        metric(
            "moonshine_queue_waiting",
            "gauge",
            "Requests waiting for a generation slot.",
            one(self.waiting.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_rejected_total",
            "counter",
            "Requests refused because the queue was full.",
            one(self.rejected.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_cancelled_total",
            "counter",
            "Generations stopped because the client went away.",
            one(self.cancelled.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_prompt_tokens_total",
            "counter",
            "Prompt tokens of completed or cancelled generations.",
            one(self.prompt_tokens.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_prompt_tokens_reused_total",
            "counter",
            "Prompt tokens served from a cached KV session.",
            one(self
                .prompt_tokens_reused
                .load(Ordering::Relaxed)
                .to_string()),
        );
        metric(
            "moonshine_prefill_tokens_total",
            "counter",
            "Prompt tokens sent to the stations by completed or cancelled generations.",
            one(self.prefill_tokens.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_completion_tokens_total",
            "counter",
            "Generated tokens.",
            one(self.completion_tokens.load(Ordering::Relaxed).to_string()),
        );
        let ms = |us: u64| format!("{:.3}", us as f64 / 1e3);
        metric(
            "moonshine_station_compute_ms_total",
            "counter",
            "Engine compute reported by stations (X-Compute-Ms), all hops.",
            one(ms(self.compute_us.load(Ordering::Relaxed))),
        );
        let hops = self
            .hop_us
            .lock()
            .map(|m| {
                m.iter()
                    .map(|((i, u, l), us)| {
                        (
                            format!("{{hop=\"{i}\",station=\"{u}\",layers=\"{l}\"}}"),
                            ms(*us),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        metric(
            "moonshine_hop_compute_ms_total",
            "counter",
            "Engine compute per forward hop.",
            hops,
        );
        metric(
            "moonshine_generation_seconds_total",
            "counter",
            "Wall time spent generating.",
            one(format!(
                "{:.3}",
                self.generation_us.load(Ordering::Relaxed) as f64 / 1e6
            )),
        );
        s
    }
}

/// Everything the handlers share.
pub struct AppState {
    backend: Backend,
    template: Option<ChatTemplate>,
    args: ServeArgs,
    gate: Arc<Semaphore>,
    /// Free station KV sessions (ids `gw-PID-i`), with what each holds.
    pool: Mutex<Vec<KvSession>>,
    metrics: Metrics,
    created: u64,
}

/// Runs the gateway until Ctrl-C.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.max_concurrent == 0 {
        anyhow::bail!("--max-concurrent must be at least 1");
    }
    let backend = args.target.connect()?;
    let template = match backend.info {
        Some(_) => Some(
            backend
                .chat_template()
                .context("loading the model's chat template")?,
        ),
        None => None,
    };
    if template.is_none() {
        warn!("no station serves a tokenizer: chat completions will be refused");
    }
    let pool = (0..args.max_concurrent)
        .map(|i| KvSession::with_id(format!("gw-{}-{i}", std::process::id())))
        .collect();
    let state = Arc::new(AppState {
        gate: Arc::new(Semaphore::new(args.max_concurrent)),
        pool: Mutex::new(pool),
        metrics: Metrics::default(),
        created: now_s(),
        template,
        backend,
        args,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let listener = TcpListener::bind(state.args.listen)
            .await
            .with_context(|| format!("binding {}", state.args.listen))?;
        let addr = listener.local_addr().context("local address")?;
        println!(
            "moonshine serve: listening on http://{addr} (model {}, {} hop(s))",
            state.backend.model_id,
            state.backend.chain.hops().len()
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok(())
    })
}

/// Serves on `listener` until `shutdown` resolves (the station's accept loop,
/// [`fat_station::station::serve_connections`]).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    // What connections and streams freed after the last generation ended goes back to the
    // OS too (the soak's gateway kept ~1 MiB of freed heap otherwise).
    let trimmer = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if state.metrics.active.load(Ordering::Relaxed) == 0 {
                    fat_station::station::heap::return_free_heap();
                }
            }
        })
    };
    fat_station::station::serve_connections(listener, state, handle, shutdown).await;
    trimmer.abort();
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;
type Resp = Response<Body>;

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<&'static str>,
    message: String,
}

fn bad(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        kind: "invalid_request_error",
        code: None,
        param,
        message: message.into(),
    }
}

impl ApiError {
    fn response(&self) -> Resp {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        let mut r = json_resp(self.status, &body);
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<GenError> for ApiError {
    fn from(e: GenError) -> ApiError {
        match e {
            GenError::Template(_) | GenError::EmptyPrompt => bad(Some("messages"), e.to_string()),
            GenError::ContextFull { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..bad(Some("messages"), e.to_string())
            },
            GenError::Station(fat_station::client::ClientError::Refused {
                status: 400 | 413,
                ..
            }) => bad(Some("messages"), e.to_string()),
            GenError::NoTokenizer => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "server_error",
                code: Some("no_tokenizer"),
                param: None,
                message: e.to_string(),
            },
            _ => ApiError {
                status: StatusCode::BAD_GATEWAY,
                kind: "server_error",
                code: Some("station_error"),
                param: None,
                message: e.to_string(),
            },
        }
    }
}

fn json_resp(status: StatusCode, v: &Value) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

async fn handle(st: Arc<AppState>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let t0 = Instant::now();
    let r = match route(&st, req).await {
        Ok(r) => r,
        Err(e) => {
            info!("{method} {path} -> {} {}", e.status.as_u16(), e.message);
            e.response()
        }
    };
    let known = ["/v1/chat/completions", "/v1/models", "/metrics", "/health"];
    st.metrics.request(
        if known.contains(&path.as_str()) {
            &path
        } else {
            "other"
        },
        r.status(),
    );
    debug!(
        "{method} {path} -> {} in {:.1} ms",
        r.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(r)
}

async fn route(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => chat_completions(st, req).await,
        (&Method::GET, "/v1/models") => Ok(json_resp(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": st.backend.model_id, "object": "model", "created": st.created, "owned_by": "aeon-shell"}]}),
        )),
        (&Method::GET, "/metrics") => {
            let total = st.args.max_concurrent;
            let mut r = Response::new(Full::new(Bytes::from(st.metrics.render(total))).boxed());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        (&Method::GET, "/health") => Ok(json_resp(
            StatusCode::OK,
            &json!({"status": "ok", "model": st.backend.model_id}),
        )),
        (_, p @ ("/v1/chat/completions" | "/v1/models" | "/metrics" | "/health")) => {
            Err(ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                kind: "invalid_request_error",
                code: Some("method_not_allowed"),
                param: None,
                message: format!("{} is not allowed on {p}", req.method()),
            })
        }
        (_, p) => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            code: Some("not_found"),
            param: None,
            message: format!("no route {p}"),
        }),
    }
}

/// `POST /v1/chat/completions` body (fields we do not use are ignored).
#[derive(Deserialize, Debug)]
struct ChatRequest {
    model: Option<String>,
    messages: Option<Vec<ApiMessage>>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Extension (llama.cpp, vLLM): top-k sampling.
    top_k: Option<i64>,
    /// Extension (llama.cpp): repetition penalty.
    repeat_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    n: Option<i64>,
    tools: Option<Vec<Value>>,
    logprobs: Option<bool>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
}

#[derive(Deserialize, Debug)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize, Debug)]
struct ApiMessage {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A validated request.
struct Job {
    messages: Vec<Message>,
    stream: bool,
    include_usage: bool,
    max_tokens: usize,
    sampling: SamplingParams,
    stops: Vec<String>,
}

fn validate(r: ChatRequest, args: &ServeArgs) -> Result<Job, ApiError> {
    if r.model.as_deref().is_none_or(str::is_empty) {
        return Err(bad(Some("model"), "you must provide a model parameter"));
    }
    let msgs = r
        .messages
        .ok_or_else(|| bad(Some("messages"), "messages is required"))?;
    if msgs.is_empty() {
        return Err(bad(
            Some("messages"),
            "messages must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => return Err(bad(Some("messages"), format!("messages[{i}].role {other:?} is not one of system, developer, user, assistant, tool"))),
        };
        let content = match m.content {
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(s)) => t.push_str(&s),
                        (k, _) => return Err(bad(Some("messages"), format!("messages[{i}]: content part type {k:?} is not supported (text only)"))),
                    }
                }
                t
            }
            None => {
                return Err(bad(
                    Some("messages"),
                    format!("messages[{i}].content is required"),
                ))
            }
        };
        messages.push(Message::new(role, content));
    }
    if r.n.is_some_and(|n| n != 1) {
        return Err(bad(Some("n"), "only n = 1 is supported"));
    }
    if r.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(bad(Some("tools"), "tools are not supported"));
    }
    if r.logprobs == Some(true) {
        return Err(bad(Some("logprobs"), "logprobs are not supported"));
    }
    for (name, v) in [
        ("frequency_penalty", r.frequency_penalty),
        ("presence_penalty", r.presence_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(bad(
                Some(if name == "frequency_penalty" {
                    "frequency_penalty"
                } else {
                    "presence_penalty"
                }),
                format!("{name} is not supported (use repeat_penalty)"),
            ));
        }
    }
    let max_tokens = match r.max_completion_tokens.or(r.max_tokens) {
        None => args.default_max_tokens.min(args.max_tokens_limit),
        Some(n) if n >= 1 && (n as u64) <= args.max_tokens_limit as u64 => n as usize,
        Some(n) => {
            return Err(bad(
                Some("max_tokens"),
                format!(
                    "max_tokens must be between 1 and {}, got {n}",
                    args.max_tokens_limit
                ),
            ))
        }
    };
    let temperature = r.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad(
            Some("temperature"),
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_k = match r.top_k {
        None => 0,
        Some(k) if k >= 0 => k as usize,
        Some(k) => return Err(bad(Some("top_k"), format!("top_k must be >= 0, got {k}"))),
    };
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p: r.top_p.unwrap_or(1.0),
        repeat_penalty: r.repeat_penalty.unwrap_or(1.0),
        repeat_last_n: 64,
        seed: r.seed.map(|s| s as u64).unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        }),
    };
    sampling.validate().map_err(|e| {
        let param = match e {
            crate::sampling::SamplingError::Temperature(_) => "temperature",
            crate::sampling::SamplingError::TopP(_) => "top_p",
            crate::sampling::SamplingError::RepeatPenalty(_) => "repeat_penalty",
        };
        bad(Some(param), e.to_string())
    })?;
    let stops = match r.stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > 4 {
        return Err(bad(Some("stop"), "at most 4 stop sequences"));
    }
    let stream = r.stream.unwrap_or(false);
    Ok(Job {
        messages,
        stream,
        include_usage: stream && r.stream_options.is_some_and(|o| o.include_usage),
        max_tokens,
        sampling,
        stops,
    })
}

/// The request body, bounded in size (413) and in the wait for each piece (408, `--body-timeout`),
/// by the same reader as the station's.
async fn read_body(st: &AppState, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    use fat_station::station::conn::{self, BodyError};
    let max = st.args.max_body;
    let refusal = |status, code, message| ApiError {
        status,
        kind: "invalid_request_error",
        code: Some(code),
        param: None,
        message,
    };
    let gap = Duration::from_secs(st.args.body_timeout.max(1));
    match conn::read_body(req, max, gap).await {
        Ok(b) => Ok(b),
        Err(e @ BodyError::TooLarge { .. }) => Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            e.to_string(),
        )),
        Err(e @ BodyError::Timeout { .. }) => Err(refusal(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            e.to_string(),
        )),
        Err(e) => Err(bad(None, e.to_string())),
    }
}

/// Sets a flag when dropped: the handler future or the response body (and with it the
/// client) went away.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A place in the admission queue, given back on drop whatever way the wait ends: a slot
/// was granted, the client went away (the handler future is dropped), or shutdown.
struct QueuePlace<'a>(&'a Metrics);

impl<'a> QueuePlace<'a> {
    /// Takes a place when fewer than `max` requests wait.
    fn take(m: &'a Metrics, max: usize) -> Option<QueuePlace<'a>> {
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
async fn admit(st: &Arc<AppState>) -> Result<OwnedSemaphorePermit, ApiError> {
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

/// A leased station session and generation slot; returned to the pool on drop, whatever
/// way the generation ended.
struct Lease {
    st: Arc<AppState>,
    session: Option<KvSession>,
    _permit: OwnedSemaphorePermit,
    finish: &'static str,
    tokens: usize,
}

impl Lease {
    /// Leases the pooled session whose cache shares the longest prefix with `prompt`.
    fn new(
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

/// What the generation thread reports once the prompt is in the cache.
struct Started {
    timing: Timing,
    prompt_tokens: usize,
}

async fn chat_completions(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let body = read_body(st, req).await?;
    let r: ChatRequest =
        serde_json::from_slice(&body).map_err(|e| bad(None, format!("invalid JSON body: {e}")))?;
    let job = validate(r, &st.args)?;
    if st.template.is_none() {
        return Err(GenError::NoTokenizer.into());
    }

    // Admission before any station call; the slot is held from here on (RAII).
    let permit = admit(st).await?;
    let queue_ms = t0.elapsed().as_secs_f64() * 1e3;

    // Render and tokenize (station calls: blocking pool).
    let st2 = st.clone();
    let messages = job.messages.clone();
    let prompt = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, GenError> {
        let t = st2.template.as_ref().ok_or(GenError::NoTokenizer)?;
        st2.backend.chat_tokens(t, &messages)
    })
    .await
    .map_err(|e| internal(format!("tokenize task: {e}")))??;
    let tokenize_ms = t0.elapsed().as_secs_f64() * 1e3 - queue_ms;
    let lease = Lease::new(st, permit, &prompt)?;

    let id = format!(
        "chatcmpl-{:x}{:x}",
        now_s(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let created = now_s();
    let model = st.backend.model_id.clone();
    let gen = GenRequest {
        prompt,
        max_tokens: job.max_tokens,
        sampling: job.sampling.clone(),
        stops: job.stops.clone(),
    };
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Started, ApiError>>();
    let cancel = Arc::new(AtomicBool::new(false));
    let cancel_guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = job.stream;
    let include_usage = job.include_usage;
    let st3 = st.clone();
    let (id2, model2) = (id.clone(), model.clone());
    let gen_task = tokio::task::spawn_blocking(move || -> Result<GenOutcome, ApiError> {
        let mut lease = lease;
        let st = st3;
        let t = Instant::now();
        let is_cancelled = || cancel.load(Ordering::Relaxed);
        let session = lease
            .session
            .as_mut()
            .ok_or_else(|| internal("lease without session".into()))?;
        let g = match Generation::start(&st.backend, session, &gen, &is_cancelled) {
            Ok(g) => g,
            Err(GenError::Cancelled { prefilled }) => {
                lease.finish = "cancelled";
                st.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                st.metrics
                    .prompt_tokens
                    .fetch_add(gen.prompt.len() as u64, Ordering::Relaxed);
                st.metrics
                    .prefill_tokens
                    .fetch_add(prefilled as u64, Ordering::Relaxed);
                info!(id = %id2, prefilled, prompt = gen.prompt.len(), "client went away during prefill: generation cancelled");
                return Err(internal("cancelled".into()));
            }
            Err(e) => {
                warn!(id = %id2, "prefill failed: {e}");
                let _ = ready_tx.send(Err(e.into()));
                return Err(internal("prefill failed".into()));
            }
        };
        let _ = ready_tx.send(Ok(Started {
            timing: g.timing().clone(),
            prompt_tokens: gen.prompt.len(),
        }));
        let chunk = |delta: Value, finish: Value| {
            sse(
                &json!({"id": id2, "object": "chat.completion.chunk", "created": created, "model": model2, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
            )
        };
        let gone = stream
            && tx
                .blocking_send(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                ))
                .is_err();
        let out = g.run(|text| {
            !gone
                && !is_cancelled()
                && (!stream
                    || tx
                        .blocking_send(chunk(json!({"content": text}), Value::Null))
                        .is_ok())
        });
        st.metrics
            .generation_us
            .fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        let o = match out {
            Ok(o) => o,
            Err(e) => {
                warn!(id = %id2, "generation failed: {e}");
                if stream {
                    let _ = tx.blocking_send(sse(&json!({"error": {"message": e.to_string(), "type": "server_error", "code": "station_error"}})));
                    let _ = tx.blocking_send(Bytes::from_static(b"data: [DONE]\n\n"));
                }
                return Err(e.into());
            }
        };
        let completion = o.completion_tokens(&st.backend);
        lease.tokens = completion;
        st.metrics
            .prompt_tokens
            .fetch_add(o.prompt_tokens as u64, Ordering::Relaxed);
        st.metrics
            .prompt_tokens_reused
            .fetch_add((o.prompt_tokens - o.prompt_sent) as u64, Ordering::Relaxed);
        st.metrics
            .prefill_tokens
            .fetch_add(o.prompt_sent as u64, Ordering::Relaxed);
        st.metrics
            .completion_tokens
            .fetch_add(o.tokens.len() as u64, Ordering::Relaxed);
        st.metrics.timing(&o.timing);
        let reason = match o.finish {
            Finish::Cancelled => {
                lease.finish = "cancelled";
                st.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                info!(id = %id2, tokens = completion, "client went away: generation cancelled");
                return Ok(o);
            }
            Finish::Stop => "stop",
            Finish::Length => "length",
        };
        lease.finish = reason;
        if stream {
            let mut done = tx.blocking_send(sse(&json!({"id": id2, "object": "chat.completion.chunk", "created": created, "model": model2, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))).is_ok();
            if done && include_usage {
                let usage = json!({"prompt_tokens": o.prompt_tokens, "completion_tokens": completion, "total_tokens": o.prompt_tokens + completion});
                done = tx.blocking_send(sse(&json!({"id": id2, "object": "chat.completion.chunk", "created": created, "model": model2, "choices": [], "usage": usage}))).is_ok();
            }
            if done {
                let _ = tx.blocking_send(Bytes::from_static(b"data: [DONE]\n\n"));
            }
        }
        Ok(o)
    });
    let started = match ready_rx.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(gen_task
                .await
                .map_err(|e| internal(format!("generation task: {e}")))?
                .err()
                .unwrap_or_else(|| internal("generation ended early".into())))
        }
    };
    let timing_header = |t: &Timing| {
        format!(
            "tokenize;dur={tokenize_ms:.1}, queue;dur={queue_ms:.1}, {}",
            t.server_timing()
        )
    };
    if stream {
        let mut r = Response::new(
            SseBody {
                rx,
                _cancel: cancel_guard,
            }
            .boxed(),
        );
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        if let Ok(v) = HeaderValue::from_str(&timing_header(&started.timing)) {
            h.insert("server-timing", v);
        }
        // The generation thread owns the rest; the body ends when it drops `tx`.
        drop(gen_task);
        return Ok(r);
    }
    drop(rx);
    let _cancel_guard = cancel_guard;
    let o = gen_task
        .await
        .map_err(|e| internal(format!("generation task: {e}")))??;
    let completion = o.completion_tokens(&st.backend);
    let reason = if o.finish == Finish::Stop {
        "stop"
    } else {
        "length"
    };
    let body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": o.text}, "finish_reason": reason, "logprobs": null}],
        "usage": {"prompt_tokens": started.prompt_tokens, "completion_tokens": completion, "total_tokens": started.prompt_tokens + completion},
    });
    let mut r = json_resp(StatusCode::OK, &body);
    let total = o.timing.server_timing();
    let hv = format!(
        "tokenize;dur={tokenize_ms:.1}, queue;dur={queue_ms:.1}, {total}, total;dur={:.1}",
        t0.elapsed().as_secs_f64() * 1e3
    );
    if let Ok(v) = HeaderValue::from_str(&hv) {
        r.headers_mut().insert("server-timing", v);
    }
    Ok(r)
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn internal(message: String) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        kind: "server_error",
        code: None,
        param: None,
        message,
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One server-sent event: `data: JSON\n\n`.
fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A response body fed by the generation thread; dropping it (client gone) closes the
/// channel, which the thread sees at its next send.
struct SseBody {
    rx: mpsc::Receiver<Bytes>,
    _cancel: CancelOnDrop,
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            target: TargetArgs {
                station: "http://127.0.0.1:1".into(),
                mesh: None,
                discover: false,
                discover_listen: "0.0.0.0:7979".parse().unwrap(),
                discover_timeout: 1.0,
                timeout: 1,
            },
            listen: "127.0.0.1:0".parse().unwrap(),
            max_concurrent: 1,
            max_queue: 1,
            default_max_tokens: 16,
            max_tokens_limit: 100,
            max_body: 1000,
            body_timeout: 30,
        }
    }

    fn parse(v: Value) -> Result<Job, ApiError> {
        validate(
            serde_json::from_value(v).map_err(|e| bad(None, e.to_string()))?,
            &args(),
        )
    }

    #[test]
    fn a_plain_request_validates_with_openai_defaults() {
        let j =
            parse(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(j.messages, vec![Message::new("user", "hi")]);
        assert_eq!(
            (
                j.stream,
                j.max_tokens,
                j.sampling.temperature,
                j.sampling.top_p
            ),
            (false, 16, 1.0, 1.0)
        );
        let j = parse(json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "stop": "x", "seed": 5, "temperature": 0,
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}))
        .unwrap();
        assert_eq!(j.messages, vec![Message::new("system", "ab")]);
        assert!(j.stream && j.include_usage);
        assert_eq!(
            (j.stops, j.sampling.seed, j.sampling.temperature),
            (vec!["x".to_string()], 5, 0.0)
        );
    }

    #[test]
    fn bad_requests_name_the_parameter() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "hi"}]}),
                "model",
            ),
            (json!({"model": "m"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
                "messages",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 101}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}),
                "top_p",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}),
                "n",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5}),
                "presence_penalty",
            ),
        ];
        for (body, param) in cases {
            let e = parse(body.clone())
                .err()
                .unwrap_or_else(|| panic!("{body} should be refused"));
            assert_eq!(
                (e.status, e.param),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{body}: {}",
                e.message
            );
        }
        // Wrong types are caught by the JSON parser.
        assert!(
            serde_json::from_value::<ChatRequest>(json!({"model": "m", "messages": "hi"})).is_err()
        );
    }

    #[test]
    fn metrics_render_as_prometheus_text() {
        let m = Metrics::default();
        m.request("/v1/models", StatusCode::OK);
        m.timing(&Timing {
            embed_ms: 1.0,
            hops: vec![("http://a".into(), "0-24".into(), 2.5)],
            head_ms: 0.5,
            steps: 1,
        });
        let s = m.render(4);
        assert!(
            s.contains("moonshine_requests_total{route=\"/v1/models\",code=\"200\"} 1\n"),
            "{s}"
        );
        assert!(
            s.contains("moonshine_station_compute_ms_total 4.000\n"),
            "{s}"
        );
        assert!(s.contains("moonshine_hop_compute_ms_total{hop=\"0\",station=\"http://a\",layers=\"0-24\"} 2.500\n"), "{s}");
        assert!(s.contains("# TYPE moonshine_sessions_busy gauge"));
    }
}
