//! Shared by moonshine's integration tests: the real model, station processes, the CLI.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// The model cache (`AEON_MODELS_DIR`, default `~/.cache/aeon-shell/models`).
pub fn models_dir() -> PathBuf {
    match std::env::var_os("AEON_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/aeon-shell/models"),
    }
}

/// The Qwen2.5-Coder-0.5B KNOT.
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.knot";

fn required() -> bool {
    std::env::var("AEON_REQUIRE_MODELS").as_deref() == Ok("1")
}

/// The station binary: `FAT_STATION_BIN`, else the workspace's `target/release/fat-station`.
pub fn station_bin() -> Option<PathBuf> {
    let p = match std::env::var_os("FAT_STATION_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/fat-station"),
    };
    if p.exists() {
        return Some(p);
    }
    if required() {
        panic!(
            "{} is missing and AEON_REQUIRE_MODELS=1: cargo build --release -p fat-station",
            p.display()
        );
    }
    eprintln!(
        "skipping: {} not found (cargo build --release -p fat-station, or set FAT_STATION_BIN)",
        p.display()
    );
    None
}

/// The cached Qwen KNOT and the station binary, or `None` (the test skips) when either is
/// absent and `AEON_REQUIRE_MODELS` is not 1.
pub fn setup() -> Option<(PathBuf, PathBuf)> {
    let m = models_dir().join(QWEN);
    if !m.exists() {
        if required() {
            panic!(
                "{} is missing and AEON_REQUIRE_MODELS=1: run scripts/fetch-model.sh",
                m.display()
            );
        }
        eprintln!(
            "skipping: {} not found (run scripts/fetch-model.sh)",
            m.display()
        );
        return None;
    }
    Some((m, station_bin()?))
}

/// A child process killed on drop, with the URL it printed.
pub struct Proc {
    pub child: Child,
    pub url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin args --listen 127.0.0.1:0` and waits for the line with its `http://` URL.
pub fn spawn_listening(bin: &std::path::Path, args: &[&str]) -> Proc {
    spawn_with_env(bin, &[args, &["--listen", "127.0.0.1:0"]].concat(), &[])
}

/// Starts `bin args` with `env` added and waits for the line with its `http://` URL.
pub fn spawn_with_env(bin: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read ready line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no url in {line:?}"))
        .to_string();
    Proc { child, url }
}

/// A station over `knot` with extra args (`--role`, `--layers`).
pub fn station(bin: &std::path::Path, knot: &std::path::Path, extra: &[&str]) -> Proc {
    let mut a = vec!["--knot", knot.to_str().expect("utf-8 path")];
    a.extend_from_slice(extra);
    spawn_listening(bin, &a)
}

/// Runs moonshine with `args` (and `stdin`), returning its output.
pub fn moonshine(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moonshine"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn moonshine");
    let mut si = child.stdin.take().expect("stdin");
    if let Some(s) = stdin {
        si.write_all(s.as_bytes()).expect("write stdin");
    }
    drop(si);
    child.wait_with_output().expect("moonshine output")
}

/// Runs moonshine and insists on exit 0; returns (stdout, stderr).
pub fn moonshine_ok(args: &[&str], stdin: Option<&str>) -> (String, String) {
    let o = moonshine(args, stdin);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(
        o.status.success(),
        "moonshine {args:?} failed ({}):\n{out}\n{err}",
        o.status
    );
    (out, err)
}
