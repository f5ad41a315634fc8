//! `moonshine`: generate text over stations, or serve an OpenAI-compatible API.
//!
//! Exit codes: 0 success (also when stdout is closed early), 2 error.
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = moonshine::cli::Args::parse_checked();
    // The gateway logs requests and session releases; the CLI keeps stderr for its own lines,
    // and the REPL for the chat: a warning there would land in the middle of a reply (the
    // REPL says itself what went wrong with a turn).
    let default = match &args.cmd {
        Some(moonshine::cli::Cmd::Serve(_)) => aeon_cli::LevelFilter::INFO,
        None if args.gen.repl() => aeon_cli::LevelFilter::ERROR,
        _ => aeon_cli::LevelFilter::WARN,
    };
    aeon_cli::init_logging(default, args.verbosity);
    match moonshine::cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moonshine: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
