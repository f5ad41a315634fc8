//! The probe's verdicts and exit codes on the real Qwen model.

use std::path::PathBuf;
use std::process::Command;

fn qwen() -> Option<PathBuf> {
    let dir = std::env::var_os("AEON_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/aeon-shell/models")
        });
    let p = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.knot");
    if p.exists() {
        return Some(p);
    }
    assert_ne!(
        std::env::var("AEON_REQUIRE_MODELS").as_deref(),
        Ok("1"),
        "{} missing",
        p.display()
    );
    eprintln!(
        "skipping: {} not found (run scripts/fetch-model.sh)",
        p.display()
    );
    None
}

fn probe(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_paris-probe"))
        .args(args)
        .output()
        .expect("run paris-probe");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn paris_passes_by_ids_and_by_text() {
    let Some(m) = qwen() else { return };
    let m = m.to_str().expect("utf-8");
    let (code, out, err) = probe(&[
        "--dense",
        m,
        "--dense-only",
        "--tokens",
        "785,6722,315,9625,374",
        "--expected",
        "12095",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS: argmax 12095 matches"), "{out}");

    let (code, out, err) = probe(&[
        "--dense",
        m,
        "--prompt",
        "The capital of France is",
        "--expect",
        " Paris",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["tokens"], serde_json::json!([785, 6722, 315, 9625, 374]));
    assert_eq!(v["argmax"], 12095);
    assert_eq!(v["expected_rank"], 0);
    assert!(v["margin"].as_f64().expect("margin") > 3.0);
}

/// The seed report's verdict line, `max finite logit +14.34 at token_id 12095 -> PASS: argmax
/// 12095 matches`, with the real logit of this run (the same one --json reports).
#[test]
fn prints_the_seed_verdict_line_with_the_real_logit() {
    let Some(m) = qwen() else { return };
    let m = m.to_str().expect("utf-8");
    let args = [
        "--dense",
        m,
        "--dense-only",
        "--tokens",
        "785,6722,315,9625,374",
        "--expected",
        "12095",
    ];
    // Under the seed's name for the probe, `paris-probe-rknot` (the same program).
    let o = Command::new(env!("CARGO_BIN_EXE_paris-probe-rknot"))
        .args(args)
        .output()
        .expect("run paris-probe-rknot");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (_, json, _) = probe(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
    let logit = v["logit"].as_f64().expect("logit");
    let want =
        format!("max finite logit {logit:+.2} at token_id 12095 -> PASS: argmax 12095 matches");
    assert!(
        out.lines().any(|l| l.starts_with(&want)),
        "no line starting {want:?} in:\n{out}"
    );
}

#[test]
fn wrong_expectation_fails_with_exit_1_and_says_why() {
    let Some(m) = qwen() else { return };
    let (code, out, _) = probe(&[
        "--dense",
        m.to_str().expect("utf-8"),
        "--tokens",
        "785,6722,315,9625,374",
        "--expected",
        "7148",
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL: expected 7148") && out.contains("got argmax 12095"),
        "{out}"
    );
}

#[test]
fn perplexity_of_a_natural_sentence_is_low() {
    let Some(m) = qwen() else { return };
    let (code, out, err) = probe(&[
        "--dense",
        m.to_str().expect("utf-8"),
        "--tokens",
        "785,6722,315,9625,374",
        "--expected",
        "12095",
        "--json",
        "--perplexity-text",
        "The capital of France is Paris. The capital of Germany is Berlin.",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let nll = v["nll"].as_f64().expect("nll");
    assert!(nll > 0.0 && nll < 3.0, "mean NLL {nll}");
}

#[test]
fn errors_exit_2() {
    let (code, _, err) = probe(&[
        "--dense",
        "/nonexistent.knot",
        "--tokens",
        "1",
        "--expected",
        "2",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.knot"), "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.knot");
    std::fs::write(&bad, b"not a knot file at all").expect("write");
    let (code, _, err) = probe(&[
        "--dense",
        bad.to_str().expect("utf-8"),
        "--tokens",
        "1",
        "--expected",
        "2",
    ]);
    assert_eq!(code, 2, "{err}");
}

/// A one-shot collector: answers one admit and hands back the record it was sent.
fn fake_collector() -> (String, std::thread::JoinHandle<serde_json::Value>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let h = std::thread::spawn(move || {
        let (mut c, _) = l.accept().expect("accept");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = c.read(&mut chunk).expect("read");
            assert!(n > 0, "connection closed before the head ended");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .expect("content-length")
            .trim()
            .parse()
            .expect("length");
        while buf.len() < head_end + len {
            let n = c.read(&mut chunk).expect("read body");
            assert!(n > 0, "connection closed inside the body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let rec: serde_json::Value =
            serde_json::from_slice(&buf[head_end..head_end + len]).expect("record JSON");
        let body = serde_json::json!({"ok": true, "key": rec["key"], "disposition": "stored", "created": 1})
            .to_string();
        write!(
            c,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("answer");
        rec
    });
    (url, h)
}

/// Issue 18 item 6: the seed probes `qwen05-dense.knot` and looks up
/// `qwen05-dense:dense:785,...`: the collector key names the file, not the model id.
#[test]
fn collector_key_is_the_model_files_stem() {
    let Some(m) = qwen() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("qwen05-dense.knot");
    std::os::unix::fs::symlink(&m, &file).expect("symlink");
    let (url, collector) = fake_collector();
    let o = Command::new(env!("CARGO_BIN_EXE_paris-probe"))
        .args(["--dense", file.to_str().expect("utf-8"), "--dense-only"])
        .args(["--tokens", "785,6722,315,9625,374", "--expected", "12095"])
        .args(["--threads", "2"])
        .env("GNOSIS_FOIL_CACHE_URL", &url)
        .output()
        .expect("run paris-probe");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let key = "qwen05-dense:dense:785,6722,315,9625,374";
    assert!(
        err.contains(&format!("foil-cache-admit: status=200 key={key}")),
        "{err}"
    );
    let rec = collector.join().expect("collector thread");
    assert_eq!(rec["key"], key);
    assert_eq!(rec["argmax"], 12095);
}

#[test]
fn a_gguf_or_an_absent_station_is_one_line_with_a_hint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let g = dir.path().join("my-model.gguf");
    test_support::gguf_stub(&g);
    let p = g.display();
    // A GGUF runs directly (imported once into the model cache); one that cannot be imported
    // is one line that says so.
    let o = Command::new(env!("CARGO_BIN_EXE_paris-probe"))
        .args([
            "--dense",
            &p.to_string(),
            "--tokens",
            "1",
            "--expected",
            "2",
        ])
        .env("AEON_MODELS_DIR", dir.path().join("cache"))
        .output()
        .expect("run paris-probe");
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "paris-probe: error: importing {p} into the model cache: "
        )),
        "{err}"
    );
    assert_eq!(o.status.code(), Some(2), "{err}");
    // HOST:PORT without http://, and nothing listening there.
    let (code, _, err) = probe(&[
        "--station",
        "127.0.0.1:1",
        "--tokens",
        "1",
        "--expected",
        "2",
    ]);
    assert_eq!(
        err,
        "paris-probe: error: cannot reach http://127.0.0.1:1/health: connection refused \
         (is fat-station running at http://127.0.0.1:1?)\n"
    );
    assert_eq!(code, 2);
}
