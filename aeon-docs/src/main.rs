//! `aeon-docs [OUT_DIR]`: writes the man pages and shell completions of every binary into
//! OUT_DIR (default `target/docs`); see the library for the layout.
//!
//! Exit codes: 0 written (also `--help`, `--version`); 2 bad arguments (clap's message: an
//! unknown flag is refused, never taken for a folder) or an I/O error.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = aeon_docs::cli::Args::parse();
    match aeon_docs::generate(&args.out) {
        Ok(files) => {
            println!("aeon-docs: {} files in {}", files.len(), args.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aeon-docs: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
