//! Arguments, the run and the report of `parity-station-handoff`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::{
    all_splits, check_shards, check_views, fmt_ranges, ranges_at, reference, Compare, SplitReport,
    TestResult, DEFAULT_TEXT, TEST2_TOKENS,
};
use anyhow::{bail, Context, Result};
use clap::Parser;
use fat_station::engine::tokenizer::Tokenizer;
use knot_format::Knot;

/// Split a model in-process and check the chained result equals the monolithic one, bit for bit.
///
/// The model is loaded once; each split is a chain of "stations" (views of the file that
/// hold one layer range each, or with --from-shards real shard files written by shard-knot)
/// handing the f32 residual on, each with its own KV cache.
///
/// TEST 1: 4 tokens in one pass: final residual rows and logits.
/// TEST 2: 8 tokens as a 4-token prefill + 4 single-token decode steps through the caches.
///
/// Prints cos and max |delta| of residual and logits per test and `OVERALL: PASS` only when
/// every split is bit-identical (delta 0.0).
///
/// Examples:
///   parity-station-handoff qwen.knot --split 12
///   parity-station-handoff qwen.knot --split 8,16
///   parity-station-handoff qwen.knot --all-splits --step 4
///
/// Exit codes: 0 PASS; 1 a split differs; 2 usage, I/O or engine errors.
#[derive(Debug, Parser)]
// Verbatim: clap would run the TEST lines and the examples together.
#[command(
    name = "parity-station-handoff",
    version,
    about,
    long_about,
    verbatim_doc_comment
)]
pub struct Args {
    /// The whole model (.knot).
    pub knot: PathBuf,
    /// Cut point(s): `12` splits into 0..12 | 12..L; `8,16` into three stations.
    /// [default: the midpoint L/2]
    #[arg(long, value_delimiter = ',', conflicts_with = "all_splits")]
    pub split: Vec<u32>,
    /// Check every 2-way split 1..L-1, then 3-way splits (a, b) on a grid of --step.
    #[arg(long)]
    pub all_splits: bool,
    /// Grid step of the 3-way splits of --all-splits (1 = every 3-way split).
    #[arg(long, default_value_t = 1)]
    pub step: u32,
    /// Build the stations from real shard files (written to a temp dir with shard-knot's
    /// split and loaded as what they hold) as well as from views of the whole file.
    #[arg(long)]
    pub from_shards: bool,
    /// Token ids, comma-separated (at least 8) [default: the first 8 tokens of
    /// "The capital of France is Paris, ..." when the model has a tokenizer].
    #[arg(long, value_delimiter = ',')]
    pub tokens: Vec<u32>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

fn default_tokens(knot: &Knot) -> Result<Vec<u32>> {
    let fallback = || -> Vec<u32> {
        let v = knot.arch().vocab.max(1);
        [785u32, 6722, 315, 9625, 374, 12095, 11, 323]
            .iter()
            .map(|t| t % v)
            .collect()
    };
    let Some(data) = knot.tokenizer().context("reading the tokenizer")? else {
        return Ok(fallback());
    };
    let Ok(tok) = Tokenizer::from_data(&data) else {
        return Ok(fallback());
    };
    let ids = tok.encode(DEFAULT_TEXT, false);
    Ok(if ids.len() >= TEST2_TOKENS {
        ids[..TEST2_TOKENS].to_vec()
    } else {
        fallback()
    })
}

fn line(c: &Compare) -> String {
    format!("cos {:.9} max|d| {:.3e}", c.cos, c.max_abs_delta)
}

/// One test as the seed report prints it, `TEST 1 (4 tokens): cos=1.000000
/// max-abs-delta=0.000000 -> PASS` (the worse of residual and logits), then the detail.
fn test_line(label: &str, t: &TestResult) -> String {
    format!(
        "{label}: cos={:.6} max-abs-delta={:.6} -> {}  (residual {}, logits {}; {:.0} ms)",
        t.residual.cos.min(t.logits.cos),
        t.residual.max_abs_delta.max(t.logits.max_abs_delta),
        verdict(t.pass()),
        line(&t.residual),
        line(&t.logits),
        t.ms
    )
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

/// Runs the checks; `Ok` carries the exit code.
pub fn run(args: Args) -> Result<ExitCode> {
    let t_all = Instant::now();
    let knot = Knot::open(&args.knot)?;
    let n = knot.arch().n_layers;
    if n < 2 {
        bail!("{} has {n} layer(s): nothing to split", args.knot.display());
    }
    let tokens = if args.tokens.is_empty() {
        default_tokens(&knot)?
    } else {
        args.tokens.clone()
    };
    let cuts: Vec<Vec<u32>> = if args.all_splits {
        all_splits(n, args.step)
    } else if args.split.is_empty() {
        vec![vec![n / 2]]
    } else {
        vec![args.split.clone()]
    };
    for c in &cuts {
        if c.windows(2).any(|w| w[0] >= w[1]) || c.iter().any(|&k| k == 0 || k >= n) {
            bail!(
                "--split {c:?}: cut points must increase and lie in 1..{}",
                n - 1
            );
        }
    }

    let rf = reference(&knot, &tokens).context("monolithic reference run")?;
    let tmp = if args.from_shards {
        Some(tempfile::tempdir().context("creating a temp dir for shard files")?)
    } else {
        None
    };
    let mut reports: Vec<SplitReport> = Vec::new();
    let mut o = std::io::stdout().lock();
    if !args.json {
        writeln!(
            o,
            "model {} ({} layers), tokens {:?}\nmonolithic: argmax {} logit {:.3} ({:.0} ms for both tests)",
            knot.header().model_id,
            n,
            tokens,
            rf.argmax,
            rf.top_logit,
            rf.ms
        )?;
    }
    let detailed = cuts.len() == 1;
    for c in &cuts {
        let ranges = ranges_at(c, n);
        let mut these = vec![check_views(&knot, &rf, &ranges, &tokens)
            .with_context(|| format!("split {}", fmt_ranges(&ranges)))?];
        if let Some(dir) = &tmp {
            these.push(
                check_shards(&knot, &rf, &ranges, &tokens, dir.path())
                    .with_context(|| format!("split {} from shard files", fmt_ranges(&ranges)))?,
            );
        }
        for r in these {
            if args.json {
            } else if detailed {
                writeln!(o, "split {} ({})", fmt_ranges(&r.ranges), r.source)?;
                writeln!(o, "{}", test_line("TEST 1 (4 tokens)", &r.test1))?;
                writeln!(o, "{}", test_line("TEST 2 (8 tokens, 4+4)", &r.test2))?;
            } else {
                writeln!(
                    o,
                    "{:<28} {:<6} T1 res {:.1e} log {:.1e}  T2 res {:.1e} log {:.1e}  {}  {:.0} ms",
                    fmt_ranges(&r.ranges),
                    r.source,
                    r.test1.residual.max_abs_delta,
                    r.test1.logits.max_abs_delta,
                    r.test2.residual.max_abs_delta,
                    r.test2.logits.max_abs_delta,
                    verdict(r.pass),
                    r.test1.ms + r.test2.ms
                )?;
            }
            reports.push(r);
        }
    }
    let failed = reports.iter().filter(|r| !r.pass).count();
    let pass = failed == 0;
    let elapsed = t_all.elapsed().as_secs_f64();
    let split_ms: f64 = reports.iter().map(|r| r.test1.ms + r.test2.ms).sum();
    if args.json {
        let v = serde_json::json!({
            "model": args.knot,
            "model_hash": knot.model_hash(),
            "n_layers": n,
            "tokens": tokens,
            "reference": {"argmax": rf.argmax, "logit": rf.top_logit, "ms": rf.ms},
            "splits": reports,
            "failed": failed,
            "elapsed_s": elapsed,
            "overall": verdict(pass),
        });
        serde_json::to_writer_pretty(&mut o, &v)?;
        writeln!(o)?;
    } else {
        writeln!(
            o,
            "{} split runs ({} splits{}), {} failed; {:.1} s in all, {:.0} ms per split run on average",
            reports.len(),
            cuts.len(),
            if args.from_shards { ", views and shard files" } else { "" },
            failed,
            elapsed,
            split_ms / reports.len().max(1) as f64
        )?;
        writeln!(o, "OVERALL: {}", verdict(pass))?;
    }
    Ok(if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
