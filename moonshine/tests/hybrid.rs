//! A hybrid model (Liquid LFM2: short convolutions between attention layers) behind the
//! gateway: a second chat turn processes only its new tokens (counted on the station), and
//! lookup decoding, which rolls back rejected drafts, gives the plain greedy ids. The model is
//! synthetic (`make-synthetic-model.py --preset lfm2-tiny`): random weights, Qwen's tokenizer
//! and chat template.

mod support;

use serde_json::Value;
use support::*;

fn metrics(url: &str) -> String {
    ureq::get(&format!("{url}/metrics"))
        .call()
        .expect("GET /metrics")
        .into_string()
        .expect("metrics text")
}

/// Asserts the station never answered `409` (a session it could not rewind, which the gateway
/// would answer by filling the session again from position 0).
fn assert_no_conflicts(url: &str) {
    let text = metrics(url);
    assert!(
        !text.contains("code=\"409\""),
        "the station refused a rewind:\n{text}"
    );
}

/// `fat_station_tokens_total` of the station at `url`: token rows that entered the model.
fn tokens_embedded(url: &str) -> u64 {
    let text = metrics(url);
    text.lines()
        .find_map(|l| l.strip_prefix("fat_station_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fat_station_tokens_total in\n{text}"))
}

#[test]
fn a_second_chat_turn_on_a_hybrid_processes_only_its_new_tokens() {
    second_turn_processes_only_its_new_tokens("lfm2-tiny");
}

/// The same on Mamba, every layer a scan whose state cannot be cut back, only restored from
/// its snapshots (the end of each prompt, the starts of the latest forwards).
#[test]
fn a_second_chat_turn_on_mamba_processes_only_its_new_tokens() {
    second_turn_processes_only_its_new_tokens("mamba-tiny");
}

fn second_turn_processes_only_its_new_tokens(preset: &str) {
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_, knot)) = test_support::synthetic_model(dir.path(), preset, &[]) else {
        return;
    };
    let st = station(&bin, &knot, &[]);
    let (_, err) = moonshine_ok(
        &[
            "--chat",
            "-c",
            "What is the capital of France? Answer in one word.",
            "-n",
            "12",
            "--temperature",
            "0",
            "--stats",
            "--station",
            &st.url,
        ],
        Some("What is the capital of Germany? Answer in one word.\n"),
    );
    // "turn N: sent S of T prompt tokens (R reused from the KV cache), n tokens in ..."
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
    let (sent, total, reused) = (t2[1], t2[2], t2[3]);
    assert!(
        reused > t1[2] && sent + reused == total && sent < 30,
        "{preset}: turn 2 reuses turn 1 and its reply: {t1:?} {t2:?}\n{err}"
    );
    // On the station: both prompts' new tokens and the decoded ones, nothing re-processed
    // (a refill of turn 2 from position 0 would embed its `total` tokens again).
    assert_no_conflicts(&st.url);
    let (gen1, gen2) = (t1[4], t2[4]);
    let embedded = tokens_embedded(&st.url) as usize;
    assert!(
        embedded <= t1[1] + sent + gen1 + gen2 && embedded < t1[2] + total,
        "{preset}: the station embedded {embedded} tokens: turn 1 sent {}, turn 2 sent \
         {sent} of {total}, {gen1} + {gen2} generated",
        t1[1]
    );
}

#[test]
fn lookup_decoding_on_a_hybrid_gives_the_plain_greedy_ids() {
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_, knot)) = test_support::synthetic_model(dir.path(), "lfm2-tiny", &[]) else {
        return;
    };
    let st = station(&bin, &knot, &[]);
    // A prompt that repeats itself, so prompt-lookup drafts something; on this model and
    // prompt some drafts are rejected (measured: 17 of 18 kept), so the stations roll back.
    let prompt = "the cat sat on the mat and the dog sat on the log and the cat";
    let run = |extra: &[&str]| -> Value {
        let mut a = vec![
            "--chat",
            "-c",
            prompt,
            "-n",
            "40",
            "--json",
            "--temperature",
            "0",
            "--station",
            &st.url,
        ];
        a.extend_from_slice(extra);
        let (out, _) = moonshine_ok(&a, None);
        serde_json::from_str(out.lines().next().expect("one turn")).expect("json")
    };
    let plain = run(&[]);
    let fast = run(&["--lookup"]);
    assert_eq!(
        plain["tokens"], fast["tokens"],
        "lookup changed greedy output on lfm2"
    );
    let (acc, dr) = (
        fast["accepted"].as_u64().expect("accepted"),
        fast["drafted"].as_u64().expect("drafted"),
    );
    assert!(
        acc < dr,
        "every draft was kept ({acc} of {dr}): no rollback was exercised"
    );
    assert_no_conflicts(&st.url);
    eprintln!(
        "lfm2 lookup: {} tokens, plain {} trips, lookup {} trips ({} of {} drafts kept)",
        fast["tokens"].as_array().map_or(0, |a| a.len()),
        plain["trips"],
        fast["trips"],
        fast["accepted"],
        fast["drafted"]
    );
}

/// A rewind the recurrent state cannot make exactly (past what a Gated DeltaNet keeps: the
/// start of its latest forward and the checkpoints) answers `409 session_mismatch` with the
/// position the station went back to; the gateway re-sends from there, not from 0, and the
/// logits equal a fresh session's. The synthetic Qwen3.5 (`--preset qwen35-tiny`), a station
/// keeping a checkpoint every 4 positions and none at turn ends.
#[test]
fn after_a_409_the_gateway_resends_from_the_stations_checkpoint_not_from_zero() {
    use moonshine::generate::{KvSession, Timing};
    use station_wire::client::{Chain, StationClient};
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_, knot)) = test_support::synthetic_model(dir.path(), "qwen35-tiny", &[]) else {
        return;
    };
    let st = station(
        &bin,
        &knot,
        &["--checkpoint-every", "4", "--checkpoint-turns", "0"],
    );
    let timeout = std::time::Duration::from_secs(60);
    let chain = Chain::new(vec![(
        StationClient::new(&st.url, timeout),
        knot_format::LayerRange::new(0, 4),
    )])
    .expect("chain");
    let a: Vec<u32> = (0..12).map(|i| 785 + 37 * i).collect();
    let mut s = KvSession::new("rewind");
    let mut timing = Timing::default();
    // Decode-like: one token per request, 12 positions (checkpoints at 4, 8, 12).
    for i in 1..=a.len() {
        let (_, sent) = s
            .feed(&chain, &a[..i], &mut timing, &|| false)
            .expect("feed");
        assert_eq!(sent, 1);
    }
    let before = tokens_embedded(&st.url);
    // An edited turn keeping 6 tokens: the station goes back to its checkpoint at 4 (409),
    // and the gateway sends the 5 tokens from there.
    let mut b = a[..6].to_vec();
    b.extend([11, 12, 13]);
    let (got, sent) = s
        .feed(&chain, &b, &mut timing, &|| false)
        .expect("rewound feed");
    assert_eq!(sent, b.len() - 4, "re-sent from the checkpoint at 4");
    // On the station: fewer rows embedded than a refill from 0 (the refused request, then
    // all 9 again) would take.
    let embedded = tokens_embedded(&st.url) - before;
    assert!(
        embedded < 2 * b.len() as u64,
        "{embedded} tokens embedded for the rewound feed"
    );
    assert!(
        metrics(&st.url).contains("code=\"409\""),
        "the station answered 409 for the rewind"
    );
    let mut fresh = KvSession::new("fresh");
    let (want, _) = fresh
        .feed(&chain, &b, &mut timing, &|| false)
        .expect("fresh");
    assert_eq!(got, want, "the replay from the checkpoint is exact");
}
