//! Argument parsing and the commands of the `shard-knot` binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::{even_ranges, parse_ranges, split, split_bytes, summarize};
use anyhow::{Context, Result};
use clap::{ArgGroup, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use knot_format::Knot;

/// Split a KNOT model into per-node shards, and inspect what a shard holds.
///
/// Each shard holds one layer range at its original indices.
///
/// Examples:
///   shard-knot split M.knot --nodes 3 -o shards/
///   shard-knot split M.knot --ranges 0..8,8..16,16..24 -o shards/
///   shard-knot inspect shards/M.L08-16.knot
///   fat-station --knot shards/M.L08-16.knot      (serves /forward for layers 8-16 only)
///
/// Exit codes: 0 success; 2 usage, I/O or other errors. Logging: -v, -q, or RUST_LOG=info.
#[derive(Debug, Parser)]
// Verbatim: clap would reflow the examples into one line.
#[command(name = "shard-knot", version, about, long_about, verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Command,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write one shard per layer range: entry (embedding + first layers), mid (layers),
    /// exit (layers + final norm + head; the embedding when the head is tied).
    ///
    /// Files are named DIR/<stem>.Laa-bb.knot and written atomically; each carries the
    /// architecture, the tokenizer and a shard record with the parent's model hash.
    #[command(group(ArgGroup::new("how").required(true).args(["ranges", "nodes"])))]
    Split {
        /// The whole model (.knot) to split.
        knot: PathBuf,
        /// Comma-separated half-open layer ranges in order, `a..b` or `a-b`
        /// (e.g. 0..12,12..24). A single 0..L range writes a `full` shard.
        #[arg(long)]
        ranges: Option<String>,
        /// Split into N contiguous ranges of (nearly) equal layer counts.
        #[arg(long)]
        nodes: Option<u32>,
        /// Output directory (created if missing).
        #[arg(short, long)]
        output: PathBuf,
        /// Print the written shards as JSON (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Print a shard's role, layer range, parent model and the bytes it holds
    /// (embedding / layers / head).
    Inspect {
        /// A shard (or whole model) .knot file.
        knot: PathBuf,
        /// Print JSON (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Plan contiguous layer ranges by node size (a weight budget with --node-ram, as the R1
    /// Mesh Scaling Plan counts; free RAM less a reserve and the KV budget with --node-free),
    /// report how many nodes the model needs and why, and with -o DIR write one node
    /// manifest per node plus the shards (see specs/mesh.md). Refuses a plan that does not
    /// fit unless --disk-paged.
    #[command(after_help = PLAN_EXAMPLES)]
    Plan(crate::plan::PlanArgs),
}

/// `shard-knot plan --help`'s examples, one command per line (a doc comment would be reflowed
/// into one line, and `verbatim_doc_comment` would keep the summary's line breaks in the list
/// of commands too).
const PLAN_EXAMPLES: &str = "\
Examples:
  shard-knot plan M.knot --node-ram 2.4G -o mesh/
  shard-knot plan M.knot --node-free 2.95G --kv-tokens 2048
  shard-knot plan M.knot --node phone=2.4G --node pi=1.6G
  shard-knot plan --model-bytes 7G --layers 32 --node-ram 2.4G";

/// Runs one command; `Ok` carries the exit code.
pub fn run(args: Args) -> Result<ExitCode> {
    let quiet = args.verbosity.quiet;
    match args.cmd {
        Command::Split {
            knot,
            ranges,
            nodes,
            output,
            json,
        } => cmd_split(&knot, ranges.as_deref(), nodes, &output, json, quiet),
        Command::Inspect { knot, json } => cmd_inspect(&knot, json),
        Command::Plan(a) => crate::plan::run(a),
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn cmd_split(
    path: &Path,
    ranges: Option<&str>,
    nodes: Option<u32>,
    out: &Path,
    json: bool,
    quiet: bool,
) -> Result<ExitCode> {
    let t0 = Instant::now();
    let parent = Knot::open(path)?;
    let n = parent.arch().n_layers;
    let ranges = match (ranges, nodes) {
        (Some(spec), _) => parse_ranges(spec, n).context("--ranges")?,
        (None, Some(k)) => even_ranges(n, k).context("--nodes")?,
        (None, None) => anyhow::bail!("give --ranges or --nodes"),
    };
    let covered: u32 = ranges.iter().map(|r| r.len()).sum();
    if covered != n {
        tracing::warn!("the ranges cover {covered} of {n} layers: a contiguous part of a chain");
    }
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("model");
    let total = split_bytes(&parent, &ranges)?;
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    pb.set_style(
        ProgressStyle::with_template(
            "split [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let r = split(&parent, &ranges, out, stem, &mut |d| pb.set_position(d));
    pb.finish_and_clear();
    let shards = r.with_context(|| format!("splitting {}", path.display()))?;
    let mut o = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "parent": path,
            "parent_hash": parent.model_hash(),
            "parent_layers": n,
            "elapsed_s": t0.elapsed().as_secs_f64(),
            "shards": shards,
        });
        serde_json::to_writer_pretty(&mut o, &v)?;
        writeln!(o)?;
        return Ok(ExitCode::SUCCESS);
    }
    for s in &shards {
        writeln!(
            o,
            "{:<5} layers {:>3}..{:<3} {:>4} tensors {:>8.1} MB  {}",
            format!("{:?}", s.role).to_lowercase(),
            s.layers.start,
            s.layers.end,
            s.tensors,
            mb(s.file_len),
            s.path.display()
        )?;
    }
    writeln!(
        o,
        "wrote {} shards of {} ({} layers, parent {}) in {:.2}s",
        shards.len(),
        path.display(),
        n,
        parent.model_hash(),
        t0.elapsed().as_secs_f64()
    )?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_inspect(path: &Path, json: bool) -> Result<ExitCode> {
    let k = Knot::open(path)?;
    let s = summarize(&k);
    let mut o = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut o, &s)?;
        writeln!(o)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        o,
        "file        {} ({:.1} MB)",
        path.display(),
        mb(s.file_len)
    )?;
    writeln!(o, "model       {}", s.model_id)?;
    writeln!(o, "hash        {}", s.model_hash)?;
    match (&s.role, &s.parent_hash) {
        (Some(role), Some(parent)) => {
            writeln!(
                o,
                "role        {} (layers {}..{} of {})",
                format!("{role:?}").to_lowercase(),
                s.layers.start,
                s.layers.end,
                s.parent_layers
            )?;
            writeln!(o, "parent      {parent}")?;
        }
        _ => writeln!(
            o,
            "role        not a shard (whole model, layers 0..{})",
            s.parent_layers
        )?,
    }
    writeln!(
        o,
        "tokenizer   {}",
        if s.tokenizer_bytes > 0 {
            format!("{} bytes", s.tokenizer_bytes)
        } else {
            "none".into()
        }
    )?;
    writeln!(o, "tensors     {}", s.tensor_count)?;
    let b = &s.bytes;
    writeln!(o, "  embedding {:>10.1} MB", mb(b.embedding))?;
    writeln!(
        o,
        "  layers    {:>10.1} MB ({} blocks)",
        mb(b.layers),
        s.per_layer.len()
    )?;
    writeln!(
        o,
        "  head      {:>10.1} MB{}",
        mb(b.head),
        if s.tied_head && b.head > 0 {
            " (tied: the token embedding)"
        } else {
            ""
        }
    )?;
    if b.other > 0 {
        writeln!(o, "  other     {:>10.1} MB", mb(b.other))?;
    }
    writeln!(o, "  total     {:>10.1} MB", mb(b.total))?;
    if let (Some(first), Some(last)) = (s.per_layer.first(), s.per_layer.last()) {
        writeln!(
            o,
            "blocks      {}..{}: {:.1} MB (block {}) .. {:.1} MB (block {})",
            s.layers.start,
            s.layers.end,
            mb(first.1),
            first.0,
            mb(last.1),
            last.0
        )?;
    }
    if !s.non_block.is_empty() {
        writeln!(o, "non-block   {}", s.non_block.join(", "))?;
    }
    if !s.missing_layers.is_empty() {
        writeln!(o, "WARNING: blocks with no tensors: {:?}", s.missing_layers)?;
    }
    Ok(ExitCode::SUCCESS)
}
