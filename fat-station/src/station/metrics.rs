//! The station's own `GET /metrics` (the text format is `http_frame::prometheus`).
//!
//! The station's names follow llama-server's and vLLM's where they mean the same thing:
//! `fat_station_requests_running` / `_waiting` (vLLM `num_requests_running` /
//! `num_requests_waiting`, llama-server `requests_processing` / `requests_deferred`: compute
//! requests holding a permit / waiting for one), `fat_station_kv_cache_usage_ratio`
//! (llama-server `kv_cache_usage_ratio`, vLLM `kv_cache_usage_perc`, here KV bytes over
//! `--max-session-bytes`), `fat_station_kv_cache_tokens` (llama-server `kv_cache_tokens`).
//! Gauges never end in `_total`; counters always do; durations are seconds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use http_frame::prometheus::{Exposition, Histogram};

/// Compute time of one request, seconds (a decode step of a 0.5B model is ~10-50 ms, a
/// 128-token prefill chunk a second or two on two cores).
const COMPUTE_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Waiting for a compute permit, seconds.
const QUEUE_BOUNDS: &[f64] = &[0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

/// The station's counters and histograms (gauges are read from the state when rendered).
pub struct StationMetrics {
    /// (route, status) -> requests answered.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Compute requests holding a permit now.
    pub(crate) running: AtomicUsize,
    /// Compute requests waiting for a permit now.
    pub(crate) waiting: AtomicUsize,
    /// Token rows through `/embed` (prompt and decode tokens entering the model).
    pub(crate) tokens: AtomicU64,
    /// Sessions evicted (idle timeout, LRU beyond the session or byte limits).
    pub(crate) evicted: AtomicU64,
    /// Rows (positions) `POST /chain` ran through this node's layers: prompts, decode steps
    /// and the replays after a rewind or a failover.
    pub(crate) chain_rows: AtomicU64,
    /// Session states taken from a peer (`POST /checkpoint`).
    pub(crate) checkpoints_in: AtomicU64,
    /// Engine time per compute request.
    pub(crate) compute: Histogram,
    /// Time waiting for a compute permit.
    pub(crate) queue: Histogram,
    /// Answers refused because the response budget was spent.
    pub(crate) responses_refused: AtomicU64,
}

impl Default for StationMetrics {
    fn default() -> Self {
        StationMetrics {
            requests: Mutex::new(BTreeMap::new()),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            tokens: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            chain_rows: AtomicU64::new(0),
            checkpoints_in: AtomicU64::new(0),
            compute: Histogram::new(COMPUTE_BOUNDS),
            queue: Histogram::new(QUEUE_BOUNDS),
            responses_refused: AtomicU64::new(0),
        }
    }
}

/// The routes counted by name; any other path is `other` (no label per stray path).
const ROUTES: &[&str] = &[
    "/health",
    "/metrics",
    "/tokenizer",
    "/vocab",
    "/embed",
    "/forward",
    "/lm-head",
    "/tokenize",
    "/detokenize",
    "/chain",
    "/checkpoint",
];

/// What the station's state says at render time.
pub struct Gauges {
    pub sessions: usize,
    pub max_sessions: usize,
    pub kv_bytes: usize,
    pub max_kv_bytes: usize,
    pub kv_tokens: usize,
    pub uptime_s: f64,
    /// Response bytes held for clients that have not read them yet.
    pub response_bytes: usize,
    /// `--max-response-memory`.
    pub max_response_bytes: usize,
}

impl StationMetrics {
    /// Counts one answered request.
    pub fn request(&self, path: &str, status: u16) {
        let route = ROUTES
            .iter()
            .find(|&&r| r == path)
            .copied()
            .unwrap_or("other");
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route, status)).or_default() += 1;
        }
    }

    /// Prometheus text for `/metrics`.
    pub fn render(&self, g: &Gauges) -> String {
        let mut e = Exposition::default();
        let reqs = self
            .requests
            .lock()
            .map(|m| {
                m.iter()
                    .map(|((r, c), n)| (format!("{{route=\"{r}\",code=\"{c}\"}}"), n.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        e.family(
            "fat_station_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
            reqs,
        );
        let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        e.one(
            "fat_station_requests_running",
            "gauge",
            "Compute requests running now (vLLM num_requests_running, llama-server requests_processing).",
            n(&self.running),
        );
        e.one(
            "fat_station_requests_waiting",
            "gauge",
            "Compute requests waiting for a permit (vLLM num_requests_waiting, llama-server requests_deferred).",
            n(&self.waiting),
        );
        e.one(
            "fat_station_sessions",
            "gauge",
            "Live KV sessions.",
            g.sessions,
        );
        e.one(
            "fat_station_sessions_max",
            "gauge",
            "Most live KV sessions (--max-sessions).",
            g.max_sessions,
        );
        e.one(
            "fat_station_kv_cache_bytes",
            "gauge",
            "KV-cache bytes the live sessions hold.",
            g.kv_bytes,
        );
        e.one(
            "fat_station_kv_cache_usage_ratio",
            "gauge",
            "KV-cache bytes over --max-session-bytes (llama-server kv_cache_usage_ratio).",
            format!("{:.6}", g.kv_bytes as f64 / g.max_kv_bytes.max(1) as f64),
        );
        e.one(
            "fat_station_kv_cache_tokens",
            "gauge",
            "Positions cached over all live sessions (llama-server kv_cache_tokens).",
            g.kv_tokens,
        );
        e.one(
            "fat_station_tokens_total",
            "counter",
            "Token rows embedded (prompt and decode tokens entering the model).",
            self.tokens.load(Ordering::Relaxed),
        );
        e.one(
            "fat_station_chain_rows_total",
            "counter",
            "Positions POST /chain ran through this node's layers (prompts, decode steps, replays).",
            self.chain_rows.load(Ordering::Relaxed),
        );
        e.one(
            "fat_station_checkpoints_received_total",
            "counter",
            "Session states a peer shipped here (POST /checkpoint) and this node took.",
            self.checkpoints_in.load(Ordering::Relaxed),
        );
        e.one(
            "fat_station_sessions_evicted_total",
            "counter",
            "Sessions dropped by the idle timeout or the session and byte limits.",
            self.evicted.load(Ordering::Relaxed),
        );
        e.family(
            "fat_station_compute_seconds",
            "histogram",
            "Engine time of one compute request (embed, forward, lm-head, tokenizer calls).",
            self.compute.lines(""),
        );
        e.family(
            "fat_station_queue_seconds",
            "histogram",
            "Time a compute request waited for a permit (--max-compute).",
            self.queue.lines(""),
        );
        e.one(
            "fat_station_response_bytes",
            "gauge",
            "Response bytes held for clients that have not read them yet.",
            g.response_bytes,
        );
        e.one(
            "fat_station_response_bytes_max",
            "gauge",
            "Most response bytes held at once (--max-response-memory).",
            g.max_response_bytes,
        );
        e.one(
            "fat_station_responses_refused_total",
            "counter",
            "Answers refused (503 responses_busy) because the response budget was spent.",
            self.responses_refused.load(Ordering::Relaxed),
        );
        e.one(
            "fat_station_uptime_seconds",
            "gauge",
            "Seconds since the station started.",
            format!("{:.3}", g.uptime_s),
        );
        e.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn station_metrics_render_with_gauges_not_named_total() {
        let m = StationMetrics::default();
        m.request("/embed", 200);
        m.request("/no/such/path", 404);
        m.compute.observe(0.02);
        let g = Gauges {
            sessions: 2,
            max_sessions: 64,
            kv_bytes: 512,
            max_kv_bytes: 1024,
            kv_tokens: 30,
            uptime_s: 1.0,
            response_bytes: 0,
            max_response_bytes: 1 << 20,
        };
        let s = m.render(&g);
        for line in [
            "fat_station_requests_total{route=\"/embed\",code=\"200\"} 1\n",
            "fat_station_requests_total{route=\"other\",code=\"404\"} 1\n",
            "fat_station_kv_cache_usage_ratio 0.500000\n",
            "fat_station_sessions 2\n",
            "fat_station_compute_seconds_bucket{le=\"0.025\"} 1\n",
            "fat_station_compute_seconds_count 1\n",
        ] {
            assert!(s.contains(line), "{line}: {s}");
        }
        for l in s
            .lines()
            .filter(|l| l.starts_with("# TYPE") && l.ends_with(" gauge"))
        {
            assert!(!l.contains("_total "), "{l}");
        }
    }
}
