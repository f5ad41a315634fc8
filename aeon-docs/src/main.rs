//! `aeon-docs [OUT_DIR]`: writes the man pages and shell completions of every binary into
//! OUT_DIR (default `target/docs`); see the library for the layout.
//!
//! Exit codes: 0 written; 2 an argument or I/O error.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let out = args
        .next()
        .map_or_else(|| PathBuf::from("target/docs"), PathBuf::from);
    if args.next().is_some() {
        eprintln!("usage: aeon-docs [OUT_DIR]");
        return ExitCode::from(2);
    }
    match aeon_docs::generate(&out) {
        Ok(files) => {
            println!("aeon-docs: {} files in {}", files.len(), out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aeon-docs: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
