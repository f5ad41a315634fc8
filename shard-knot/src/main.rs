//! `shard-knot`: split a KNOT into per-node shards and inspect them. See `cli.rs`.
//!
//! Exit codes: 0 success; 2 usage, I/O or any other error. A closed stdout exits 0.

use shard_knot::cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = <cli::Args as clap::Parser>::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, args.verbosity);
    aeon_cli::exit_code("shard-knot", cli::run(args), 2)
}
