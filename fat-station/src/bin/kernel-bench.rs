//! kernel-bench: weight-streaming throughput of the matmul kernels on Qwen-sized matrices.
//!
//! Matrices go through [`linear_with`] as the engine's do: the 16-row interleaved kernels where
//! the CPU and type have them (`--blocks`: the block kernels only).
//!
//! Prints, for every type the engine accepts ([`DType::ALL`]) at Qwen2.5-0.5B's ffn shape (and
//! a few more shapes), GB/s of weight bytes streamed by a matvec (decode) at 1 and 2 threads
//! next to the read roofline of the same bytes, and for an 8-row matmul (prefill chunk) the
//! weight GB/s times rows ("per-token equivalent") and its ratio to the matvec.
//! Weights are random blocks with sane scales. Honest from DRAM: each type's copies total a
//! working set well above the last-level cache (16x it by default, read from sysfs), cycled so
//! every call reads a copy last touched a whole working set ago; the roofline
//! ([`stream_read`]: the same page touch as the kernels, wide loads, the same threads) reads
//! the same copies the same way, its runs alternating with the kernel's (best of each).
//!
//! `--forward MODEL.knot` instead runs the engine itself on one thread: a `--prefill`-token
//! prompt in one batch, then `--decode` greedy tokens, and prints the greedy ids and a BLAKE3
//! of the last logits' bits (`scripts/arm-proxy.sh` counts its instructions under qemu-aarch64
//! at two sizes and divides the difference; two machines compare the hash for bit identity).
//!
//! Exit codes: 0 success, 2 bad arguments or a failed setup.

use anyhow::{Context, Result};
use clap::Parser;
use fat_station::engine::kernels::blocks::f16_fields;
use fat_station::engine::kernels::roofline::stream_read;
use fat_station::engine::kernels::{kernels, linear_with, Kernels, Linear, QMatrix};
use fat_station::engine::ops::argmax;
use knot_format::DType;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Measure kernel throughput against the memory-bandwidth roofline.
#[derive(Parser)]
struct Args {
    /// Seconds to spend per measurement.
    #[arg(long, default_value_t = 0.4)]
    secs: f64,
    /// Size of the bandwidth buffer in MiB.
    #[arg(long, default_value_t = 1024)]
    bw_mib: usize,
    /// Tokens for the batched (prefill) measurement.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Cycle through copies of each matrix totalling at least this many MiB, so weights come
    /// from DRAM as in decode rather than from the last-level cache (default: 16x the LLC,
    /// at least 256; 0: one copy, i.e. from cache for small matrices).
    #[arg(long)]
    cold_mib: Option<usize>,
    /// Only measure this dtype (GGML name, e.g. `q5_0`).
    #[arg(long)]
    only: Option<String>,
    /// Use the block kernels on the stored rows, not the 16-row interleaved copies.
    #[arg(long)]
    blocks: bool,
    /// Run the whole model (a .knot file) instead: prefill, greedy decode, one thread.
    #[arg(long)]
    forward: Option<std::path::PathBuf>,
    /// With --forward: prompt tokens, prefilled in one batch (a fixed English prompt's ids,
    /// repeated).
    #[arg(long, default_value_t = 8)]
    prefill: usize,
    /// With --forward: greedy tokens decoded one at a time after the prompt.
    #[arg(long, default_value_t = 0)]
    decode: usize,
    /// With --forward: run the blocks one at a time and print a BLAKE3 of the residual's bits
    /// after the embedding and after every block, for every forward call (prefill and each
    /// decoded token), then of the logits: two machines' traces show the first block where
    /// their bits part.
    #[arg(long)]
    trace: bool,
    /// With --forward: also write the last logits as little-endian f32 to FILE (to compare
    /// with another engine's, e.g. scripts/reference/llamacpp-logits.c on the same GGUF).
    #[arg(long, value_name = "FILE")]
    logits_out: Option<std::path::PathBuf>,
    #[command(flatten)]
    verbosity: aeon_cli::Verbosity,
}

/// "The capital of France is Paris. The" in Qwen2.5's vocabulary: the --forward prompt.
const PROMPT: [u32; 8] = [785, 6722, 315, 9625, 374, 12095, 13, 576];

/// `--forward`: prefill + greedy decode on one thread; prints the ids and the logits' hash.
fn forward(path: &std::path::Path, args: &Args) -> Result<()> {
    use fat_station::engine::Model;
    let (prefill, decode, trace) = (args.prefill, args.decode, args.trace);
    if prefill == 0 {
        anyhow::bail!("--prefill must be at least 1");
    }
    let knot = knot_format::Knot::open(path)?;
    let m = Model::load(&knot, None).context("loading the model")?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("building thread pool")?;
    let prompt: Vec<u32> = (0..prefill).map(|i| PROMPT[i % PROMPT.len()]).collect();
    let (ids, logits) = pool.install(|| -> Result<(Vec<u32>, Vec<f32>)> {
        let mut s = m.new_session(prefill + decode + 1);
        let step = |s: &mut fat_station::engine::Session, toks: &[u32], call: usize| {
            if trace {
                traced_logits(&m, s, toks, call)
            } else {
                m.logits(s, toks).map_err(Into::into)
            }
        };
        let mut logits = step(&mut s, &prompt, 0).context("prefill")?;
        let mut ids = Vec::with_capacity(decode + 1);
        for i in 0..=decode {
            let next = argmax(&logits);
            ids.push(next);
            if i < decode {
                logits = step(&mut s, &[next], i + 1).context("decode")?;
            }
        }
        Ok((ids, logits))
    })?;
    println!("kernels: {:?}", kernels().isa);
    println!("greedy ids: {ids:?}");
    println!("last logits blake3: {}", bits_hash(&logits));
    if let Some(out) = &args.logits_out {
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// BLAKE3 of the values' bits (little-endian), hex.
fn bits_hash(v: &[f32]) -> String {
    let mut h = blake3::Hasher::new();
    for x in v {
        h.update(&x.to_bits().to_le_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// [`fat_station::engine::Model::logits`] one block at a time, printing `trace CALL STAGE
/// HASH` after the embedding, each block and the head (the same bits as one call: each
/// block's output depends only on its input and its cache).
fn traced_logits(
    m: &fat_station::engine::Model,
    s: &mut fat_station::engine::Session,
    toks: &[u32],
    call: usize,
) -> Result<Vec<f32>> {
    let mut x = m.embed(toks)?;
    println!("trace {call} embed {}", bits_hash(&x));
    for l in 0..m.cfg.n_layers as u32 {
        m.forward(s, &mut x, knot_format::LayerRange::new(l, l + 1))?;
        println!("trace {call} block{l} {}", bits_hash(&x));
    }
    let logits = m.lm_head(&x)?;
    println!("trace {call} logits {}", bits_hash(&logits));
    Ok(logits)
}

/// SplitMix64 for reproducible random weights.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random blocks whose f16 scales are small finite numbers (block offsets as ggml lays them).
fn random_weights(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let mut v: Vec<u8> = (0..n / dtype.block_elems() * bb)
        .map(|_| rng.next() as u8)
        .collect();
    let fields = f16_fields(dtype);
    if dtype == DType::F32 {
        for c in v.chunks_exact_mut(4) {
            c.copy_from_slice(&(rng.f32() * 0.1).to_le_bytes());
        }
    }
    if dtype == DType::F16 {
        for c in v.chunks_exact_mut(2) {
            c.copy_from_slice(&half::f16::from_f32(rng.f32() * 0.1).to_le_bytes());
        }
    }
    if dtype == DType::BF16 {
        for c in v.chunks_exact_mut(2) {
            c.copy_from_slice(&half::bf16::from_f32(rng.f32() * 0.1).to_le_bytes());
        }
    }
    for blk in v.chunks_exact_mut(bb) {
        if dtype == DType::MXFP4 {
            // An e8m0 scale byte: 2^-16 .. 2^-9.
            blk[0] = 112 + blk[0] % 8;
        }
        for &o in fields {
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(rng.f32() * 0.01).to_le_bytes());
        }
    }
    v
}

/// Best-of-runs seconds per call of `f`, running for about `secs`.
fn time_it(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::MAX;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// The last-level cache's size in bytes (the largest `cache/index*/size` of cpu0), if sysfs
/// says.
fn llc_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let s = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        let s = s.trim();
        let (num, mul) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<usize>().ok().map(|n| n * mul)
    })
    .max()
}

/// Best seconds per call of `a` and of `b`, alternating a few rounds of each (so a minute of
/// lower bandwidth on the shared machine hits both alike).
fn time_pair(secs: f64, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    const ROUNDS: usize = 4;
    let (mut ta, mut tb) = (f64::MAX, f64::MAX);
    for _ in 0..ROUNDS {
        ta = ta.min(time_it(secs / (2 * ROUNDS) as f64, &mut a));
        tb = tb.min(time_it(secs / (2 * ROUNDS) as f64, &mut b));
    }
    (ta, tb)
}

/// The measured (dtype, rows, cols): every type the engine accepts at Qwen2.5-0.5B's ffn_up
/// shape (896 x 4864), then its ffn_down (Q5_0) and its Q8_0 embedding-sized head.
fn shapes() -> Vec<(DType, usize, usize)> {
    let mut v: Vec<_> = DType::ALL.iter().map(|&d| (d, 896, 4864)).collect();
    v.extend([(DType::Q5_0, 4864, 896), (DType::Q8_0, 151936, 896)]);
    v
}

fn run(args: Args) -> Result<()> {
    if let Some(path) = &args.forward {
        return forward(path, &args);
    }
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .context("building thread pool")
        })
        .collect::<Result<_>>()?;
    let kern = Kernels::for_isa(kernels().isa).context("kernel table")?;
    let kern = if args.blocks {
        kern.without_rows16()
    } else {
        kern
    };
    println!(
        "kernels: {:?}{}",
        kern.isa,
        if args.blocks { " (block kernels)" } else { "" }
    );
    let llc = llc_bytes();
    let cold_mib = args
        .cold_mib
        .unwrap_or_else(|| ((llc.unwrap_or(32 << 20) * 16) >> 20).max(256));
    let buf: Vec<u8> = (0..args.bw_mib << 20).map(|i| (i >> 12) as u8).collect();
    // 4 MiB pieces cycled (best of many short reads, as the per-type rows): one read of the
    // whole buffer takes tens of ms, long enough to be preempted on a loaded machine.
    let pieces: Vec<&[u8]> = buf.chunks_exact(4 << 20).collect();
    if pieces.is_empty() {
        anyhow::bail!("--bw-mib must be at least 4");
    }
    let bw: Vec<f64> = pools
        .iter()
        .map(|p| {
            let mut k = 0;
            let t = p.install(|| {
                time_it(args.secs * 2.0, || {
                    k = (k + 1) % pieces.len();
                    black_box(stream_read(pieces[k]));
                })
            });
            (4 << 20) as f64 / t / 1e9
        })
        .collect();
    drop(pieces);
    drop(buf);
    println!(
        "read bandwidth ({} MiB buffer, 4 MiB reads): 1 thread {:.1} GB/s, 2 threads {:.1} GB/s",
        args.bw_mib, bw[0], bw[1]
    );
    println!(
        "per type: copies cycled over {cold_mib} MiB (LLC {}), roofline = the same copies read \
         the same way, alternating",
        llc.map_or("unknown".into(), |b| format!("{} MiB", b >> 20))
    );
    println!(
        "{:<6} {:>14} {:>6} | {:>6} {:>6} {:>5} {:>6} {:>6} {:>5} | {:>7} {:>5} {:>7} {:>5}",
        "dtype",
        "rows x cols",
        "MB",
        "rd1t",
        "1t",
        "%rd",
        "rd2t",
        "2t",
        "%rd",
        "b8 1t",
        "x1t",
        "b8 2t",
        "x2t"
    );
    let mut rng = Rng(42);
    for (dtype, rows, cols) in shapes() {
        if args.only.as_deref().is_some_and(|o| o != dtype.name()) {
            continue;
        }
        let one = dtype.bytes_for((rows * cols) as u64).context("size")? as usize;
        let copies = (cold_mib << 20).div_ceil(one).clamp(1, 1024);
        let data = random_weights(dtype, rows * cols, &mut rng).repeat(copies);
        let ws: Vec<Linear> = data
            .chunks_exact(one)
            .map(|d| {
                let w = Linear::new(QMatrix::new(dtype, rows, cols, d).context("weight geometry")?);
                // Build the interleaved copy now, not inside the timing.
                w.interleaved(&kern);
                Ok(w)
            })
            .collect::<Result<_>>()?;
        // What a matmul over copy k streams: its interleaved tiles, or its blocks.
        let stream: Vec<&[u8]> = ws
            .iter()
            .map(|w| w.interleaved(&kern).map_or(w.q.data, |p| p.as_bytes()))
            .collect();
        let bytes = one as f64;
        let mut gbs = Vec::new();
        let mut roof = Vec::new();
        for n_tok in [1, args.batch] {
            let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.f32() * 2.0).collect();
            let mut y = vec![0f32; n_tok * rows];
            for p in &pools {
                let (mut k, mut j) = (0, 0);
                let kernel = || {
                    k = (k + 1) % ws.len();
                    linear_with(&kern, &ws[k], &x, n_tok, &mut y)
                };
                if n_tok > 1 {
                    let t = p.install(|| time_it(args.secs, kernel));
                    gbs.push(bytes * n_tok as f64 / t / 1e9);
                    continue;
                }
                let read = || {
                    j = (j + 1) % stream.len();
                    black_box(stream_read(stream[j]));
                };
                let (t, tr) = p.install(|| time_pair(args.secs * 2.0, kernel, read));
                gbs.push(bytes / t / 1e9);
                roof.push(stream[0].len() as f64 / tr / 1e9);
            }
        }
        println!(
            "{:<6} {:>14} {:>6.1} | {:>6.1} {:>6.1} {:>4.0}% {:>6.1} {:>6.1} {:>4.0}% | {:>7.1} {:>4.1}x {:>7.1} {:>4.1}x",
            dtype.name(),
            format!("{rows}x{cols}"),
            bytes / 1e6,
            roof[0],
            gbs[0],
            100.0 * gbs[0] / roof[0],
            roof[1],
            gbs[1],
            100.0 * gbs[1] / roof[1],
            gbs[2],
            gbs[2] / gbs[0],
            gbs[3],
            gbs[3] / gbs[1]
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::INFO, args.verbosity);
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel-bench: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type the engine accepts is measured (BF16 once was not), with sane random weights:
    /// each row's dot with ones is finite.
    #[test]
    fn every_accepted_type_is_measured_with_finite_weights() {
        let s = shapes();
        for d in DType::ALL {
            assert!(s.iter().any(|&(t, _, _)| t == d), "{d} not measured");
            let w = random_weights(d, 2 * 4864, &mut Rng(7));
            let lin = Linear::new(QMatrix::new(d, 2, 4864, &w).unwrap());
            let mut y = [0f32; 2];
            linear_with(kernels(), &lin, &vec![1.0; 4864], 1, &mut y);
            assert!(y.iter().all(|v| v.is_finite()), "{d}: {y:?}");
        }
    }
}
