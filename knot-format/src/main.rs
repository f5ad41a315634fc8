//! `knot`: import, inspect and verify KNOT model files. See `cli.rs` for the commands.
//!
//! Exit codes: 0 success; 1 `verify` found a corrupt or hostile file; 2 usage, I/O or any
//! other error. A closed stdout (broken pipe) exits 0.

use knot_format::cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = <cli::Args as clap::Parser>::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, args.verbosity);
    aeon_cli::exit_code("knot", cli::run(args), 2)
}
