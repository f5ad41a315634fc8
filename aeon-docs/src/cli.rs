//! The `aeon-docs` command line.

use std::path::PathBuf;

use clap::Parser;

/// Write the man pages and shell completions of every aeon-shell binary (`make docs`).
///
/// Each is generated from the binary's own clap definition, so it never drifts from --help.
///
/// Examples:
///   aeon-docs
///   aeon-docs /tmp/docs
///   man -l target/docs/man/moonshine.1
///
/// Layout: OUT_DIR/man/NAME.1 and NAME-SUBCOMMAND.1, OUT_DIR/completions/{bash,zsh,fish}/.
///
/// Exit codes: 0 written; 2 bad arguments or an I/O error.
#[derive(Debug, Parser)]
// Verbatim: clap would reflow the examples into one line.
#[command(name = "aeon-docs", version, about, long_about, verbatim_doc_comment)]
pub struct Args {
    /// Folder to write into (created if missing).
    #[arg(value_name = "OUT_DIR", default_value = "target/docs")]
    pub out: PathBuf,
}
