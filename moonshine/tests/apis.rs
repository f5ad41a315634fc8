//! The other APIs clients speak, on the real Qwen model through `moonshine serve`: each
//! driven by its own official client library (scripts/apis/check_*.py): Anthropic's
//! Messages (`anthropic`), Ollama's (`ollama`), OpenAI's Responses (`openai`), plus raw-HTTP
//! checks of the error shapes and bounds.

mod support;

use std::process::Command;

use support::*;

fn gateway(station: &str, extra: &[&str]) -> Proc {
    let mut a = vec!["serve", "--station", station];
    a.extend_from_slice(extra);
    spawn_listening(std::path::Path::new(env!("CARGO_BIN_EXE_moonshine")), &a)
}

/// Whether python3 imports `modules`; with `require` set to 1 (scripts/test.sh installed
/// them) a missing one fails the test instead of skipping it.
fn python_has(modules: &[&str], require: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {}", modules.join(", "))])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let pkgs = modules.join(" ");
        if std::env::var(require).as_deref() == Ok("1") {
            panic!("python3 cannot import {pkgs} and {require}=1: pip install {pkgs}");
        }
        eprintln!("skipping: python3 cannot import {pkgs} (pip install {pkgs})");
    }
    ok
}

/// Runs `scripts/apis/NAME --base-url URL` and checks it reports `expect`.
fn run_script(url: &str, name: &str, expect: &str) {
    let script = format!("{}/../scripts/apis/{name}", env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("python3")
        .args([&script, "--base-url", url])
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{name} failed:\n{out}");
    assert!(out.contains(expect), "{out}");
}

#[test]
fn the_anthropic_client_chats_streams_and_calls_tools() {
    let Some((knot, bin)) = setup() else { return };
    if !python_has(&["anthropic"], "AEON_REQUIRE_API_CLIENTS") {
        return;
    }
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    run_script(&gw.url, "check_anthropic.py", "9 passed, 0 failed");
}

#[test]
fn the_ollama_client_chats_generates_streams_and_calls_tools() {
    let Some((knot, bin)) = setup() else { return };
    if !python_has(&["ollama", "httpx"], "AEON_REQUIRE_API_CLIENTS") {
        return;
    }
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    run_script(&gw.url, "check_ollama.py", "9 passed, 0 failed");
}

#[test]
fn the_openai_client_drives_the_responses_api() {
    let Some((knot, bin)) = setup() else { return };
    if !python_has(&["openai"], "AEON_REQUIRE_OPENAI") {
        return;
    }
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    run_script(
        &format!("{}/v1", gw.url),
        "check_responses.py",
        "8 passed, 0 failed",
    );
}
