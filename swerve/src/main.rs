//! `swerve`: admits rootfs bases (signed BLAKE3 manifests) and runs commands inside them in fresh
//! namespaces ("slivers"). This file only parses arguments, calls the library
//! ([`swerve::cli`]) and maps the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use swerve::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    aeon_cli::init_logging_from("SWERVE_LOG", aeon_cli::LevelFilter::WARN, cli.verbosity);
    match cli::run(cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            if aeon_cli::is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("swerve: {err:#}");
            ExitCode::from(1)
        }
    }
}
