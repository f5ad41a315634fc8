//! `parity-station-handoff`: split inference must equal monolithic inference bit for bit.
//! See `cli.rs`.
//!
//! Exit codes: 0 `OVERALL: PASS`; 1 a split differed; 2 usage, I/O or engine errors.
//! A closed stdout exits 0.

use parity_station_handoff::cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = <cli::Args as clap::Parser>::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, args.verbosity);
    aeon_cli::exit_code("parity-station-handoff", cli::run(args), 2)
}
