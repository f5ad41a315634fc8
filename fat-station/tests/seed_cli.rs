//! The station as the seed report uses it: its `pipeline ready in N ms` line and
//! `fat-station --sharded`.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::*;

/// The first two stdout lines of a station started with `args` (killed afterwards).
fn first_two_lines(args: &[&str]) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fat-station"))
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fat-station");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let (mut a, mut b) = (String::new(), String::new());
    out.read_line(&mut a).expect("first line");
    out.read_line(&mut b).expect("second line");
    let _ = child.kill();
    let _ = child.wait();
    (a, b)
}

#[test]
fn station_prints_pipeline_ready_after_its_url_line() {
    let Some(path) = model(QWEN) else { return };
    let (url_line, ready) = first_two_lines(&["--knot", path.to_str().expect("utf-8")]);
    assert!(url_line.contains("http://127.0.0.1:"), "{url_line:?}");
    let n = ready
        .strip_prefix("pipeline ready in ")
        .and_then(|r| r.split_once(" ms"))
        .map(|(n, _)| n)
        .unwrap_or_else(|| panic!("not the seed's line: {ready:?}"));
    assert!(
        n.parse::<u64>().is_ok(),
        "N is whole milliseconds: {ready:?}"
    );
}

#[test]
fn sharded_station_refuses_the_whole_model_and_serves_a_range() {
    let Some(path) = model(QWEN) else { return };
    let p = path.to_str().expect("utf-8");
    let o = Command::new(env!("CARGO_BIN_EXE_fat-station"))
        .args(["--knot", p, "--sharded", "--listen", "127.0.0.1:0"])
        .output()
        .expect("run fat-station");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--sharded") && err.contains("whole model"),
        "{err}"
    );

    let (url_line, ready) = first_two_lines(&["--knot", p, "--sharded", "--layers", "0..12"]);
    assert!(
        url_line.contains("layers 0-12 +embed on http://"),
        "{url_line:?}"
    );
    assert!(ready.starts_with("pipeline ready in "), "{ready:?}");
}

/// A GGUF runs directly (`-m`, `--host`/`--port` as llama-server spells them): the first
/// start imports it once into the model cache, the second reuses the cached KNOT.
#[test]
fn a_gguf_runs_directly_imported_once_into_the_model_cache() {
    let Some(knot) = model(SMOLLM2) else { return };
    let gguf = knot.with_extension("gguf");
    let cache = tempfile::tempdir().expect("tempdir");
    let start = || {
        let log = cache.path().join("stderr.log");
        let st = spawn_url(
            Command::new(station_bin())
                .args(["-m", gguf.to_str().expect("utf-8")])
                .args(["--host", "127.0.0.1", "--port", "0"])
                .env("AEON_MODELS_DIR", cache.path())
                .stderr(std::fs::File::create(&log).expect("log file")),
        );
        let body = ureq::get(&format!("{}/health", st.url))
            .call()
            .expect("health")
            .into_string()
            .expect("body");
        let health: serde_json::Value = serde_json::from_str(&body).expect("json");
        drop(st);
        (health, std::fs::read_to_string(&log).expect("log"))
    };
    let (first, log1) = start();
    assert!(log1.contains("is a GGUF: importing it once"), "{log1}");
    let imported: Vec<_> = std::fs::read_dir(cache.path().join("imported"))
        .expect("the import is in the cache")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(imported.len(), 1, "{imported:?}");
    let (second, log2) = start();
    assert!(
        !log2.contains("importing"),
        "reused, not imported again: {log2}"
    );
    // The same model as the KNOT fetch-model.sh imported, both times.
    let want = knot_format::Knot::open(&knot)
        .expect("knot")
        .model_hash()
        .to_string();
    assert_eq!(first["model_hash"], want.as_str(), "{first}");
    assert_eq!(second["model_hash"], want.as_str(), "{second}");
}

#[test]
fn a_gguf_that_does_not_import_is_one_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let g = dir.path().join("my-model.gguf");
    test_support::gguf_stub(&g);
    let o = Command::new(env!("CARGO_BIN_EXE_fat-station"))
        .args([
            "--knot",
            g.to_str().expect("utf-8"),
            "--listen",
            "127.0.0.1:0",
        ])
        .env("AEON_MODELS_DIR", dir.path().join("cache"))
        .output()
        .expect("run fat-station");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("fat-station: error: importing ") && last.contains("into the model cache"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Nothing half-written is left where a later start would take it for an import.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("cache/imported"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().ends_with(".knot")),
        "{left:?}"
    );
}

/// A station's stderr redirected to a file: one access line per request (method, route,
/// status, ms, bytes) and no ANSI colour codes (they were written into redirected logs).
#[test]
fn a_redirected_log_has_an_access_line_per_request_and_no_colour() {
    let Some(path) = model(SMOLLM2) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("station.log");
    let st = spawn_url(
        Command::new(station_bin())
            .args([
                "--knot",
                path.to_str().expect("utf-8"),
                "--listen",
                "127.0.0.1:0",
            ])
            .stderr(std::fs::File::create(&log).expect("log file")),
    );
    let health = ureq::get(&format!("{}/health", st.url))
        .call()
        .expect("health")
        .into_string()
        .expect("body");
    let missing = ureq::get(&format!("{}/nowhere", st.url)).call();
    assert!(matches!(missing, Err(ureq::Error::Status(404, _))));
    drop(st);
    let text = std::fs::read_to_string(&log).expect("read log");
    assert!(
        !text.contains('\x1b'),
        "ANSI escapes in a redirected log: {text:?}"
    );
    let line = |route: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" access: GET {route} ")))
            .unwrap_or_else(|| panic!("no access line for {route} in {text}"))
            .split(" access: ")
            .nth(1)
            .expect("message")
            .to_string()
    };
    // `GET /health 200 0.4 ms 345 B`
    let h = line("/health");
    let f: Vec<&str> = h.split(' ').collect();
    let len = health.len().to_string();
    assert_eq!(
        [f[0], f[1], f[2], f[4], f[5], f[6]],
        ["GET", "/health", "200", "ms", len.as_str(), "B"],
        "{h}"
    );
    assert!(f[3].parse::<f64>().is_ok(), "{h}");
    let n = line("/nowhere");
    assert!(n.starts_with("GET /nowhere 404 "), "{n}");
}
