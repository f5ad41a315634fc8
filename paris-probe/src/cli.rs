//! The `paris-probe` command line: its flags ([`Args`], also what the man page and shell
//! completions are generated from) and [`run`]; `main.rs` parses and maps the verdict to
//! an exit code.

use crate::{open_chain, open_dense, probe, Question, Report, Source};
use anyhow::{Context, Result};
use clap::Parser;
use knot_format::Knot;

/// Probe a model's next-token argmax against an expected token.
///
/// Examples:
///   paris-probe --dense qwen.knot --tokens 785,6722,315,9625,374 --expected 12095
///   paris-probe --dense qwen.knot --prompt "The capital of France is" --expect " Paris"
///
/// Exit codes: 0 PASS, 1 FAIL, 2 error. With --json one JSON object is printed (the contract
/// monster-guard reads; see specs/qspec.md).
#[derive(Parser, Debug)]
// Verbatim: clap would reflow the examples into one line.
#[command(version, about, long_about, verbatim_doc_comment)]
pub struct Args {
    /// Model file to run in this process (.knot, or a GGUF: imported once into the model cache).
    #[arg(long, conflicts_with_all = ["station", "mesh"])]
    dense: Option<std::path::PathBuf>,
    /// Accepted for compatibility with the reference runs: --dense is always dense-only.
    #[arg(long)]
    dense_only: bool,
    /// Probe a running station (a full model) instead of a file (`http://HOST:PORT` or
    /// `HOST:PORT`).
    #[arg(long, value_parser = fat_station::client::station_url)]
    station: Option<String>,
    /// Probe a chain of stations described by a mesh file.
    #[arg(long)]
    mesh: Option<std::path::PathBuf>,
    /// Prompt token ids, comma separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    tokens: Option<Vec<u32>>,
    /// Prompt text, tokenized with the model's own tokenizer.
    #[arg(long)]
    prompt: Option<String>,
    /// Expected next token id.
    #[arg(long, conflicts_with = "expect")]
    expected: Option<u32>,
    /// Expected continuation text; its first token (model's tokenizer) is the expected id.
    #[arg(long)]
    expect: Option<String>,
    /// How many top candidates to report.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// Also report the mean negative log-likelihood (nats/token) of this passage.
    #[arg(long)]
    perplexity_text: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

pub fn run(args: Args) -> Result<bool> {
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("configuring threads")?;
    }
    let q = Question {
        tokens: args.tokens.clone(),
        prompt: args.prompt.clone(),
        expected: args.expected,
        expect_text: args.expect.clone(),
        top_k: args.top_k,
        perplexity_text: args.perplexity_text.clone(),
    };
    let report = match &args.dense {
        Some(path) => {
            // A GGUF runs directly: imported once into the model cache.
            let knot = Knot::open(knot_format::cli::runnable_model(
                path,
                args.verbosity.quiet,
            )?)?;
            let (model, tok) = open_dense(&knot)?;
            probe(&Source::Dense(&model, tok.map(Box::new)), &q)?
        }
        None => probe(
            &Source::Chain(Box::new(open_chain(
                args.station.as_deref(),
                args.mesh.as_deref(),
            )?)),
            &q,
        )?,
    };
    crate::foil::admit_if_configured(&report.probe, args.dense.as_deref());
    if args.json {
        println!("{}", serde_json::to_string(&report.probe)?);
    } else {
        print_text(&report);
    }
    Ok(report.probe.pass == Some(true))
}

fn print_text(report: &Report) {
    let r = &report.probe;
    let show = |t: &Option<String>| t.as_deref().map(|s| format!(" {s:?}")).unwrap_or_default();
    let hash = r.model_hash.as_deref().unwrap_or_default();
    println!(
        "model: {} ({})",
        r.model_id.as_deref().unwrap_or_default(),
        &hash[..hash.len().min(16)]
    );
    println!("tokens: {:?}", r.tokens);
    println!(
        "argmax: {}{} logit {:.4}",
        r.argmax,
        show(&r.argmax_text),
        r.logit
    );
    println!("top-{}:", r.top.len());
    for c in &r.top {
        println!("  {:>7}{} {:.4}", c.id, show(&c.text), c.logit);
    }
    if let (Some(nll), Some(n)) = (r.nll, r.nll_tokens) {
        println!(
            "perplexity passage: mean NLL {nll:.4} nats/token over {n} tokens (ppl {:.2})",
            (nll as f64).exp()
        );
    }
    // The verdict line as the seed report prints it, so scripts that grep it work:
    // `max finite logit +14.34 at token_id 12095 -> PASS: argmax 12095 matches`.
    let best = match crate::max_finite(&report.logits) {
        Some((id, l)) => format!("max finite logit {l:+.2} at token_id {id}"),
        None => "no finite logit".to_string(),
    };
    if r.pass == Some(true) {
        println!(
            "{best} -> PASS: argmax {} matches (margin {:.4})",
            r.argmax, r.margin
        );
    } else {
        println!(
            "{best} -> FAIL: expected {}{} (logit {:.4}, rank {}), got argmax {}{} (logit {:.4})",
            r.expected,
            show(&r.expected_text),
            r.expected_logit,
            r.expected_rank,
            r.argmax,
            show(&r.argmax_text),
            r.logit
        );
    }
}
