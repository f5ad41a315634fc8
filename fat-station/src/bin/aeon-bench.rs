//! aeon-bench: the engine's prefill and decode speed on a real model next to the machine's
//! memory-bandwidth roofline, plus the station's hop cost, start-to-ready time and peak RSS.
//!
//! One run measures, on the same machine and in this order:
//! - streaming read bandwidth at each thread count (sum of u64 over a buffer far larger than
//!   the last-level cache, plain and touching each 4 KiB page 256 KiB ahead as the kernels do,
//!   best of several passes), measured right before and after every timed repetition so the
//!   roofline and the speed come from the same minutes of a shared machine;
//! - bytes of weights one decoded token reads (every block tensor + final norm + output
//!   head; the embedding row is negligible) and so the roofline tok/s = bandwidth / bytes;
//! - prefill tok/s (a `--prompt-len` prompt in one batch, fresh session, best of `--reps`) and
//!   decode tok/s (`--decode` greedy tokens after the prompt through the KV cache) at each
//!   thread count, each in its own rayon pool;
//! - a `fat-station` process on loopback: start-to-ready (spawn until `/health` answers,
//!   median of `--starts`) and the cost of one decode hop (round trip of `/forward` for one
//!   token minus the station's `X-Compute-Ms`, median of `--hops`);
//! - peak RSS (VmHWM) of this process and of the station.
//!
//! `scripts/bench.sh` runs it next to llama.cpp on the same GGUF and prints the ratios.
//!
//! Exit codes: 0 success, 2 bad arguments, a missing model or a failed measurement.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use fat_station::client::StationClient;
use fat_station::engine::kernels::{count_weight_bytes, kernels};
use fat_station::engine::ops::argmax;
use fat_station::engine::tokenizer::Tokenizer;
use fat_station::engine::Model;
use knot_format::{Knot, LayerRange};
use serde::Serialize;

/// Measure the engine against the memory roofline (and the station's overheads).
///
/// Prints a human summary, or with --json one JSON object (see `Report` in the source) that
/// scripts/bench.sh combines with llama.cpp's figures.
///
/// Exit codes: 0 success, 2 bad arguments, a missing model or a failed measurement.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// Model file (.knot). Default: qwen2.5-coder-0.5b-instruct-q4_k_m.knot in the model
    /// cache ($AEON_MODELS_DIR, else ~/.cache/aeon-shell/models).
    #[arg(long)]
    knot: Option<PathBuf>,
    /// Prompt length in tokens for the prefill measurement (a fixed English text, tokenized
    /// and repeated as needed; the ids are in the JSON so peers can use the same ones).
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Greedy tokens decoded after the prompt for the decode measurement.
    #[arg(long, default_value_t = 64)]
    decode: usize,
    /// Thread counts to measure, comma separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Timed repetitions of the prefill + decode measurement per thread count: the best
    /// prefill is reported, and the best decode against the bandwidth read around it.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Bandwidth buffer in MiB (keep it far above the last-level cache).
    #[arg(long, default_value_t = 1024)]
    bw_mib: usize,
    /// Passes of each read kind over the bandwidth buffer, before and after every timed
    /// repetition (the best is that repetition's bandwidth).
    #[arg(long, default_value_t = 3)]
    bw_reps: usize,
    /// Decode hops timed against the station (median reported).
    #[arg(long, default_value_t = 64)]
    hops: usize,
    /// Station starts timed for start-to-ready (median reported).
    #[arg(long, default_value_t = 5)]
    starts: usize,
    /// The fat-station binary. Default: next to this executable.
    #[arg(long)]
    station_bin: Option<PathBuf>,
    /// Skip the station measurements (hop cost, start-to-ready).
    #[arg(long)]
    no_station: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// deepseek2: cache MLA's latent rows (kv_lora_rank + rope floats per position, the
    /// absorbed form) instead of per-head keys and values (llama.cpp's layout, the default).
    #[arg(long)]
    mla_latent_cache: bool,
    #[command(flatten)]
    verbosity: aeon_cli::Verbosity,
}

/// Everything one run measured. Rates are tokens (or bytes) per second; times in ms.
#[derive(Serialize)]
struct Report {
    model: String,
    knot: String,
    kernels: String,
    prompt_tokens: Vec<u32>,
    decode_tokens: usize,
    /// Weight bytes one decoded token streams.
    bytes_per_token: u64,
    /// Weight bytes the matrix products read per decoded token, counted by the kernels
    /// (`kernels::count_weight_bytes`) over the greedy decode after the prompt: against
    /// `bytes_per_token`, reads beyond the arithmetic (none expected: a mixture of experts
    /// reads only its chosen experts). Norms and the embedding row are not counted.
    counted_bytes_per_token: f64,
    /// One entry per thread count.
    runs: Vec<Run>,
    station: Option<StationFigures>,
    /// VmHWM of this process, MiB (includes the mmapped weights it touched).
    peak_rss_mib: f64,
    /// The first prefill of the freshly loaded model at the first thread count, ms: it also
    /// pages the weights in and builds the interleaved copies the kernels use (one-time).
    first_prefill_ms: f64,
    /// 1-minute load average before and after the run (/proc/loadavg): above ~0.5 other
    /// processes shared the CPUs and the wall-clock rates are pessimistic.
    loadavg: [f64; 2],
}

/// One thread count's figures. The decode figures are those of the repetition with the best
/// decode, against the bandwidth measured around that repetition.
#[derive(Serialize)]
struct Run {
    threads: usize,
    /// Streaming read bandwidth, GB/s (1e9 bytes): the best pass right before or right after
    /// the best decode repetition.
    bandwidth_gbs: f64,
    /// bandwidth / bytes_per_token.
    roofline_tok_s: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// decode_tok_s / roofline_tok_s.
    decode_vs_roofline: f64,
    /// Decode tokens per CPU-second of this process (all threads, spinning included): on a
    /// machine shared with other work this shows the speed an idle machine would give.
    decode_tok_per_cpu_s: f64,
    /// Prefill tokens per CPU-second of this process.
    prefill_tok_per_cpu_s: f64,
    /// Greedy continuation (first 16 ids), so runs can be checked for identical output.
    greedy: Vec<u32>,
    /// Every timed repetition, in order.
    reps: Vec<Rep>,
}

/// One timed repetition at one thread count.
#[derive(Serialize, Clone, Copy)]
struct Rep {
    /// Best read bandwidth around this repetition, GB/s.
    bandwidth_gbs: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    decode_tok_per_cpu_s: f64,
    prefill_tok_per_cpu_s: f64,
}

#[derive(Serialize)]
struct StationFigures {
    /// Spawn until /health answers, median, ms.
    start_to_ready_ms: f64,
    /// Every start, ms.
    starts_ms: Vec<f64>,
    /// Median (round trip - X-Compute-Ms) of a one-token /forward 0-N hop, ms.
    hop_overhead_ms: f64,
    /// Median round trip of that hop, ms.
    hop_round_trip_ms: f64,
    /// Median X-Compute-Ms of that hop.
    hop_compute_ms: f64,
    /// Body bytes of one decode hop (one residual row, f32).
    hop_bytes: usize,
    /// The station's VmHWM after the hops, MiB.
    station_peak_rss_mib: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, args.verbosity);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aeon-bench: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn models_dir() -> PathBuf {
    match std::env::var_os("AEON_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/aeon-shell/models"),
    }
}

/// A fixed English text; its tokens (repeated as needed) are the benchmark prompt.
const PROMPT_TEXT: &str =
    "The capital of France is Paris. It sits on the Seine, in the north of the country, \
and has been the seat of French kings, emperors and presidents for most of a thousand years. \
Its museums hold paintings from every century, its cafes fill the pavements from morning to night, \
and its bridges link the islands of the old city to the wide boulevards of the new one.";

fn prompt_tokens(knot: &Knot, n: usize) -> Result<Vec<u32>> {
    let data = knot
        .tokenizer()
        .context("reading the tokenizer")?
        .context("the model file carries no tokenizer")?;
    let tok = Tokenizer::from_data(&data).context("building the tokenizer")?;
    let ids = tok.encode(PROMPT_TEXT, false);
    if ids.is_empty() {
        bail!("the tokenizer produced no tokens for the prompt text");
    }
    Ok(ids.iter().copied().cycle().take(n).collect())
}

/// Weight bytes a decoded token reads: all block tensors, the final norm and the output head;
/// of a mixture of experts' stacked experts (`*_exps`), the `k / E` a token runs.
fn bytes_per_token(knot: &Knot) -> u64 {
    let moe = knot.arch().moe.as_ref();
    let mut sum: u64 = knot
        .tensors()
        .filter(|t| t.name().starts_with("blk.") || t.name() == "output_norm.weight")
        .map(|t| match moe {
            Some(m) if t.name().contains("_exps.") => {
                t.bytes.len() as u64 * m.n_experts_used as u64 / m.n_experts as u64
            }
            _ => t.bytes.len() as u64,
        })
        .sum();
    // The head is `output.weight`, or the embedding when tied (then all of it is read too).
    let head = knot
        .tensor("output.weight")
        .or_else(|| knot.tensor("token_embd.weight"));
    sum += head.map(|t| t.bytes.len() as u64).unwrap_or(0);
    sum
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building a thread pool")
}

/// Sum of `buf`, wrapping; written so LLVM vectorizes it (integer adds, 8 accumulators).
#[inline(always)]
fn sum_u64(buf: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = buf.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &v| a.wrapping_add(v));
    acc.iter().fold(tail, |a, &v| a.wrapping_add(v))
}

/// u64 words in a 4 KiB page, and how far ahead [`sum_touching`] touches (256 KiB).
const PAGE_WORDS: usize = 512;
const TOUCH_AHEAD_WORDS: usize = 64 * PAGE_WORDS;

/// [`sum_u64`] page by page, first touching (prefetching) the page 256 KiB ahead. Why: on 4 KiB
/// pages the hardware prefetchers stop at each page edge and each page needs a TLB walk (slow
/// under a hypervisor); the engine's kernels touch pages ahead for that reason, so an honest
/// roofline reads the same way (on this VM: 27-33 GB/s against 20-22 for a plain AVX-512 read).
#[inline(always)]
fn sum_touching(buf: &[u64]) -> u64 {
    let mut acc = 0u64;
    for (i, page) in buf.chunks(PAGE_WORDS).enumerate() {
        touch(
            buf.as_ptr()
                .wrapping_add(i * PAGE_WORDS + TOUCH_AHEAD_WORDS),
        );
        acc = acc.wrapping_add(sum_u64(page));
    }
    acc
}

/// Prefetches the line at `p` into L1 (nothing where this build has no prefetch intrinsic).
#[inline(always)]
fn touch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address (past the end is harmless).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
/// [`sum_u64`] compiled for AVX2 (wider loads; the baseline build only has SSE2).
unsafe fn sum_u64_avx2(buf: &[u64], touch: bool) -> u64 {
    if touch {
        sum_touching(buf)
    } else {
        sum_u64(buf)
    }
}

fn sum_fast(buf: &[u64], touch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { sum_u64_avx2(buf, touch) };
    }
    if touch {
        sum_touching(buf)
    } else {
        sum_u64(buf)
    }
}

/// Streaming read bandwidth in GB/s on the current rayon pool (one contiguous part per
/// thread): the best of `reps` plain and `reps` page-touching passes.
fn bandwidth(buf: &[u64], reps: usize) -> f64 {
    use rayon::prelude::*;
    let chunk = buf.len().div_ceil(rayon::current_num_threads());
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for pass in 0..2 * reps.max(1) {
        let touch = pass % 2 == 1;
        let t = Instant::now();
        sink ^= buf
            .par_chunks(chunk)
            .map(|c| sum_fast(c, touch))
            .reduce(|| 0, |a, b| a.wrapping_add(b));
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    (buf.len() * 8) as f64 / best / 1e9
}

/// CPU seconds used so far by all threads of this process (`/proc/self/task/*/schedstat`).
fn cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut ns = 0u64;
    for e in dir.flatten() {
        if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

/// What [`engine_speed`] measured: every timed repetition and the greedy continuation.
struct Speed {
    reps: Vec<Rep>,
    greedy: Vec<u32>,
}

/// Prefill and decode speed at `threads`, `reps` timed repetitions after one warm-up pass, each
/// between two bandwidth measurements over `bw_buf` on the same pool.
fn engine_speed(
    m: &Model<'_>,
    prompt: &[u32],
    decode: usize,
    threads: usize,
    reps: usize,
    (bw_buf, bw_reps): (&[u64], usize),
) -> Result<Speed> {
    let p = pool(threads)?;
    p.install(|| {
        let mut out = Vec::new();
        let mut greedy = Vec::new();
        // One untimed warm-up pass pages the weights in and sizes the scratch.
        for rep in 0..reps.max(1) + 1 {
            let bw_before = if rep > 0 {
                bandwidth(bw_buf, bw_reps)
            } else {
                0.0
            };
            let mut s = m.new_session(prompt.len() + decode + 1);
            let (t, c) = (Instant::now(), cpu_seconds());
            let mut logits = m.logits(&mut s, prompt).context("prefill")?;
            let prefill = t.elapsed().as_secs_f64();
            let prefill_cpu = cpu_seconds() - c;
            let mut ids = Vec::with_capacity(decode);
            let mut dt = 0.0;
            let cpu0 = cpu_seconds();
            for _ in 0..decode {
                let next = argmax(&logits);
                ids.push(next);
                let t = Instant::now();
                logits = m.logits(&mut s, &[next]).context("decode")?;
                dt += t.elapsed().as_secs_f64();
            }
            let cpu = cpu_seconds() - cpu0;
            if rep > 0 {
                out.push(Rep {
                    bandwidth_gbs: bw_before.max(bandwidth(bw_buf, bw_reps)),
                    prefill_tok_s: prompt.len() as f64 / prefill,
                    decode_tok_s: decode as f64 / dt,
                    decode_tok_per_cpu_s: decode as f64 / cpu,
                    prefill_tok_per_cpu_s: prompt.len() as f64 / prefill_cpu,
                });
            }
            greedy = ids;
        }
        greedy.truncate(16);
        Ok(Speed { reps: out, greedy })
    })
}

/// The 1-minute load average, NaN when unreadable.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// VmHWM of a process (`self` or a pid) in MiB.
fn peak_rss_mib(pid: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let s = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kb: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmHWM in {path}"))?;
    Ok(kb / 1024.0)
}

/// A station process, killed on drop.
struct StationProc {
    child: Child,
    url: String,
}

impl Drop for StationProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns a station on a free loopback port; returns it and the spawn-to-/health-answers time.
fn start_station(bin: &Path, knot: &Path) -> Result<(StationProc, Duration)> {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .arg("--knot")
        .arg(knot)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let stdout = child.stdout.take().context("station stdout")?;
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(str::to_string);
    let Some(url) = url else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("station printed no address (read {read:?}: {line:?})");
    };
    let proc = StationProc { child, url };
    let c = StationClient::new(&proc.url, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.health() {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("station never answered /health")
            }
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    Ok((proc, t.elapsed()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn station_figures(
    args: &Args,
    bin: &Path,
    knot: &Path,
    n_layers: u32,
    hidden: usize,
    prompt: &[u32],
) -> Result<StationFigures> {
    let mut starts = Vec::new();
    for _ in 0..args.starts.max(1) {
        let (_s, d) = start_station(bin, knot)?;
        starts.push(ms(d));
    }
    let (st, _) = start_station(bin, knot)?;
    let c = StationClient::new(&st.url, Duration::from_secs(60));
    let all = LayerRange::new(0, n_layers);
    let x = c.embed(prompt).context("station /embed")?;
    c.forward(&x.residual, all, Some(("bench", 0)), false)
        .context("station prefill")?;
    let (mut over, mut rtt, mut comp) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for i in 0..args.hops.max(1) {
        let tok = prompt[i % prompt.len()];
        let e = c.embed(&[tok]).context("station /embed")?;
        let t = Instant::now();
        let h = c
            .forward(&e.residual, all, Some(("bench", prompt.len() + i)), false)
            .context("station decode hop")?;
        let r = ms(t.elapsed());
        bytes = h.bytes;
        over.push(r - h.compute_ms);
        rtt.push(r);
        comp.push(h.compute_ms);
        debug_assert_eq!(h.residual.len(), hidden);
    }
    let station_peak_rss_mib = peak_rss_mib(&st.child.id().to_string())?;
    let mut s2 = starts.clone();
    Ok(StationFigures {
        start_to_ready_ms: median(&mut s2),
        starts_ms: starts,
        hop_overhead_ms: median(&mut over),
        hop_round_trip_ms: median(&mut rtt),
        hop_compute_ms: median(&mut comp),
        hop_bytes: bytes,
        station_peak_rss_mib,
    })
}

fn run(args: Args) -> Result<()> {
    if args.threads.is_empty() || args.threads.contains(&0) {
        bail!("--threads needs positive thread counts, e.g. 1,2");
    }
    if args.prompt_len == 0 {
        bail!("--prompt-len must be at least 1");
    }
    let knot_path = args
        .knot
        .clone()
        .unwrap_or_else(|| models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.knot"));
    if !knot_path.exists() {
        bail!(
            "{} not found (run scripts/fetch-model.sh, or pass --knot)",
            knot_path.display()
        );
    }
    let knot = Knot::open(&knot_path)?;
    let m = Model::load(&knot, None)
        .context("loading the model")?
        .with_mla_latent_cache(args.mla_latent_cache);
    let h = m.holdings();
    if !(h.embed && h.head) {
        bail!(
            "{} is a shard; the bench needs the whole model",
            knot_path.display()
        );
    }
    let load0 = loadavg();
    let prompt = prompt_tokens(&knot, args.prompt_len)?;
    let bpt = bytes_per_token(&knot);
    let (first_prefill_ms, counted_bpt) =
        pool(args.threads[0])?.install(|| -> Result<(f64, f64)> {
            let mut s = m.new_session(prompt.len() + args.decode + 1);
            let t = Instant::now();
            let mut logits = m.logits(&mut s, &prompt).context("first prefill")?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            // The decode's weight bytes as the kernels count them (untimed).
            count_weight_bytes(true);
            for _ in 0..args.decode {
                logits = m.logits(&mut s, &[argmax(&logits)]).context("decode")?;
            }
            let counted = count_weight_bytes(false);
            Ok((ms, counted as f64 / args.decode.max(1) as f64))
        })?;

    // Before the bandwidth buffer, which would dominate the high-water mark (the first
    // prefill has paged the weights in and built the interleaved copies).
    let peak_rss = peak_rss_mib("self")?;
    let words = args.bw_mib.max(1) * 1024 * 1024 / 8;
    let bw_buf: Vec<u64> = (0..words as u64).collect();

    let mut runs = Vec::new();
    for &t in &args.threads {
        if !args.json {
            eprintln!("aeon-bench: measuring the engine at {t} thread(s)...");
        }
        let sp = engine_speed(
            &m,
            &prompt,
            args.decode,
            t,
            args.reps,
            (&bw_buf, args.bw_reps),
        )?;
        let best = |f: fn(&Rep) -> f64| sp.reps.iter().map(f).fold(0.0, f64::max);
        let top = sp
            .reps
            .iter()
            .copied()
            .max_by(|a, b| a.decode_tok_s.total_cmp(&b.decode_tok_s))
            .context("no timed repetition")?;
        let roof = top.bandwidth_gbs * 1e9 / bpt as f64;
        runs.push(Run {
            threads: t,
            bandwidth_gbs: top.bandwidth_gbs,
            roofline_tok_s: roof,
            prefill_tok_s: best(|r| r.prefill_tok_s),
            decode_tok_s: top.decode_tok_s,
            decode_vs_roofline: top.decode_tok_s / roof,
            decode_tok_per_cpu_s: best(|r| r.decode_tok_per_cpu_s),
            prefill_tok_per_cpu_s: best(|r| r.prefill_tok_per_cpu_s),
            greedy: sp.greedy,
            reps: sp.reps,
        });
    }
    drop(bw_buf);

    let station = if args.no_station {
        None
    } else {
        let bin = match &args.station_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe()
                .context("locating this executable")?
                .with_file_name("fat-station"),
        };
        if !bin.exists() {
            bail!("{} not found (build it with cargo build --release -p fat-station, or pass --station-bin / --no-station)", bin.display());
        }
        Some(station_figures(
            &args,
            &bin,
            &knot_path,
            m.cfg.n_layers as u32,
            m.cfg.hidden,
            &prompt,
        )?)
    };

    let report = Report {
        model: knot.header().model_id.clone(),
        knot: knot_path.display().to_string(),
        kernels: format!("{:?}", kernels().isa),
        prompt_tokens: prompt,
        decode_tokens: args.decode,
        bytes_per_token: bpt,
        counted_bytes_per_token: counted_bpt,
        runs,
        station,
        peak_rss_mib: peak_rss,
        first_prefill_ms,
        loadavg: [load0, loadavg()],
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print_summary(&report);
    }
    Ok(())
}

fn print_summary(r: &Report) {
    println!("model {} ({}), kernels {}", r.model, r.knot, r.kernels);
    println!(
        "weights read per decoded token: {:.1} MB (matrix products counted: {:.1} MB); prompt \
         {} tokens, decode {} tokens",
        r.bytes_per_token as f64 / 1e6,
        r.counted_bytes_per_token / 1e6,
        r.prompt_tokens.len(),
        r.decode_tokens
    );
    println!(
        "{:>7} {:>10} {:>10} {:>12} {:>11} {:>9} {:>14}",
        "threads",
        "bw GB/s",
        "roof tok/s",
        "prefill t/s",
        "decode t/s",
        "of roof",
        "decode t/cpu-s"
    );
    for x in &r.runs {
        println!(
            "{:>7} {:>10.1} {:>10.1} {:>12.1} {:>11.1} {:>8.0}% {:>14.1}",
            x.threads,
            x.bandwidth_gbs,
            x.roofline_tok_s,
            x.prefill_tok_s,
            x.decode_tok_s,
            x.decode_vs_roofline * 100.0,
            x.decode_tok_per_cpu_s
        );
    }
    if let Some(s) = &r.station {
        println!(
            "station: start-to-ready {:.1} ms (median of {}); decode hop {:.3} ms over compute \
             (round trip {:.2} ms, compute {:.2} ms, {} B); station peak RSS {:.0} MiB",
            s.start_to_ready_ms,
            s.starts_ms.len(),
            s.hop_overhead_ms,
            s.hop_round_trip_ms,
            s.hop_compute_ms,
            s.hop_bytes,
            s.station_peak_rss_mib
        );
    }
    println!(
        "peak RSS (this process, incl. mmapped weights): {:.0} MiB; first prefill after load \
         (pages weights in, builds the interleaved copies) {:.0} ms",
        r.peak_rss_mib, r.first_prefill_ms
    );
    println!(
        "load average before/after: {:.2} / {:.2}",
        r.loadavg[0], r.loadavg[1]
    );
}
