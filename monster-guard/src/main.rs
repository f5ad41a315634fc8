//! monster-guard CLI: parses arguments, calls the library ([`monster_guard::cli`]), maps the
//! result to an exit status. See the library docs (`monster-guard/src/lib.rs`) for the exit
//! statuses.

use std::process::ExitCode;

use clap::Parser;
use monster_guard::cli::{self, Cli};
use monster_guard::GuardError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    aeon_cli::init_logging(aeon_cli::LevelFilter::WARN, cli.verbosity);
    match cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("monster-guard: {err:#}");
            let code = err
                .chain()
                .find_map(|e| e.downcast_ref::<GuardError>())
                .map_or(monster_guard::EXIT_ERROR, GuardError::exit_code);
            ExitCode::from(code)
        }
    }
}
