//! Shared by moonshine's integration tests: the workspace's `test-support` (the real model,
//! the station binary, processes that print their URL) and the moonshine CLI.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use test_support::{spawn_url, station_bin, Proc, QWEN};

/// The cached Qwen KNOT and the station binary, or `None` (the test skips) when either is
/// absent and `AEON_REQUIRE_MODELS` is not 1.
pub fn setup() -> Option<(PathBuf, PathBuf)> {
    Some((test_support::model(QWEN)?, station_bin()?))
}

/// Starts `bin args --listen 127.0.0.1:0` and waits for the line with its `http://` URL.
pub fn spawn_listening(bin: &Path, args: &[&str]) -> Proc {
    spawn_with_env(bin, &[args, &["--listen", "127.0.0.1:0"]].concat(), &[])
}

/// Starts `bin args` with `env` added and waits for the line with its `http://` URL.
pub fn spawn_with_env(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
    spawn_url(Command::new(bin).args(args).envs(env.iter().copied()))
}

/// A station over `knot` with extra args (`--role`, `--layers`).
pub fn station(bin: &Path, knot: &Path, extra: &[&str]) -> Proc {
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
