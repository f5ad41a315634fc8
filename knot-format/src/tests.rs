//! Unit tests of the container: round trips, hostile headers, shards, resolver, verify.

use std::path::Path;

use crate::container::{Preamble, ALIGN, PREAMBLE_LEN};
use crate::*;

pub(crate) fn test_arch() -> ArchConfig {
    ArchConfig {
        arch: "llama".into(),
        n_layers: 2,
        hidden: 64,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        ffn: 128,
        vocab: 300,
        context_len: 512,
        norm_eps: 1e-5,
        rope_base: 10000.0,
        rope_style: RopeStyle::Normal,
        tied_embeddings: true,
        ..Default::default()
    }
}

fn test_tokenizer() -> TokenizerData {
    TokenizerData {
        model: "gpt2".into(),
        pre: "qwen2".into(),
        tokens: vec!["a".into(), "b".into(), "ab".into(), "<|end|>".into()],
        token_types: vec![1, 1, 1, 3],
        merges: vec!["a b".into()],
        scores: vec![],
        add_space_prefix: None,
        bos_id: None,
        eos_id: Some(3),
        pad_id: Some(3),
        unk_id: None,
        add_bos: false,
        add_eos: false,
        chat_template: Some("{{ messages }}".into()),
    }
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn tensor_bytes(dtype: DType, shape: &[u64], seed: u64) -> Vec<u8> {
    let n = dtype
        .bytes_for(shape.iter().product())
        .expect("whole blocks");
    bytes(n as usize, seed)
}

/// A small valid model: two layers of llama-like tensors + tokenizer.
fn write_small(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut i = 0;
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_q.weight",
        "output_norm.weight",
    ] {
        let (dt, shape) = if name.ends_with("norm.weight") {
            (DType::F32, vec![64])
        } else {
            (DType::Q8_0, vec![64, 3])
        };
        i += 1;
        data.push((
            name.to_string(),
            dt,
            shape.clone(),
            tensor_bytes(dt, &shape, i),
        ));
    }
    let mut w = KnotWriter::new("small", test_arch());
    w.tokenizer(test_tokenizer());
    for (n, dt, shape, b) in &data {
        w.add_tensor(n, *dt, shape.clone(), b)
            .expect("valid tensor");
    }
    w.write(path, &mut |_| {}).expect("write");
    data.into_iter().map(|(n, _, _, b)| (n, b)).collect()
}

#[test]
fn round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.knot");
    let mut expect = Vec::new();
    let mut w = KnotWriter::new("all-dtypes", test_arch());
    w.tokenizer(test_tokenizer());
    for (i, dt) in DType::ALL.into_iter().enumerate() {
        let shape = vec![dt.block_elems() as u64 * 2, 3];
        let b = tensor_bytes(dt, &shape, i as u64);
        expect.push((format!("t.{dt}"), dt, shape, b));
    }
    for (n, dt, shape, b) in &expect {
        w.add_tensor(n, *dt, shape.clone(), b).unwrap();
    }
    let mut last = 0;
    w.write(&path, &mut |d| last = d).unwrap();
    assert_eq!(last, w.tensor_bytes());

    let k = Knot::open(&path).unwrap();
    assert_eq!(k.header().tensors.len(), DType::ALL.len());
    assert_eq!(k.arch(), &test_arch());
    assert_eq!(k.tokenizer().unwrap(), Some(test_tokenizer()));
    for (n, dt, shape, b) in &expect {
        let v = k.tensor(n).unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(v.entry.dtype, *dt);
        assert_eq!(&v.entry.shape, shape);
        assert_eq!(v.bytes, &b[..], "{n} bytes differ");
        assert_eq!(v.entry.offset % ALIGN, 0, "{n} unaligned");
        assert_eq!(v.entry.blake3, blake3::hash(b).to_hex().as_str());
    }
    assert_eq!(k.tensors().count(), DType::ALL.len());
    k.verify(&mut |_| {}).unwrap();
    assert_eq!(k.model_hash().len(), 64);
    assert_eq!(k.file_len(), std::fs::metadata(&path).unwrap().len());
    // Deterministic: the same input gives the same model hash.
    let p2 = dir.path().join("again.knot");
    w.write(&p2, &mut |_| {}).unwrap();
    assert_eq!(Knot::open(&p2).unwrap().model_hash(), k.model_hash());
}

#[test]
fn tokenizer_less_and_empty_models_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.knot");
    KnotWriter::new("empty", test_arch())
        .write(&path, &mut |_| {})
        .unwrap();
    let k = Knot::open(&path).unwrap();
    assert_eq!(k.tensors().count(), 0);
    assert_eq!(k.tokenizer().unwrap(), None);
    k.verify(&mut |_| {}).unwrap();
}

#[test]
fn writer_rejects_bad_tensors() {
    let b = vec![0u8; 34];
    let mut w = KnotWriter::new("x", test_arch());
    w.add_tensor("a", DType::Q8_0, vec![32], &b).unwrap();
    let dup = w.add_tensor("a", DType::Q8_0, vec![32], &b).unwrap_err();
    assert!(dup.to_string().contains("duplicate"), "{dup}");
    let short = w.add_tensor("b", DType::Q8_0, vec![64], &b).unwrap_err();
    assert!(short.to_string().contains("need 68"), "{short}");
    let partial = w.add_tensor("c", DType::Q4_K, vec![100], &b).unwrap_err();
    assert!(partial.to_string().contains("whole number"), "{partial}");
    assert!(w.add_tensor("d", DType::F32, vec![], &b).is_err());
    assert!(w
        .add_tensor("e", DType::F32, vec![1, 1, 1, 1, 1], &b[..4])
        .is_err());
    assert!(w.add_tensor("f", DType::F32, vec![0, 4], &[]).is_err());
    assert!(w.add_tensor("", DType::F32, vec![1], &b[..4]).is_err());
    assert_eq!(w.tensor_count(), 1);
}

#[test]
fn write_is_atomic_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    std::fs::write(&path, b"old contents").unwrap();
    write_small(&path);
    Knot::open(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("m.knot")]);
    // Writing into a missing directory fails cleanly.
    let err =
        KnotWriter::new("x", test_arch()).write(dir.path().join("no/such/dir.knot"), &mut |_| {});
    assert!(matches!(err, Err(KnotError::Io { .. })));
}

#[test]
fn shard_record_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard.knot");
    let rec = ShardRecord {
        role: Role::Mid,
        layers: LayerRange::new(8, 16),
        parent_hash: "ab".repeat(32),
        parent_layers: 24,
    };
    let b = tensor_bytes(DType::F32, &[64], 1);
    let mut arch = test_arch();
    arch.n_layers = 24; // a shard's arch is its parent's
    let mut w = KnotWriter::new("shard", arch);
    w.shard(rec.clone())
        .add_tensor("blk.8.attn_norm.weight", DType::F32, vec![64], &b)
        .unwrap();
    w.write(&path, &mut |_| {}).unwrap();
    let k = Knot::open(&path).unwrap();
    assert_eq!(k.shard(), Some(&rec));
    assert_eq!(k.tensor("blk.8.attn_norm.weight").unwrap().layer(), Some(8));
    // A full model has no shard record.
    let p2 = dir.path().join("full.knot");
    write_small(&p2);
    assert_eq!(Knot::open(&p2).unwrap().shard(), None);
}

#[test]
fn resolver_accepts_underscore_and_bin_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    let data = write_small(&path);
    let k = Knot::open(&path).unwrap();
    for spelling in [
        "blk.1.attn_q.weight",
        "blk_1_attn_q_weight",
        "blk.1.attn_q.weight.bin",
        "blk_1_attn_q_weight.bin",
    ] {
        let v = k
            .tensor(spelling)
            .unwrap_or_else(|| panic!("{spelling} not resolved"));
        assert_eq!(v.entry.name, "blk.1.attn_q.weight");
        assert_eq!(v.bytes, &data[2].1[..]);
    }
    assert_eq!(
        k.tensor("token_embd_weight").unwrap().entry.name,
        "token_embd.weight"
    );
    assert!(k.tensor("blk.2.attn_q.weight").is_none());
    assert!(k.tensor("blk_1_attn_q").is_none());
    assert_eq!(layer_of("blk.12.ffn_up.weight"), Some(12));
    assert_eq!(layer_of("blk_3_ffn_up_weight"), Some(3));
    assert_eq!(layer_of("output.weight"), None);
}

#[test]
fn verify_names_the_flipped_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let off = Knot::open(&path)
        .unwrap()
        .tensor("blk.1.attn_q.weight")
        .unwrap()
        .entry
        .offset;
    let mut f = std::fs::read(&path).unwrap();
    f[off as usize + 5] ^= 0x01;
    std::fs::write(&path, &f).unwrap();
    let k = Knot::open(&path).expect("open does not read tensor bytes");
    let err = k.verify(&mut |_| {}).unwrap_err();
    assert_eq!(err.tensor(), Some("blk.1.attn_q.weight"), "{err}");
    assert!(err.is_integrity());
    assert!(err.to_string().contains("blk.1.attn_q.weight"));
}

#[test]
fn verify_and_tokenizer_detect_a_corrupt_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let off = Knot::open(&path)
        .unwrap()
        .header()
        .tokenizer
        .as_ref()
        .unwrap()
        .offset;
    let mut f = std::fs::read(&path).unwrap();
    f[off as usize + 3] ^= 0x20;
    std::fs::write(&path, &f).unwrap();
    let k = Knot::open(&path).unwrap();
    assert!(matches!(
        k.tokenizer(),
        Err(KnotError::SectionHashMismatch { .. })
    ));
    assert!(matches!(
        k.verify(&mut |_| {}),
        Err(KnotError::SectionHashMismatch { .. })
    ));
}

// ---------- hostile files ----------

fn open_bytes(b: &[u8]) -> Result<Knot, KnotError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.knot");
    std::fs::write(&path, b).unwrap();
    Knot::open(&path)
}

fn set_u32(f: &mut [u8], at: usize, v: u32) {
    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn set_u64(f: &mut [u8], at: usize, v: u64) {
    f[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A file whose preamble is consistent with `header_json` (correct hash and lengths), with
/// `data_len` zero bytes of data after the page-aligned header.
fn forge(header_json: &[u8], data_len: u64) -> Vec<u8> {
    let start = (PREAMBLE_LEN + header_json.len() as u64).div_ceil(ALIGN) * ALIGN;
    let file_len = start + data_len;
    let mut f = vec![0u8; file_len as usize];
    let pre = Preamble {
        header_offset: PREAMBLE_LEN,
        header_len: header_json.len() as u64,
        file_len,
        header_hash: *blake3::hash(header_json).as_bytes(),
    };
    f[..PREAMBLE_LEN as usize].copy_from_slice(&pre.encode());
    f[PREAMBLE_LEN as usize..PREAMBLE_LEN as usize + header_json.len()]
        .copy_from_slice(header_json);
    f
}

/// A header with one Q8_0 [64] tensor (68 bytes) at `offset`.
fn one_tensor_header(offset: u64) -> Header {
    Header {
        model_id: "h".into(),
        arch: test_arch(),
        tokenizer: None,
        tensors: vec![TensorEntry {
            name: "a".into(),
            dtype: DType::Q8_0,
            shape: vec![64],
            offset,
            len: 68,
            blake3: blake3::hash(&[0u8; 68]).to_hex().to_string(),
        }],
        shard: None,
    }
}

fn forge_header(h: &Header) -> Vec<u8> {
    forge(&serde_json::to_vec(h).unwrap(), 3 * ALIGN)
}

fn expect_err(b: &[u8], want: &str) {
    match open_bytes(b) {
        Ok(_) => panic!("hostile file opened; wanted error containing {want:?}"),
        Err(e) => assert!(e.to_string().contains(want), "error {e:?} lacks {want:?}"),
    }
}

#[test]
fn forged_valid_file_opens() {
    // The forge itself is sound, so the rejections below are for the stated reason.
    let k = open_bytes(&forge_header(&one_tensor_header(ALIGN))).unwrap();
    k.verify(&mut |_| {}).unwrap();
}

#[test]
fn hostile_preambles_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let good = std::fs::read(&path).unwrap();

    expect_err(&[], "shorter than the 128-byte preamble");
    expect_err(&good[..100], "shorter than the 128-byte preamble");
    let mut f = good.clone();
    f[0..4].copy_from_slice(b"KNUT");
    assert!(matches!(open_bytes(&f), Err(KnotError::BadMagic { .. })));
    // A GGUF model where a KNOT is expected is named as such (the hint: `knot import`).
    let mut f = good.clone();
    f[0..4].copy_from_slice(b"GGUF");
    assert!(matches!(open_bytes(&f), Err(KnotError::IsGguf { .. })));
    let mut f = good.clone();
    set_u32(&mut f, 4, 2);
    assert!(matches!(
        open_bytes(&f),
        Err(KnotError::UnsupportedVersion { version: 2, .. })
    ));
    // Truncated and extended files.
    assert!(matches!(
        open_bytes(&good[..good.len() - 1]),
        Err(KnotError::LengthMismatch { .. })
    ));
    let mut f = good.clone();
    f.extend_from_slice(&[0; 10]);
    assert!(matches!(
        open_bytes(&f),
        Err(KnotError::LengthMismatch { .. })
    ));
    let mut f = good.clone();
    set_u64(&mut f, 16, good.len() as u64);
    expect_err(&f, "runs past the end");
    let mut f = good.clone();
    set_u64(&mut f, 16, u64::MAX);
    expect_err(&f, "header_len");
    let mut f = good.clone();
    set_u64(&mut f, 16, 0);
    expect_err(&f, "header_len 0");
    let mut f = good.clone();
    set_u64(&mut f, 8, 64);
    expect_err(&f, "header_offset is 64");
    // A flipped header byte.
    let mut f = good.clone();
    f[PREAMBLE_LEN as usize + 10] ^= 1;
    assert!(matches!(
        open_bytes(&f),
        Err(KnotError::HeaderHashMismatch { .. })
    ));
}

#[test]
fn hostile_headers_are_rejected() {
    expect_err(&forge(b"not json", 0), "header JSON invalid");
    expect_err(&forge(b"{}", 0), "header JSON invalid");
    expect_err(&forge(&[0xff; 40], 0), "header JSON invalid");

    expect_err(
        &forge_header(&one_tensor_header(ALIGN + 8)),
        "not a multiple of 4096",
    );
    expect_err(
        &forge_header(&one_tensor_header(0)),
        "inside the preamble/header",
    );
    expect_err(
        &forge_header(&one_tensor_header(3 * ALIGN + ALIGN)),
        "past the end",
    );
    expect_err(
        &forge_header(&one_tensor_header(u64::MAX - 4095)),
        "past the end",
    );

    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].len = 69;
    expect_err(&forge_header(&h), "69 bytes, but 64 q8_0 elements need 68");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].shape = vec![1 << 30, 1 << 30, 1 << 30];
    expect_err(&forge_header(&h), "more than 2^48");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].shape = vec![u64::MAX, u64::MAX];
    expect_err(&forge_header(&h), "more than 2^48");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].shape = vec![64, 1, 1, 1, 1];
    expect_err(&forge_header(&h), "5 dimensions");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].shape = vec![64, 0];
    expect_err(&forge_header(&h), "zero dimension");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].blake3 = "XYZ".into();
    expect_err(&forge_header(&h), "64 lowercase hex");
    let mut h = one_tensor_header(ALIGN);
    h.tensors[0].name.clear();
    expect_err(&forge_header(&h), "empty name");

    // Duplicates and overlaps.
    let mut h = one_tensor_header(ALIGN);
    let mut second = h.tensors[0].clone();
    second.offset = 2 * ALIGN;
    h.tensors.push(second.clone());
    expect_err(&forge_header(&h), "duplicate name");
    second.name = "b".into();
    second.offset = ALIGN;
    h.tensors[1] = second;
    expect_err(&forge_header(&h), "overlaps");
    let mut h = one_tensor_header(ALIGN);
    h.tokenizer = Some(SectionRef {
        offset: ALIGN,
        len: 10,
        blake3: "0".repeat(64),
    });
    expect_err(&forge_header(&h), "overlaps");
    h.tokenizer = Some(SectionRef {
        offset: 2 * ALIGN,
        len: u64::MAX,
        blake3: "0".repeat(64),
    });
    expect_err(&forge_header(&h), "tokenizer section");

    // An absurd dtype name is a JSON error, not a panic.
    let j = serde_json::to_string(&one_tensor_header(ALIGN))
        .unwrap()
        .replace("\"Q8_0\"", "\"Q9_9\"");
    expect_err(&forge(j.as_bytes(), 3 * ALIGN), "header JSON invalid");
}

#[test]
fn random_header_mutations_never_panic() {
    // A cheap stand-in for a fuzz target: mutate header bytes, re-seal the hash (so the
    // parser and validator, not just the hash check, see the damage), open.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let good = std::fs::read(&path).unwrap();
    let hlen = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
    let r = bytes(1500 * 3, 99);
    let mut opened = 0;
    for i in 0..1500 {
        let mut f = good.clone();
        let at = PREAMBLE_LEN as usize + (r[3 * i] as usize * 256 + r[3 * i + 1] as usize) % hlen;
        f[at] = if i % 2 == 0 {
            r[3 * i + 2]
        } else {
            b"0123456789,:[]{}\"-"[r[3 * i + 2] as usize % 18]
        };
        let h = *blake3::hash(&f[PREAMBLE_LEN as usize..PREAMBLE_LEN as usize + hlen]).as_bytes();
        f[32..64].copy_from_slice(&h);
        if let Ok(k) = open_bytes(&f) {
            opened += 1;
            let _ = k.verify(&mut |_| {});
            let _ = k.tokenizer();
            for v in k.tensors() {
                assert_eq!(v.bytes.len() as u64, v.entry.len);
            }
        }
    }
    assert!(opened < 1500, "some mutations must be rejected");
}

/// `good` with its header JSON rewritten by `edit` and the preamble re-sealed (length and
/// hash), so only the header validation stands between the edit and the reader.
pub(crate) fn reseal(good: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let hlen = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
    let start = PREAMBLE_LEN as usize;
    let mut v: serde_json::Value = serde_json::from_slice(&good[start..start + hlen]).unwrap();
    edit(&mut v);
    let j = serde_json::to_vec(&v).unwrap();
    let data_start = (start + hlen).div_ceil(ALIGN as usize) * ALIGN as usize;
    assert!(
        start + j.len() <= data_start,
        "edited header must fit its page"
    );
    let mut f = good.to_vec();
    f[start..data_start].fill(0);
    f[start..start + j.len()].copy_from_slice(&j);
    set_u64(&mut f, 16, j.len() as u64);
    f[32..64].copy_from_slice(blake3::hash(&j).as_bytes());
    f
}

fn small_shard_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let good = std::fs::read(&path).unwrap();
    reseal(&good, |h| {
        h["shard"] = serde_json::json!({
            "role": "mid", "layers": {"start": 1, "end": 2},
            "parent_hash": "a".repeat(64), "parent_layers": 2
        });
        let t = h["tensors"].as_array_mut().unwrap();
        t.retain(|t| t["name"] != "blk.0.attn_q.weight");
    })
}

/// Issue 17 item 11: a header claiming 2^31 layers, or a shard of layers 7..u32::MAX, opened
/// fine (and `shard-knot inspect` then allocated 68 GB). The reader refuses both now.
#[test]
fn absurd_layer_counts_and_ranges_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let good = std::fs::read(&path).unwrap();
    open_bytes(&reseal(&good, |_| {})).expect("re-sealing alone keeps the file valid");
    open_bytes(&small_shard_bytes()).expect("a well-formed shard opens");

    let f = reseal(&good, |h| h["arch"]["n_layers"] = (1u64 << 31).into());
    expect_err(&f, "arch.n_layers = 2147483648 is outside 1..=65536");
    let f = reseal(&good, |h| h["arch"]["n_layers"] = 1.into());
    expect_err(
        &f,
        "\"blk.1.attn_q.weight\" belongs to block 1, outside the blocks 0..1",
    );
    let f = reseal(&small_shard_bytes(), |h| {
        h["shard"]["layers"] = serde_json::json!({"start": 7, "end": u32::MAX})
    });
    expect_err(
        &f,
        "shard layers 7..4294967295 are not a non-empty range inside 0..2",
    );
    let f = reseal(&small_shard_bytes(), |h| {
        h["shard"]["layers"] = serde_json::json!({"start": 2, "end": 1})
    });
    expect_err(&f, "not a non-empty range");
    let f = reseal(&small_shard_bytes(), |h| {
        h["shard"]["parent_layers"] = 9.into()
    });
    expect_err(&f, "parent_layers 9 differs from arch.n_layers 2");
    for (field, v) in [
        ("hidden", 0u64),
        ("vocab", u64::from(u32::MAX)),
        ("head_dim", 1 << 21),
        ("context_len", 1 << 30),
    ] {
        let f = reseal(&good, |h| h["arch"][field] = v.into());
        expect_err(&f, &format!("arch.{field} = {v} is outside"));
    }
}

/// Issue 17 item 14: the reserved preamble bytes 64..128 are covered by no hash; a reader
/// now requires them zero (every writer so far wrote zeros, so existing files still open).
#[test]
fn nonzero_reserved_preamble_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.knot");
    write_small(&path);
    let good = std::fs::read(&path).unwrap();
    assert!(good[64..128].iter().all(|&b| b == 0), "writers zero them");
    for at in [64, 100, 127] {
        let mut f = good.clone();
        f[at] = 0x5a;
        expect_err(
            &f,
            &format!("reserved preamble byte {at} is 0x5a, must be zero"),
        );
    }
}

#[test]
fn writer_refuses_a_header_readers_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let mut arch = test_arch();
    arch.n_layers = u32::MAX;
    let mut w = KnotWriter::new("bad", arch);
    w.add_tensor_owned("blk.0.x", DType::F32, vec![4], vec![0; 16])
        .unwrap();
    let out = dir.path().join("bad.knot");
    let e = w.write(&out, &mut |_| {}).unwrap_err();
    assert!(matches!(e, KnotError::InvalidHeader { .. }), "{e}");
    assert!(e.to_string().contains("arch.n_layers"), "{e}");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no temp file left"
    );
}
