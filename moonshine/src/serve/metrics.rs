//! The gateway's Prometheus metrics: request counts, tokens, per-hop compute, latency histograms.

use super::*;

/// Time to first token, seconds (vLLM's buckets from 10 ms to a minute).
pub(super) const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];
/// Time between two generated tokens, seconds.
pub(super) const ITL_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// A whole request, seconds.
pub(super) const E2E_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
];

/// The latency histograms (names after vLLM's `time_to_first_token_seconds`,
/// `inter_token_latency_seconds`, `e2e_request_latency_seconds`).
pub struct Latency {
    pub(super) ttft: Histogram,
    pub(super) itl: Histogram,
    pub(super) e2e: Histogram,
}

impl Latency {
    /// One finished generation: the request arrived at `t0`, its tokens were sampled at
    /// `times`.
    pub(super) fn observe(&self, t0: Instant, times: &[Instant]) {
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
    pub(super) requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub(super) active: AtomicUsize,
    pub(super) waiting: AtomicUsize,
    pub(super) rejected: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) prompt_tokens_reused: AtomicU64,
    pub(super) prefill_tokens: AtomicU64,
    pub(super) completion_tokens: AtomicU64,
    /// Station compute, microseconds, summed over hops.
    pub(super) compute_us: AtomicU64,
    /// (hop index, url, layers) -> compute microseconds.
    pub(super) hop_us: Mutex<BTreeMap<(usize, String, String), u64>>,
    pub(super) generation_us: AtomicU64,
    /// Requests whose chat template ran past its budget (fuel, recursion, output size).
    pub(super) template_budget: AtomicU64,
    pub(super) latency: Latency,
}

impl Metrics {
    pub(super) fn request(&self, route: &str, status: StatusCode) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), status.as_u16())).or_default() += 1;
        }
    }

    pub(super) fn timing(&self, t: &Timing) {
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
        let mut e = Exposition::default();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, String)>| {
            e.family(name, kind, help, lines)
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
        e.finish()
    }
}
