//! `moonshine serve`: an OpenAI-compatible gateway over a chain of stations.
//!
//! Routes: `POST /v1/chat/completions` (SSE when `stream: true`), `GET /v1/models`,
//! `GET /metrics` (Prometheus text), `GET /health`, `GET /mesh` (the chain for the web page)
//! and the web page itself (`GET /`, [`crate::web`]). Contract: `specs/openai-api.md`.
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

use fat_station::station::metrics::Histogram;

use crate::api::{self, bad, Answer, ApiError, Job, Limits, PromptSpec, Route};
use crate::chat::{ChatTemplate, TemplateError};
use crate::generate::{
    Backend, FimTokens, Finish, GenError, GenRequest, Generation, KvSession, Timing,
};
use crate::structured::{Grammar, GrammarError, Vocab};
use crate::target::TargetArgs;
use crate::web::{self, ChainView, HopView, LastGeneration, MeshView};

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
    #[arg(long)]
    pub served_model_name: Option<String>,
    #[command(flatten)]
    pub lookup: crate::lookup::LookupArgs,
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

/// Time to first token, seconds (vLLM's buckets from 10 ms to a minute).
const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
/// Time between two generated tokens, seconds.
const ITL_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// A whole request, seconds.
const E2E_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
];

/// The latency histograms (names after vLLM's `time_to_first_token_seconds`,
/// `inter_token_latency_seconds`, `e2e_request_latency_seconds`).
pub struct Latency {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
}

impl Latency {
    /// One finished generation: the request arrived at `t0`, its tokens were sampled at
    /// `times`.
    fn observe(&self, t0: Instant, times: &[Instant]) {
        if let Some(first) = times.first() {
            self.ttft.observe(first.duration_since(t0).as_secs_f64());
        }
        for w in times.windows(2) {
            self.itl.observe(w[1].duration_since(w[0]).as_secs_f64());
        }
        self.e2e.observe(t0.elapsed().as_secs_f64());
    }
}

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            e2e: Histogram::new(E2E_BOUNDS),
        }
    }
}

/// Prometheus counters, gauges and histograms of the gateway.
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
    /// Requests whose chat template ran past its budget (fuel, recursion, output size).
    template_budget: AtomicU64,
    latency: Latency,
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
            "moonshine_sessions",
            "gauge",
            "Station KV session ids in the pool.",
            one(sessions_total.to_string()),
        );
        metric(
            "moonshine_requests_running",
            "gauge",
            "Requests generating now (vLLM's num_requests_running, llama-server's requests_processing).",
            one(self.active.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "moonshine_requests_waiting",
            "gauge",
            "Requests queued for a slot (vLLM's num_requests_waiting, llama-server's requests_deferred).",
            one(self.waiting.load(Ordering::Relaxed).to_string()),
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
            "moonshine_template_budget_exceeded_total",
            "counter",
            "Requests refused because the chat template ran past its budget (instructions, nesting or output size).",
            one(self.template_budget.load(Ordering::Relaxed).to_string()),
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
        let l = &self.latency;
        metric(
            "moonshine_time_to_first_token_seconds",
            "histogram",
            "From a request's arrival to its first generated token.",
            l.ttft.lines(""),
        );
        metric(
            "moonshine_inter_token_latency_seconds",
            "histogram",
            "Between two generated tokens of one request (one decode step through the chain).",
            l.itl.lines(""),
        );
        metric(
            "moonshine_e2e_request_latency_seconds",
            "histogram",
            "From a request's arrival to its last token.",
            l.e2e.lines(""),
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
        let listener = TcpListener::bind(state.args.listen)
            .await
            .with_context(|| format!("binding {}", state.args.listen))?;
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
        Ok(preflight())
    } else if let Err(e) = authorize(&st, &req, &path) {
        Err(e)
    } else {
        route(&st, req).await
    };
    let mut r = match answer {
        Ok(r) => r,
        Err(e) => {
            info!("{method} {path} -> {} {}", e.status.as_u16(), e.message);
            e.response()
        }
    };
    if let Some(o) = origin {
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", o);
        h.insert("vary", HeaderValue::from_static("origin"));
    }
    // No answer is to be read as another type than it says (an error echoing a path, say).
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    st.metrics.request(
        if API_ROUTES.contains(&path.as_str()) || web::asset(&path).is_some() {
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

/// The request's `Origin` when `--allowed-origins` lists it (or `*`): the value of
/// `Access-Control-Allow-Origin` for the answer.
fn allowed_origin<B>(allowed: &[String], req: &Request<B>) -> Option<HeaderValue> {
    let o = req.headers().get(hyper::header::ORIGIN)?;
    let s = o.to_str().ok()?;
    allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/') == s)
        .then(|| o.clone())
}

/// A CORS preflight (`OPTIONS`): which methods and headers a browser may use; the
/// allow-origin header is added by [`handle`] for an allowed origin only. No key is asked
/// (browsers send none on a preflight).
fn preflight() -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = StatusCode::NO_CONTENT;
    let h = r.headers_mut();
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("authorization, content-type"),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("600"));
    r
}

/// With `--api-key`, every route but `/health` and the web page's files needs
/// `Authorization: Bearer KEY`; else 401 in OpenAI's shape (`invalid_api_key`). The page's
/// files are public constants (a browser sends no key when it opens a page); the page sends
/// the key on its calls to the API and `/mesh`.
fn authorize<B>(st: &AppState, req: &Request<B>, path: &str) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    if path == "/health" || (req.method() == Method::GET && web::asset(path).is_some()) {
        return Ok(());
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "invalid_request_error",
        code: Some("invalid_api_key"),
        param: None,
        message: match given {
            None => "no API key: send Authorization: Bearer KEY".into(),
            Some(_) => "incorrect API key".into(),
        },
    })
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One hop's answer to its own `/health`, against the blocks the chain gives it.
struct HopProbe {
    url: String,
    /// `a-b`.
    layers: String,
    health: Option<fat_station::wire::Health>,
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
                let probe = fat_station::client::StationClient::new(c.url(), timeout);
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
    "/metrics",
    "/health",
    "/mesh",
];

async fn route(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    if req.method() == Method::GET {
        if let Some(a) = web::asset(req.uri().path()) {
            return Ok(page(a));
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => completion(st, req, Route::Chat).await,
        (&Method::POST, "/v1/completions") => completion(st, req, Route::Completions).await,
        (&Method::POST, "/infill") => completion(st, req, Route::Infill).await,
        (&Method::GET, "/v1/models") => Ok(json_resp(
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
        (_, p) if API_ROUTES.contains(&p) || web::asset(p).is_some() => Err(ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "invalid_request_error",
            code: Some("method_not_allowed"),
            param: None,
            message: format!("{} is not allowed on {p}", req.method()),
        }),
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
}

/// The `param` a route's prompt problems name.
fn prompt_param(route: Route) -> &'static str {
    match route {
        Route::Chat => "messages",
        Route::Completions => "prompt",
        Route::Infill => "input_prefix",
    }
}

/// A generation error as the API answers it; prompt problems name `param`.
fn api_error(e: GenError, param: &'static str) -> ApiError {
    match e {
        GenError::Template(TemplateError::Budget(_)) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            code: Some("template_budget_exceeded"),
            param: None,
            message: e.to_string(),
        },
        GenError::PromptTooLong { .. } => ApiError {
            code: Some("context_length_exceeded"),
            ..bad(Some(param), e.to_string())
        },
        GenError::Template(_) | GenError::EmptyPrompt => bad(Some(param), e.to_string()),
        GenError::ContextFull { .. } => ApiError {
            code: Some("context_length_exceeded"),
            ..bad(Some(param), e.to_string())
        },
        GenError::Station(fat_station::client::ClientError::Refused {
            status: 400 | 413, ..
        }) => bad(Some(param), e.to_string()),
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

/// Checks what a job needs from the model before admission: a chat template for chat, the
/// fill-in-the-middle tokens for a suffix, a tokenizer for text.
fn check_model(st: &AppState, route: Route, job: &Job) -> Result<(), ApiError> {
    match &job.prompt {
        PromptSpec::Ids(_) => Ok(()),
        _ if st.backend.tok.is_none() => Err(api_error(GenError::NoTokenizer, "")),
        PromptSpec::Chat(_) if st.template.is_none() => Err(api_error(GenError::NoTokenizer, "")),
        PromptSpec::Fim { .. } if st.fim.is_none() => {
            let param = if route == Route::Infill {
                "input_suffix"
            } else {
                "suffix"
            };
            Err(bad(
                Some(param),
                format!(
                    "{param}: model {} has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>)",
                    st.backend.model_id
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The grammar for a job's `format`: the vocabulary's trie is fetched and built once.
fn grammar(st: &AppState, schema: &Value) -> Result<Grammar, GenError> {
    // The schema's bounds first: a refused schema costs no vocabulary fetch.
    crate::structured::check_schema(schema)?;
    let mut slot = st
        .vocab
        .lock()
        .map_err(|_| GrammarError::Vocab("a request building it failed".into()))?;
    let vocab = match slot.as_ref() {
        Some(v) => v.clone(),
        None => {
            let t = Instant::now();
            let v = Arc::new(st.backend.vocab()?);
            info!(
                tokens = v.len(),
                ms = t.elapsed().as_millis() as u64,
                "vocabulary trie for structured output built"
            );
            *slot = Some(v.clone());
            v
        }
    };
    drop(slot);
    Ok(vocab.grammar(schema)?)
}

/// A job's prompt ids, its text for `echo`, and the grammar of its format.
type Prompted = (Vec<u32>, Option<String>, Option<Grammar>);

/// The prompt's ids, for `echo` its text, and the grammar of its `format` (station calls:
/// run on the blocking pool).
fn prompt_tokens(st: &AppState, job: &Job) -> Result<Prompted, GenError> {
    let grammar = match &job.format {
        Some((_, schema)) => Some(grammar(st, schema)?),
        None => None,
    };
    let b = &st.backend;
    let ids = match &job.prompt {
        PromptSpec::Chat(m) => {
            let template = st.template.as_ref().ok_or(GenError::NoTokenizer)?;
            let tools = job.tools.as_ref();
            let mut ids = b.chat_tokens_with_tools(template, m, tools.map(|t| &t.list))?;
            if tools.is_some_and(|t| t.forced) {
                // A forced call: the answer starts inside the call block, under its schema.
                let open = format!("{}\n", crate::tools::OPEN);
                ids.extend(
                    b.tokenizer()?
                        .tokenize_parts(&[(&open, true)], Some(false))?,
                );
            }
            ids
        }
        PromptSpec::Text(t) => b.tokenize(t, None)?,
        PromptSpec::Ids(ids) => ids.clone(),
        PromptSpec::Fim {
            prefix,
            suffix,
            middle,
        } => b.fim_prompt(st.fim.ok_or(GenError::NoTokenizer)?, prefix, suffix, middle)?,
    };
    let echo = match (&job.prompt, job.echo) {
        (_, false) => None,
        (PromptSpec::Text(t), true) => Some(t.clone()),
        (_, true) => Some(b.detokenize(&ids)?),
    };
    Ok((ids, echo, grammar))
}

/// `POST /v1/chat/completions`, `/v1/completions`, `/infill`: parse, check, admit,
/// tokenize, generate on the blocking pool, answer whole or as server-sent events.
async fn completion(
    st: &Arc<AppState>,
    req: Request<Incoming>,
    route: Route,
) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let body = read_body(st, req).await?;
    let limits = Limits {
        default_max_tokens: st.args.default_max_tokens,
        max_tokens_limit: st.args.max_tokens_limit,
        vocab: st.backend.info.as_ref().map(|i| i.vocab),
    };
    let job = api::parse(route, &body, &limits)?;
    check_model(st, route, &job)?;
    let pparam = prompt_param(route);

    // Admission before any station call; the slot is held from here on (RAII).
    let permit = admit(st).await?;
    let queue_ms = t0.elapsed().as_secs_f64() * 1e3;

    // Render and tokenize (station calls: blocking pool). The slot goes with the work: a
    // client that leaves does not free it while its template or schema is still running.
    let st2 = st.clone();
    let job2 = job.clone();
    let fparam = job.format.as_ref().map_or(pparam, |f| f.0);
    let (prompted, permit) = tokio::task::spawn_blocking(move || {
        let out = prompt_tokens(&st2, &job2);
        // Counted here: the client may be gone by the time the handler would see it.
        if let Err(GenError::Template(TemplateError::Budget(_))) = &out {
            st2.metrics.template_budget.fetch_add(1, Ordering::Relaxed);
        }
        (out, permit)
    })
    .await
    .map_err(|e| internal(format!("tokenize task: {e}")))?;
    let (prompt, echo, grammar) = prompted.map_err(|e| match e {
        GenError::Grammar(GrammarError::Schema(why)) => bad(
            Some(fparam),
            format!("{fparam}: the schema is not supported: {why}"),
        ),
        e => api_error(e, pparam),
    })?;
    let tokenize_ms = t0.elapsed().as_secs_f64() * 1e3 - queue_ms;
    // A prompt past the stations' context is refused before any of it is computed.
    st.backend
        .check_context(prompt.len())
        .map_err(|e| api_error(e, pparam))?;
    let lease = Lease::new(st, permit, &prompt)?;

    let id = format!(
        "{}{:x}{:x}",
        Answer::id_prefix(route),
        now_s(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let created = now_s();
    let model = st.served_name.clone();
    let gen = GenRequest {
        prompt,
        max_tokens: job.max_tokens,
        sampling: job.sampling.clone(),
        stops: job.stops.clone(),
        logprobs: job.logprobs,
        lookup: st.args.lookup.params().ok().flatten(),
        grammar,
    };
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Started, ApiError>>();
    let cancel = Arc::new(AtomicBool::new(false));
    let cancel_guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = job.stream;
    let include_usage = job.include_usage;
    let want_logprobs = job.logprobs.is_some();
    let tools = job.tools.clone();
    let st3 = st.clone();
    let id2 = id.clone();
    let gen_task = tokio::task::spawn_blocking(move || -> Result<(Value, Timing), ApiError> {
        let mut lease = lease;
        let st = st3;
        let t = Instant::now();
        let is_cancelled = || cancel.load(Ordering::Relaxed);
        let text_of = |tok: u32| st.backend.token_text(tok).unwrap_or_default();
        let mut answer = Answer::new(
            route,
            id2.clone(),
            created,
            model,
            echo,
            want_logprobs,
            &text_of,
        );
        if let Some(t) = &tools {
            answer = answer.with_tools(t);
        }
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
                let _ = ready_tx.send(Err(api_error(e, pparam)));
                return Err(internal("prefill failed".into()));
            }
        };
        let prefill_timing = g.timing().clone();
        let _ = ready_tx.send(Ok(Started {
            timing: prefill_timing.clone(),
        }));
        let gone = stream
            && answer
                .first_chunk()
                .is_some_and(|c| tx.blocking_send(sse(&c)).is_err());
        let mut sent_lps = 0;
        let out = g.run_with_logprobs(|text, lps| {
            sent_lps += lps.len();
            !gone
                && !is_cancelled()
                && (!stream
                    || tx
                        .blocking_send(sse(&answer.chunk(text, lps, None)))
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
                return Err(api_error(e, pparam));
            }
        };
        let completion = o.completion_tokens(&st.backend);
        lease.tokens = completion;
        if gen.grammar.is_some() {
            let per = o.mask_s * 1e3 / o.tokens.len().max(1) as f64;
            info!(id = %id2, tokens = o.tokens.len(), mask_ms_per_token = format!("{per:.3}"), decode_s = format!("{:.2}", o.decode_s), "constrained decoding");
        }
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
        st.metrics.latency.observe(t0, &o.token_times);
        if let Ok(mut l) = st.last.lock() {
            *l = Some(LastGeneration::new(
                &prefill_timing,
                &o.timing,
                o.tokens.len(),
                o.decode_s,
                now_s(),
            ));
        }
        let reason = match o.finish {
            Finish::Cancelled => {
                lease.finish = "cancelled";
                st.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                info!(id = %id2, tokens = completion, "client went away: generation cancelled");
                return Ok((Value::Null, o.timing));
            }
            Finish::Stop => "stop",
            Finish::Length => "length",
        };
        lease.finish = reason;
        let usage = json!({"prompt_tokens": o.prompt_tokens, "completion_tokens": completion, "total_tokens": o.prompt_tokens + completion});
        if stream {
            // The last chunk carries the logprobs of tokens that added no text (a stop
            // string's), so the streamed logprobs are the whole answer's.
            let rest = &o.logprobs[sent_lps.min(o.logprobs.len())..];
            let mut done = answer
                .last_chunks(&o.text, rest, reason)
                .iter()
                .all(|c| tx.blocking_send(sse(c)).is_ok());
            if done && include_usage {
                done = tx.blocking_send(sse(&answer.usage_chunk(&usage))).is_ok();
            }
            if done {
                let _ = tx.blocking_send(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            return Ok((Value::Null, o.timing));
        }
        let stop_type = match (o.finish, o.tokens.last()) {
            (Finish::Length, _) => "limit",
            (_, Some(&t)) if st.backend.is_eog(t) => "eos",
            _ => "word",
        };
        Ok((
            answer.whole(&o.text, &o.logprobs, reason, stop_type, &usage),
            o.timing,
        ))
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
    let (body, timing) = gen_task
        .await
        .map_err(|e| internal(format!("generation task: {e}")))??;
    let mut r = json_resp(StatusCode::OK, &body);
    let hv = format!(
        "{}, total;dur={:.1}",
        timing_header(&timing),
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
