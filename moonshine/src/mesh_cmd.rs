//! `moonshine mesh discover|form`: owned by the mesh engineer (placeholder until then).

use std::process::ExitCode;

/// Runs `moonshine mesh ARGS...`; `args` are everything after `mesh`.
pub fn run(args: Vec<String>) -> ExitCode {
    let _ = args;
    eprintln!("moonshine mesh: not built yet");
    ExitCode::from(2)
}
