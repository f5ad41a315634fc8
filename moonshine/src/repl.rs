//! The chat REPL: `moonshine --chat` on a terminal.
//!
//! Line editing and history (rustyline; the history is kept in
//! `$XDG_STATE_HOME/aeon-shell/moonshine-history`, else `~/.local/state/...`), commands that
//! never reach the model (`/help`, `/bye`, `/clear`, `/set`, `/show`), multi-line input between
//! `"""` lines, Ctrl-C during a reply stops the reply and keeps the conversation (the partial
//! reply stays in it, as shown), Ctrl-C at the prompt clears the line, Ctrl-D leaves. A reply
//! that breaks off (a station dies) is kept as Ctrl-C keeps one and ends with one line,
//! `[stopped: station URL unreachable: WHY]`; log lines stay off the chat (`main.rs` logs
//! errors only in the REPL unless -v or RUST_LOG asks for more).
//!
//! The pure parts (commands, `/set`, multi-line input) are functions tested below; the loop
//! is driven in a real terminal by `tests/repl.rs` (tmux).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;

use crate::chat::{ChatTemplate, Message};
use crate::generate::{Backend, Finish, GenError, GenOutcome, GenRequest, Generation, KvSession};
use crate::lookup::LookupParams;
use crate::sampling::SamplingParams;

/// What a turn runs with; `/set` changes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stops: Vec<String>,
    pub system: Option<String>,
    /// Print the turn's statistics on their own line after each reply.
    pub stats: bool,
    /// Speculative decoding with prompt-lookup drafts (`--lookup`).
    pub lookup: Option<LookupParams>,
}

/// A line that starts with `/`.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Help,
    Bye,
    Clear,
    Show,
    /// `/set KEY VALUE`, or `/set` alone (prints the settings).
    Set(Option<(String, String)>),
}

/// The commands' help, one per line.
pub const HELP: &str = "\
/help                 this list
/bye                  leave (also /exit, /quit, Ctrl-D)
/clear                forget the conversation (the system message stays)
/show                 the settings
/set KEY VALUE        change a setting: temperature, top_k, top_p, min_p, repeat_penalty,
                      repeat_last_n, seed, max_tokens, system (TEXT, or - for none),
                      stats (on/off)
\"\"\"                   start or end a message of several lines
Ctrl-C                stop a reply (the conversation is kept); at the prompt: clear the line";

/// Reads a command line (`/...`); `Err` says why it is not one (an unknown command).
pub fn parse_command(line: &str) -> Option<Result<Command, String>> {
    let rest = line.trim().strip_prefix('/')?;
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (rest, ""),
    };
    Some(match name {
        "help" | "?" => Ok(Command::Help),
        "bye" | "exit" | "quit" => Ok(Command::Bye),
        "clear" => Ok(Command::Clear),
        "show" => Ok(Command::Show),
        "set" if arg.is_empty() => Ok(Command::Set(None)),
        "set" => match arg.split_once(char::is_whitespace) {
            Some((k, v)) => Ok(Command::Set(Some((k.to_string(), v.trim().to_string())))),
            None => Err(format!("/set {arg} needs a value: /set {arg} VALUE")),
        },
        other => Err(format!("unknown command /{other}: /help lists them")),
    })
}

/// Applies `/set key value` to `s`; `Ok` is the line that confirms it.
pub fn apply_set(s: &mut Settings, key: &str, value: &str) -> Result<String, String> {
    fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
        v.parse()
            .map_err(|_| format!("{key} {v:?}: expected a number"))
    }
    let mut next = s.clone();
    match key {
        "temperature" | "temp" => next.sampling.temperature = num(key, value)?,
        "top_k" => next.sampling.top_k = num(key, value)?,
        "top_p" => next.sampling.top_p = num(key, value)?,
        "min_p" => next.sampling.min_p = num(key, value)?,
        "repeat_penalty" => next.sampling.repeat_penalty = num(key, value)?,
        "repeat_last_n" => next.sampling.repeat_last_n = num(key, value)?,
        "seed" => next.sampling.seed = num(key, value)?,
        "max_tokens" | "n" => match num::<usize>(key, value)? {
            0 => return Err("max_tokens must be at least 1".into()),
            n => next.max_tokens = n,
        },
        "system" => next.system = (value != "-").then(|| value.to_string()),
        "stats" => {
            next.stats = match value {
                "on" | "true" | "1" => true,
                "off" | "false" | "0" => false,
                _ => return Err(format!("stats {value:?}: expected on or off")),
            }
        }
        _ => {
            return Err(format!(
                "unknown setting {key:?}: temperature, top_k, top_p, min_p, repeat_penalty, \
                 repeat_last_n, seed, max_tokens, system, stats"
            ))
        }
    }
    next.sampling.validate().map_err(|e| e.to_string())?;
    *s = next;
    Ok(format!("set {key} {value}"))
}

/// The settings as `/show` prints them.
pub fn show(s: &Settings) -> String {
    let p = &s.sampling;
    format!(
        "temperature {} top_k {} top_p {} min_p {} repeat_penalty {} repeat_last_n {} seed {}\n\
         max_tokens {} stats {} system {}",
        p.temperature,
        p.top_k,
        p.top_p,
        p.min_p,
        p.repeat_penalty,
        p.repeat_last_n,
        p.seed,
        s.max_tokens,
        if s.stats { "on" } else { "off" },
        s.system.as_deref().map_or("-".into(), |t| format!("{t:?}")),
    )
}

/// Multi-line input: a line that starts with `"""` opens a message that ends at a line ending
/// with `"""` (the same line, when it is longer than the opening marker).
#[derive(Debug, Default)]
pub struct MultiLine {
    open: Option<Vec<String>>,
}

impl MultiLine {
    /// Whether a message is open (the prompt shows `... `).
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Feeds one line; `Some(text)` when it completes a message (a plain line is one).
    pub fn feed(&mut self, line: &str) -> Option<String> {
        match self.open.as_mut() {
            None => match line.strip_prefix("\"\"\"") {
                None => Some(line.to_string()),
                Some(rest) => match rest.strip_suffix("\"\"\"") {
                    Some(one) => Some(one.to_string()),
                    None => {
                        self.open = Some(vec![rest.to_string()]);
                        None
                    }
                },
            },
            Some(lines) => match line.strip_suffix("\"\"\"") {
                Some(last) => {
                    lines.push(last.to_string());
                    let text = lines.join("\n");
                    self.open = None;
                    Some(text.trim_matches('\n').to_string())
                }
                None => {
                    lines.push(line.to_string());
                    None
                }
            },
        }
    }
}

/// Set by SIGINT (Ctrl-C while a reply streams: the terminal is not in raw mode then).
static STOP: AtomicBool = AtomicBool::new(false);

/// Catches SIGINT for the rest of the process: it sets [`STOP`] instead of killing it.
/// Returns once the handler is installed.
fn catch_ctrl_c() -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return drop(tx.send(Err(e))),
            };
            rt.block_on(async move {
                use tokio::signal::unix::{signal, SignalKind};
                match signal(SignalKind::interrupt()) {
                    Ok(mut s) => {
                        let _ = tx.send(Ok(()));
                        while s.recv().await.is_some() {
                            STOP.store(true, Ordering::SeqCst);
                        }
                    }
                    Err(e) => drop(tx.send(Err(e))),
                }
            })
        })
        .context("starting the Ctrl-C thread")?;
    rx.recv()
        .context("the Ctrl-C thread ended")?
        .context("catching Ctrl-C")
}

/// Where the history lives between runs.
fn history_path() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let state = env("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("aeon-shell/moonshine-history"))
}

/// Writes to stdout now (a reply streams as it is made).
fn say(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes()).and_then(|()| o.flush());
}

/// Runs the REPL until /bye or Ctrl-D. `first` is a first user turn (`-c`).
pub fn run(b: &Backend, mut settings: Settings, first: Option<String>) -> Result<()> {
    let template = b.chat_template().context("loading the chat template")?;
    catch_ctrl_c()?;
    let mut rl = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let history = history_path();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    eprintln!(
        "chatting with {} (/help for commands, Ctrl-D or /bye to leave)",
        b.model_id
    );
    let mut chat = Chat {
        b,
        template,
        messages: Vec::new(),
        session: KvSession::new("chat"),
        turn: 0,
    };
    let mut multi = MultiLine::default();
    let mut pending = first;
    loop {
        let line = match pending.take() {
            Some(p) => p,
            None => match rl.readline(if multi.is_open() { "... " } else { ">>> " }) {
                Ok(l) => {
                    let _ = rl.add_history_entry(l.as_str());
                    l
                }
                Err(ReadlineError::Interrupted) => {
                    multi = MultiLine::default();
                    eprintln!("(Ctrl-D or /bye to leave)");
                    continue;
                }
                Err(ReadlineError::Eof) => break,
                Err(e) => return Err(e).context("reading a line"),
            },
        };
        // A command is a plain line; inside `"""` a `/` is text.
        let plain = !multi.is_open() && !line.starts_with("\"\"\"");
        let Some(text) = multi.feed(&line) else {
            continue;
        };
        if plain {
            if let Some(cmd) = parse_command(&text) {
                match cmd {
                    Ok(Command::Bye) => break,
                    Ok(Command::Help) => eprintln!("{HELP}"),
                    Ok(Command::Clear) => {
                        chat.messages.clear();
                        eprintln!("(conversation cleared)");
                    }
                    Ok(Command::Show) | Ok(Command::Set(None)) => eprintln!("{}", show(&settings)),
                    Ok(Command::Set(Some((k, v)))) => match apply_set(&mut settings, &k, &v) {
                        Ok(m) => eprintln!("({m})"),
                        Err(e) => eprintln!("error: {e}"),
                    },
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
        }
        if text.trim().is_empty() {
            continue;
        }
        if let Err(e) = chat.turn(&settings, text) {
            eprintln!("error: {e:#}");
        }
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = rl.save_history(h);
    }
    Ok(())
}

/// The conversation and its KV session on the stations.
struct Chat<'a> {
    b: &'a Backend,
    template: ChatTemplate,
    /// User and assistant turns (the system message is prepended per turn from the settings).
    messages: Vec<Message>,
    session: KvSession,
    turn: u64,
}

impl Chat<'_> {
    /// One user turn: render, prefill, stream the reply (Ctrl-C stops it), keep both.
    fn turn(&mut self, s: &Settings, user: String) -> Result<()> {
        self.turn += 1;
        self.messages.push(Message::new("user", user));
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(sys) = &s.system {
            all.push(Message::new("system", sys.clone()));
        }
        all.extend(self.messages.iter().cloned());
        let prompt = match self.b.chat_tokens(&self.template, &all) {
            Ok(p) => p,
            Err(e) => {
                self.messages.pop();
                return Err(e).context("rendering the chat template");
            }
        };
        let req = GenRequest {
            prompt,
            max_tokens: s.max_tokens,
            sampling: SamplingParams {
                seed: s.sampling.seed.wrapping_add(self.turn),
                ..s.sampling.clone()
            },
            stops: s.stops.clone(),
            logprobs: None,
            lookup: s.lookup.clone(),
            grammar: None,
        };
        STOP.store(false, Ordering::SeqCst);
        let stopped = || STOP.load(Ordering::SeqCst);
        // What reached the screen, so a failure mid-reply can end that line and keep it.
        let mut shown = String::new();
        let outcome = Generation::start(self.b, &mut self.session, &req, &stopped).and_then(|g| {
            g.run(|t| {
                if stopped() {
                    return false;
                }
                say(t);
                shown.push_str(t);
                true
            })
        });
        let o = match outcome {
            Ok(o) => o,
            Err(GenError::Cancelled { .. }) => {
                // Stopped during the prefill: nothing was said, the turn is forgotten.
                self.messages.pop();
                say("[stopped]\n");
                return Ok(());
            }
            Err(e) if shown.is_empty() => {
                // Nothing was said: the conversation is as it was before this turn.
                self.messages.pop();
                return Err(e).context("generating");
            }
            Err(e) => {
                // The reply broke off (a station died): as with Ctrl-C, what was shown stays
                // in the conversation, and the reason gets a line of its own.
                if !shown.ends_with('\n') {
                    say("\n");
                }
                say(&format!("[stopped: {}]\n", broke_off(&e)));
                self.messages.push(Message::new("assistant", shown));
                return Ok(());
            }
        };
        self.messages
            .push(Message::new("assistant", o.text.clone()));
        say("\n");
        match o.finish {
            Finish::Cancelled => say("[stopped]\n"),
            Finish::Length => say(&format!(
                "[cut at {} tokens: /set max_tokens N for longer replies]\n",
                s.max_tokens
            )),
            Finish::Stop => {}
        }
        if s.stats {
            eprintln!("{}", stats_line(self.b, self.turn, &o));
        }
        Ok(())
    }
}

/// Why a reply broke off, in a few words: `station http://HOST:PORT unreachable: connection
/// refused` rather than the client's full message (which names the route and asks whether a
/// station runs there).
pub fn broke_off(e: &GenError) -> String {
    use station_wire::client::ClientError;
    match e {
        GenError::Station(ClientError::Transport {
            base,
            why,
            unreachable: true,
            ..
        }) => format!("station {base} unreachable: {why}"),
        GenError::Station(ClientError::Transport { base, why, .. }) => {
            format!("station {base} stopped answering: {why}")
        }
        other => other.to_string(),
    }
}

/// A turn's statistics on one line: `turn N: sent S of T prompt tokens (R reused from the KV
/// cache), C tokens in X s (Y tok/s)`.
pub fn stats_line(b: &Backend, turn: u64, o: &GenOutcome) -> String {
    let n = o.completion_tokens(b);
    let secs = o.prefill_s + o.decode_s;
    format!(
        "turn {turn}: sent {} of {} prompt tokens ({} reused from the KV cache), {n} tokens in \
         {secs:.2} s ({:.1} tok/s)",
        o.prompt_sent,
        o.prompt_tokens,
        o.prompt_tokens - o.prompt_sent,
        n as f64 / secs.max(1e-9)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                repeat_penalty: 1.0,
                repeat_last_n: 64,
                seed: 1,
                min_p: 0.05,
                ..Default::default()
            },
            max_tokens: 128,
            stops: vec![],
            system: None,
            stats: false,
            lookup: None,
        }
    }

    #[test]
    fn commands_never_reach_the_model() {
        assert_eq!(parse_command("/help"), Some(Ok(Command::Help)));
        assert_eq!(parse_command("  /bye "), Some(Ok(Command::Bye)));
        assert_eq!(parse_command("/quit"), Some(Ok(Command::Bye)));
        assert_eq!(parse_command("/clear"), Some(Ok(Command::Clear)));
        assert_eq!(parse_command("/set"), Some(Ok(Command::Set(None))));
        assert_eq!(
            parse_command("/set system You are terse."),
            Some(Ok(Command::Set(Some((
                "system".into(),
                "You are terse.".into()
            )))))
        );
        assert_eq!(
            parse_command("/frob"),
            Some(Err("unknown command /frob: /help lists them".into()))
        );
        assert!(matches!(parse_command("/set top_k"), Some(Err(_))));
        assert_eq!(
            parse_command("hello /help"),
            None,
            "only a leading / is a command"
        );
    }

    #[test]
    fn set_changes_one_setting_and_refuses_bad_values_whole() {
        let mut s = settings();
        assert_eq!(
            apply_set(&mut s, "temperature", "0"),
            Ok("set temperature 0".into())
        );
        assert_eq!(s.sampling.temperature, 0.0);
        apply_set(&mut s, "max_tokens", "512").unwrap();
        apply_set(&mut s, "system", "Be brief.").unwrap();
        apply_set(&mut s, "stats", "on").unwrap();
        assert_eq!(
            (s.max_tokens, s.system.as_deref(), s.stats),
            (512, Some("Be brief."), true)
        );
        apply_set(&mut s, "system", "-").unwrap();
        assert_eq!(s.system, None);
        let before = s.clone();
        for (k, v) in [
            ("top_p", "0"),
            ("top_p", "x"),
            ("temperature", "-1"),
            ("max_tokens", "0"),
            ("stats", "maybe"),
            ("colour", "blue"),
        ] {
            assert!(apply_set(&mut s, k, v).is_err(), "{k} {v}");
        }
        assert_eq!(s, before, "a refused /set changes nothing");
    }

    #[test]
    fn a_broken_off_reply_names_the_station_in_a_few_words() {
        use station_wire::client::ClientError;
        let lost = |unreachable, why: &str| {
            GenError::Station(ClientError::Transport {
                url: "http://10.0.0.2:8080/forward".into(),
                base: "http://10.0.0.2:8080".into(),
                why: why.into(),
                unreachable,
            })
        };
        assert_eq!(
            broke_off(&lost(true, "connection refused")),
            "station http://10.0.0.2:8080 unreachable: connection refused"
        );
        assert_eq!(
            broke_off(&lost(false, "connection reset")),
            "station http://10.0.0.2:8080 stopped answering: connection reset"
        );
        let other = GenError::BadLogits { got: 3, want: 4 };
        assert_eq!(broke_off(&other), other.to_string());
    }

    #[test]
    fn triple_quotes_make_one_message_of_several_lines() {
        let mut m = MultiLine::default();
        assert_eq!(m.feed("hello"), Some("hello".into()));
        assert_eq!(m.feed("\"\"\"one line\"\"\""), Some("one line".into()));
        assert_eq!(m.feed("\"\"\"first"), None);
        assert!(m.is_open());
        assert_eq!(m.feed("/help"), None, "a command inside a message is text");
        assert_eq!(m.feed("last\"\"\""), Some("first\n/help\nlast".into()));
        assert!(!m.is_open());
        assert_eq!(m.feed("\"\"\""), None);
        assert_eq!(m.feed("a"), None);
        assert_eq!(m.feed("\"\"\""), Some("a".into()));
    }
}
