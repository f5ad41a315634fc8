//! Issue 36, one trip per token: `moonshine serve --mesh` over three stations that forward to
//! each other sends one `POST /chain` per generated token into the entry, and the exit answers
//! the sampled token rather than 600 KB of logits. Counted from the stations' side (their
//! `/metrics`) and on the gateway's link (a byte-counting relay in front of the entry), beside
//! the same chain driven hop by hop (`--per-hop`, the path before): same greedy text, same
//! seeded samples, same logprobs.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use support::*;

/// A TCP relay to `target`; counts the bytes flowing back from `target` (what crosses the
/// gateway's link from the chain).
fn byte_relay(target: &str) -> (String, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let down = Arc::new(AtomicUsize::new(0));
    let (target, n) = (
        target.trim_start_matches("http://").to_string(),
        down.clone(),
    );
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let Ok(s) = std::net::TcpStream::connect(&target) else {
                continue;
            };
            let (mut c2, mut s2) = (c.try_clone().expect("clone"), s.try_clone().expect("clone"));
            let n = n.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(k) = s2.read(&mut buf) {
                    if k == 0 || c2.write_all(&buf[..k]).is_err() {
                        break;
                    }
                    n.fetch_add(k, Ordering::SeqCst);
                }
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let (mut c, mut s) = (c, s);
                let _ = std::io::copy(&mut c, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (url, down)
}

/// A station's `fat_station_requests_total`, summed over status codes, by route.
fn requests(url: &str) -> BTreeMap<String, f64> {
    let text = ureq::get(&format!("{url}/metrics"))
        .call()
        .expect("metrics")
        .into_string()
        .expect("text");
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("fat_station_requests_total{route=\"") else {
            continue;
        };
        let (route, rest) = rest.split_once('"').expect("route label");
        let v: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("value");
        *m.entry(route.to_string()).or_default() += v;
    }
    m
}

/// Requests by route across `stations`, after minus before.
fn delta(before: &[BTreeMap<String, f64>], stations: &[&str]) -> Vec<BTreeMap<String, f64>> {
    stations
        .iter()
        .zip(before)
        .map(|(u, b)| {
            let mut now = requests(u);
            for (k, v) in now.iter_mut() {
                *v -= b.get(k).copied().unwrap_or(0.0);
            }
            now.retain(|k, v| *v > 0.0 && k != "/metrics");
            now
        })
        .collect()
}

fn chat(gw: &Proc, extra: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({"model": "m", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Count from one to fifty in English words, separated by commas."}]});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    let text = ureq::post(&format!("{}/v1/chat/completions", gw.url))
        .send_string(&body.to_string())
        .unwrap_or_else(|e| panic!("chat: {e}"))
        .into_string()
        .expect("body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// One completion's station requests and downlink bytes per generated token.
struct Run {
    answer: serde_json::Value,
    tokens: f64,
    per_station: Vec<BTreeMap<String, f64>>,
    bytes: usize,
}

fn run(gw: &Proc, stations: &[&str], down: &[Arc<AtomicUsize>], extra: serde_json::Value) -> Run {
    let before: Vec<_> = stations.iter().map(|u| requests(u)).collect();
    let sum = || -> usize { down.iter().map(|d| d.load(Ordering::SeqCst)).sum() };
    let b0 = sum();
    let answer = chat(gw, extra);
    // The relay counts a response's bytes after writing them on: let it finish.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let bytes = sum() - b0;
    let per_station = delta(&before, stations);
    let tokens = answer["usage"]["completion_tokens"]
        .as_f64()
        .expect("completion_tokens");
    Run {
        answer,
        tokens,
        per_station,
        bytes,
    }
}

/// Station requests that scale with the tokens generated (the prompt's one `/tokenize` left
/// out).
fn total(r: &Run) -> f64 {
    r.per_station
        .iter()
        .flat_map(|m| m.iter())
        .filter(|(k, _)| *k != "/tokenize")
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn serve_sends_one_request_per_token_into_a_three_station_chain() {
    let Some((knot, bin)) = setup() else { return };
    let exit = station(&bin, &knot, &["--role", "exit", "--layers", "16..24"]);
    let mid = station(
        &bin,
        &knot,
        &[
            "--role",
            "mid",
            "--layers",
            "8..16",
            "--route-to",
            &exit.url,
        ],
    );
    let entry = station(
        &bin,
        &knot,
        &[
            "--role",
            "entry",
            "--layers",
            "0..8",
            "--route-to",
            &mid.url,
        ],
    );
    // The gateways reach each station through a relay that counts what comes back (the
    // stations reach each other directly): the bytes crossing the gateway's link.
    let links: Vec<(String, Arc<AtomicUsize>)> = [&entry, &mid, &exit]
        .iter()
        .map(|p| byte_relay(&p.url))
        .collect();
    let down: Vec<Arc<AtomicUsize>> = links.iter().map(|l| l.1.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let write_mesh = |name: &str, urls: [&str; 3]| {
        let p = dir.path().join(name);
        let m = serde_json::json!({"model": "qwen-3hop", "stations": [
            {"url": urls[0], "layers": "0-8"}, {"url": urls[1], "layers": "8-16"},
            {"url": urls[2], "layers": "16-24"}]});
        std::fs::write(&p, m.to_string()).expect("write mesh");
        p.to_str().expect("utf-8").to_string()
    };
    // Relaying, the entry forwards to the URLs it was allowed (--route-to): the real ones.
    let one_trip = write_mesh("relayed.json", [&links[0].0, &mid.url, &exit.url]);
    let hop_by_hop = write_mesh("per-hop.json", [&links[0].0, &links[1].0, &links[2].0]);
    let moonshine = std::path::Path::new(env!("CARGO_BIN_EXE_moonshine"));
    let relayed = spawn_listening(moonshine, &["serve", "--mesh", &one_trip]);
    let per_hop = spawn_listening(moonshine, &["serve", "--mesh", &hop_by_hop, "--per-hop"]);
    let stations = [entry.url.as_str(), mid.url.as_str(), exit.url.as_str()];
    // Warm both (the vocabulary fetch, the chat template) so the counts are the decode's.
    run(
        &relayed,
        &stations,
        &down,
        serde_json::json!({"max_tokens": 1}),
    );
    run(
        &per_hop,
        &stations,
        &down,
        serde_json::json!({"max_tokens": 1}),
    );

    let one = run(&relayed, &stations, &down, serde_json::json!({}));
    let hop = run(&per_hop, &stations, &down, serde_json::json!({}));
    eprintln!(
        "relayed: {} tokens, stations {:?}, {} B down ({:.0} B/token); per hop: {} tokens, \
         stations {:?}, {} B down ({:.0} B/token)",
        one.tokens,
        one.per_station,
        one.bytes,
        one.bytes as f64 / one.tokens,
        hop.tokens,
        hop.per_station,
        hop.bytes,
        hop.bytes as f64 / hop.tokens
    );
    assert!(one.tokens >= 8.0, "{}", one.answer);
    // Greedy: the same answer either way.
    assert_eq!(one.answer["choices"], hop.answer["choices"]);
    // One request per generated token (the first comes with the prompt's), each node one
    // /chain, nothing else: no /embed, /forward, /lm-head or /detokenize from the gateway.
    let chain = |r: &Run, i: usize| r.per_station[i].get("/chain").copied().unwrap_or(0.0);
    for i in 0..3 {
        assert_eq!(chain(&one, i), chain(&one, 0), "{:?}", one.per_station);
    }
    assert!(
        (one.tokens..=one.tokens + 1.0).contains(&chain(&one, 0)),
        "{:?}",
        one.per_station
    );
    assert_eq!(total(&one), 3.0 * chain(&one, 0), "{:?}", one.per_station);
    // The exit answers a token, not logits: under 8 KiB per token on the gateway's link.
    assert!(
        (one.bytes as f64) / one.tokens < 8192.0,
        "{} B for {} tokens",
        one.bytes,
        one.tokens
    );
    // Per hop the gateway makes /embed, /forward x 3 and /lm-head per token, and 600 KB of
    // Qwen's logits come back each time; it no longer asks /detokenize per token.
    assert!(total(&hop) >= 5.0 * hop.tokens, "{:?}", hop.per_station);
    assert!(!hop.per_station[0].contains_key("/detokenize"));
    assert!((hop.bytes as f64) / hop.tokens > 500_000.0);

    // Seeded sampling with penalties and a bias: the exit's sampler is the gateway's.
    let sampled = serde_json::json!({"temperature": 0.9, "top_p": 0.95, "seed": 7,
        "frequency_penalty": 0.4, "presence_penalty": 0.3, "min_p": 0.02,
        "logit_bias": {"11": -2}});
    let a = run(&relayed, &stations, &down, sampled.clone());
    let b = run(&per_hop, &stations, &down, sampled);
    assert_eq!(a.answer["choices"], b.answer["choices"]);
    assert!(chain(&a, 0) <= a.tokens + 1.0, "{:?}", a.per_station);

    // Logprobs: what the exit computed equals the gateway's computation over full logits.
    let lp = serde_json::json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 8});
    let a = run(&relayed, &stations, &down, lp.clone());
    let b = run(&per_hop, &stations, &down, lp);
    let content = |r: &Run| r.answer["choices"][0]["logprobs"]["content"].clone();
    assert_eq!(
        content(&a).as_array().map(Vec::len),
        Some(8),
        "{}",
        a.answer
    );
    assert_eq!(content(&a), content(&b));
    assert!(chain(&a, 0) <= a.tokens + 1.0, "{:?}", a.per_station);

    // Structured output, greedy: the exit answers each row's best candidates, the gateway
    // masks them; the same document as masking every logit, and no logits asked.
    let schema = serde_json::json!({"max_tokens": 40, "response_format": {"type": "json_schema",
        "json_schema": {"name": "count", "schema": {"type": "object",
            "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}},
            "required": ["numbers"]}}}});
    let a = run(&relayed, &stations, &down, schema.clone());
    let b = run(&per_hop, &stations, &down, schema);
    eprintln!(
        "structured: relayed {:?} {} B, per hop {:?} {} B, {} tokens",
        a.per_station, a.bytes, b.per_station, b.bytes, a.tokens
    );
    assert_eq!(a.answer["choices"], b.answer["choices"]);
    assert!(
        !a.per_station[2].contains_key("/lm-head"),
        "{:?}",
        a.per_station
    );
    // A row whose candidates the grammar all refuses costs its logits: rare, not never.
    assert!(
        a.bytes * 10 < b.bytes,
        "{} B relayed, {} B per hop",
        a.bytes,
        b.bytes
    );

    // A bad ask is a one-line 400, at the entry and at a forwarded hop.
    let post = |url: &str, headers: &[(&str, &str)], body: Vec<u8>| {
        let mut r = ureq::post(&format!("{url}/chain"));
        for (h, v) in headers {
            r = r.set(h, v);
        }
        match r.send_bytes(&body) {
            Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap_or_default()),
            Ok(r) => (r.status(), String::new()),
            Err(e) => panic!("{e}"),
        }
    };
    let route = format!("{},{}", mid.url, exit.url);
    let (s, m) = post(
        &entry.url,
        &[("x-route", &route), ("x-return", "token")],
        br#"{"tokens": [1, 2], "exit": {"drafts": [5, 6, 7]}}"#.to_vec(),
    );
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("rows"), "{m}");
    let (s, m) = post(
        &entry.url,
        &[("x-route", &route), ("x-return", "token")],
        br#"{"tokens": [1], "exit": {"sample": {"temperature": -1, "top_k": 0, "top_p": 1,
            "min_p": 0, "repeat_penalty": 1, "repeat_last_n": 0, "presence_penalty": 0,
            "frequency_penalty": 0, "rng": 0}}}"#
            .to_vec(),
    );
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("temperature"), "{m}");
    let (s, m) = post(
        &mid.url,
        &[
            ("x-request-id", "r1"),
            ("x-from-layer", "8"),
            ("x-exit-ask", "99999"),
        ],
        vec![0u8; 896 * 4],
    );
    assert_eq!(s, 400, "{m}");
    assert!(m.contains("X-Exit-Ask"), "{m}");
}
