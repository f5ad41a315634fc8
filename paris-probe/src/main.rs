//! `paris-probe`: does the model answer the expected next token? See `cli.rs`.
//!
//! Exit codes: 0 PASS (argmax == expected), 1 FAIL, 2 error.

use std::process::ExitCode;

use clap::Parser;
use paris_probe::cli::{self, Args};

pub fn main() -> ExitCode {
    let args = Args::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, args.verbosity);
    match cli::run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("paris-probe: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
