//! `moonshine --chat` in a real terminal (tmux: send-keys to type, capture-pane to read the
//! screen): Ctrl-C during a reply stops it and keeps the conversation, Up recalls the last
//! line, /set changes a setting, a reply cut by the token limit is marked, /bye leaves; a
//! station that dies mid-reply ends the reply with one line of its own and no log line lands
//! in the chat. Uses SmolLM2-135M (the smallest cached model) for speed.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

/// A tmux server of its own (`-L`), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn keys(&self, keys: &[&str]) {
        let o = self.cmd(&[&["send-keys", "-t", "t"], keys].concat());
        assert!(o.status.success(), "send-keys {keys:?}");
    }

    fn screen(&self) -> String {
        let o = self.cmd(&["capture-pane", "-p", "-t", "t", "-S", "-200"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Waits until `f(screen)` holds; panics with the screen after `secs`.
    fn wait(&self, what: &str, secs: u64, f: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "waited {secs} s for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn alive(&self) -> bool {
        self.cmd(&["has-session", "-t", "t"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// The last line of the screen that is not blank.
fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// tmux, or `None` (skip) unless `AEON_REQUIRE_MODELS=1` (scripts/test.sh installs it).
fn tmux_present() -> bool {
    let ok = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            !test_support::required(),
            "tmux is missing: apt-get install tmux (scripts/test.sh does)"
        );
        eprintln!("skipping: tmux not found");
    }
    ok
}

/// Starts `moonshine --chat` with `args` in a fresh tmux server named after `tag`, with its
/// history in `home`, and waits for the prompt.
fn start_repl(tag: &str, home: &std::path::Path, args: &[&str]) -> Tmux {
    let t = Tmux {
        socket: format!("moonshine-{tag}-{}", std::process::id()),
    };
    // The command as separate arguments: tmux runs it without a shell, so Ctrl-C reaches
    // moonshine alone (a `sh -c` in the pane's process group would die of it and close the pane).
    let h = home.display().to_string();
    let (home_env, state_env) = (format!("HOME={h}"), format!("XDG_STATE_HOME={h}"));
    let mut cmd = vec![
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        "150",
        "-y",
        "50",
        "env",
        &home_env,
        &state_env,
        env!("CARGO_BIN_EXE_moonshine"),
        "--chat",
    ];
    cmd.extend_from_slice(args);
    let o = t.cmd(&cmd);
    assert!(o.status.success(), "tmux new-session: {o:?}");
    t.wait("the prompt", 30, |s| last_line(s) == ">>>");
    t
}

#[test]
fn ctrl_c_stops_a_reply_and_keeps_the_chat_and_up_recalls_a_line() {
    let Some(model) = test_support::model(test_support::SMOLLM2) else {
        return;
    };
    let Some(bin) = station_bin() else { return };
    if !tmux_present() {
        return;
    }
    let st = station(&bin, &model, &[]);
    let home = tempfile::tempdir().expect("tempdir");
    let t = start_repl(
        "repl",
        home.path(),
        &[
            "--stats",
            // Greedy: SmolLM2 then counts for as long as it is let (sampled at the chat default
            // 0.8 it sometimes answers in 27 tokens, before Ctrl-C can stop anything).
            "--temperature",
            "0",
            "-n",
            "2000",
            "--station",
            &st.url,
        ],
    );

    // A long reply, stopped by Ctrl-C once it has begun.
    let ask = "Count from 1 to 500, one number per line.";
    t.keys(&[ask, "Enter"]);
    t.wait("the reply to begin", 60, |s| {
        s.lines()
            .skip_while(|l| !l.contains(ask))
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .count()
            >= 3
    });
    t.keys(&["C-c"]);
    let s = t.wait("the stopped reply and a new prompt", 30, |s| {
        s.contains("[stopped]") && last_line(s) == ">>>"
    });
    assert!(t.alive(), "Ctrl-C killed the REPL:\n{s}");

    // Up recalls the line; Ctrl-U clears it again.
    t.keys(&["Up"]);
    t.wait("the recalled line", 10, |s| {
        last_line(s) == format!(">>> {ask}")
    });
    t.keys(&["C-u"]);
    t.wait("a cleared line", 10, |s| last_line(s) == ">>>");

    // /set reaches the settings, not the model; the next turn reuses the first one (the
    // conversation was kept) and is cut at 4 tokens, visibly.
    t.keys(&["/set max_tokens 4", "Enter"]);
    t.wait("the /set confirmation", 10, |s| {
        s.contains("(set max_tokens 4)")
    });
    t.keys(&["And then?", "Enter"]);
    let s = t.wait("turn 2's statistics", 60, |s| s.contains("turn 2: sent"));
    let stats = s
        .lines()
        .find(|l| l.starts_with("turn 2: sent"))
        .expect("stats line");
    let reused: usize = stats
        .split('(')
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reused count in {stats:?}"));
    assert!(
        reused > 10,
        "turn 2 reuses turn 1 from the KV cache: {stats}"
    );
    assert!(s.contains("[cut at 4 tokens"), "the cut is marked:\n{s}");

    // /help is answered by the REPL; /bye leaves with the terminal in order.
    t.keys(&["/help", "Enter"]);
    t.wait("the help", 10, |s| {
        s.contains("/bye") && s.contains("/set KEY VALUE")
    });
    t.keys(&["/bye", "Enter"]);
    let t0 = Instant::now();
    while t.alive() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "/bye did not leave:\n{}",
            t.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let history = std::fs::read_to_string(home.path().join("aeon-shell/moonshine-history"))
        .expect("the history is kept between runs");
    assert!(history.contains(ask), "{history}");
}

/// Issue 39: a station that died mid-reply glued `error: generating: ...` onto the partial
/// text, and after it came back the client's WARN log line (`stations lost the session`)
/// landed in the chat. Now the partial reply ends its line, the reason is one line
/// (`[stopped: station URL ...]`), and no log line reaches the terminal.
#[test]
fn a_station_dying_mid_reply_stops_it_on_a_line_of_its_own_and_no_log_line_lands_in_the_chat() {
    let Some(model) = test_support::model(test_support::SMOLLM2) else {
        return;
    };
    let Some(bin) = station_bin() else { return };
    if !tmux_present() {
        return;
    }
    // A fixed port, so that the station can come back where the REPL looks for it.
    let port = test_support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let knot = model.to_str().expect("utf-8 path");
    let start = || spawn_with_env(&bin, &["--knot", knot, "--listen", &listen], &[]);
    let mut st = start();
    let home = tempfile::tempdir().expect("tempdir");
    let t = start_repl(
        "died",
        home.path(),
        &["--temperature", "0", "-n", "2000", "--station", &st.url],
    );

    let ask = "Write a long story about a cat who learns to fly.";
    t.keys(&[ask, "Enter"]);
    t.wait("the reply to begin", 60, |s| {
        s.lines()
            .skip_while(|l| !l.contains(ask))
            .skip(1)
            .map(str::len)
            .sum::<usize>()
            >= 40
    });
    let _ = st.child.kill();
    let _ = st.child.wait();
    let s = t.wait("the stopped reply and a new prompt", 30, |s| {
        s.contains("[stopped:") && last_line(s) == ">>>"
    });
    let stop = s
        .lines()
        .find(|l| l.contains("[stopped:"))
        .expect("the stop line");
    assert!(
        stop.starts_with(&format!("[stopped: station {}", st.url)) && stop.ends_with(']'),
        "the reason is a line of its own, naming the station:\n{s}"
    );
    assert!(!s.contains("error: generating"), "{s}");
    let reply: Vec<&str> = s
        .lines()
        .skip_while(|l| !l.contains(ask))
        .skip(1)
        .take_while(|l| !l.contains("[stopped:"))
        .collect();
    assert!(
        reply.iter().any(|l| !l.trim().is_empty()),
        "the partial reply stays on the screen:\n{s}"
    );

    // The station comes back (as systemd would restart it) without the conversation's KV
    // session: the next turn sends the whole conversation again, and says nothing about it
    // in the chat (the client's warning would have).
    drop(st);
    let _st = start();
    t.keys(&["/set max_tokens 8", "Enter"]);
    t.wait("the /set confirmation", 10, |s| {
        s.contains("(set max_tokens 8)")
    });
    t.keys(&["Thanks. Now say hello.", "Enter"]);
    let s = t.wait("the second reply and a new prompt", 60, |s| {
        let after: Vec<&str> = s
            .lines()
            .skip_while(|l| !l.contains("Now say hello."))
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        after.len() >= 2 && last_line(s) == ">>>"
    });
    for bad in ["WARN", "ERROR", "INFO", "moonshine::"] {
        assert!(
            !s.contains(bad),
            "a log line landed in the chat ({bad}):\n{s}"
        );
    }
    t.keys(&["/bye", "Enter"]);
}
