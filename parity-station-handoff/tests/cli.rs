//! The parity CLI on the real models (skips when absent unless AEON_REQUIRE_MODELS=1).

use std::path::PathBuf;
use std::process::{Command, Output};

use test_support::{model, GEMMA, QWEN, SMOLLM2};

const BIN: &str = env!("CARGO_BIN_EXE_parity-station-handoff");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("spawn parity-station-handoff")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn qwen_midpoint_split_is_bit_identical() {
    let Some(m) = model(QWEN) else {
        return;
    };
    let o = run(&[m.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("split 0..12 | 12..24 (views)"), "{t}");
    assert_eq!(
        t.matches("max|d| 0.000e0").count(),
        4,
        "residual and logits of both tests: {t}"
    );
    assert!(
        t.contains("tokens [785, 6722, 315, 9625,"),
        "the default tokens start with the Paris prompt: {t}"
    );
    // The seed report's lines, at the start of a line, so scripts that grep them work.
    for want in [
        "TEST 1 (4 tokens): cos=1.000000 max-abs-delta=0.000000 -> PASS",
        "TEST 2 (8 tokens, 4+4): cos=1.000000 max-abs-delta=0.000000 -> PASS",
    ] {
        assert!(
            t.lines().any(|l| l.starts_with(want)),
            "no {want:?} in:\n{t}"
        );
    }
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .ends_with("OVERALL: PASS"),
        "{t}"
    );
}

#[test]
fn qwen_three_way_split_from_shard_files_json() {
    let Some(m) = model(QWEN) else {
        return;
    };
    let o = run(&[
        m.to_str().unwrap(),
        "--split",
        "8,16",
        "--from-shards",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert_eq!(j["overall"], "PASS");
    let splits = j["splits"].as_array().expect("splits");
    assert_eq!(
        splits
            .iter()
            .map(|s| s["source"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["views", "shards"]
    );
    for s in splits {
        assert_eq!(s["ranges"].as_array().unwrap().len(), 3);
        for t in ["test1", "test2"] {
            for what in ["residual", "logits"] {
                assert_eq!(s[t][what]["max_abs_delta"], 0.0, "{t} {what}");
                assert_eq!(s[t][what]["identical"], true);
            }
        }
    }
}

#[test]
fn smollm2_tied_head_split_from_shards() {
    let Some(m) = model(SMOLLM2) else {
        return;
    };
    let o = run(&[m.to_str().unwrap(), "--split", "7,23", "--from-shards"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("0..7 | 7..23 | 23..30 (shards)"), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .ends_with("OVERALL: PASS"),
        "{t}"
    );
}

/// Issue 19: gemma3 splits like qwen2. Cuts on both sides of its first global layer (5 of
/// 0..18; the others slide a window) and one in the second group, from real shard files: the
/// tied head, the sandwich norms and the two RoPE bases all travel with their layers.
#[test]
fn gemma3_split_around_a_global_layer_from_shards() {
    let Some(m) = model(GEMMA) else {
        return;
    };
    let o = run(&[
        m.to_str().unwrap(),
        "--split",
        "5,6,13",
        "--from-shards",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert_eq!(j["overall"], "PASS", "{j}");
    for s in j["splits"].as_array().expect("splits") {
        assert_eq!(s["ranges"].as_array().unwrap().len(), 4, "{s}");
        for t in ["test1", "test2"] {
            for what in ["residual", "logits"] {
                assert_eq!(s[t][what]["identical"], true, "{t} {what}: {s}");
            }
        }
    }
}

#[test]
fn bad_splits_and_shard_inputs_exit_2() {
    let Some(m) = model(SMOLLM2) else {
        return;
    };
    let m = m.to_str().unwrap();
    for args in [
        vec![m, "--split", "0"],
        vec![m, "--split", "30"],
        vec![m, "--split", "12,8"],
        vec![m, "--tokens", "1,2,3"],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
    // A shard is not a whole model.
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_parity-station-handoff"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("--all-splits"));
    let shard_bin = PathBuf::from(BIN).with_file_name("shard-knot");
    if shard_bin.exists() {
        let s = Command::new(&shard_bin)
            .args(["split", m, "--nodes", "2", "-o"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(s.status.success(), "{}", text(&s));
        let shard = dir.path().join("smollm2-135m-instruct-q4_1.L00-15.knot");
        let o = run(&[shard.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("is a shard"), "{}", text(&o));
    }
}
