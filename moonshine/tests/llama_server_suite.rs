//! llama.cpp's own server test suite as our conformance suite (issue 38): the tests of
//! tools/server/tests in the llama.cpp tree of PyPI's llama-cpp-python 0.3.36 sdist, run
//! unchanged against fat-station + `moonshine serve` by
//! `scripts/conformance/llama-server-tests.sh` (our plugin replaces only the server start and
//! stop). Every test that is not skipped with its reason must pass.

mod support;

use std::process::Command;

use support::*;

/// Whether python3 has what the suite imports; with `AEON_REQUIRE_LLAMA_SUITE=1`
/// (scripts/test.sh installed them) a missing one fails the test instead of skipping it.
fn python_ready() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import pytest, requests, openai, wget, filelock"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let pkgs = "pytest requests openai wget filelock";
        if std::env::var("AEON_REQUIRE_LLAMA_SUITE").as_deref() == Ok("1") {
            panic!(
                "python3 cannot import {pkgs} and AEON_REQUIRE_LLAMA_SUITE=1: pip install {pkgs}"
            );
        }
        eprintln!("skipping: python3 cannot import {pkgs} (pip install {pkgs})");
    }
    ok
}

#[test]
fn llama_cpp_server_tests_pass_against_the_gateway() {
    // The suite's presets map to SmolLM2 (stories260K's place) and Qwen2.5-Coder (infill).
    let (Some(_), Some(_), Some(station)) = (
        test_support::model(test_support::SMOLLM2),
        test_support::model(QWEN),
        station_bin(),
    ) else {
        return;
    };
    if !python_ready() {
        return;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/conformance/llama-server-tests.sh"
    );
    let o = Command::new("bash")
        .arg(script)
        .env("AEON_STATION_BIN", &station)
        .env("AEON_MOONSHINE_BIN", env!("CARGO_BIN_EXE_moonshine"))
        .env("AEON_MODELS_DIR", test_support::models_dir())
        .output()
        .expect("run llama-server-tests.sh");
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.status.success(),
        "llama.cpp's server tests failed:\n{out}"
    );
    // pytest's last line: "N passed, M skipped in S s", no failures or errors.
    let summary = out.lines().last().unwrap_or("");
    assert!(
        summary.contains(" passed") && !summary.contains("failed") && !summary.contains("error"),
        "{summary}"
    );
}
