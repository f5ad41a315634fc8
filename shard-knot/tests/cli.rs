//! The `shard-knot` CLI on a synthetic model (always runs) and on SmolLM2 (tied head; skips
//! when the model is absent unless AEON_REQUIRE_MODELS=1).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use knot_format::{ArchConfig, Knot, KnotWriter, LayerRange, Role, TokenizerData};
use test_support::{model, reseal, tiny_arch, SMOLLM2};

const BIN: &str = env!("CARGO_BIN_EXE_shard-knot");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("spawn shard-knot")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "shard-knot {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 stdout")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A tiny 4-layer model: two F32 tensors per block, embedding, final norm and (unless tied)
/// an output head. Every tensor has distinct bytes.
fn synthetic(dir: &Path, tied: bool) -> PathBuf {
    let (hidden, vocab, n_layers) = (32u32, 16u32, 4u32);
    let arch = ArchConfig {
        hidden,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
        vocab,
        context_len: 128,
        tied_embeddings: tied,
        ..tiny_arch(n_layers)
    };
    let mut w = KnotWriter::new("synthetic", arch);
    w.tokenizer(TokenizerData {
        model: "gpt2".into(),
        tokens: (0..vocab).map(|i| format!("t{i}")).collect(),
        ..Default::default()
    });
    let mut seed = 0u32;
    let mut data = |n: u32| -> Vec<u8> {
        seed += 1;
        (0..n)
            .flat_map(|i| ((seed * 1000 + i) as f32).to_le_bytes())
            .collect()
    };
    let f32t = knot_format::DType::F32;
    w.add_tensor_owned(
        "token_embd.weight",
        f32t,
        vec![hidden as u64, vocab as u64],
        data(hidden * vocab),
    )
    .unwrap();
    for l in 0..n_layers {
        w.add_tensor_owned(
            &format!("blk.{l}.attn_norm.weight"),
            f32t,
            vec![hidden as u64],
            data(hidden),
        )
        .unwrap();
        w.add_tensor_owned(
            &format!("blk.{l}.ffn_norm.weight"),
            f32t,
            vec![hidden as u64],
            data(hidden),
        )
        .unwrap();
    }
    w.add_tensor_owned(
        "output_norm.weight",
        f32t,
        vec![hidden as u64],
        data(hidden),
    )
    .unwrap();
    if !tied {
        w.add_tensor_owned(
            "output.weight",
            f32t,
            vec![hidden as u64, vocab as u64],
            data(hidden * vocab),
        )
        .unwrap();
    }
    let p = dir.join(if tied { "tied.knot" } else { "untied.knot" });
    w.write(&p, &mut |_| {}).unwrap();
    p
}

fn names(k: &Knot) -> Vec<String> {
    k.tensors().map(|t| t.name().to_string()).collect()
}

/// Every tensor of `shard` is the parent's, bit for bit, under the same name.
fn assert_copied(parent: &Knot, shard: &Knot) {
    for t in shard.tensors() {
        let p = parent
            .tensor(t.name())
            .unwrap_or_else(|| panic!("{} is not in the parent", t.name()));
        assert_eq!(p.bytes, t.bytes, "{} differs from the parent", t.name());
        assert_eq!(
            (p.entry.dtype, &p.entry.shape),
            (t.entry.dtype, &t.entry.shape)
        );
    }
}

#[test]
fn split_untied_into_entry_mid_exit() {
    let dir = tempfile::tempdir().unwrap();
    let m = synthetic(dir.path(), false);
    let out = dir.path().join("shards");
    let text = ok(&["split", s(&m), "--ranges", "0..1,1..3,3..4", "-o", s(&out)]);
    assert!(text.contains("wrote 3 shards"), "{text}");
    let parent = Knot::open(&m).unwrap();
    let open = |n: &str| Knot::open(out.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let (entry, mid, exit) = (
        open("untied.L00-01.knot"),
        open("untied.L01-03.knot"),
        open("untied.L03-04.knot"),
    );
    for (k, role, r) in [
        (&entry, Role::Entry, LayerRange::new(0, 1)),
        (&mid, Role::Mid, LayerRange::new(1, 3)),
        (&exit, Role::Exit, LayerRange::new(3, 4)),
    ] {
        k.verify(&mut |_| {}).expect("shard verifies");
        let rec = k.shard().expect("shard record");
        assert_eq!((rec.role, rec.layers, rec.parent_layers), (role, r, 4));
        assert_eq!(rec.parent_hash, parent.model_hash());
        assert_eq!(k.arch(), parent.arch());
        assert_eq!(
            k.tokenizer().unwrap(),
            parent.tokenizer().unwrap(),
            "tokenizer copied"
        );
        assert_copied(&parent, k);
    }
    assert_eq!(
        names(&entry),
        [
            "token_embd.weight",
            "blk.0.attn_norm.weight",
            "blk.0.ffn_norm.weight"
        ]
    );
    assert_eq!(
        names(&mid),
        [
            "blk.1.attn_norm.weight",
            "blk.1.ffn_norm.weight",
            "blk.2.attn_norm.weight",
            "blk.2.ffn_norm.weight"
        ]
    );
    assert_eq!(
        names(&exit),
        [
            "blk.3.attn_norm.weight",
            "blk.3.ffn_norm.weight",
            "output_norm.weight",
            "output.weight"
        ]
    );

    // inspect --json: role, range, parent and the byte breakdown.
    let j: serde_json::Value = serde_json::from_str(&ok(&[
        "inspect",
        s(&out.join("untied.L03-04.knot")),
        "--json",
    ]))
    .unwrap();
    assert_eq!(j["role"], "exit");
    assert_eq!(j["layers"]["start"], 3);
    assert_eq!(j["parent_hash"], parent.model_hash());
    assert_eq!(j["bytes"]["embedding"], 0);
    assert_eq!(j["bytes"]["layers"], 2 * 32 * 4);
    assert_eq!(j["bytes"]["head"], 32 * 4 + 32 * 16 * 4);
    assert_eq!(j["missing_layers"].as_array().map(Vec::len), Some(0));
    let text = ok(&["inspect", s(&out.join("untied.L00-01.knot"))]);
    assert!(
        text.contains("role        entry (layers 0..1 of 4)"),
        "{text}"
    );
}

#[test]
fn tied_exit_gets_the_embedding_and_nodes_split_evenly() {
    let dir = tempfile::tempdir().unwrap();
    let m = synthetic(dir.path(), true);
    let out = dir.path().join("s");
    ok(&["split", s(&m), "--nodes", "2", "-o", s(&out)]);
    let exit = Knot::open(out.join("tied.L02-04.knot")).unwrap();
    assert_eq!(exit.shard().unwrap().role, Role::Exit);
    assert!(
        exit.tensor("token_embd.weight").is_some(),
        "a tied exit carries the embedding as its head"
    );
    assert_copied(&Knot::open(&m).unwrap(), &exit);
    let j: serde_json::Value = serde_json::from_str(&ok(&[
        "inspect",
        s(&out.join("tied.L02-04.knot")),
        "--json",
    ]))
    .unwrap();
    assert_eq!(j["bytes"]["embedding"], 0);
    assert_eq!(j["bytes"]["head"], 32 * 4 + 32 * 16 * 4);
    assert_eq!(j["tied_head"], true);

    // One range over everything is a full shard.
    ok(&["split", s(&m), "--nodes", "1", "-o", s(&out)]);
    let full = Knot::open(out.join("tied.L00-04.knot")).unwrap();
    assert_eq!(full.shard().unwrap().role, Role::Full);
    assert_eq!(names(&full), names(&Knot::open(&m).unwrap()));
}

#[test]
fn bad_input_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let m = synthetic(dir.path(), false);
    let out = dir.path().join("o");
    for (args, needle) in [
        (
            vec!["split", s(&m), "--ranges", "0..3,2..4", "-o", s(&out)],
            "overlaps",
        ),
        (
            vec!["split", s(&m), "--ranges", "0..5", "-o", s(&out)],
            "outside the model",
        ),
        (
            vec!["split", s(&m), "--ranges", "a..b", "-o", s(&out)],
            "bad range",
        ),
        (
            // A hole in the chain was a warning, and the shards were written.
            vec!["split", s(&m), "--ranges", "0..1,2..4", "-o", s(&out)],
            "shard-knot: error: --ranges: ranges 0..1,2..4: layers 1..2 are in no range: the shards would not make a whole chain\n",
        ),
        (
            vec!["split", s(&m), "--nodes", "5", "-o", s(&out)],
            "more nodes than layers",
        ),
        (
            vec!["split", "/nonexistent.knot", "--nodes", "2", "-o", s(&out)],
            "open /nonexistent.knot: No such file",
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
    }
    // Neither --ranges nor --nodes: clap usage error (exit 2).
    assert_eq!(run(&["split", s(&m), "-o", s(&out)]).status.code(), Some(2));
    // A shard cannot be split again.
    ok(&["split", s(&m), "--nodes", "2", "-o", s(&out)]);
    let o = run(&[
        "split",
        s(&out.join("untied.L00-02.knot")),
        "--nodes",
        "2",
        "-o",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already a shard"));
    // No temp files left behind.
    let stray: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(stray.is_empty(), "temp files left: {stray:?}");
}

/// Issue 21: `--node-ram 2.4` was read as 2 bytes ("0 KB"); a size needs a unit.
#[test]
fn plan_refuses_a_size_without_a_unit() {
    let o = run(&[
        "plan",
        "--model-bytes",
        "7G",
        "--layers",
        "32",
        "--node-ram",
        "2.4",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--node-ram") && err.contains("did you mean 2.4G?"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert_eq!(
        err.matches("did you mean").count(),
        1,
        "the cause once: {err}"
    );
    let o = run(&[
        "plan",
        "--model-bytes",
        "7",
        "--layers",
        "32",
        "--node-ram",
        "2.4G",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--model-bytes") && err.contains("did you mean 7G?"),
        "{err}"
    );
}

/// The `knot` binary beside ours, if it was built (target/<profile>/knot).
fn knot_bin() -> Option<PathBuf> {
    let p = Path::new(BIN).with_file_name("knot");
    p.exists().then_some(p)
}

#[test]
fn smollm2_shards_verify_and_cover_the_model() {
    let Some(m) = model(SMOLLM2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    ok(&["split", s(&m), "--nodes", "3", "-o", s(dir.path())]);
    let parent = Knot::open(&m).unwrap();
    let mut held = std::collections::BTreeSet::new();
    for name in [
        "smollm2-135m-instruct-q4_1.L00-10.knot",
        "smollm2-135m-instruct-q4_1.L10-20.knot",
        "smollm2-135m-instruct-q4_1.L20-30.knot",
    ] {
        let p = dir.path().join(name);
        let k = Knot::open(&p).unwrap();
        k.verify(&mut |_| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(knot) = knot_bin() {
            let o = Command::new(knot).args(["verify", s(&p)]).output().unwrap();
            assert!(
                o.status.success(),
                "knot verify {name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert_copied(&parent, &k);
        held.extend(names(&k));
    }
    assert_eq!(
        held,
        names(&parent).into_iter().collect(),
        "the shards hold every tensor"
    );
}

/// Runs shard-knot with its address space capped at 2 GiB, so a reader that trusts a
/// hostile header dies (exit 134) instead of taking the machine's memory.
fn run_capped(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152 && exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(args)
        .output()
        .expect("spawn sh")
}

/// Issue 17 item 11: `inspect` and `plan` aborted (68 GB allocation) on a KNOT claiming
/// 2^31 layers or a shard of layers 7..u32::MAX, which `Knot::open` accepted. Now the
/// reader refuses the header: one line, exit 2.
#[test]
fn absurd_layer_counts_are_refused_not_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let m = synthetic(dir.path(), true);
    let out = dir.path().join("shards");
    ok(&["split", s(&m), "--nodes", "2", "-o", s(&out)]);
    let shard = out.join("tied.L02-04.knot");
    reseal(&m, |h| h["arch"]["n_layers"] = (1u64 << 31).into());
    reseal(&shard, |h| {
        h["shard"]["layers"] = serde_json::json!({"start": 7, "end": u32::MAX})
    });
    for (args, needle) in [
        (
            vec![
                "plan",
                "--model-bytes",
                "1G",
                "--layers",
                "4294967295",
                "--node-ram",
                "1G",
            ],
            "4294967295 is not in 1..=65536",
        ),
        (
            vec!["inspect", s(&m)],
            "arch.n_layers = 2147483648 is outside",
        ),
        (
            vec!["inspect", "--json", s(&m)],
            "arch.n_layers = 2147483648",
        ),
        (
            vec!["plan", s(&m), "--node-ram", "1G"],
            "arch.n_layers = 2147483648",
        ),
        (
            vec!["inspect", s(&shard)],
            "shard layers 7..4294967295 are not a non-empty range inside 0..4",
        ),
    ] {
        let o = run_capped(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
    }
}

#[test]
fn a_gguf_where_a_knot_is_expected_says_to_import_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let g = dir.path().join("my-model.gguf");
    test_support::gguf_stub(&g);
    let p = g.display();
    let want = format!(
        "shard-knot: error: {p} is a GGUF file, not a KNOT: convert it first with \
         `knot import {p} -o MODEL.knot`\n"
    );
    for args in [
        vec!["split", s(&g), "--nodes", "2", "-o", s(dir.path())],
        vec!["plan", s(&g), "--node-ram", "1G"],
        vec!["inspect", s(&g)],
    ] {
        let o = run(&args);
        assert_eq!(String::from_utf8_lossy(&o.stderr), want, "{args:?}");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}
