//! Bounded, seeded fuzzing of the two parsers of this crate: the KNOT reader (`Knot::open`
//! and what it hands out) and the GGUF reader (`Gguf::parse`, the importer's metadata
//! readers). A few thousand mutations and truncations of a small valid file each, in
//! seconds. Asserts that nothing panics and that no input makes a reader allocate much: this
//! test binary's allocator refuses any single allocation over [`CAP`] (the process then
//! aborts, naming the size) and records the peak of live heap bytes per input.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use knot_format::gguf::Gguf;
use knot_format::header::{MAX_DIM, MAX_LAYERS};
use knot_format::{ArchConfig, DType, Knot, KnotWriter, ShardRecord, TokenizerData};
use test_support::tiny_arch;

/// Largest single allocation any reader may ask for while fuzzed.
const CAP: usize = 64 << 20;
/// Most heap one input may hold at once above the baseline (the inputs are kilobytes).
const PEAK_PER_INPUT: usize = 16 << 20;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, with a cap per allocation and live/peak accounting.
struct Capped;

// SAFETY: every call forwards to `System` with the caller's layout unchanged; refusing an
// allocation by returning null is allowed by the `GlobalAlloc` contract.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from this allocator (hence `System`) with layout `l`.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if new_size > CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: `p` came from `System` with layout `l`; `new_size` is non-zero per contract.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

/// One test at a time, so the live/peak figures are this test's.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` and returns the heap it held at its peak above what was live before.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

/// xorshift64*: deterministic, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that probe bounds: zero, one, powers of two around 2^31, 2^32, 2^48, the maxima.
const EXTREMES: [u64; 10] = [
    0,
    1,
    7,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 48,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
];

// ---------------------------------------------------------------- KNOT

/// A small valid model (or, with `shard`, a mid shard of layers 1..2) with a tokenizer.
fn small_knot(path: &Path, shard: bool) {
    let mut w = KnotWriter::new("fuzz", tiny_arch(3));
    w.tokenizer(TokenizerData {
        model: "gpt2".into(),
        tokens: vec!["a".into(), "b".into(), "ab".into(), "<e>".into()],
        token_types: vec![1, 1, 1, 3],
        merges: vec!["a b".into()],
        eos_id: Some(3),
        ..TokenizerData::default()
    });
    let layers: &[u32] = if shard { &[1] } else { &[0, 1, 2] };
    if shard {
        w.shard(ShardRecord {
            role: knot_format::Role::Mid,
            layers: knot_format::LayerRange::new(1, 2),
            parent_hash: "ab".repeat(32),
            parent_layers: 3,
        });
    } else {
        w.add_tensor_owned(
            "token_embd.weight",
            DType::Q8_0,
            vec![32, 4],
            vec![1; 4 * 34],
        )
        .unwrap();
    }
    for &l in layers {
        w.add_tensor_owned(
            &format!("blk.{l}.attn_q.weight"),
            DType::F16,
            vec![32, 2],
            vec![l as u8; 128],
        )
        .unwrap();
        w.add_tensor_owned(
            &format!("blk.{l}.attn_norm.weight"),
            DType::F32,
            vec![32],
            vec![2; 128],
        )
        .unwrap();
    }
    w.write(path, &mut |_| {}).unwrap();
}

/// Replaces one random number in the JSON tree with an extreme value.
fn poke_number(v: &mut serde_json::Value, rng: &mut Rng, seen: &mut usize, pick: usize) {
    match v {
        serde_json::Value::Number(_) => {
            if *seen == pick {
                let x = EXTREMES[rng.below(EXTREMES.len())];
                *v = match rng.below(3) {
                    0 => serde_json::json!(x),
                    1 => serde_json::json!(-(x as i64 & 0xffff)),
                    _ => serde_json::json!(x as f64 * 1.5),
                };
            }
            *seen += 1;
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| poke_number(x, rng, seen, pick)),
        serde_json::Value::Object(o) => {
            o.values_mut().for_each(|x| poke_number(x, rng, seen, pick))
        }
        _ => {}
    }
}

/// `good` with its header replaced by `header` and the preamble re-sealed (length, hash), so
/// the validator (not the hash check) sees the damage. `None` when it no longer fits.
fn reseal(good: &[u8], header: &[u8]) -> Option<Vec<u8>> {
    let hlen = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
    let data_start = (128 + hlen).div_ceil(4096) * 4096;
    if 128 + header.len() > data_start {
        return None;
    }
    let mut f = good.to_vec();
    f[128..data_start].fill(0);
    f[128..128 + header.len()].copy_from_slice(header);
    f[16..24].copy_from_slice(&(header.len() as u64).to_le_bytes());
    f[32..64].copy_from_slice(blake3::hash(header).as_bytes());
    Some(f)
}

/// One mutation of a valid KNOT.
fn mutate_knot(good: &[u8], rng: &mut Rng) -> Vec<u8> {
    let hlen = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
    let header = &good[128..128 + hlen];
    match rng.below(6) {
        // Raw bytes anywhere (preamble, header, sections), hash left stale.
        0 => {
            let mut f = good.to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len());
                f[at] = rng.next() as u8;
            }
            f
        }
        // Truncated (the preamble's file_len kept or made to match).
        1 => {
            let mut f = good[..rng.below(good.len())].to_vec();
            if f.len() >= 32 && rng.below(2) == 0 {
                let n = f.len() as u64;
                f[24..32].copy_from_slice(&n.to_le_bytes());
            }
            f
        }
        // A preamble field set to an extreme value.
        2 => {
            let mut f = good.to_vec();
            let at = [8, 16, 24][rng.below(3)];
            f[at..at + 8].copy_from_slice(&EXTREMES[rng.below(EXTREMES.len())].to_le_bytes());
            f
        }
        // Header text bytes changed, re-sealed.
        3 => {
            let mut h = header.to_vec();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(h.len());
                h[at] = b"0123456789,:[]{}\"-.e"[rng.below(20)];
            }
            reseal(good, &h).unwrap_or_else(|| good.to_vec())
        }
        // One number of the header set to an extreme, re-sealed.
        4 => {
            let mut v: serde_json::Value = serde_json::from_slice(header).unwrap();
            let mut count = 0;
            poke_number(&mut v, rng, &mut count, usize::MAX);
            let pick = rng.below(count);
            let mut seen = 0;
            poke_number(&mut v, rng, &mut seen, pick);
            reseal(good, &serde_json::to_vec(&v).unwrap()).unwrap_or_else(|| good.to_vec())
        }
        // Tensor entries dropped, duplicated or renamed into another block, re-sealed.
        _ => {
            let mut v: serde_json::Value = serde_json::from_slice(header).unwrap();
            let t = v["tensors"].as_array_mut().unwrap();
            let i = rng.below(t.len());
            match rng.below(3) {
                0 => {
                    t.remove(i);
                }
                1 => {
                    let c = t[i].clone();
                    t.push(c);
                }
                _ => t[i]["name"] = format!("blk.{}.x", EXTREMES[rng.below(10)]).into(),
            }
            reseal(good, &serde_json::to_vec(&v).unwrap()).unwrap_or_else(|| good.to_vec())
        }
    }
}

/// Uses everything an opened file hands out, checking the bounds readers rely on.
fn exercise_knot(k: &Knot) {
    let a = k.arch();
    assert!((1..=MAX_LAYERS).contains(&a.n_layers), "{}", a.n_layers);
    for d in [
        a.hidden,
        a.n_heads,
        a.n_kv_heads,
        a.head_dim,
        a.ffn,
        a.vocab,
    ] {
        assert!((1..=MAX_DIM).contains(&d));
    }
    if let Some(s) = k.shard() {
        assert!(s.layers.start < s.layers.end && s.layers.end <= a.n_layers);
    }
    // What shard-knot's inspect and plan build from the header.
    let held = k.shard().map_or(a.n_layers, |s| s.layers.len());
    let per_layer = vec![0u64; held as usize];
    for t in k.tensors() {
        assert_eq!(t.bytes.len() as u64, t.entry.len);
        if let Some(l) = t.layer() {
            let start = k.shard().map_or(0, |s| s.layers.start);
            assert!(
                l >= start && ((l - start) as usize) < per_layer.len(),
                "{}",
                t.name()
            );
        }
    }
    let _ = k.tokenizer();
    let _ = k.verify(&mut |_| {});
}

#[test]
fn knot_reader_survives_mutations_without_panic_or_big_allocation() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x6b6e_6f74_2d66_757a);
    let (mut opened, mut worst) = (0, 0);
    for shard in [false, true] {
        let src = dir.path().join(if shard { "s.knot" } else { "m.knot" });
        small_knot(&src, shard);
        let good = std::fs::read(&src).unwrap();
        let k = Knot::open(&src).unwrap();
        exercise_knot(&k);
        drop(k);
        for i in 0..1500 {
            let f = mutate_knot(&good, &mut rng);
            // A fresh name each time: rewriting one file in place makes ext4 flush it.
            let path = dir.path().join(format!("fuzzed-{i}.knot"));
            std::fs::write(&path, &f).unwrap();
            let peak = peak_of(|| {
                let r = std::panic::catch_unwind(|| {
                    if let Ok(k) = Knot::open(&path) {
                        exercise_knot(&k);
                        true
                    } else {
                        false
                    }
                });
                match r {
                    Ok(true) => opened += 1,
                    Ok(false) => {}
                    Err(_) => panic!("input {i} (shard={shard}) panicked a reader"),
                }
            });
            worst = worst.max(peak);
            assert!(peak < PEAK_PER_INPUT, "input {i}: {peak} bytes of heap");
            std::fs::remove_file(&path).unwrap();
        }
    }
    eprintln!("knot fuzz: 3000 inputs, {opened} opened, worst heap peak {worst} bytes");
    assert!(
        opened > 0 && opened < 3000,
        "{opened} opened: mutations must do both"
    );
}

// ---------------------------------------------------------------- GGUF

fn gstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A small valid GGUF: a qwen2 config, a tokenizer, arrays of several kinds (nested too),
/// three tensors.
fn small_gguf() -> Vec<u8> {
    let mut kv = Vec::new();
    let mut n_kv = 0u64;
    let mut put = |key: &str, ty: u32, val: &[u8]| {
        gstr(&mut kv, key);
        kv.extend_from_slice(&ty.to_le_bytes());
        kv.extend_from_slice(val);
        n_kv += 1;
    };
    let s = |v: &str| {
        let mut b = Vec::new();
        gstr(&mut b, v);
        b
    };
    let strs = |v: &[&str]| {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| gstr(&mut b, x));
        b
    };
    put("general.architecture", 8, &s("qwen2"));
    put("general.name", 8, &s("fuzz"));
    for (k, v) in [
        ("qwen2.block_count", 1u32),
        ("qwen2.context_length", 128),
        ("qwen2.embedding_length", 64),
        ("qwen2.feed_forward_length", 96),
        ("qwen2.attention.head_count", 4),
        ("tokenizer.ggml.eos_token_id", 3),
    ] {
        put(k, 4, &v.to_le_bytes());
    }
    put(
        "qwen2.attention.layer_norm_rms_epsilon",
        6,
        &1e-6f32.to_le_bytes(),
    );
    put("tokenizer.ggml.model", 8, &s("gpt2"));
    put(
        "tokenizer.ggml.tokens",
        9,
        &strs(&["a", "b", "ab", "<eos>"]),
    );
    put("tokenizer.ggml.merges", 9, &strs(&["a b"]));
    let mut types = 5u32.to_le_bytes().to_vec();
    types.extend_from_slice(&4u64.to_le_bytes());
    for t in [1i32, 1, 1, 3] {
        types.extend_from_slice(&t.to_le_bytes());
    }
    put("tokenizer.ggml.token_type", 9, &types);
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend_from_slice(&2u64.to_le_bytes());
    for _ in 0..2 {
        nested.extend_from_slice(&10u32.to_le_bytes());
        nested.extend_from_slice(&2u64.to_le_bytes());
        nested.extend_from_slice(&[9; 16]);
    }
    put("x.nested", 9, &nested);

    let mut infos = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    let tensors: [(&str, DType, &[u64]); 3] = [
        ("token_embd.weight", DType::Q8_0, &[64, 4]),
        ("blk.0.attn_q.weight", DType::Q4_K, &[256, 2]),
        ("blk.0.attn_q.bias", DType::F32, &[64]),
    ];
    for (name, dt, shape) in tensors {
        while !data.len().is_multiple_of(32) {
            data.push(0);
        }
        gstr(&mut infos, name);
        infos.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        shape
            .iter()
            .for_each(|d| infos.extend_from_slice(&d.to_le_bytes()));
        infos.extend_from_slice(&dt.ggml_id().to_le_bytes());
        infos.extend_from_slice(&(data.len() as u64).to_le_bytes());
        let n = dt.bytes_for(shape.iter().product()).unwrap();
        data.extend((0..n).map(|i| i as u8));
    }
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(&kv);
    b.extend_from_slice(&infos);
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend_from_slice(&data);
    b
}

fn mutate_gguf(good: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut f = good.to_vec();
    match rng.below(4) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len());
                f[at] = rng.next() as u8;
            }
        }
        1 => f.truncate(rng.below(good.len())),
        // A u64 (a count, a length, a dim, an offset) set to an extreme value.
        2 => {
            let at = rng.below(f.len() - 8);
            f[at..at + 8].copy_from_slice(&EXTREMES[rng.below(EXTREMES.len())].to_le_bytes());
        }
        // A u32 (a value type, a dim count, a ggml type) set to a small or extreme value.
        _ => {
            let at = rng.below(f.len() - 4);
            let v = [0u32, 1, 5, 8, 9, 12, 13, 99, u32::MAX][rng.below(9)];
            f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    f
}

#[test]
fn gguf_reader_survives_mutations_without_panic_or_big_allocation() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let good = small_gguf();
    let p = Path::new("fuzz.gguf");
    let g = Gguf::parse(&good, p).unwrap();
    ArchConfig::from_gguf(&g, p).unwrap();
    TokenizerData::from_gguf(&g, p).unwrap().unwrap();
    let mut rng = Rng(0x6767_7566_2d66_757a);
    let (mut parsed, mut worst) = (0, 0);
    for i in 0..4000 {
        let f = mutate_gguf(&good, &mut rng);
        let peak = peak_of(|| {
            let r = std::panic::catch_unwind(|| {
                let Ok(g) = Gguf::parse(&f, p) else {
                    return false;
                };
                for t in &g.tensors {
                    if let Some(b) = g.tensor_bytes(t, &f) {
                        assert_eq!(Some(b.len() as u64), t.byte_len());
                    }
                }
                let _ = ArchConfig::from_gguf(&g, p);
                let _ = TokenizerData::from_gguf(&g, p);
                true
            });
            match r {
                Ok(ok) => parsed += usize::from(ok),
                Err(_) => panic!("input {i} panicked the GGUF reader: {f:?}"),
            }
        });
        worst = worst.max(peak);
        assert!(peak < PEAK_PER_INPUT, "input {i}: {peak} bytes of heap");
    }
    eprintln!("gguf fuzz: 4000 inputs, {parsed} parsed, worst heap peak {worst} bytes");
    assert!(
        parsed > 0 && parsed < 4000,
        "{parsed} parsed: mutations must do both"
    );
}

/// Issue 17 item 12, measured: a GGUF whose one metadata array fills 1 MiB, of each element
/// type, costs the parser at most twice the file plus the fixed nesting budget (the old
/// `Vec<GgufValue>` spent 32 bytes per element: 32 MiB for 1 MiB of u8).
#[test]
fn metadata_arrays_cost_about_their_file_size() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const BODY: usize = 1 << 20;
    // (element type, encoded element)
    let empty_array: Vec<u8> = [0u32.to_le_bytes().as_slice(), &0u64.to_le_bytes()].concat();
    let one_char: Vec<u8> = [1u64.to_le_bytes().as_slice(), b"x"].concat();
    let cases: [(u32, Vec<u8>); 8] = [
        (0, vec![7]),
        (2, vec![7; 2]),
        (4, vec![7; 4]),
        (6, vec![0; 4]),
        (7, vec![1]),
        (10, vec![7; 8]),
        (8, one_char),
        (9, empty_array),
    ];
    for (elem, item) in cases {
        // Nested arrays are capped per file; stay inside the cap.
        let n = match elem {
            9 => knot_format::gguf::MAX_NESTED_ARRAYS,
            _ => BODY / item.len(),
        };
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        gstr(&mut b, "x.big");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&elem.to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
        for _ in 0..n {
            b.extend_from_slice(&item);
        }
        let peak = peak_of(|| {
            let g = Gguf::parse(&b, Path::new("big.gguf")).unwrap();
            assert_eq!(g.get("x.big").unwrap().as_array().unwrap().len(), n);
        });
        let budget = 2 * b.len() + knot_format::gguf::MAX_NESTED_ARRAYS * 64;
        eprintln!(
            "array of type {elem}: {n} elements, file {} bytes, heap peak {peak}",
            b.len()
        );
        assert!(
            peak <= budget,
            "array of type {elem}: {peak} bytes of heap for a {}-byte file",
            b.len()
        );
    }
}
