//! Imports the real Qwen2.5-Coder-0.5B Q4_K_M GGUF and checks the KNOT against the GGUF
//! (through our reader) and against a golden index made by the reference Python reader
//! (`tests/golden/make_gguf_index.py`). Also drives the `knot` CLI on the result.
//!
//! Needs the model in `$AEON_MODELS_DIR` (default `~/.cache/aeon-shell/models`; run
//! `scripts/fetch-model.sh qwen`). Skips when it is absent unless `AEON_REQUIRE_MODELS=1`.
//! Run with `--release`.

use std::process::Command;
use std::time::Instant;

use knot_format::gguf::GgufFile;
use knot_format::{import_gguf, DType, Knot, RopeStyle};
use sha2::{Digest, Sha256};
use test_support::{model, QWEN_GGUF};

#[derive(serde::Deserialize)]
struct GoldenTensor {
    name: String,
    ggml_type: u32,
    shape: Vec<u64>,
    offset: u64,
    n_bytes: u64,
    sha256: String,
}

#[derive(serde::Deserialize)]
struct Golden {
    architecture: String,
    tensor_count: usize,
    n_tokens: usize,
    n_merges: usize,
    tensors: Vec<GoldenTensor>,
}

#[test]
fn real_qwen_import_matches_gguf_and_golden_index() {
    let Some(gguf) = model(QWEN_GGUF) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("qwen.knot");

    let t0 = Instant::now();
    let summary = import_gguf(&gguf, &out, &mut |_| {}).expect("import");
    let import_s = t0.elapsed().as_secs_f64();
    let gguf_len = std::fs::metadata(&gguf).unwrap().len();
    eprintln!(
        "import: {:.2}s, knot {} bytes ({:.1} MB) from gguf {} bytes, model hash {}",
        import_s,
        summary.file_len,
        summary.file_len as f64 / 1e6,
        gguf_len,
        summary.model_hash
    );

    let t1 = Instant::now();
    let k = Knot::open(&out).expect("open");
    eprintln!("open: {:?}", t1.elapsed());
    let a = k.arch();
    assert_eq!(k.header().tensors.len(), 291);
    assert_eq!(a.arch, "qwen2");
    assert_eq!((a.n_layers, a.hidden, a.vocab), (24, 896, 151936));
    assert_eq!(
        (a.n_heads, a.n_kv_heads, a.head_dim, a.ffn),
        (14, 2, 64, 4864)
    );
    assert_eq!(a.rope_style, RopeStyle::Neox);
    assert_eq!(a.rope_base, 1_000_000.0);
    assert!(a.qkv_bias && !a.qk_norm && !a.tied_embeddings);
    assert_eq!(k.shard(), None);
    assert_eq!(summary.model_hash, k.model_hash());

    // Every tensor's bytes equal the GGUF's (through our reader).
    let src = GgufFile::open(&gguf).unwrap();
    assert_eq!(src.gguf.tensors.len(), 291);
    for t in &src.gguf.tensors {
        let v = k
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!(v.entry.dtype.ggml_id(), t.ggml_type, "{}", t.name);
        assert_eq!(v.entry.shape, t.shape, "{}", t.name);
        assert!(
            v.bytes == src.tensor_bytes(t).unwrap(),
            "{} bytes differ",
            t.name
        );
        assert_eq!(v.entry.offset % 4096, 0);
    }

    // Independent witness: the reference Python reader's offsets, sizes and SHA-256s.
    let golden: Golden = serde_json::from_str(include_str!(
        "golden/qwen2.5-coder-0.5b-instruct-q4_k_m.index.json"
    ))
    .unwrap();
    assert_eq!(golden.architecture, "qwen2");
    assert_eq!(golden.tensor_count, 291);
    assert_eq!(golden.tensors.len(), 291);
    let raw = src.bytes();
    for g in &golden.tensors {
        let ours = src
            .gguf
            .tensor(&g.name)
            .unwrap_or_else(|| panic!("{} not in our GGUF index", g.name));
        assert_eq!(
            src.gguf.data_offset + ours.offset,
            g.offset,
            "{}: data offset",
            g.name
        );
        assert_eq!(ours.byte_len(), Some(g.n_bytes), "{}: size", g.name);
        let v = k.tensor(&g.name).unwrap();
        assert_eq!(
            v.entry.dtype,
            DType::from_ggml_id(g.ggml_type).unwrap(),
            "{}",
            g.name
        );
        assert_eq!(v.entry.shape, g.shape, "{}", g.name);
        assert!(
            v.bytes == &raw[g.offset as usize..(g.offset + g.n_bytes) as usize],
            "{}",
            g.name
        );
        assert_eq!(
            format!("{:x}", Sha256::digest(v.bytes)),
            g.sha256,
            "{}: sha256",
            g.name
        );
    }
    let dtypes: std::collections::BTreeSet<_> = k.tensors().map(|v| v.entry.dtype.name()).collect();
    assert_eq!(
        dtypes.into_iter().collect::<Vec<_>>(),
        ["f32", "q4_K", "q5_0", "q6_K", "q8_0"]
    );

    // Tokenizer section.
    let tok = k.tokenizer().unwrap().expect("tokenizer");
    assert_eq!(tok.tokens.len(), golden.n_tokens);
    assert_eq!(tok.tokens.len(), 151936);
    assert_eq!(tok.merges.len(), golden.n_merges);
    assert_eq!(tok.merges.len(), 151387);
    assert_eq!(tok.token_types.len(), 151936);
    assert_eq!((tok.model.as_str(), tok.pre.as_str()), ("gpt2", "qwen2"));
    assert_eq!(
        (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos),
        (Some(151643), Some(151645), Some(151643), false)
    );
    assert_eq!(tok.tokens[151645], "<|im_end|>");
    assert!(tok
        .chat_template
        .as_deref()
        .is_some_and(|t| t.contains("<|im_start|>")));

    let t2 = Instant::now();
    k.verify(&mut |_| {}).expect("verify");
    eprintln!("verify: {:?}", t2.elapsed());
    drop(k);

    // The CLI: inspect --json, verify OK, then a flipped byte makes verify fail naming it.
    let knot = env!("CARGO_BIN_EXE_knot");
    let o = Command::new(knot)
        .args(["inspect", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["tensor_count"], 291);
    assert_eq!(j["arch"]["arch"], "qwen2");
    assert_eq!(j["arch"]["n_layers"], 24);
    assert_eq!(j["arch"]["hidden"], 896);
    assert_eq!(j["arch"]["vocab"], 151936);
    assert_eq!(j["model_hash"], summary.model_hash.as_str());

    let o = Command::new(knot).arg("verify").arg(&out).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("OK: 291 tensors verified"));

    let victim = "blk.17.ffn_down.weight";
    let off = {
        let k = Knot::open(&out).unwrap();
        let e = k.tensor(victim).unwrap().entry;
        e.offset + e.len / 2
    };
    flip_byte(&out, off);
    let o = Command::new(knot).arg("verify").arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(victim),
        "verify output does not name {victim}: {err}"
    );
}

fn flip_byte(path: &std::path::Path, off: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(off)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x40;
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(&b).unwrap();
}

#[test]
fn real_smollm2_imports_as_llama_with_normal_rope() {
    let Some(gguf) = model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smol.knot");
    let s = import_gguf(&gguf, &out, &mut |_| {}).expect("import");
    assert_eq!(s.tensors, 272);
    let k = Knot::open(&out).unwrap();
    let a = k.arch();
    assert_eq!(
        (a.arch.as_str(), a.n_layers, a.hidden, a.vocab),
        ("llama", 30, 576, 49152)
    );
    assert_eq!(
        (a.n_heads, a.n_kv_heads, a.head_dim, a.ffn),
        (9, 3, 64, 1536)
    );
    assert_eq!(a.rope_style, RopeStyle::Normal);
    assert!(a.tied_embeddings && !a.qkv_bias && !a.qk_norm);
    let tok = k.tokenizer().unwrap().unwrap();
    assert_eq!(
        (tok.tokens.len(), tok.merges.len(), tok.pre.as_str()),
        (49152, 48900, "smollm")
    );
    assert_eq!(
        (tok.bos_id, tok.eos_id, tok.unk_id),
        (Some(1), Some(2), Some(0))
    );
    let src = GgufFile::open(&gguf).unwrap();
    for t in &src.gguf.tensors {
        assert!(
            k.tensor(&t.name).unwrap().bytes == src.tensor_bytes(t).unwrap(),
            "{}",
            t.name
        );
    }
    k.verify(&mut |_| {}).unwrap();
}
