//! The moonshine CLI against real station processes on the real Qwen model: `--oneoff` over a
//! station and a two-hop mesh, greedy generation against step-by-step one-offs, seeded
//! sampling, and a multi-turn chat that reuses its KV cache.

mod support;

use serde_json::Value;
use support::*;

const PARIS: &str = "The capital of France is";

#[test]
fn oneoff_prints_paris_via_a_station_and_a_two_hop_mesh() {
    let Some((knot, bin)) = setup() else { return };
    let full = station(&bin, &knot, &[]);
    let (out, _) = moonshine_ok(&["--oneoff", "-c", PARIS, "--station", &full.url], None);
    assert_eq!(out, "The capital of France is -> Paris\n");
    let (out, _) = moonshine_ok(
        &[
            "--oneoff",
            "--tokens",
            "785,6722,315,9625,374",
            "--station",
            &full.url,
        ],
        None,
    );
    assert_eq!(out, "785,6722,315,9625,374 -> 12095 \" Paris\"\n");

    let entry = station(&bin, &knot, &["--role", "entry", "--layers", "0..12"]);
    let exit = station(&bin, &knot, &["--role", "exit", "--layers", "12..24"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh-2.json");
    let m = serde_json::json!({"model": "qwen", "stations": [{"url": entry.url, "layers": "0-12"}, {"url": exit.url, "layers": "12-24"}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let mesh = mesh.to_str().expect("utf-8 path");
    let (out, err) = moonshine_ok(&["--oneoff", "-c", PARIS, "--mesh", mesh], None);
    assert_eq!(out, "The capital of France is -> Paris\n");
    assert!(
        err.contains("layers 0-12") && err.contains("layers 12-24"),
        "per-hop lines: {err}"
    );

    // The mesh and the single station agree on the logit bit for bit (JSON keeps f32 exactly).
    let j = |args: &[&str]| -> Value {
        serde_json::from_str(&moonshine_ok(args, None).0).expect("json")
    };
    let a = j(&["--oneoff", "--json", "-c", PARIS, "--station", &full.url]);
    let b = j(&["--oneoff", "--json", "-c", PARIS, "--mesh", mesh]);
    assert_eq!((&a["next_id"], &a["logit"]), (&b["next_id"], &b["logit"]));

    // Generation over the mesh equals generation over the single station.
    let g = |t: &[&str]| -> Value {
        let mut args = vec!["-c", PARIS, "-n", "8", "--json"];
        args.extend_from_slice(t);
        j(&args)
    };
    assert_eq!(
        g(&["--station", &full.url])["tokens"],
        g(&["--mesh", mesh])["tokens"]
    );
}

#[test]
fn greedy_generation_equals_step_by_step_oneoff_and_seeds_reproduce() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let run = |args: &[&str]| -> Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["--json", "--station", &st.url]);
        serde_json::from_str(&moonshine_ok(&a, None).0).expect("json")
    };
    let ids = |v: &Value| -> Vec<u64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect()
    };

    // Greedy with the KV cache, 16 tokens.
    let g = run(&["-c", PARIS, "-n", "16"]);
    let prompt = ids(&g["prompt"]);
    let gen = ids(&g["tokens"]);
    assert_eq!(prompt, [785, 6722, 315, 9625, 374]);
    assert_eq!(gen.len(), 16, "{g}");
    assert_eq!(gen[0], 12095);
    assert!(
        g["text"].as_str().expect("text").starts_with(" Paris"),
        "{g}"
    );

    // A stop string ends generation and is not part of the text.
    let s = run(&["-c", PARIS, "-n", "16", "--stop", "."]);
    assert_eq!(
        (s["text"].as_str(), s["finish_reason"].as_str()),
        (Some(" Paris"), Some("stop")),
        "{s}"
    );

    // Each token equals a stateless one-off over everything before it (no cache).
    let mut ctx = prompt.clone();
    for (i, &want) in gen.iter().enumerate() {
        let list = ctx
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let o = run(&["--oneoff", "--tokens", &list]);
        assert_eq!(
            o["next_id"].as_u64(),
            Some(want),
            "token {i}: cached decode and stateless one-off disagree"
        );
        ctx.push(want);
    }

    // Sampling: the same seed gives the same text; other seeds (almost surely) another.
    let sample = |seed: &str| {
        run(&[
            "-c",
            "Once upon a time",
            "-n",
            "24",
            "--temperature",
            "0.8",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--seed",
            seed,
        ])["text"]
            .clone()
    };
    let a = sample("7");
    assert_eq!(a, sample("7"), "same seed, same text");
    assert!(
        a != sample("8") || a != sample("9"),
        "three seeds gave one text: {a}"
    );
}

#[test]
fn chat_uses_the_models_template_and_keeps_the_kv_cache_across_turns() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let (out, err) = moonshine_ok(
        &[
            "--chat",
            "-c",
            "What is the capital of France? Answer in one word.",
            "-n",
            "16",
            // Greedy (chat samples at 0.8 by default) and the statistics lines (behind --stats).
            "--temperature",
            "0",
            "--stats",
            "--station",
            &st.url,
        ],
        Some("What is the capital of Germany? Answer in one word.\n"),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.len() >= 2 && lines[0].contains("Paris") && lines[1].contains("Berlin"),
        "replies: {out:?}\n{err}"
    );
    // Turn 2 sends only the new tokens: the first turn and its reply are in the cache.
    // "turn N: sent S of T prompt tokens (R reused from the KV cache)"
    let turn = |n: usize| -> Vec<usize> {
        let l = err
            .lines()
            .find(|l| l.starts_with(&format!("turn {n}:")))
            .unwrap_or_else(|| panic!("no turn {n} line in {err}"));
        l.split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let (t1, t2) = (turn(1), turn(2));
    assert_eq!(
        (t1[1], t1[3]),
        (t1[2], 0),
        "turn 1 sends its whole prompt: {t1:?}"
    );
    let (sent, total, reused) = (t2[1], t2[2], t2[3]);
    assert!(
        reused > t1[2] && sent + reused == total && sent < 30,
        "turn 2 reuses turn 1 and its reply: {t2:?}"
    );
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.contains(" tokens in ") && l.ends_with("tok/s)")),
        "{err}"
    );
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let o = moonshine(&["--station", "http://127.0.0.1:1"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to do"));
    let o = moonshine(
        &[
            "-c",
            "hi",
            "--station",
            "http://127.0.0.1:1",
            "--timeout",
            "2",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("moonshine: error: cannot reach http://127.0.0.1:1/health"),
        "{err}"
    );
    let o = moonshine(
        &[
            "-c",
            "hi",
            "--top-p",
            "0",
            "--station",
            "http://127.0.0.1:1",
            "--timeout",
            "2",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("mesh.json");
    std::fs::write(&bad, r#"{"stations": [{"url": "http://127.0.0.1:1", "layers": "0-12"}, {"url": "http://127.0.0.1:2", "layers": "13-24"}]}"#).expect("write");
    let o = moonshine(
        &[
            "--oneoff",
            "-c",
            "hi",
            "--mesh",
            bad.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("expected a range starting at 12"),
        "a gap in the mesh is named: {err}"
    );
}

#[test]
fn streamed_text_never_shows_half_a_character() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let b = moonshine::generate::Backend::connect(
        &moonshine::generate::Target::Station(st.url.clone()),
        std::time::Duration::from_secs(60),
    )
    .expect("connect");
    // In Qwen's vocabulary "🫠" is three tokens and "ꙮ" two: their bytes arrive in pieces.
    let text = "I feel 🫠 ꙮ today, café!";
    let ids = b.tokenize(text, Some(false)).expect("tokenize");
    assert!(
        ids.len() > text.split_whitespace().count() + 3,
        "characters split over tokens: {ids:?}"
    );
    let mut s = moonshine::textstream::TextStream::new(vec![]);
    let mut detok = |ids: &[u32]| b.detokenize(ids);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(s.push(id, &mut detok).expect("push").text);
    }
    pieces.push(s.finish(&mut detok).expect("finish").text);
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert!(
        pieces.iter().filter(|p| p.is_empty()).count() >= 3,
        "bytes were held back: {pieces:?}"
    );
    assert_eq!(pieces.concat(), text);
}

#[test]
fn oneoff_builds_its_chain_from_beacons_with_discover() {
    let Some((knot, bin)) = setup() else { return };
    // A per-test UDP port on loopback broadcast, so parallel tests don't hear each other.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("udp")
        .local_addr()
        .expect("addr")
        .port();
    let beacon = format!("127.255.255.255:{port}");
    let common = ["--beacon", beacon.as_str(), "--beacon-interval-ms", "100"];
    let _entry = station(
        &bin,
        &knot,
        &[&["--layers", "0..12", "--node-id", "d0"][..], &common[..]].concat(),
    );
    let _exit = station(
        &bin,
        &knot,
        &[&["--layers", "12..24", "--node-id", "d1"][..], &common[..]].concat(),
    );
    let listen = format!("0.0.0.0:{port}");
    let (out, err) = moonshine_ok(
        &[
            "--oneoff",
            "-c",
            PARIS,
            "--discover",
            "--discover-listen",
            &listen,
            "--discover-timeout",
            "1.5",
        ],
        None,
    );
    assert_eq!(out, "The capital of France is -> Paris\n", "{err}");
    assert!(
        err.contains("layers 0-12") && err.contains("layers 12-24"),
        "two hops expected: {err}"
    );
}

/// A busy station may evict a generation's session between two decode steps (LRU beyond
/// `--max-sessions`); the generation re-fills its context and goes on with the same tokens
/// (the soak saw `409 session_mismatch` end a stream instead).
#[test]
fn a_session_evicted_mid_generation_is_refilled_and_the_tokens_are_unchanged() {
    use moonshine::generate::{generate, Backend, GenRequest, KvSession, Target};
    use moonshine::sampling::SamplingParams;
    use std::time::Duration;

    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &["--max-sessions", "1"]);
    let b = Backend::connect(&Target::Station(st.url.clone()), Duration::from_secs(120))
        .expect("connect");
    let req = GenRequest {
        prompt: vec![785, 6722, 315, 9625, 374],
        max_tokens: 10,
        sampling: SamplingParams::default(),
        stops: vec![],
        logprobs: None,
        lookup: None,
        grammar: None,
    };
    let plain = generate(&b, &mut KvSession::new("plain"), &req, |_| true).expect("plain");

    // Another client's session takes the only slot after each piece of text.
    let intruder = station_wire::client::StationClient::new(&st.url, Duration::from_secs(120));
    let row = intruder.embed(&[100]).expect("embed").residual;
    let all = knot_format::LayerRange::new(0, 24);
    let mut evictions = 0;
    let evicted = generate(&b, &mut KvSession::new("evicted"), &req, |_| {
        intruder
            .forward(
                &row,
                all,
                Some((&format!("intruder-{evictions}"), 0)),
                false,
            )
            .expect("intruder forward");
        evictions += 1;
        true
    })
    .expect("generation survives the evictions");
    assert!(evictions >= 3, "the session was evicted {evictions} times");
    assert_eq!(evicted.tokens, plain.tokens);
    assert_eq!(evicted.text, plain.text);
}

/// A function to repeat with one change: where prompt-lookup drafts hit.
const EDIT_PROMPT: &str = "Repeat this Python function exactly, but rename `total` to `acc`. \
Reply with only the code.\n\n```python\ndef summarize(orders, tax_rate):\n    total = 0\n    \
for order in orders:\n        if order.status == \"cancelled\":\n            continue\n        \
subtotal = order.quantity * order.unit_price\n        total += subtotal * (1 + tax_rate)\n    \
return round(total, 2)\n```";

/// Free prose: drafts rarely hit.
const PROSE_PROMPT: &str = "Write three sentences about a lighthouse keeper who finds a letter.";

/// Speculative decoding with prompt-lookup drafts (`--lookup`) over a two-station chain gives
/// greedy output identical, token id for token id, to plain decoding, on a code edit (where
/// it makes more than one token per chain trip) and on prose; sampled decoding with lookup
/// runs and keeps only drafts it verified.
#[test]
fn lookup_decoding_is_lossless_over_a_two_station_chain() {
    let Some((knot, bin)) = setup() else { return };
    let entry = station(&bin, &knot, &["--role", "entry", "--layers", "0..12"]);
    let exit = station(&bin, &knot, &["--role", "exit", "--layers", "12..24"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh-2.json");
    let m = serde_json::json!({"model": "qwen", "stations": [{"url": entry.url, "layers": "0-12"}, {"url": exit.url, "layers": "12-24"}]});
    std::fs::write(&mesh, m.to_string()).expect("write mesh");
    let mesh = mesh.to_str().expect("utf-8 path");
    let run = |prompt: &str, n: &str, extra: &[&str]| -> Value {
        let mut a = vec!["--chat", "-c", prompt, "-n", n, "--json", "--mesh", mesh];
        a.extend_from_slice(extra);
        // Greedy unless asked: --chat samples at temperature 0.8 by default.
        if !extra.contains(&"--temperature") {
            a.extend(["--temperature", "0"]);
        }
        let (out, _) = moonshine_ok(&a, None);
        serde_json::from_str(out.lines().next().expect("one turn")).expect("json")
    };
    let per_trip = |v: &Value| v["tokens_per_trip"].as_f64().expect("tokens_per_trip");
    for (what, prompt, n) in [("code", EDIT_PROMPT, "80"), ("prose", PROSE_PROMPT, "40")] {
        let plain = run(prompt, n, &[]);
        let fast = run(prompt, n, &["--lookup"]);
        assert_eq!(
            plain["tokens"], fast["tokens"],
            "{what}: lookup changed greedy output:\n{}\n---\n{}",
            plain["text"], fast["text"]
        );
        assert_eq!(plain["drafted"], 0);
        assert_eq!(
            per_trip(&plain),
            1.0,
            "{what}: plain decoding is one token a trip"
        );
        eprintln!(
            "{what}: {} tokens, plain {} trips, lookup {} trips ({} of {} drafts kept)",
            fast["tokens"].as_array().map_or(0, |a| a.len()),
            plain["trips"],
            fast["trips"],
            fast["accepted"],
            fast["drafted"]
        );
        if what == "code" {
            assert!(
                per_trip(&fast) > 2.0,
                "the code edit repeats its prompt: {} tokens per trip\n{}",
                per_trip(&fast),
                fast["text"]
            );
        }
    }
    let sampled = run(
        EDIT_PROMPT,
        "40",
        &["--lookup", "--temperature", "0.7", "--seed", "5"],
    );
    let (acc, dr) = (
        sampled["accepted"].as_u64().expect("accepted"),
        sampled["drafted"].as_u64().expect("drafted"),
    );
    assert!(acc > 0 && acc <= dr, "sampled lookup: {acc} of {dr} kept");
}
