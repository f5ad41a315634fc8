//! `moonshine`: generate text over stations, or serve an OpenAI-compatible API.
//!
//! Exit codes: 0 success (also when stdout is closed early), 2 error.
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = moonshine::cli::Args::parse();
    // The gateway logs requests and session releases; the CLI keeps stderr for its own lines.
    let default = if matches!(args.cmd, Some(moonshine::cli::Cmd::Serve(_))) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match moonshine::cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moonshine: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
