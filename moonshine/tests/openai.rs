//! `moonshine serve` on the real Qwen model: the official `openai` Python client
//! (scripts/openai/check_openai.py), and the gateway's own behaviour over raw HTTP: the
//! bounded queue, Server-Timing per hop, Prometheus metrics, OpenAI-style errors.

#![allow(clippy::result_large_err)] // ureq::Error is what the test inspects.

mod support;

use std::io::Read;
use std::process::Command;
use std::time::Duration;

use support::*;

fn gateway(station: &str, extra: &[&str]) -> Proc {
    let mut a = vec!["serve", "--station", station];
    a.extend_from_slice(extra);
    spawn_listening(std::path::Path::new(env!("CARGO_BIN_EXE_moonshine")), &a)
}

fn openai_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("AEON_REQUIRE_OPENAI").as_deref() == Ok("1") {
            panic!("python3 cannot import openai and AEON_REQUIRE_OPENAI=1: pip install openai");
        }
        eprintln!("skipping: python3 cannot import openai (pip install openai)");
    }
    ok
}

#[test]
fn the_official_openai_client_chats_streams_and_cancels() {
    let Some((knot, bin)) = setup() else { return };
    if !openai_available() {
        return;
    }
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &["--max-concurrent", "2"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/openai/check_openai.py"
    );
    let o = Command::new("python3")
        .args([script, "--base-url", &format!("{}/v1", gw.url)])
        .output()
        .expect("run check_openai.py");
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "check_openai.py failed:\n{out}");
    assert!(out.contains("5 passed, 0 failed"), "{out}");
}

#[test]
fn gateway_queue_timing_metrics_and_errors() {
    let Some((knot, bin)) = setup() else { return };
    let entry = station(&bin, &knot, &["--role", "entry", "--layers", "0..12"]);
    let exit = station(&bin, &knot, &["--role", "exit", "--layers", "12..24"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh.json");
    let m = serde_json::json!({"model": "qwen-2hop", "stations": [{"url": entry.url, "layers": "0-12"}, {"url": exit.url, "layers": "12-24"}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let mut a = vec![
        "serve",
        "--mesh",
        mesh.to_str().expect("utf-8"),
        "--max-concurrent",
        "1",
        "--max-queue",
        "0",
    ];
    a.push("--default-max-tokens");
    a.push("400");
    let gw = spawn_listening(std::path::Path::new(env!("CARGO_BIN_EXE_moonshine")), &a);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build();
    let url = |p: &str| format!("{}{p}", gw.url);
    let post = |body: serde_json::Value| {
        agent
            .post(&url("/v1/chat/completions"))
            .send_string(&body.to_string())
    };
    let msg = |text: &str| serde_json::json!([{"role": "user", "content": text}]);

    // Models: the mesh file's name.
    let models: serde_json::Value = agent
        .get(&url("/v1/models"))
        .call()
        .expect("models")
        .into_string()
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .expect("json");
    assert_eq!(models["data"][0]["id"], "qwen-2hop");

    // Non-streamed: Server-Timing names each hop with its layers.
    let r = post(serde_json::json!({"model": "m", "messages": msg("What is the capital of France? Answer in one word."), "temperature": 0, "max_tokens": 8})).expect("completion");
    let timing = r.header("server-timing").unwrap_or_default().to_string();
    assert!(
        timing.contains("hop0;desc=\"")
            && timing.contains(" 0-12\";dur=")
            && timing.contains(" 12-24\";dur=")
            && timing.contains("total;dur="),
        "{timing}"
    );
    let v: serde_json::Value = r
        .into_string()
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .expect("json");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("Paris"),
        "{v}"
    );

    // Bounded queue: one generation running, no queue -> the next request gets 429.
    let long = post(serde_json::json!({"model": "m", "stream": true, "seed": 3, "temperature": 0.9, "messages": msg("Tell me a very long story.")})).expect("stream");
    assert_eq!(long.header("content-type"), Some("text/event-stream"));
    let mut reader = long.into_reader();
    let mut first = [0u8; 64];
    reader.read_exact(&mut first).expect("first chunk");
    match post(serde_json::json!({"model": "m", "messages": msg("hi")})) {
        Err(ureq::Error::Status(429, r)) => {
            assert_eq!(r.header("retry-after"), Some("1"));
            let e: serde_json::Value = r
                .into_string()
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .expect("json");
            assert_eq!(e["error"]["type"], "rate_limit_exceeded", "{e}");
        }
        other => panic!("expected 429 while the only slot is busy, got {other:?}"),
    }
    drop(reader); // client goes away: the generation is cancelled and the slot freed
    let metrics = || {
        agent
            .get(&url("/metrics"))
            .call()
            .expect("metrics")
            .into_string()
            .expect("text")
    };
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    let mut m = metrics();
    for _ in 0..300 {
        if value(&m, "moonshine_cancelled_total") == 1.0
            && value(&m, "moonshine_sessions_busy") == 0.0
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        m = metrics();
    }
    assert_eq!(
        (
            value(&m, "moonshine_cancelled_total"),
            value(&m, "moonshine_sessions_busy")
        ),
        (1.0, 0.0),
        "{m}"
    );
    assert_eq!(value(&m, "moonshine_rejected_total"), 1.0);
    assert!(
        value(&m, "moonshine_completion_tokens_total") < 200.0,
        "the cancelled generation stopped early: {m}"
    );
    assert!(value(&m, "moonshine_station_compute_ms_total") > 0.0);
    assert!(
        m.contains("moonshine_hop_compute_ms_total{hop=\"1\""),
        "{m}"
    );
    assert!(
        m.contains("moonshine_requests_total{route=\"/v1/chat/completions\",code=\"429\"} 1"),
        "{m}"
    );
    // The slot is usable again.
    post(serde_json::json!({"model": "m", "messages": msg("hi"), "max_tokens": 2}))
        .expect("slot free again");

    // OpenAI-style errors.
    let err = |r: Result<ureq::Response, ureq::Error>| match r {
        Err(ureq::Error::Status(s, r)) => (
            s,
            r.into_string()
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .expect("json"),
        ),
        other => panic!("expected an error status, got {other:?}"),
    };
    let (s, e) = err(agent
        .post(&url("/v1/chat/completions"))
        .send_string("{not json"));
    assert_eq!(
        (s, e["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    let (s, e) = err(post(
        serde_json::json!({"model": "m", "messages": msg("hi"), "temperature": 5}),
    ));
    assert_eq!(
        (s, e["error"]["param"].as_str()),
        (400, Some("temperature"))
    );
    let (s, _) = err(agent.get(&url("/v1/nothing")).call());
    assert_eq!(s, 404);
    let (s, _) = err(agent.get(&url("/v1/chat/completions")).call());
    assert_eq!(s, 405);
}
