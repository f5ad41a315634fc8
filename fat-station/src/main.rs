//! `fat-station`: serve a KNOT model (or one layer range of it) over HTTP.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use fat_station::engine::Holdings;
use fat_station::server::{self, Limits, Station};
use knot_format::{Knot, LayerRange};

/// Serve a KNOT model over HTTP: /embed, /forward (X-Layer-Range: a-b), /lm-head,
/// /tokenize, /detokenize, /health. See specs/station-wire.md.
///
/// A station holds either the whole model, the part a shard file carries, or the layer
/// range given by --role/--layers (original layer indices, half-open).
///
/// Exit codes: 0 clean shutdown, 2 bad arguments or model.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// Model or shard file (.knot).
    #[arg(long)]
    knot: std::path::PathBuf,
    /// Address to serve on; port 0 picks a free one (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Serve only this part of a full model: entry (embedding + layers), mid (layers),
    /// exit (layers + head), full. Needs --layers unless full.
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    /// Layers to serve, `a..b` or `a-b` (half-open, original indices).
    #[arg(long)]
    layers: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Most live KV-cache sessions.
    #[arg(long, default_value_t = 64)]
    max_sessions: usize,
    /// Most positions per session.
    #[arg(long, default_value_t = 4096)]
    max_positions: usize,
    /// Seconds an idle session is kept.
    #[arg(long, default_value_t = 600)]
    session_idle_s: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoleArg {
    Entry,
    Mid,
    Exit,
    Full,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fat-station: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn holdings(args: &Args, n_layers: u32) -> Result<Option<Holdings>> {
    let layers = match &args.layers {
        Some(s) => Some(LayerRange::parse(s).with_context(|| format!("--layers {s:?}: expected a..b"))?),
        None => None,
    };
    Ok(match (args.role, layers) {
        (None, None) => None,
        (Some(RoleArg::Full), None) => Some(Holdings::full(n_layers as usize)),
        (Some(r), None) => bail!("--role {r:?} needs --layers a..b"),
        (role, Some(l)) => {
            if l.end > n_layers || l.is_empty() {
                bail!("--layers {l} is outside the model's 0..{n_layers}");
            }
            let (embed, head) = match role {
                Some(RoleArg::Entry) => (true, false),
                Some(RoleArg::Mid) => (false, false),
                Some(RoleArg::Exit) => (false, true),
                Some(RoleArg::Full) => (true, true),
                None => (l.start == 0, l.end == n_layers),
            };
            Some(Holdings { embed, layers: l, head })
        }
    })
}

fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global().context("configuring compute threads")?;
    }
    let knot = Knot::open(&args.knot).with_context(|| format!("opening {}", args.knot.display()))?;
    let held = holdings(&args, knot.arch().n_layers)?;
    let limits = Limits {
        max_sessions: args.max_sessions,
        session_idle: Duration::from_secs(args.session_idle_s),
        max_positions: args.max_positions,
        ..Limits::default()
    };
    let station = Station::open(knot, held, limits).context("loading the model")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let (listener, addr) = server::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let h = station.model().holdings();
        println!(
            "fat-station: serving {} layers {}-{}{}{} on http://{addr} (ready in {:.1} ms)",
            station.model().knot().header().model_id,
            h.layers.start,
            h.layers.end,
            if h.embed { " +embed" } else { "" },
            if h.head { " +lm-head" } else { "" },
            t0.elapsed().as_secs_f64() * 1e3
        );
        server::serve(listener, station, shutdown_signal()).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
