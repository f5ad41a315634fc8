//! Runs the real `knot` binary in a temp dir on a small synthetic model: exit codes,
//! `inspect` (text and JSON), `verify` naming a corrupt tensor, usage errors.

use std::path::Path;
use std::process::{Command, Output};

use knot_format::{ArchConfig, DType, KnotWriter};
use test_support::{reseal, tiny_arch};

fn knot(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_knot"))
        .args(args)
        .arg(file)
        .output()
        .expect("run knot")
}

fn write_model(path: &Path) {
    let arch = ArchConfig {
        n_kv_heads: 2,
        vocab: 8,
        ..tiny_arch(1)
    };
    let mut w = KnotWriter::new("tiny", arch);
    w.add_tensor_owned(
        "token_embd.weight",
        DType::Q8_0,
        vec![32, 8],
        vec![7; 8 * 34],
    )
    .unwrap();
    w.add_tensor_owned(
        "blk.0.attn_q.weight",
        DType::F16,
        vec![32, 32],
        vec![3; 2048],
    )
    .unwrap();
    w.write(path, &mut |_| {}).unwrap();
}

#[test]
fn inspect_verify_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tiny.knot");
    write_model(&m);

    let o = knot(&["inspect"], &m);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("blk.0.attn_q.weight") && text.contains("q8_0") && text.contains("32x8"),
        "{text}"
    );

    let o = knot(&["inspect", "--json"], &m);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["tensor_count"], 2);
    assert_eq!(j["arch"]["arch"], "llama");
    assert_eq!(j["arch"]["hidden"], 32);
    assert_eq!(j["tensors"][1]["shape"], serde_json::json!([32, 32]));

    let o = knot(&["verify"], &m);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("OK: 2 tensors verified"));

    // Corrupt the second tensor: exit 1, named.
    let mut b = std::fs::read(&m).unwrap();
    let n = b.len();
    b[n - 100] ^= 1;
    std::fs::write(&m, &b).unwrap();
    let o = knot(&["verify"], &m);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("blk.0.attn_q.weight"));

    // Truncated file: verify calls it corrupt (1); inspect refuses it (2).
    std::fs::write(&m, &b[..n - 1]).unwrap();
    assert_eq!(knot(&["verify"], &m).status.code(), Some(1));
    let o = knot(&["inspect"], &m);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("truncated"));

    // Missing file and usage errors: 2.
    assert_eq!(
        knot(&["verify"], &dir.path().join("nope.knot"))
            .status
            .code(),
        Some(2)
    );
    assert_eq!(knot(&["frobnicate"], &m).status.code(), Some(2));
    let o = knot(&["import"], &dir.path().join("nope.gguf"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope.gguf"));
}

/// Issue 17 items 11 and 14: `knot verify` said OK to a header claiming 2^31 layers (which
/// made shard-knot allocate 68 GB) and to non-zero reserved preamble bytes. Both are
/// corruption now: exit 1, one line naming the field.
#[test]
fn verify_refuses_absurd_header_values_and_reserved_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tiny.knot");
    write_model(&m);
    reseal(&m, |_| {});
    assert_eq!(
        knot(&["verify"], &m).status.code(),
        Some(0),
        "re-sealing alone is fine"
    );

    reseal(&m, |h| h["arch"]["n_layers"] = (1u64 << 31).into());
    let o = knot(&["verify"], &m);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("arch.n_layers = 2147483648 is outside 1..=65536"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    write_model(&m);
    let mut b = std::fs::read(&m).unwrap();
    b[90] = 1;
    std::fs::write(&m, &b).unwrap();
    let o = knot(&["verify"], &m);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("reserved preamble byte 90"), "{err}");
}

/// Issue 17 item 12: a 64 MiB GGUF holding one 64 M-element u8 array took 2.17 GB of RSS
/// in `knot import` (32 bytes per element) before it failed on the missing architecture.
/// Arrays are held compactly now: under a 1 GiB address-space cap the import gets as far
/// as the real error (exit 2) instead of dying on an allocation.
#[test]
fn import_holds_a_huge_metadata_array_compactly() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("bigarr.gguf");
    let n: u64 = 64 << 20;
    let key = b"x.big";
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // key/values
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&0u32.to_le_bytes()); // of u8
    b.extend_from_slice(&n.to_le_bytes());
    b.resize(b.len() + n as usize, 0);
    std::fs::write(&g, &b).unwrap();
    drop(b);
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_knot"))
        .arg("import")
        .arg(&g)
        .arg("-o")
        .arg(dir.path().join("out.knot"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("\"general.architecture\": missing"), "{err}");
}

#[test]
fn a_gguf_where_a_knot_is_expected_says_to_import_it() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("my-model.gguf");
    test_support::gguf_stub(&g);
    let p = g.display();
    for cmd in ["verify", "inspect"] {
        let o = knot(&[cmd], &g);
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            format!(
                "knot: error: {p} is a GGUF file, not a KNOT: convert it first with \
                 `knot import {p} -o MODEL.knot`\n"
            ),
            "{cmd}"
        );
        assert_eq!(
            o.status.code(),
            Some(2),
            "{cmd}: a usage error, not corruption"
        );
    }
}

#[test]
fn verify_json_gives_the_verdict_to_scripts_and_q_v_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tiny.knot");
    write_model(&m);
    let o = knot(&["-q", "verify", "--json"], &m);
    assert_eq!(o.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((&j["ok"], &j["tensors"]), (&true.into(), &2.into()), "{j}");
    assert_eq!(j["model_hash"].as_str().map(str::len), Some(64), "{j}");
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let mut b = std::fs::read(&m).unwrap();
    let n = b.len();
    b[n - 100] ^= 1;
    std::fs::write(&m, &b).unwrap();
    let o = knot(&["verify", "-v", "--json"], &m);
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&j["ok"], &j["tensor"]),
        (&false.into(), &"blk.0.attn_q.weight".into()),
        "{j}"
    );
    assert!(
        j["error"].as_str().is_some_and(|e| e.contains("corrupt")),
        "{j}"
    );
    // Both at once is a usage error.
    assert_eq!(knot(&["verify", "-q", "-v"], &m).status.code(), Some(2));
}
