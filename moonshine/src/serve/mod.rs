//! `moonshine serve`: an OpenAI-compatible gateway over a chain of stations.
//!
//! Routes: `POST /v1/chat/completions` (SSE when `stream: true`), `/v1/completions`,
//! `GET /v1/models` (each also without `/v1`), llama-server's own ([`llama_server`]:
//! `/completion`, `/tokenize`, `/detokenize`, `/apply-template`, `/props`, `/slots`; and
//! `/infill`), `GET /metrics` (Prometheus text), `GET /health`, `GET /mesh` (the chain for the
//! web page) and the web page itself (`GET /`, [`crate::web`]). Contract: `specs/openai-api.md`.
//! The other APIs (Anthropic's `/v1/messages`, Ollama's `/api/*`, OpenAI's `/v1/responses`,
//! `/v1/embeddings`) are translations onto the same request model ([`dialect`];
//! `specs/other-apis.md`).
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
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use http_frame::prometheus::{Exposition, Histogram};

use crate::api::{self, bad, Answer, ApiError, Job, Limits, PromptSpec, Route};
use crate::chat::{ChatTemplate, TemplateError};
use crate::generate::{
    Backend, FimTokens, Finish, GenError, GenOutcome, GenRequest, Generation, KvSession, Timing,
};
use crate::structured::{Grammar, GrammarError, Vocab};
use crate::target::TargetArgs;
use crate::web::{self, ChainView, HopView, LastGeneration, MeshView};

mod admission;
mod anthropic;
mod auth;
mod completion;
mod dialect;
mod embeddings;
mod lease;
mod llama_server;
mod metrics;
mod ollama;
mod responses;
mod sse;

use admission::*;
use auth::*;
use completion::*;
use dialect::{Dialect, OpenAi};
use lease::*;
pub use metrics::{Latency, Metrics};
use sse::*;

/// `moonshine serve` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8000", conflicts_with_all = ["host", "port"])]
    pub listen: SocketAddr,
    /// The IP address to listen on, as llama-server takes it (with --port; default 127.0.0.1).
    #[arg(long)]
    pub host: Option<std::net::IpAddr>,
    /// The port to listen on, as llama-server takes it (with --host; default 8000).
    #[arg(long)]
    pub port: Option<u16>,
    /// Generations running at once (each holds one station KV session); llama-server's
    /// `-np/--parallel`.
    #[arg(long, visible_alias = "parallel", default_value_t = 4)]
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
    /// Require `Authorization: Bearer KEY` on every route but `/health` (401 otherwise);
    /// default: the `MOONSHINE_API_KEY` environment variable, when set.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Origins a browser may call the API from (CORS), comma-separated; `*` allows any.
    /// Without it no CORS header is sent.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// The model's id in `/v1/models` and in every answer; default: the mesh file's `model`
    /// or the station's model name, as a lower-case slug without a trailing weight-format
    /// word (`Qwen2.5 Coder 0.5B Instruct AWQ` -> `qwen2.5-coder-0.5b-instruct`).
    /// llama-server's `--alias`.
    #[arg(long, visible_alias = "alias")]
    pub served_model_name: Option<String>,
    /// The seed of a request that gives none (llama-server's `--seed`): the same request
    /// then gets the same answer. Default: a fresh seed per request.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Answer `GET /slots` with 501 instead of listing the generation slots (llama-server's
    /// `--no-slots`).
    #[arg(long)]
    pub no_slots: bool,
    /// How `/v1/embeddings` pools an input's rows into one vector (mean, as llama-server
    /// `--embeddings --pooling mean` on a generative model; `last`; `cls`: the first row).
    #[arg(long, value_enum, default_value_t = embeddings::Pooling::Mean)]
    pub pooling: embeddings::Pooling,
    #[command(flatten)]
    pub lookup: crate::lookup::LookupArgs,
}

impl ServeArgs {
    /// Where to listen: `--listen`, or `--host`/`--port` over its default.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(
            self.host.unwrap_or(self.listen.ip()),
            self.port.unwrap_or(self.listen.port()),
        )
    }
}

/// The default served name: `name` lower-cased, runs of other characters than letters,
/// digits, `.`, `_` made one `-`, and a trailing `awq`/`gptq`/`gguf`/`exl2` dropped (the
/// source checkpoint's format, which the served KNOT weights are not in).
pub fn served_name(name: &str) -> String {
    let mut words: Vec<String> = name
        .to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '_'))
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect();
    while words.len() > 1
        && words
            .last()
            .is_some_and(|w| ["awq", "gptq", "gguf", "exl2"].contains(&w.as_str()))
    {
        words.pop();
    }
    words.join("-")
}

/// Everything the handlers share.
pub struct AppState {
    backend: Backend,
    template: Option<ChatTemplate>,
    /// The model's fill-in-the-middle tokens (`suffix`, `/infill`), when it has them.
    fim: Option<FimTokens>,
    /// The model's name in `/v1/models` and every answer.
    served_name: String,
    /// The key every route but `/health` asks for (`--api-key`, `MOONSHINE_API_KEY`).
    api_key: Option<String>,
    args: ServeArgs,
    gate: Arc<Semaphore>,
    /// Free station KV sessions (ids `gw-PID-i`), with what each holds.
    pool: Mutex<Vec<KvSession>>,
    metrics: Metrics,
    created: u64,
    /// The vocabulary's trie for structured output, built at the first request asking for it.
    vocab: Mutex<Option<Arc<Vocab>>>,
    /// What the last finished generation cost (`/mesh`).
    last: Mutex<Option<LastGeneration>>,
    /// The hops' last `/health` answers and when they were asked (`/mesh` reuses them for
    /// [`PROBE_REUSE`], so pages polling it do not multiply the stations' work).
    probes: tokio::sync::Mutex<Option<(Instant, Arc<Vec<HopProbe>>)>>,
}

/// How long `/mesh` reuses the hops' health answers.
const PROBE_REUSE: Duration = Duration::from_secs(1);

/// Runs the gateway until Ctrl-C.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.max_concurrent == 0 {
        anyhow::bail!("--max-concurrent must be at least 1");
    }
    args.lookup.params().map_err(anyhow::Error::msg)?;
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
    let fim = match backend.tok {
        Some(_) => backend
            .fim_tokens()
            .context("looking up the fill-in-the-middle tokens")?,
        None => None,
    };
    let pool = (0..args.max_concurrent)
        .map(|i| KvSession::with_id(format!("gw-{}-{i}", std::process::id())))
        .collect();
    let state = Arc::new(AppState {
        gate: Arc::new(Semaphore::new(args.max_concurrent)),
        pool: Mutex::new(pool),
        metrics: Metrics::default(),
        created: now_s(),
        vocab: Mutex::new(None),
        last: Mutex::new(None),
        probes: tokio::sync::Mutex::new(None),
        template,
        fim,
        served_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| served_name(&backend.model_id)),
        api_key: args
            .api_key
            .clone()
            .or_else(|| std::env::var("MOONSHINE_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        backend,
        args,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let at = state.args.listen_addr();
        let listener = TcpListener::bind(at)
            .await
            .with_context(|| format!("binding {at}"))?;
        let addr = listener.local_addr().context("local address")?;
        println!(
            "moonshine serve: listening on http://{addr} (model {}, {} hop(s))",
            state.served_name,
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
/// [`http_frame::conn::serve_connections`]).
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
                    http_frame::heap::return_free_heap();
                }
            }
        })
    };
    http_frame::conn::serve_connections(listener, state, handle, shutdown).await;
    trimmer.abort();
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;
type Resp = Response<Body>;

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
    let origin = allowed_origin(&st.args.allowed_origins, &req);
    let answer = if method == Method::OPTIONS {
        Ok(preflight(&req))
    } else if let Err(e) = authorize(&st, &req, &path) {
        Err(e)
    } else {
        route(&st, req).await
    };
    let mut r = match answer {
        Ok(r) => r,
        Err(e) => {
            info!("{method} {path} -> {} {}", e.status.as_u16(), e.message);
            dialect::error_for(&path, &e)
        }
    };
    if let Some(o) = origin {
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", o);
        h.append("vary", HeaderValue::from_static("origin"));
    }
    // No answer is to be read as another type than it says (an error echoing a path, say).
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    st.metrics.request(
        if API_ROUTES.contains(&path.as_str())
            || llama_server::ROUTES.contains(&path.as_str())
            || web::asset(&path).is_some()
        {
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

/// One hop's answer to its own `/health`, against the blocks the chain gives it.
struct HopProbe {
    url: String,
    /// `a-b`.
    layers: String,
    health: Option<station_wire::wire::Health>,
    /// Why the hop cannot serve its part (`None`: fine).
    problem: Option<String>,
}

/// Asks every hop for its own `/health` (`timeout` each; station calls: blocking pool).
async fn probe_hops(st: &Arc<AppState>, timeout: Duration) -> Result<Vec<HopProbe>, ApiError> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || {
        st.backend
            .chain
            .hops()
            .iter()
            .map(|(c, r)| {
                let probe = station_wire::client::StationClient::new(c.url(), timeout);
                let (health, problem) = match probe.health() {
                    Ok(h) => {
                        let p = crate::generate::hop_problem(c.url(), *r, &h);
                        (Some(h), p)
                    }
                    Err(e) => (None, Some(format!("{} is down: {e}", c.url()))),
                };
                HopProbe {
                    url: c.url().to_string(),
                    layers: format!("{}-{}", r.start, r.end),
                    health,
                    problem,
                }
            })
            .collect()
    })
    .await
    .map_err(|e| internal(format!("health task: {e}")))
}

/// `GET /health`: asks every hop for its own `/health` (2 s each) and answers 200
/// `{"status": "ok"}` only when each serves its blocks; else 503 naming the first hop down.
async fn health(st: &Arc<AppState>) -> Result<Resp, ApiError> {
    let hops = probe_hops(st, Duration::from_secs(2)).await?;
    let list: Vec<Value> = hops
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({"hop": i, "url": h.url, "layers": h.layers, "status": if h.problem.is_some() { "down" } else { "ok" }, "error": h.problem})
        })
        .collect();
    let down = hops.iter().enumerate().find_map(|(i, h)| {
        h.problem
            .as_ref()
            .map(|p| format!("hop {i} (layers {}): {p}", h.layers))
    });
    Ok(match down {
        None => json_resp(
            StatusCode::OK,
            &json!({"status": "ok", "model": st.served_name, "hops": list}),
        ),
        Some(why) => json_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unavailable", "model": st.served_name, "hops": list,
                "error": {"message": why, "type": "unavailable_error", "code": 503}}),
        ),
    })
}

/// `GET /mesh` (the web page's mesh view): the chain, each hop's health (its `/health`,
/// 1 s each, answers reused for [`PROBE_REUSE`]) and compute per token in the last
/// generation, and the gateway's tokens/s. Always 200: a hop down is part of the view.
async fn mesh(st: &Arc<AppState>) -> Result<Resp, ApiError> {
    let probes = {
        // Held across the probe: concurrent polls wait for one probe instead of each
        // sending their own.
        let mut slot = st.probes.lock().await;
        match slot.as_ref() {
            Some((at, p)) if at.elapsed() < PROBE_REUSE => p.clone(),
            _ => {
                let p = Arc::new(probe_hops(st, Duration::from_secs(1)).await?);
                *slot = Some((Instant::now(), p.clone()));
                p
            }
        }
    };
    let last = st.last.lock().ok().and_then(|l| l.clone());
    let hops = probes
        .iter()
        .enumerate()
        .map(|(i, p)| HopView {
            hop: i,
            url: p.url.clone(),
            layers: p.layers.clone(),
            status: if p.problem.is_some() { "down" } else { "ok" },
            error: p.problem.clone(),
            role: p.health.as_ref().map(|h| h.role.clone()),
            sessions: p.health.as_ref().map(|h| h.sessions),
            ms_per_token: last.as_ref().and_then(|l| l.hop_ms.get(i).copied()),
        })
        .collect();
    let view = MeshView {
        model: st.served_name.clone(),
        chains: vec![ChainView { hops }],
        tokens_per_s: last.as_ref().and_then(|l| l.tokens_per_s),
        generations_active: st.metrics.active.load(Ordering::Relaxed),
        completion_tokens_total: st.metrics.completion_tokens.load(Ordering::Relaxed),
        last,
    };
    let body = serde_json::to_value(&view).map_err(|e| internal(format!("mesh view: {e}")))?;
    Ok(json_resp(StatusCode::OK, &body))
}

/// `POST /render` `{"text"}`: the page's Markdown as a tree of whitelisted elements
/// ([`web::markdown`]), `{"nodes": [...]}`.
async fn render(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    #[derive(serde::Deserialize)]
    struct Body {
        text: String,
    }
    let body = read_body(st, req).await?;
    let b: Body = serde_json::from_slice(&body).map_err(|e| bad(Some("text"), e.to_string()))?;
    // Highlighting is regex work: off the reactor.
    let nodes = tokio::task::spawn_blocking(move || web::markdown::render(&b.text))
        .await
        .map_err(|e| internal(format!("rendering: {e}")))?;
    Ok(json_resp(StatusCode::OK, &json!({ "nodes": nodes })))
}

/// A page file with its headers ([`web::asset_headers`]).
fn page(a: &'static web::Asset) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from_static(a.body.as_bytes())).boxed());
    web::asset_headers(r.headers_mut(), a);
    r
}

/// The API's routes (for 405 and the request metrics' labels); the page's are [`web`]'s.
const API_ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/infill",
    "/v1/models",
    // Without `/v1`, as llama-server and clients given a base URL without it call them.
    "/chat/completions",
    "/completions",
    "/models",
    "/metrics",
    "/health",
    "/mesh",
    "/render",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/chat",
    "/api/generate",
    "/api/tags",
    "/api/show",
    "/api/version",
    "/api/embed",
    "/v1/responses",
    "/v1/embeddings",
];

async fn route(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    if req.method() == Method::GET {
        if let Some(a) = web::asset(req.uri().path()) {
            return Ok(page(a));
        }
    }
    let req = match llama_server::route(st, req).await {
        Ok(answer) => return answer,
        Err(req) => req,
    };
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions" | "/chat/completions") => {
            completion(st, req, Route::Chat).await
        }
        (&Method::POST, "/v1/completions" | "/completions") => {
            completion(st, req, Route::Completions).await
        }
        (&Method::POST, "/infill") => completion(st, req, Route::Infill).await,
        // The other APIs clients speak: translations at the edge (serve::dialect).
        (&Method::POST, "/v1/messages") => anthropic::messages(st, req).await,
        (&Method::POST, "/v1/messages/count_tokens") => anthropic::count_tokens(st, req).await,
        (&Method::POST, "/v1/embeddings" | "/embeddings") => embeddings::embeddings(st, req).await,
        (&Method::POST, "/v1/responses" | "/responses") => responses::responses(st, req).await,
        (&Method::POST, "/api/chat") => ollama::chat(st, req).await,
        (&Method::POST, "/api/generate") => ollama::generate_route(st, req).await,
        (&Method::GET, "/api/tags") => Ok(ollama::tags(st)),
        (&Method::POST, "/api/embed") => embeddings::ollama_embed(st, req).await,
        (&Method::POST, "/api/show") => ollama::show(st, req).await,
        (&Method::GET | &Method::HEAD, "/api/version") => Ok(ollama::version()),
        (&Method::GET, "/v1/models" | "/models") => Ok(json_resp(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": st.served_name, "object": "model", "created": st.created, "owned_by": "aeon-shell"}]}),
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
        (&Method::GET, "/health") => health(st).await,
        (&Method::GET, "/mesh") => mesh(st).await,
        (&Method::POST, "/render") => render(st, req).await,
        (_, p)
            if API_ROUTES.contains(&p)
                || llama_server::ROUTES.contains(&p)
                || web::asset(p).is_some() =>
        {
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

async fn read_body(st: &AppState, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    use http_frame::conn::{self, BodyError};
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_served_name_is_a_slug_without_the_source_format() {
        assert_eq!(
            served_name("Qwen2.5 Coder 0.5B Instruct AWQ"),
            "qwen2.5-coder-0.5b-instruct"
        );
        assert_eq!(served_name("qwen-2hop"), "qwen-2hop");
        assert_eq!(
            served_name("SmolLM2 135M Instruct"),
            "smollm2-135m-instruct"
        );
        assert_eq!(served_name("awq"), "awq");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"key-1", b"key-1"));
        assert!(!same_secret(b"key-1", b"key-2"));
        assert!(!same_secret(b"key", b"key-1"));
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
        // Histograms: cumulative buckets, +Inf = count.
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        m.latency.observe(t0, &[ms(30), ms(100), ms(400)]);
        let s = m.render(4);
        for line in [
            "moonshine_time_to_first_token_seconds_bucket{le=\"0.025\"} 0\n",
            "moonshine_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n",
            "moonshine_inter_token_latency_seconds_bucket{le=\"0.075\"} 1\n",
            "moonshine_inter_token_latency_seconds_bucket{le=\"0.2\"} 1\n",
            "moonshine_inter_token_latency_seconds_bucket{le=\"0.4\"} 2\n",
            "moonshine_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2\n",
            "moonshine_inter_token_latency_seconds_count 2\n",
            "moonshine_inter_token_latency_seconds_sum 0.370000\n",
            "# TYPE moonshine_requests_running gauge\n",
        ] {
            assert!(s.contains(line), "{line}: {s}");
        }
        // No gauge ends in _total.
        for l in s
            .lines()
            .filter(|l| l.starts_with("# TYPE") && l.ends_with(" gauge"))
        {
            assert!(!l.contains("_total "), "{l}");
        }
    }
}
