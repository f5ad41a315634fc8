//! What every binary of the workspace shares on its command line: `-v/--verbose` and
//! `-q/--quiet` ([`Verbosity`], flattened into each tool's arguments) and logging to stderr
//! ([`init_logging`]); how a tool's result becomes its exit code ([`exit_code`]); and byte sizes
//! as users type them ([`size`]).
//!
//! The rule, the same in every tool:
//! - each tool has a default level (`warn` for the one-shot tools, `info` for servers, whose
//!   stderr is their log); `-v` raises it one step (warn -> info -> debug -> trace), `-vv` two;
//!   `-q` lowers it to `error` and tells the tool to drop its progress and statistics lines;
//! - without `-v`/`-q`, the tool's environment variable (`RUST_LOG`; swerve's `SWERVE_LOG`)
//!   decides when set, in `tracing_subscriber`'s `EnvFilter` syntax;
//! - colour (ANSI escapes) only when stderr is a terminal, never into a redirected log.

pub mod size;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::ArgAction;
pub use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::filter::Targets;

/// `-v/--verbose` and `-q/--quiet`, for `#[command(flatten)]` (global: they work after a
/// subcommand too).
#[derive(clap::Args, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verbosity {
    /// More on stderr: each -v one log level more than the tool's default (warn, info, debug,
    /// trace).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Less on stderr: errors only (no warnings, progress or statistics).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// Log levels from least to most, the steps `-v` climbs.
const LEVELS: [LevelFilter; 5] = [
    LevelFilter::ERROR,
    LevelFilter::WARN,
    LevelFilter::INFO,
    LevelFilter::DEBUG,
    LevelFilter::TRACE,
];

impl Verbosity {
    /// The level for a tool whose default is `default`, or `None` when neither flag was
    /// given (the environment variable, else `default`, decides).
    pub fn level(&self, default: LevelFilter) -> Option<LevelFilter> {
        if self.quiet {
            return Some(LevelFilter::ERROR);
        }
        if self.verbose == 0 {
            return None;
        }
        let at = LEVELS.iter().position(|&l| l == default).unwrap_or(1);
        Some(LEVELS[(at + self.verbose as usize).min(LEVELS.len() - 1)])
    }
}

/// Installs the global logger: stderr, `default` level adjusted by `v` (see the module's
/// rule), `RUST_LOG` when neither flag is given, ANSI colour only on a terminal.
pub fn init_logging(default: LevelFilter, v: Verbosity) {
    init_logging_from("RUST_LOG", default, v)
}

/// [`init_logging`] with the tool's own environment variable in place of `RUST_LOG`. The
/// variable is read in `tracing_subscriber`'s `Targets` syntax (`debug`,
/// `fat_station=debug,hyper=warn`): `Targets` rather than `EnvFilter` keeps the regex engine
/// out of the binaries (about 0.3 MB on aarch64). One it cannot read is named in a warning.
pub fn init_logging_from(env: &str, default: LevelFilter, v: Verbosity) {
    use tracing_subscriber::prelude::*;
    let spec = std::env::var(env).unwrap_or_default();
    let (filter, bad) = filter(&spec, default, v);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(filter)
        .init();
    if let Some(e) = bad {
        tracing::warn!("{env}={spec:?} not understood ({e}); logging at {default}");
    }
}

/// The filter for `spec` (the environment variable's value) under the module's rule, and the
/// parse error when `spec` was used and did not parse.
pub fn filter(spec: &str, default: LevelFilter, v: Verbosity) -> (Targets, Option<String>) {
    let plain = Targets::new().with_default(default);
    if let Some(l) = v.level(default) {
        return (Targets::new().with_default(l), None);
    }
    if spec.trim().is_empty() {
        return (plain, None);
    }
    match spec.parse::<Targets>() {
        Ok(t) => (t, None),
        Err(e) => (plain, Some(e.to_string())),
    }
}

/// Whether `err` comes from writing to a closed stdout (`tool | head`): not a failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The one-shot tools' exit rule: the tool's own code on success, 0 when stdout was closed
/// under it, else `tool: error: ...` (the whole context chain on one line) and `on_error`.
pub fn exit_code(tool: &str, result: anyhow::Result<ExitCode>, on_error: u8) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{tool}: error: {err:#}");
            ExitCode::from(on_error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(verbose: u8, quiet: bool) -> Verbosity {
        Verbosity { verbose, quiet }
    }

    #[test]
    fn each_v_is_one_level_more_and_q_is_errors_only() {
        let w = LevelFilter::WARN;
        assert_eq!(
            v(0, false).level(w),
            None,
            "no flag: the environment decides"
        );
        assert_eq!(v(1, false).level(w), Some(LevelFilter::INFO));
        assert_eq!(v(2, false).level(w), Some(LevelFilter::DEBUG));
        assert_eq!(v(9, false).level(w), Some(LevelFilter::TRACE));
        assert_eq!(
            v(1, false).level(LevelFilter::INFO),
            Some(LevelFilter::DEBUG)
        );
        assert_eq!(
            v(0, true).level(LevelFilter::INFO),
            Some(LevelFilter::ERROR)
        );
    }

    #[test]
    fn flags_parse_after_a_subcommand_and_refuse_both() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            v: Verbosity,
            #[command(subcommand)]
            cmd: Option<Sub>,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Run,
        }
        let c = Cli::try_parse_from(["t", "run", "-vv"]).unwrap();
        assert_eq!(c.v, v(2, false));
        let c = Cli::try_parse_from(["t", "-q", "run"]).unwrap();
        assert_eq!(c.v, v(0, true));
        assert!(Cli::try_parse_from(["t", "-q", "-v"]).is_err());
    }

    #[test]
    fn the_environment_decides_only_without_flags() {
        use tracing::Level;
        let w = LevelFilter::WARN;
        let (t, bad) = filter("fat_station=debug", w, v(0, false));
        assert!(t.would_enable("fat_station", &Level::DEBUG) && bad.is_none());
        let (t, _) = filter("fat_station=debug", w, v(0, true));
        assert!(!t.would_enable("fat_station", &Level::WARN), "-q wins");
        assert!(t.would_enable("fat_station", &Level::ERROR));
        let (t, bad) = filter("", w, v(1, false));
        assert!(t.would_enable("x", &Level::INFO) && !t.would_enable("x", &Level::DEBUG));
        assert!(bad.is_none());
        let (t, bad) = filter("=nonsense=", w, v(0, false));
        assert_eq!(t.default_level(), Some(w));
        assert!(bad.is_some(), "an unreadable RUST_LOG is reported");
    }
}
