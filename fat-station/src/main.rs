//! `fat-station`: serve a KNOT model (or one layer range of it) over HTTP. See `cli.rs`.
//!
//! Exit codes: 0 clean shutdown, 2 bad arguments or model.

use std::process::ExitCode;

use clap::Parser;
use fat_station::cli::{self, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    // A station's stderr is its log: info (one access line per request) unless -q/-v/RUST_LOG.
    aeon_cli::init_logging(aeon_cli::LevelFilter::INFO, args.verbosity);
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fat-station: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
