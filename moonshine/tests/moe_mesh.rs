//! Issue 34, the mesh on a mixture-of-experts model: everything the mesh does for dense models,
//! on the tiny synthetic qwen3moe (`make-synthetic-model.py --preset tiny-moe`: 4 layers,
//! hidden 128, 8 experts, top-2, seeded random weights, Qwen's tokenizer). A live three-station
//! chain behind `moonshine serve --mesh` and the CLI gives the single process's greedy ids, one
//! `/chain` per token; lookup decoding over the chain gives the plain greedy ids; killing the
//! active replica's exit mid-generation finishes on the other replica with the same ids; and
//! the gate: a qspec on the MoE model admits it through `monster-guard delegate` and
//! `paris-probe`, refuses a wrong expectation, and the probe over the chain reports what it
//! reports on the file.
//!
//! Needs python3 with PyPI `gguf` and `numpy`, the Qwen GGUF (its tokenizer) and the release
//! binaries (fat-station, paris-probe, monster-guard); without them each test skips with a line
//! on stderr, unless `AEON_REQUIRE_MODELS=1`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use aeon_engine::{ops::argmax, Model};
use knot_format::Knot;
use station_wire::mesh_file::{MeshFile, MeshHop};
use station_wire::replicas::{MeshChain, ReplicaSet};
use support::*;

/// "The capital of France is" in Qwen's tokenizer.
const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];
const PROMPT_CSV: &str = "785,6722,315,9625,374";
/// The tiny model's layers, split unevenly so that a middle hop runs two.
const SPLIT: [(u32, u32); 3] = [(0, 1), (1, 3), (3, 4)];

/// The tiny qwen3moe KNOT made in `dir`, or `None` (skip) without the tools.
fn tiny_moe(dir: &Path) -> Option<PathBuf> {
    test_support::synthetic_model(dir, "tiny-moe", &[]).map(|(_, knot)| knot)
}

/// Greedy ids after `prompt` in this process (the reference every chain must equal), with the
/// gap between the best and second-best logit at each step.
fn engine_greedy(knot: &Path, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let k = Knot::open(knot).expect("open knot");
    let m = Model::load(&k, None).expect("load");
    let mut s = m.new_session(prompt.len() + n + 1);
    let mut next = m.logits(&mut s, prompt).expect("prefill");
    let (mut ids, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&next);
        let second = next
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != t as usize)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        gaps.push(next[t as usize] - second);
        ids.push(t);
        next = m.logits(&mut s, &[t]).expect("decode");
    }
    (ids, gaps)
}

/// Three stations over `knot` forwarding to each other (entry -> mid -> exit) on `SPLIT`.
fn three_stations(bin: &Path, knot: &Path) -> Vec<Proc> {
    let (a, b, c) = (SPLIT[0], SPLIT[1], SPLIT[2]);
    let exit = station(
        bin,
        knot,
        &["--role", "exit", "--layers", &format!("{}..{}", c.0, c.1)],
    );
    let mid = station(
        bin,
        knot,
        &[
            "--role",
            "mid",
            "--layers",
            &format!("{}..{}", b.0, b.1),
            "--route-to",
            &exit.url,
        ],
    );
    let entry = station(
        bin,
        knot,
        &[
            "--role",
            "entry",
            "--layers",
            &format!("{}..{}", a.0, a.1),
            "--route-to",
            &mid.url,
        ],
    );
    vec![entry, mid, exit]
}

fn hops(stations: &[Proc]) -> Vec<MeshHop> {
    stations
        .iter()
        .zip(SPLIT)
        .enumerate()
        .map(|(i, (p, (a, b)))| MeshHop {
            node_id: format!("n{i}"),
            url: p.url.clone(),
            layers: format!("{a}-{b}"),
        })
        .collect()
}

/// Writes a mesh file of one chain at `path`.
fn write_mesh(path: &Path, stations: &[Proc]) -> String {
    let m = MeshFile {
        model: Some("tiny-moe".into()),
        stations: hops(stations),
        ..MeshFile::default()
    };
    std::fs::write(path, serde_json::to_string(&m).expect("json")).expect("write mesh");
    path.to_str().expect("utf-8").to_string()
}

/// `moonshine --json ARGS`: the generated ids and the whole JSON line.
fn moonshine_json(args: &[&str]) -> (Vec<u32>, serde_json::Value) {
    let mut a = args.to_vec();
    a.push("--json");
    let (out, err) = moonshine_ok(&a, None);
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let ids = v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in {v}"))
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect();
    (ids, v)
}

/// `fat_station_requests_total{route="/chain"}` of a station, summed over status codes.
fn chain_requests(url: &str) -> f64 {
    let text = ureq::get(&format!("{url}/metrics"))
        .call()
        .expect("metrics")
        .into_string()
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with("fat_station_requests_total{route=\"/chain\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn completion(gw: &Proc, max_tokens: u32) -> serde_json::Value {
    let body = serde_json::json!({"model": "m", "prompt": PROMPT.to_vec(), "max_tokens": max_tokens,
        "temperature": 0});
    let text = ureq::post(&format!("{}/v1/completions", gw.url))
        .send_string(&body.to_string())
        .unwrap_or_else(|e| panic!("completion: {e}"))
        .into_string()
        .expect("body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_three_station_moe_chain_gives_the_single_process_greedy_ids() {
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(knot) = tiny_moe(dir.path()) else {
        return;
    };
    let (want, _) = engine_greedy(&knot, &PROMPT, 16);
    let stations = three_stations(&bin, &knot);
    let mesh = write_mesh(&dir.path().join("mesh.json"), &stations);

    // The CLI over the chain (one POST /chain per token into the entry).
    let (got, _) = moonshine_json(&["--mesh", &mesh, "--tokens", PROMPT_CSV, "-n", "16"]);
    assert_eq!(
        got, want,
        "the MoE chain's greedy ids differ from one process"
    );

    // The gateway over the chain and over one full station: the same completion, and the chain
    // costs one /chain per generated token at every hop.
    let one = station(&bin, &knot, &[]);
    let moonshine = Path::new(env!("CARGO_BIN_EXE_moonshine"));
    let gw_chain = spawn_listening(moonshine, &["serve", "--mesh", &mesh]);
    let gw_one = spawn_listening(moonshine, &["serve", "--station", &one.url]);
    completion(&gw_chain, 1); // warm: the vocabulary fetch
    let before: Vec<f64> = stations.iter().map(|s| chain_requests(&s.url)).collect();
    let a = completion(&gw_chain, 12);
    let b = completion(&gw_one, 12);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{a}\n{b}");
    assert_eq!(a["usage"]["completion_tokens"], 12, "{a}");
    let per_hop: Vec<f64> = stations
        .iter()
        .zip(&before)
        .map(|(s, b)| chain_requests(&s.url) - b)
        .collect();
    assert!(
        per_hop.iter().all(|&n| n == per_hop[0]) && (12.0..=13.0).contains(&per_hop[0]),
        "one /chain per token at every hop: {per_hop:?}"
    );
}

#[test]
fn lookup_decoding_over_an_moe_chain_gives_the_plain_greedy_ids() {
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(knot) = tiny_moe(dir.path()) else {
        return;
    };
    let stations = three_stations(&bin, &knot);
    let mesh = write_mesh(&dir.path().join("mesh.json"), &stations);
    // A prompt that repeats itself, so prompt lookup drafts something.
    let prompt = "the cat sat on the mat and the dog sat on the log and the cat sat on the mat";
    let args = [
        "--mesh",
        &mesh,
        "-c",
        prompt,
        "-n",
        "40",
        "--temperature",
        "0",
    ];
    let (plain, p) = moonshine_json(&args);
    let (fast, f) = moonshine_json(&[&args[..], &["--lookup"]].concat());
    assert_eq!(plain, fast, "lookup changed the greedy ids on qwen3moe");
    let drafted = f["drafted"].as_u64().expect("drafted");
    let accepted = f["accepted"].as_u64().expect("accepted");
    // Measured: 11 of 26 drafts kept, so the stations rolled rejected drafts back.
    assert!(
        0 < drafted && accepted < drafted,
        "no draft was rejected ({accepted} of {drafted}): no rollback was exercised: {f}"
    );
    eprintln!(
        "qwen3moe lookup over 3 stations: {} tokens, plain {} trips, lookup {} trips ({} of {} \
         drafts kept)",
        fast.len(),
        p["trips"],
        f["trips"],
        f["accepted"],
        drafted
    );
}

#[test]
fn an_moe_chain_fails_over_to_a_replica_mid_generation_with_the_same_ids() {
    let Some(bin) = station_bin() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(knot) = tiny_moe(dir.path()) else {
        return;
    };
    let (want, _) = engine_greedy(&knot, &PROMPT, 16);
    let mut c0: Vec<Option<Proc>> = three_stations(&bin, &knot).into_iter().map(Some).collect();
    let c1 = three_stations(&bin, &knot);
    let chain0: Vec<MeshHop> = c0
        .iter()
        .flatten()
        .zip(SPLIT)
        .enumerate()
        .map(|(i, (p, (a, b)))| MeshHop {
            node_id: format!("c0n{i}"),
            url: p.url.clone(),
            layers: format!("{a}-{b}"),
        })
        .collect();
    let chains = vec![
        MeshChain::new(chain0, Duration::from_secs(60)).expect("chain 0"),
        MeshChain::new(hops(&c1), Duration::from_secs(60)).expect("chain 1"),
    ];
    let mut rs = ReplicaSet::new(chains, "moe-failover").expect("replicas");
    let got = rs
        .generate_greedy(&PROMPT, 16, &[], &mut |i, _| {
            if i == 4 {
                c0[2] = None; // chain 0's exit (layers 3-4) dies after the 5th token
            }
        })
        .expect("generation completes on the replica");
    assert_eq!(got, want, "ids after failover differ from one process");
    assert_eq!(rs.failovers.len(), 1, "exactly one failover");
    let f = &rs.failovers[0];
    assert_eq!(
        (f.from_chain, f.to_chain, f.reprefilled),
        (0, 1, PROMPT.len() + 5)
    );
    assert!(
        f.error.contains("c0n2") && f.error.contains("3-4"),
        "the failover names the dead hop: {}",
        f.error
    );
}

/// monster-guard with a fresh home in `dir`.
fn guard(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(test_support::release_bin(
        "monster-guard",
        "MONSTER_GUARD_BIN",
    ));
    c.args(args)
        .env("MONSTER_GUARD_HOME", dir.join("home"))
        .env_remove("PARIS_PROBE");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// paris-probe's JSON verdict with `args`.
fn probe_json(probe: &Path, args: &[&str]) -> serde_json::Value {
    let o = Command::new(probe)
        .args(args)
        .arg("--json")
        .output()
        .expect("spawn paris-probe");
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

#[test]
fn the_gate_admits_an_moe_model_by_its_qspec_and_refuses_a_wrong_one() {
    let Some(bin) = station_bin() else { return };
    let Some(probe) = test_support::need(
        test_support::release_bin("paris-probe", "PARIS_PROBE"),
        "cargo build --release -p paris-probe, or set PARIS_PROBE",
    ) else {
        return;
    };
    if test_support::need(
        test_support::release_bin("monster-guard", "MONSTER_GUARD_BIN"),
        "cargo build --release -p monster-guard, or set MONSTER_GUARD_BIN",
    )
    .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(knot) = tiny_moe(dir.path()) else {
        return;
    };
    let knot_s = knot.to_str().expect("utf-8");
    // The model's own greedy continuation is the spec's expectation (random weights know no
    // facts); its margin over the runner-up sets the bar.
    let (ids, gaps) = engine_greedy(&knot, &PROMPT, 1);
    let margin = f64::from(gaps[0]);
    assert!(margin > 0.05, "a near-tie makes a poor probe: {margin}");

    // paris-probe over the three-station chain judges as it does on the file.
    let expected = ids[0].to_string();
    let on_file = probe_json(
        &probe,
        &[
            "--dense",
            knot_s,
            "--tokens",
            PROMPT_CSV,
            "--expected",
            &expected,
        ],
    );
    let stations = three_stations(&bin, &knot);
    let mesh = write_mesh(&dir.path().join("mesh.json"), &stations);
    let on_chain = probe_json(
        &probe,
        &[
            "--mesh",
            &mesh,
            "--tokens",
            PROMPT_CSV,
            "--expected",
            &expected,
        ],
    );
    assert_eq!(on_file["argmax"], ids[0], "{on_file}");
    assert_eq!(on_chain["argmax"], on_file["argmax"], "{on_chain}");
    assert_eq!(on_file["pass"], true, "{on_file}");
    assert_eq!(on_chain["top"], on_file["top"], "{on_chain}\n{on_file}");

    let spec = |name: &str, expect: u32, min_margin: f64| -> PathBuf {
        let p = dir.path().join(name);
        let s = serde_json::json!({"knot": knot_s, "prompt_tokens": PROMPT,
            "expect_token": expect, "min_margin": min_margin, "timeout_secs": 60});
        std::fs::write(&p, s.to_string()).expect("write spec");
        p
    };
    let delegate = |spec: &Path| -> Output {
        guard(
            dir.path(),
            &["delegate", "moe", "net", "--ttl", "600", "--qspec"],
        )
        .arg(spec)
        .arg("--probe")
        .arg(&probe)
        .output()
        .expect("spawn monster-guard")
    };
    let ok = delegate(&spec("pass.json", ids[0], margin / 2.0));
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("quality spec passed -> delegated"),
        "{}",
        text(&ok)
    );
    assert!(dir.path().join("home/grants/moe.json").is_file());

    // Another token expected, or a margin the model does not have: refused, no grant.
    std::fs::remove_file(dir.path().join("home/grants/moe.json")).expect("rm grant");
    let second = on_file["top"][1]["id"].as_u64().expect("runner-up") as u32;
    for (name, expect, min_margin) in [
        ("wrong.json", second, 0.0),
        ("thin.json", ids[0], margin * 2.0),
    ] {
        let no = delegate(&spec(name, expect, min_margin));
        assert_eq!(no.status.code(), Some(3), "{name}: {}", text(&no));
        assert!(
            !dir.path().join("home/grants/moe.json").exists(),
            "{name} minted a grant"
        );
    }
}
