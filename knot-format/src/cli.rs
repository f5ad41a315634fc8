//! Argument parsing and the three commands of the `knot` binary (its clap definition is also
//! what the man page and shell completions are generated from).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::gguf::GgufFile;
use crate::{import_gguf, Knot};
use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

/// KNOT model files: page-aligned, mmap-able, BLAKE3-verified containers of GGUF's tensors.
///
/// Examples:
///   knot import MODEL.gguf -o MODEL.knot
///   knot verify MODEL.knot
///   knot inspect MODEL.knot
///
/// Exit codes: 0 success; 1 `verify` found corruption; 2 usage, I/O or other errors.
/// Logging: -v (more), -q (errors only, no progress bar), or RUST_LOG (e.g. RUST_LOG=info).
#[derive(Debug, Parser)]
// Verbatim: clap would reflow the examples (and the lines below them) into one line.
#[command(name = "knot", version, about, long_about, verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Command,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Convert a GGUF (v2/v3) model into a KNOT file, copying tensors bit-for-bit.
    ///
    /// Writes atomically (temp file + rename), so an interrupted import never leaves a
    /// half-written .knot behind. Warns (stderr, exit 0) when the engine cannot run the
    /// model's architecture.
    Import {
        /// The source GGUF file.
        gguf: PathBuf,
        /// Where to write the KNOT file [default: the GGUF path with extension .knot].
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Print a KNOT's architecture (and whether the engine runs it), shard record, model hash
    /// and tensor table.
    Inspect {
        /// The KNOT file.
        knot: PathBuf,
        /// Print JSON (for scripts): model_id, model_hash, file_len, tensor_count, arch,
        /// shard, tokenizer section and the tensor table.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash the header, tokenizer and every tensor; name the first corrupt tensor.
    ///
    /// Prints "OK: N tensors verified" and exits 0, or exits 1 naming what is corrupt.
    Verify {
        /// The KNOT file.
        knot: PathBuf,
        /// Print one JSON object (for scripts): `{"ok": true, "tensors", "bytes", "seconds",
        /// "model_hash"}`, or `{"ok": false, "error", "tensor"}` (exit 1) when the file is
        /// corrupt. Errors that are not corruption (no such file, not a KNOT) stay on stderr
        /// (exit 2).
        #[arg(long)]
        json: bool,
    },
}

/// Runs one command; `Ok` carries the exit code.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let quiet = args.verbosity.quiet;
    match args.cmd {
        Command::Import { gguf, output } => import(
            &gguf,
            output.unwrap_or_else(|| gguf.with_extension("knot")),
            quiet,
        ),
        Command::Inspect { knot, json } => inspect(&knot, json),
        Command::Verify { knot, json } => verify(&knot, json, quiet),
    }
}

/// A progress bar on stderr (drawn only on a terminal), hidden with -q.
fn bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// The KNOT to open for what a user named (a KNOT, or a GGUF imported once into the model
/// cache with a progress bar on stderr; see [`crate::model_cache`]). For every tool that
/// takes a model path, so a GGUF runs directly everywhere.
pub fn runnable_model(path: &Path, quiet: bool) -> anyhow::Result<PathBuf> {
    use crate::model_cache::{cache_dir, imported_path, is_gguf};
    if !is_gguf(path)? {
        return Ok(path.to_path_buf());
    }
    let dir = cache_dir();
    let out = imported_path(path, &dir)?;
    if !out.is_file() {
        let total = GgufFile::open(path)
            .with_context(|| format!("reading {}", path.display()))?
            .tensor_data_len();
        if !quiet {
            eprintln!(
                "{} is a GGUF: importing it once into {} (later runs reuse it)",
                path.display(),
                dir.join("imported").display()
            );
        }
        let pb = bar(total, "import", quiet);
        let importing = || format!("importing {} into the model cache", path.display());
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent).with_context(importing)?;
        }
        import_gguf(path, &out, &mut |done| pb.set_position(done.min(total)))
            .with_context(importing)?;
        pb.finish_and_clear();
    }
    tracing::info!("{} runs as {}", path.display(), out.display());
    Ok(out)
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn import(gguf: &Path, out: PathBuf, quiet: bool) -> anyhow::Result<ExitCode> {
    let total = GgufFile::open(gguf)
        .with_context(|| format!("reading {}", gguf.display()))?
        .tensor_data_len();
    let pb = bar(total, "import", quiet);
    let s = import_gguf(gguf, &out, &mut |done| pb.set_position(done))
        .with_context(|| format!("importing {} into {}", gguf.display(), out.display()))?;
    pb.finish_and_clear();
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "imported {} tensors ({}, {} layers) -> {}: {:.1} MB in {:.2}s\nmodel hash {}",
        s.tensors,
        s.arch,
        s.n_layers,
        out.display(),
        mb(s.file_len),
        s.elapsed.as_secs_f64(),
        s.model_hash
    )?;
    if !s.runs_here {
        eprintln!(
            "warning: the engine cannot run architecture {:?} (it runs {}); the KNOT is written for inspection and sharding only",
            s.arch,
            crate::RUNNABLE_ARCHS.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let k = Knot::open(path)?;
    let h = k.header();
    let mut o = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "path": path,
            "model_id": h.model_id,
            "model_hash": k.model_hash(),
            "file_len": k.file_len(),
            "tensor_count": h.tensors.len(),
            "tensor_bytes": k.tensor_bytes(),
            "arch": h.arch,
            "runs_here": h.arch.runs_here(),
            "shard": h.shard,
            "tokenizer": h.tokenizer,
            "tensors": h.tensors,
        });
        serde_json::to_writer_pretty(&mut o, &v)?;
        writeln!(o)?;
        return Ok(ExitCode::SUCCESS);
    }
    let a = &h.arch;
    writeln!(
        o,
        "file        {} ({:.1} MB)",
        path.display(),
        mb(k.file_len())
    )?;
    writeln!(o, "model       {}", h.model_id)?;
    writeln!(o, "model hash  {}", k.model_hash())?;
    writeln!(
        o,
        "arch        {} ({:?} rope), {} layers, hidden {}, ffn {}, vocab {}, ctx {}",
        a.arch, a.rope_style, a.n_layers, a.hidden, a.ffn, a.vocab, a.context_len
    )?;
    writeln!(
        o,
        "runs here   {}",
        if a.runs_here() {
            "yes".to_string()
        } else {
            format!("no (the engine runs {})", crate::RUNNABLE_ARCHS.join(", "))
        }
    )?;
    writeln!(
        o,
        "attention   {} heads, {} kv heads, head dim {}, rope base {}, norm eps {:e}",
        a.n_heads, a.n_kv_heads, a.head_dim, a.rope_base, a.norm_eps
    )?;
    writeln!(
        o,
        "flags       tied_embeddings={} qk_norm={} qkv_bias={}",
        a.tied_embeddings, a.qk_norm, a.qkv_bias
    )?;
    if let Some(m) = &a.moe {
        writeln!(
            o,
            "experts     {} per block, {} used per token, expert ffn {}{}",
            m.n_experts,
            m.n_experts_used,
            m.expert_ffn,
            if m.norm_topk {
                ", top-k weights renormalised"
            } else {
                ""
            }
        )?;
        // deepseek2's routing, each part only when the file has it.
        let mut extra = Vec::new();
        if m.leading_dense > 0 {
            extra.push(format!("first {} block(s) dense", m.leading_dense));
        }
        if m.n_shared > 0 {
            extra.push(format!("{} shared expert(s)", m.n_shared));
        }
        if let Some(w) = m.shared_ffn {
            extra.push(format!("a gated shared expert of ffn {w}"));
        }
        if let Some(g) = &m.gating {
            extra.push(format!("{g} gating"));
        }
        if let Some(s) = m.weights_scale {
            extra.push(format!("weights x{s}"));
        }
        if let Some(g) = &m.groups {
            extra.push(format!("{} groups, {} used", g.count, g.used));
        }
        if m.interleave > 1 {
            extra.push(format!("experts every {} block(s)", m.interleave));
        }
        if !extra.is_empty() {
            writeln!(o, "routing     {}", extra.join(", "))?;
        }
    }
    if let Some(m) = &a.mla {
        writeln!(
            o,
            "mla         q rank {}, kv rank {}, rope dims {} of {}, value dim {}{}{}",
            if m.q_lora_rank == 0 {
                "- (attn_q)".to_string()
            } else {
                m.q_lora_rank.to_string()
            },
            m.kv_lora_rank,
            m.rope_dim,
            a.head_dim,
            m.v_head_dim,
            m.yarn_log_mul
                .map(|l| format!(", yarn log multiplier {l}"))
                .unwrap_or_default(),
            if m.split_kv_b {
                ", split attn_k_b / attn_v_b (latent cache)"
            } else {
                ""
            }
        )?;
    }
    if let Some(r) = &a.recurrent {
        let layers: Vec<String> = (0..r.layers.len())
            .filter(|&l| r.layers[l])
            .map(|l| l.to_string())
            .collect();
        let kind = match (&r.ssm, &a.delta_net) {
            (None, None) => format!("short convolution, {} taps", r.conv_kernel),
            (None, Some(d)) => format!(
                "Gated DeltaNet, {} key / {} value heads of {}, convolution of {} taps",
                d.k_heads, d.v_heads, d.head_dim, r.conv_kernel
            ),
            (Some(s), _) => format!(
                "{} state space: inner {}, state {}, dt rank {}{}{}, conv {} taps",
                a.arch,
                s.inner,
                s.state,
                s.dt_rank,
                if s.groups > 0 {
                    format!(", {} groups", s.groups)
                } else {
                    String::new()
                },
                if s.dt_b_c_rms {
                    ", dt/B/C rms-normed"
                } else {
                    ""
                },
                r.conv_kernel
            ),
        };
        let rest = if r.layers.iter().all(|&l| l) {
            "no attention"
        } else {
            "the others attention"
        };
        writeln!(
            o,
            "recurrent   layers {} ({kind}); {rest}",
            layers.join(",")
        )?;
    }
    if let Some(r) = a.rope_dim {
        writeln!(
            o,
            "rope        partial: {r} of {} dimensions per head",
            a.head_dim
        )?;
    }
    if let Some(w) = a.sliding_window {
        let local = a
            .swa_layers
            .as_ref()
            .map(|l| l.iter().filter(|&&b| b).count().to_string())
            .unwrap_or_else(|| "the architecture's default".into());
        writeln!(
            o,
            "sliding     window {w}, local layers: {local}, local rope base {}",
            a.rope_base_swa
                .map_or_else(|| "default".to_string(), |b| b.to_string())
        )?;
    }
    if let Some(c) = a.final_logit_softcap {
        writeln!(o, "softcap     final logits {c}")?;
    }
    if let Some(s) = &a.rope_scaling {
        writeln!(
            o,
            "rope scale  {} x{} (orig ctx {})",
            s.kind, s.factor, s.original_context
        )?;
    }
    match &h.shard {
        Some(s) => writeln!(
            o,
            "shard       {:?} layers {} of {} (parent {})",
            s.role, s.layers, s.parent_layers, s.parent_hash
        )?,
        None => writeln!(o, "shard       none (whole model)")?,
    }
    match &h.tokenizer {
        Some(t) => writeln!(o, "tokenizer   {} bytes at {}", t.len, t.offset)?,
        None => writeln!(o, "tokenizer   none")?,
    }
    writeln!(
        o,
        "tensors     {} ({:.1} MB)\n",
        h.tensors.len(),
        mb(k.tensor_bytes())
    )?;
    writeln!(
        o,
        "{:<34} {:<5} {:<16} {:>11}  blake3",
        "name", "dtype", "shape", "bytes"
    )?;
    for t in &h.tensors {
        let shape = t
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("x");
        writeln!(
            o,
            "{:<34} {:<5} {:<16} {:>11}  {}",
            t.name,
            t.dtype.name(),
            shape,
            t.len,
            t.blake3
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(path: &Path, json: bool, quiet: bool) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    // Corruption is the verdict (exit 1), on stdout as JSON with --json, else on stderr.
    let failed = |e: &crate::KnotError| -> anyhow::Result<ExitCode> {
        if json {
            let v = serde_json::json!({"ok": false, "error": e.to_string(), "tensor": e.tensor()});
            writeln!(std::io::stdout().lock(), "{v}")?;
        } else {
            eprintln!("FAILED: {e}");
        }
        Ok(ExitCode::from(1))
    };
    let k = match Knot::open(path) {
        Ok(k) => k,
        Err(e) if e.is_integrity() => return failed(&e),
        Err(e) => return Err(e.into()),
    };
    let pb = bar(k.verify_bytes(), "verify", quiet || json);
    let r = k.verify(&mut |done| pb.set_position(done));
    pb.finish_and_clear();
    match r {
        Ok(()) => {
            let n = k.header().tensors.len();
            let secs = t0.elapsed().as_secs_f64();
            let mut o = std::io::stdout().lock();
            if json {
                let v = serde_json::json!({
                    "ok": true, "tensors": n, "bytes": k.verify_bytes(), "seconds": secs,
                    "model_hash": k.model_hash(),
                });
                writeln!(o, "{v}")?;
            } else {
                writeln!(
                    o,
                    "OK: {n} tensors verified ({:.1} MB in {secs:.2}s), model hash {}",
                    mb(k.verify_bytes()),
                    k.model_hash()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.is_integrity() => failed(&e),
        Err(e) => Err(e).with_context(|| format!("verifying {}", path.display())),
    }
}
