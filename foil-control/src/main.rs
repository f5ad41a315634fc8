//! `foil-control`: the residue collector server. See `cli.rs`.
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM or ctrl-c), 1 on a runtime error (data
//! directory unusable or locked, address in use), 2 on bad arguments.

use std::process::ExitCode;

use clap::Parser;
use foil_control::cli::{self, Args};

pub fn main() -> ExitCode {
    let args = Args::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::INFO, args.verbosity);
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("foil-control: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
