//! The `foil-control` command line: its flags ([`Args`], also what the man page and shell
//! completions are generated from) and [`run`], which opens the store and serves;
//! `main.rs` parses and maps the result to an exit code.

use std::io::Write;
use std::path::PathBuf;

use crate::server::{self, AppState, ServerConfig};
use crate::store::{Store, StoreConfig};
use anyhow::Context;
use clap::Parser;

/// The residue collector: probes POST forward-pass residues, anyone GETs them by key.
///
/// Records live in an append-only, fsynced log in --data-dir that is replayed on start (a torn
/// tail from a crash is truncated with a warning). Past --max-records or --max-bytes the oldest
/// records are evicted.
///
/// Endpoints:
///   POST /.aeon/model-forward-cache          admit a record  -> {"ok": true, "key": K, ...}
///   GET  /.aeon/model-forward-cache?key=K    -> record + "cache_hit": true, or {"cache_hit": false}
///   GET  /.aeon/health                       -> {status, records, bytes, uptime_s, ...}
///
/// Once listening, one line `foil-control listening on http://ADDR` is printed on stdout.
/// Logs go to stderr (-v or RUST_LOG=debug for per-request lines; -q errors only).
///
/// Example:
///   foil-control --port 8886 --data-dir /tmp/foil &
///   curl -s 'http://127.0.0.1:8886/.aeon/model-forward-cache?key=m:dense:1,2'
///
/// Exit codes: 0 clean shutdown (SIGTERM/ctrl-c), 1 runtime error, 2 bad arguments.
#[derive(Parser, Debug)]
#[command(version, verbatim_doc_comment)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (see the line printed on stdout).
    #[arg(long, default_value_t = 8886)]
    port: u16,
    /// Directory for the log (created if missing).
    /// Default: $XDG_STATE_HOME/aeon-shell/foil-control, else ~/.local/state/aeon-shell/foil-control.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Most records kept; the oldest are evicted first.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_records: u64,
    /// Most bytes of records kept (log frames of live records), e.g. 256MiB or 1G.
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_size)]
    max_bytes: u64,
    /// Largest request body accepted; larger requests get 413 (e.g. 1MiB, 64K).
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_size)]
    max_body: u64,
    /// Dead bytes (evicted or replaced records) in the log that trigger a compaction
    /// (rewrite to a temp file, fsync, rename), e.g. 16MiB.
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = parse_size)]
    compact_threshold: u64,
    /// Seconds a client gets to send a whole request body; a slower (e.g. trickling chunked)
    /// body gets 408 and the connection is closed.
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// Seconds open connections get to finish after SIGTERM/ctrl-c.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    shutdown_grace: u64,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

/// Parses a size (`64K`, `4MiB`, `4096B`; the workspace's size rule, `aeon_cli::size`).
fn parse_size(s: &str) -> Result<u64, aeon_cli::size::SizeError> {
    aeon_cli::size::parse_size_nonzero(s)
}

fn default_data_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("aeon-shell/foil-control"));
    }
    let home =
        std::env::var_os("HOME").context("neither --data-dir, XDG_STATE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".local/state/aeon-shell/foil-control"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let data_dir = match args.data_dir {
        Some(d) => d,
        None => default_data_dir()?,
    };
    let store_cfg = StoreConfig {
        max_records: usize::try_from(args.max_records).unwrap_or(usize::MAX),
        max_bytes: args.max_bytes,
        compact_threshold: args.compact_threshold,
    };
    let (store, report) = Store::open(&data_dir, store_cfg)
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    tracing::info!(
        dir = %data_dir.display(),
        records = report.records,
        frames = report.frames,
        dropped_bytes = report.dropped_bytes,
        "replayed log"
    );
    let cfg = ServerConfig {
        max_body: usize::try_from(args.max_body).unwrap_or(usize::MAX),
        shutdown_grace: std::time::Duration::from_secs(args.shutdown_grace),
        body_read_timeout: std::time::Duration::from_secs(args.body_timeout),
        ..ServerConfig::default()
    };
    let state = AppState::new(store, cfg);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        tracing::info!(%addr, "listening");
        let mut out = std::io::stdout().lock();
        // A closed stdout is not fatal: the server still serves.
        let _ = writeln!(out, "foil-control listening on http://{addr}").and_then(|()| out.flush());
        drop(out);
        server::serve(listener, state, server::shutdown_signal()).await;
        anyhow::Ok(())
    })?;
    tracing::info!("stopped cleanly");
    Ok(())
}
