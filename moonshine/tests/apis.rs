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

/// Every new route answers bad input with a 4xx in its API's own shape, at once: wrong
/// types everywhere, invalid JSON, a body past `--max-body`, the wrong method.
#[test]
fn bad_input_is_a_4xx_in_each_apis_shape() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &["--max-body", "4096"]);
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(60))
        .build();
    let send = |path: &str, body: &str| -> (u16, serde_json::Value) {
        let r = agent.post(&format!("{}{path}", gw.url)).send_string(body);
        let (code, text) = match r {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{path}: {e}"),
        };
        (
            code,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    };
    let hostile = [
        "not json",
        "[]",
        "{\"model\": 3, \"messages\": 3, \"input\": {}, \"system\": 7, \"tools\": {}, \"options\": []}",
        "{\"model\": \"m\", \"messages\": [3, null, {\"role\": []}], \"input\": [null, 3.5], \"prompt\": 5}",
        "{\"model\": \"m\", \"prompt\": [], \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"content\": 5}]}]}",
        "{\"model\": \"m\", \"prompt\": {}, \"input\": [{\"type\": \"function_call\"}], \"tool_choice\": 5}",
    ];
    let anthropic = |v: &serde_json::Value| {
        v["type"] == "error" && v["error"]["type"].is_string() && v["error"]["message"].is_string()
    };
    let openai = |v: &serde_json::Value| v["error"]["message"].is_string();
    let ollama = |v: &serde_json::Value| v["error"].is_string();
    type Shape<'a> = &'a dyn Fn(&serde_json::Value) -> bool;
    let routes: [(&str, Shape); 7] = [
        ("/v1/messages", &anthropic),
        ("/v1/messages/count_tokens", &anthropic),
        ("/v1/responses", &openai),
        ("/v1/embeddings", &openai),
        ("/api/chat", &ollama),
        ("/api/generate", &ollama),
        ("/api/embed", &ollama),
    ];
    // A body declared past --max-body: 413 before any of it is read (headers only are sent,
    // so the early answer is not lost to a reset).
    let too_large = |path: &str| -> (u16, serde_json::Value) {
        use std::io::{Read, Write};
        let addr = gw.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        write!(s, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        (
            code,
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    };
    for (path, shape) in routes {
        let (code, v) = too_large(path);
        assert!(code == 413 && shape(&v), "{path} too large: {code} {v}");
        for body in hostile {
            let (code, v) = send(path, body);
            let head: String = body.chars().take(60).collect();
            assert!(
                (400..500).contains(&code) && shape(&v),
                "{path} {head}: {code} {v}"
            );
        }
    }
    // The wrong method: 405; the gateway still serves afterwards.
    let r = agent.get(&format!("{}/v1/messages", gw.url)).call();
    assert!(matches!(r, Err(ureq::Error::Status(405, _))), "{r:?}");
    let (code, v) = send(
        "/v1/messages/count_tokens",
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
    );
    assert_eq!(code, 200, "{v}");
    assert!(v["input_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");
}

/// `--api-key`: Anthropic's clients send it as `x-api-key`, the others as a bearer token; a
/// refusal is in the shape of the API called.
#[test]
fn the_key_is_taken_as_each_api_sends_it() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &["--api-key", "k-123"]);
    let count = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    let call = |path: &str, header: Option<(&str, &str)>| -> (u16, serde_json::Value) {
        let mut r = ureq::post(&format!("{}{path}", gw.url));
        if let Some((k, v)) = header {
            r = r.set(k, v);
        }
        let (code, text) = match r.send_string(count) {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{path}: {e}"),
        };
        (
            code,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    };
    let path = "/v1/messages/count_tokens";
    assert_eq!(call(path, Some(("x-api-key", "k-123"))).0, 200);
    assert_eq!(call(path, Some(("authorization", "Bearer k-123"))).0, 200);
    let (code, v) = call(path, Some(("x-api-key", "wrong")));
    assert_eq!(
        (code, v["type"].as_str(), v["error"]["type"].as_str()),
        (401, Some("error"), Some("authentication_error")),
        "{v}"
    );
    let (code, v) = call("/api/show", None);
    assert!(code == 401 && v["error"].is_string(), "{code} {v}");
    let (code, v) = call("/v1/embeddings", None);
    assert!(
        code == 401 && v["error"]["message"].is_string(),
        "{code} {v}"
    );
}
