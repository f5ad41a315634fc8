//! `moonshine up MODEL --nodes 3`: one command plans the layers, starts three stations and
//! the gateway and prints the URL; a chat goes through all three; SIGTERM stops everything.
//! On SmolLM2-135M (test-support's model rule: skips unless `AEON_REQUIRE_MODELS=1`).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn get_json(agent: &ureq::Agent, url: &str) -> Value {
    let t = agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .into_string()
        .expect("body");
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{url}: {e}: {t}"))
}

#[test]
fn up_forms_a_three_station_mesh_chats_and_stops_everything_on_sigterm() {
    let (Some(knot), Some(bin)) = (test_support::model(test_support::SMOLLM2), station_bin())
    else {
        return;
    };
    let mut up = spawn_url(
        Command::new(env!("CARGO_BIN_EXE_moonshine"))
            .stderr(std::process::Stdio::piped())
            .args([
                "up",
                knot.to_str().expect("utf-8"),
                "--nodes",
                "3",
                "--port",
                "0",
                "--station-bin",
                bin.to_str().expect("utf-8"),
            ]),
    );
    let base = up.url.trim_end_matches('/').to_string();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();

    // Three hops tiling the 30 layers, all healthy.
    let mesh = get_json(&agent, &format!("{base}/mesh"));
    let hops = mesh["chains"][0]["hops"].as_array().expect("hops").clone();
    assert_eq!(hops.len(), 3, "{mesh}");
    let layers: Vec<&str> = hops
        .iter()
        .map(|h| h["layers"].as_str().unwrap_or(""))
        .collect();
    assert!(
        layers[0].starts_with("0-") && layers[2].ends_with("-30"),
        "{layers:?}"
    );
    assert!(hops.iter().all(|h| h["status"] == "ok"), "{mesh}");

    // A chat through all three.
    let r: Value = serde_json::from_str(
        &agent
            .post(&format!("{base}/v1/chat/completions"))
            .set("content-type", "application/json")
            .send_string(
                &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                        "max_tokens": 12, "temperature": 0})
                .to_string(),
            )
            .expect("chat")
            .into_string()
            .expect("body"),
    )
    .expect("json");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap_or("");
    eprintln!("answer through 3 stations: {text:?}");
    assert!(
        r["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{r}"
    );
    assert!(!text.trim().is_empty(), "{r}");
    let view = get_json(&agent, &format!("{base}/mesh"));
    let costs = view["chains"][0]["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .filter(|h| h["ms_per_token"].is_number())
        .count();
    assert_eq!(costs, 3, "every hop computed: {view}");

    // SIGTERM: up exits 0 and nothing it started answers any more.
    let pid = up.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = up.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "moonshine up did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    // The stations forward to each other (--route-to): one POST /chain per token, no
    // fallback to the gateway driving every hop.
    let mut err = String::new();
    std::io::Read::read_to_string(&mut up.child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    eprintln!("moonshine up's stderr:\n{err}");
    assert!(!err.contains("does not relay"), "{err}");
    assert!(err.contains("got SIGTERM: stopping"), "{err}");
    let quick = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    for url in hops
        .iter()
        .map(|h| h["url"].as_str().expect("url").to_string())
        .chain([base.clone()])
    {
        assert!(
            quick.get(&format!("{url}/health")).call().is_err(),
            "{url} still answers after moonshine up stopped"
        );
    }
}

/// Sends SIGTERM to `up`, waits for it to exit 0, and returns its stderr.
fn stop(up: &mut test_support::Proc) -> String {
    let pid = up.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = up.child.wait().expect("wait");
    assert!(status.success(), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut up.child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    err
}

#[test]
fn up_runs_a_gguf_importing_it_once_and_reusing_the_import_next_time() {
    let (Some(knot), Some(bin)) = (test_support::model(test_support::SMOLLM2), station_bin())
    else {
        return;
    };
    let gguf = knot.with_extension("gguf");
    let Some(gguf) = test_support::need(gguf, "scripts/fetch-model.sh smollm2") else {
        return;
    };
    let cache = tempfile::tempdir().expect("tempdir");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let mut first = None;
    for run in 0..2 {
        let mut up = spawn_url(
            Command::new(env!("CARGO_BIN_EXE_moonshine"))
                .env("AEON_MODELS_DIR", cache.path())
                .stderr(std::process::Stdio::piped())
                .args([
                    "up",
                    gguf.to_str().expect("utf-8"),
                    "--nodes",
                    "2",
                    "--port",
                    "0",
                    "--station-bin",
                    bin.to_str().expect("utf-8"),
                ]),
        );
        let base = up.url.trim_end_matches('/').to_string();
        let r: Value = serde_json::from_str(
            &agent
                .post(&format!("{base}/v1/completions"))
                .set("content-type", "application/json")
                .send_string(&json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}).to_string())
                .expect("completion")
                .into_string()
                .expect("body"),
        )
        .expect("json");
        assert_eq!(r["usage"]["completion_tokens"], 3, "{r}");
        let err = stop(&mut up);
        let imported: Vec<_> = std::fs::read_dir(cache.path().join("imported"))
            .expect("the import folder")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(imported.len(), 1, "{imported:?}");
        let mtime = std::fs::metadata(&imported[0])
            .and_then(|m| m.modified())
            .expect("mtime");
        if run == 0 {
            assert!(err.contains("is a GGUF: importing it once"), "{err}");
            first = Some(mtime);
        } else {
            assert!(!err.contains("importing"), "imported again: {err}");
            assert_eq!(Some(mtime), first, "the import was rewritten");
        }
    }
}
