//! The command line: `moonshine [--oneoff] -c PROMPT ...`, `moonshine serve`, `moonshine mesh`.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use crate::chat::Message;
use crate::generate::{self, Backend, GenOutcome, GenRequest, KvSession};
use crate::lookup::LookupArgs;
use crate::sampling::SamplingParams;
use crate::target::TargetArgs;

/// Generate text over a chain of fat-stations, or serve an OpenAI-compatible API.
///
/// Examples:
///   moonshine --oneoff -c "The capital of France is" --mesh specs/mesh-3.json
///   moonshine --oneoff --tokens 785,6722,315,9625,374 --station http://127.0.0.1:8080
///   moonshine -c "Once upon a time" -n 64 --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7
///   moonshine --chat -c "What is the capital of France?"       (then more turns on stdin)
///   moonshine serve --listen 127.0.0.1:8000 --mesh specs/mesh-3.json
///
/// Text streams to stdout as it is generated; the last stderr line is
/// `N tokens in S s (X tok/s)` (-q: none). Sampling is greedy unless --temperature > 0;
/// --chat samples as llama-server does by default (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05).
///
/// --chat on a terminal is a REPL: line editing and history, /help /bye /clear /set /show,
/// multi-line messages between """ lines, Ctrl-C stops a reply and keeps the conversation,
/// Ctrl-D leaves. With stdin not a terminal, each line is one user turn.
///
/// Exit codes: 0 success (also when stdout is closed early), 2 error.
#[derive(Parser, Debug)]
#[command(version, about, long_about, verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

/// Generation flags (no subcommand).
#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// Prompt text (tokenized by the entry station). In --chat mode, the first user turn.
    #[arg(short = 'c', long = "prompt", conflicts_with = "tokens")]
    pub prompt: Option<String>,
    /// Prompt token ids, comma separated (when no tokenizer is available).
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// One stateless greedy step: print `PROMPT -> NEXT` and exit.
    #[arg(long)]
    pub oneoff: bool,
    /// Most tokens to generate (per turn in --chat).
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy (argmax) [default: 0; with --chat 0.8].
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens (0: all) [default: 0; with --chat 40].
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to P (1: all)
    /// [default: 1; with --chat 0.95].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only tokens at least P times as likely as the most likely one (0: off)
    /// [default: 0; with --chat 0.05].
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1: off; 1.1 is typical).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed: the same seed, prompt and settings give the same text (default: from the clock,
    /// printed on stderr).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text is generated (not printed); repeatable.
    #[arg(long = "stop")]
    pub stops: Vec<String>,
    /// Chat: wrap turns in the model's own chat template and keep a multi-turn conversation
    /// (one user turn per stdin line after -c) with its KV cache on the stations.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// --chat: print each turn's statistics (prompt tokens sent and reused, tokens, tok/s) on
    /// a line of their own on stderr after the reply.
    #[arg(long, requires = "chat")]
    pub stats: bool,
    /// Print one JSON object (ids, text, timing) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub lookup: LookupArgs,
}

impl GenArgs {
    /// Whether these flags start the REPL: --chat with a terminal on stdin, and no --json.
    pub fn repl(&self) -> bool {
        self.chat && !self.json && std::io::stdin().is_terminal()
    }
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Serve an OpenAI-compatible API (`POST /v1/chat/completions`, `/v1/completions`,
    /// `GET /v1/models`, also without `/v1`) and llama-server's routes (`/completion`,
    /// `/infill`, `/tokenize`, `/detokenize`, `/apply-template`, `/props`, `/slots`), with
    /// `/metrics` and `/health`, over the stations.
    Serve(Box<crate::serve::ServeArgs>),
    /// One command for a mesh on this machine: plan the layers over N stations, start them
    /// and the gateway, print its URL; Ctrl-C (or SIGTERM) stops them all.
    #[command(
        after_help = "Example:\n  moonshine up model.gguf --nodes 3 --port 8000    \
                            (then open the URL it prints)\n\n\
                            Exit codes: 0 stopped by a signal, 1 a station or the gateway \
                            exited, 2 bad arguments or a start that failed."
    )]
    Up(Box<crate::up::UpArgs>),
    /// Discover stations and form a mesh (`moonshine mesh --help`).
    #[command(disable_help_flag = true)]
    Mesh {
        /// Arguments for `moonshine mesh`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

impl Args {
    /// Parses the process's arguments; prints clap's message and exits 2 on a bad command line.
    pub fn parse_checked() -> Args {
        Args::try_parse_checked_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `args` and refuses a generation flag given before a subcommand
    /// (`moonshine --station URL serve`: the gateway has its own). clap's
    /// `args_conflicts_with_subcommands` would refuse the global `-q`/`-v` there too
    /// (`moonshine -q serve`), so the rule is checked here for the non-global flags only.
    pub fn try_parse_checked_from<I, T>(args: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Args::command();
        let m = cmd.try_get_matches_from_mut(llama_server_spellings(args))?;
        if let Some((sub, _)) = m.subcommand() {
            let misplaced = cmd.get_arguments().find(|a| {
                !a.is_global_set()
                    && m.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine)
            });
            if let Some(a) = misplaced {
                let flag = a
                    .get_long()
                    .map(|l| format!("--{l}"))
                    .unwrap_or_else(|| a.get_id().to_string());
                return Err(cmd.error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "{flag} belongs after the subcommand: moonshine {sub} {flag} ... \
                         (before it, it is a flag of plain generation)"
                    ),
                ));
            }
        }
        Args::from_arg_matches(&m)
    }
}

/// Runs the parsed command line.
pub fn run(args: Args) -> Result<ExitCode> {
    match args.cmd {
        Some(Cmd::Serve(s)) => crate::serve::run(*s).map(|()| ExitCode::SUCCESS),
        Some(Cmd::Mesh { args }) => Ok(crate::mesh_cmd::run(args)),
        Some(Cmd::Up(u)) => crate::up::run(*u),
        None => run_gen(&args.target, &args.gen, args.verbosity.quiet),
    }
}

/// The sampling flags, with the defaults of the mode: greedy for plain generation, and for
/// --chat llama-server's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
fn sampling(g: &GenArgs) -> Result<SamplingParams> {
    let (temperature, top_k, top_p, min_p) = if g.chat {
        (0.8, 40, 0.95, 0.05)
    } else {
        (0.0, 0, 1.0, 0.0)
    };
    let temperature = g.temperature.unwrap_or(temperature);
    let seed = g.seed.unwrap_or_else(|| {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        if temperature > 0.0 && !g.chat {
            eprintln!("seed: {s}");
        }
        s
    });
    let p = SamplingParams {
        temperature,
        top_k: g.top_k.unwrap_or(top_k),
        top_p: g.top_p.unwrap_or(top_p),
        min_p: g.min_p.unwrap_or(min_p),
        repeat_penalty: g.repeat_penalty,
        repeat_last_n: g.repeat_last_n,
        seed,
        ..Default::default()
    };
    p.validate()?;
    Ok(p)
}

fn run_gen(t: &TargetArgs, g: &GenArgs, quiet: bool) -> Result<ExitCode> {
    if g.prompt.is_none() && g.tokens.is_none() && !g.chat {
        bail!("nothing to do: give a prompt with -c TEXT (or --tokens IDS, or --chat); see --help");
    }
    if g.oneoff && g.chat {
        bail!("--oneoff and --chat do not go together");
    }
    let b = t.connect()?;
    if g.oneoff {
        return run_oneoff(&b, g);
    }
    if g.max_tokens == 0 {
        bail!("-n must be at least 1");
    }
    let params = sampling(g)?;
    let lookup = g.lookup.params().map_err(anyhow::Error::msg)?;
    if g.chat {
        if g.repl() {
            let settings = crate::repl::Settings {
                sampling: params,
                max_tokens: g.max_tokens,
                stops: g.stops.clone(),
                system: g.system.clone(),
                stats: g.stats,
                lookup,
            };
            crate::repl::run(&b, settings, g.prompt.clone())?;
            return Ok(ExitCode::SUCCESS);
        }
        return run_chat(&b, g, params, lookup);
    }
    let prompt = match (&g.tokens, &g.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => b.tokenize(text, None).context("tokenizing the prompt")?,
        (None, None) => unreachable!("checked above"),
    };
    let req = GenRequest {
        prompt,
        max_tokens: g.max_tokens,
        sampling: params,
        stops: g.stops.clone(),
        logprobs: None,
        lookup,
        grammar: None,
    };
    let mut session = KvSession::new("moonshine");
    let mut out = Output::new(g.json);
    if !g.json {
        if let Some(p) = &g.prompt {
            out.write(p);
        }
    }
    let o = generate::generate(&b, &mut session, &req, |s| out.write(s)).context("generating")?;
    finish_line(&b, &req.prompt, &o, &mut out, g.json)?;
    if !quiet {
        print_stats(&b, &o);
    }
    Ok(ExitCode::SUCCESS)
}

/// Stdout that notices a closed pipe (the reader went away: stop, exit 0).
struct Output {
    quiet: bool,
    closed: bool,
}

impl Output {
    fn new(quiet: bool) -> Output {
        Output {
            quiet,
            closed: false,
        }
    }

    /// Writes and flushes; `false` once stdout is closed.
    fn write(&mut self, s: &str) -> bool {
        if self.quiet || self.closed {
            return !self.closed;
        }
        let mut o = std::io::stdout().lock();
        if o.write_all(s.as_bytes()).and_then(|()| o.flush()).is_err() {
            self.closed = true;
        }
        !self.closed
    }
}

fn finish_line(
    b: &Backend,
    prompt: &[u32],
    o: &GenOutcome,
    out: &mut Output,
    json: bool,
) -> Result<()> {
    if json {
        let v = serde_json::json!({
            "text": o.text, "tokens": o.tokens, "prompt": prompt, "prompt_tokens": o.prompt_tokens, "prompt_sent": o.prompt_sent,
            "completion_tokens": o.completion_tokens(b), "finish_reason": o.finish, "prefill_s": o.prefill_s,
            "decode_s": o.decode_s, "timing": o.timing, "trips": o.trips, "drafted": o.drafted,
            "accepted": o.accepted, "tokens_per_trip": o.tokens_per_trip(),
        });
        println!("{v}");
    } else {
        out.write("\n");
    }
    Ok(())
}

/// The statistics lines on stderr; the last is `N tokens in S s (X tok/s)`.
fn print_stats(b: &Backend, o: &GenOutcome) {
    let n = o.completion_tokens(b);
    let s = o.prefill_s + o.decode_s;
    eprintln!(
        "prefill: {} of {} prompt tokens sent in {:.2} s",
        o.prompt_sent, o.prompt_tokens, o.prefill_s
    );
    let hops: Vec<String> = o
        .timing
        .hops
        .iter()
        .map(|(u, l, ms)| format!("{u} {l} {ms:.0} ms"))
        .collect();
    eprintln!(
        "station compute: {:.0} ms over {} steps ({})",
        o.timing.compute_ms(),
        o.timing.steps,
        hops.join(", ")
    );
    if o.drafted > 0 {
        eprintln!(
            "lookup: {} of {} drafted tokens kept, {:.2} tokens per trip over {} trips",
            o.accepted,
            o.drafted,
            o.tokens_per_trip(),
            o.trips
        );
    }
    eprintln!(
        "{n} tokens in {s:.2} s ({:.1} tok/s)",
        n as f64 / s.max(1e-9)
    );
}

fn run_oneoff(b: &Backend, g: &GenArgs) -> Result<ExitCode> {
    let tokens = match (&g.tokens, &g.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => b
            .tokenize(text, None)
            .context("tokenizing the prompt (no tokenizer? use --tokens)")?,
        (None, None) => bail!("--oneoff needs -c TEXT or --tokens IDS"),
    };
    let r = generate::oneoff(b, &tokens).context("running the chain")?;
    if g.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    for (url, layers, ms) in &r.timing.hops {
        eprintln!("hop {url} layers {layers}: {ms:.1} ms compute");
    }
    eprintln!(
        "argmax {} logit {:.3} in {:.0} ms",
        r.next_id, r.logit, r.ms
    );
    let shown = |t: &str| {
        if t.trim().is_empty() {
            format!("{t:?}")
        } else {
            t.trim().to_string()
        }
    };
    let line = match (&g.prompt, &r.next_text) {
        (Some(p), Some(t)) if g.tokens.is_none() => format!("{p} -> {}", shown(t)),
        (_, Some(t)) => format!("{} -> {} {t:?}", join(&tokens), r.next_id),
        (_, None) => format!("{} -> {}", join(&tokens), r.next_id),
    };
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    Ok(ExitCode::SUCCESS)
}

fn join(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// --chat with stdin not a terminal (a script, a pipe): one user turn per line, replies on
/// stdout one after another; with --stats each turn's statistics on stderr; a reply cut by
/// -n is marked on stderr.
fn run_chat(
    b: &Backend,
    g: &GenArgs,
    params: SamplingParams,
    lookup: Option<crate::lookup::LookupParams>,
) -> Result<ExitCode> {
    let template = b.chat_template().context("loading the chat template")?;
    let mut messages = Vec::new();
    if let Some(s) = &g.system {
        messages.push(Message::new("system", s.clone()));
    }
    let mut session = KvSession::new("chat");
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    let mut first = g.prompt.clone();
    let mut out = Output::new(g.json);
    for turn in 1.. {
        let user = match first.take() {
            Some(p) => p,
            None => {
                if tty {
                    eprint!("> ");
                }
                match lines.next() {
                    Some(l) => l.context("reading stdin")?,
                    None => break,
                }
            }
        };
        if user.trim().is_empty() {
            continue;
        }
        messages.push(Message::new("user", user));
        let prompt = b
            .chat_tokens(&template, &messages)
            .context("rendering the chat template")?;
        let req = GenRequest {
            prompt,
            max_tokens: g.max_tokens,
            sampling: SamplingParams {
                seed: params.seed.wrapping_add(turn),
                ..params.clone()
            },
            stops: g.stops.clone(),
            logprobs: None,
            lookup: lookup.clone(),
            grammar: None,
        };
        let o =
            generate::generate(b, &mut session, &req, |s| out.write(s)).context("generating")?;
        // The reply's newline first: the statistics never run on from the reply's text.
        finish_line(b, &req.prompt, &o, &mut out, g.json)?;
        if o.finish == generate::Finish::Length {
            eprintln!(
                "[turn {turn} cut at {} tokens: -n N for longer replies]",
                g.max_tokens
            );
        }
        if g.stats {
            eprintln!("{}", crate::repl::stats_line(b, turn, &o));
        }
        messages.push(Message::new("assistant", o.text.clone()));
        if out.closed {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// llama-server's two-letter short flag `-np N` (clap's short flags are one letter), given
/// after `serve`, read as `--parallel N`; anything before `serve` is left as it is.
fn llama_server_spellings<I, T>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut serving = false;
    args.into_iter()
        .map(|a| {
            let a: std::ffi::OsString = a.into();
            if serving && a == "-np" {
                return "--parallel".into();
            }
            if a == "serve" {
                serving = true;
            }
            a
        })
        .collect()
}
