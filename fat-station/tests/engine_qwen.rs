//! The golden star on the real Qwen2.5-Coder-0.5B: " Paris", the logits against an
//! independent NumPy reference, KV-cache decode and bit-exact determinism.

mod support;

use fat_station::engine::{KvDtype, Model, Session};
use knot_format::Knot;
use support::*;

const PARIS_PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];
const PARIS: usize = 12095;

fn session(m: &Model<'_>) -> Session {
    m.new_session(256)
}

#[test]
fn paris_logits_match_the_numpy_reference() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let logits = m.logits(&mut session(&m), &PARIS_PROMPT).expect("forward");
    assert_eq!(logits.len(), 151936);
    assert_eq!(argmax(&logits), PARIS, "argmax must be \" Paris\"");

    // Made by scripts/reference/make-golden.sh (NumPy forward over gguf's dequantizers, f32).
    let golden = read_f32(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/qwen_paris_numpy.f32"),
    );
    let (rms, max) = rms_max(&logits, &golden);
    eprintln!(
        "paris: ours {:.4}, numpy {:.4}; vs numpy rms {rms:.4} max {max:.4}; top-5 ours {:?} numpy {:?}",
        logits[PARIS],
        golden[PARIS],
        top_ids(&logits, 5),
        top_ids(&golden, 5)
    );
    assert_near_reference(&logits, &golden, 0.15, 0.6);

    // The peer: llama.cpp on the same GGUF (scripts/reference/make-llamacpp-golden.py). It
    // quantizes activations as we do but differently, so it is a bound, not an identity.
    let peer = read_f32(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/qwen_paris_llamacpp.f32"),
    );
    let (rms, max) = rms_max(&logits, &peer);
    eprintln!(
        "paris: llama.cpp {:.4}; vs llama.cpp rms {rms:.4} max {max:.4}",
        peer[PARIS]
    );
    assert_eq!(
        top_ids(&logits, 3),
        top_ids(&peer, 3),
        "top-3 ids differ from llama.cpp"
    );
    assert!(
        rms <= 0.2 && max <= 1.0,
        "too far from llama.cpp: rms {rms}, max {max}"
    );
}

/// Logits for `tokens` fed in chunks of the given sizes through one session.
fn chunked(m: &Model<'_>, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let mut s = session(m);
    let mut at = 0;
    let mut logits = Vec::new();
    for &c in chunks {
        let mut x = m.embed(&tokens[at..at + c]).expect("embed");
        m.forward(&mut s, &mut x, m.holdings().layers)
            .expect("forward");
        logits = m.lm_head(&x).expect("head");
        at += c;
    }
    assert_eq!(at, tokens.len());
    logits
}

#[test]
fn logits_are_bit_identical_across_threads_and_chunking() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    // "The capital of France is Paris. The capital" - 8 tokens.
    let tokens = [785, 6722, 315, 9625, 374, 12095, 13, 576];
    let batched = with_threads(2, || chunked(&m, &tokens, &[8]));
    let one_thread = with_threads(1, || chunked(&m, &tokens, &[8]));
    let by_token = with_threads(2, || chunked(&m, &tokens, &[1; 8]));
    let four_four = with_threads(2, || chunked(&m, &tokens, &[4, 4]));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&batched), bits(&one_thread), "1 vs 2 threads differ");
    assert_eq!(
        bits(&batched),
        bits(&by_token),
        "batched vs token-by-token prefill differ"
    );
    assert_eq!(
        bits(&batched),
        bits(&four_four),
        "batched vs 4+4 through the KV cache differ"
    );
}

#[test]
fn kv_cache_decode_equals_recompute_from_scratch() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let steps = 16;

    // With the cache: prefill once, then one token per step.
    let mut s = session(&m);
    let mut cached = Vec::new();
    let mut logits = m.logits(&mut s, &PARIS_PROMPT).expect("prefill");
    for _ in 0..steps {
        let next = argmax(&logits) as u32;
        cached.push(next);
        logits = m.logits(&mut s, &[next]).expect("decode");
    }

    // From scratch: every step re-runs the whole sequence in a fresh session.
    let mut seq = PARIS_PROMPT.to_vec();
    let mut fresh = Vec::new();
    for _ in 0..steps {
        let l = m.logits(&mut session(&m), &seq).expect("recompute");
        let next = argmax(&l) as u32;
        fresh.push(next);
        seq.push(next);
    }
    eprintln!("greedy continuation ids: {cached:?}");
    assert_eq!(cached[0] as usize, PARIS);
    assert_eq!(cached, fresh, "KV-cache decode diverged from recomputation");
}

/// A longer text for the f16 cache's accuracy: prose, then code that refers back to it.
const LONG_TEXT: &str = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
counting one hundred and twelve steps, and lit the great lamp that had guided ships past the \
reef for ninety years. In winter the storms came from the north-east and the spray reached the \
gallery; in summer fishing boats passed so close that he could hear their radios. He kept a log \
of every vessel, its name, its heading and the hour it passed.\n\n\
def log_vessel(log, name, heading, hour):\n    \"\"\"Append one sighting to the keeper's log.\"\"\"\n    \
if not name:\n        raise ValueError(\"a vessel needs a name\")\n    entry = {\"name\": name, \
\"heading\": heading % 360, \"hour\": hour}\n    log.append(entry)\n    return len(log)\n\n\
def vessels_heading(log, lo, hi):\n    return [e[\"name\"] for e in log if lo <= e[\"heading\"] < hi]\n";

/// Short prompts for the f16 cache's accuracy at the next token (Paris comes as ids).
const F16_PROMPTS: [&str; 4] = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The three primary colours are red, yellow and",
    "<|im_start|>user\nWrite a haiku about rain.<|im_end|>\n<|im_start|>assistant\n",
    "SELECT name, COUNT(*) FROM orders WHERE status = 'shipped' GROUP BY",
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of the last token with the blocks split at `at` over two models of that shard
/// shape (embed + 0..at, at..24 + head), each with its own session: a two-station chain.
fn split_chain(knot: &Knot, dtype: KvDtype, tokens: &[u32], at: u32, steps: usize) -> Vec<f32> {
    use fat_station::engine::Holdings;
    use knot_format::LayerRange;
    let n = knot.arch().n_layers;
    let load = |h| {
        Model::load(knot, Some(h))
            .expect("load")
            .with_kv_dtype(dtype)
    };
    let a = load(Holdings {
        embed: true,
        layers: LayerRange::new(0, at),
        head: false,
    });
    let b = load(Holdings {
        embed: false,
        layers: LayerRange::new(at, n),
        head: true,
    });
    let (mut sa, mut sb) = (a.new_session(64), b.new_session(64));
    let mut logits = Vec::new();
    // The prompt in one batch, then `steps` tokens one by one.
    let (prompt, rest) = tokens.split_at(tokens.len() - steps);
    for chunk in std::iter::once(prompt).chain(rest.chunks(1)) {
        let mut x = a.embed(chunk).expect("embed");
        a.forward(&mut sa, &mut x, a.holdings().layers).expect("a");
        b.forward(&mut sb, &mut x, b.holdings().layers).expect("b");
        logits = b.lm_head(&x).expect("head");
    }
    logits
}

/// The f16 KV cache (`--kv-dtype f16`) keeps every determinism property within itself:
/// 1 and 2 threads, one batch, token by token, 4+4 through the cache and a chain split at
/// any block give the same bits; it stores 2 bytes per value (half of f32's).
#[test]
fn f16_kv_cache_keeps_every_determinism_property() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open");
    let m32 = Model::load(&knot, None).expect("load");
    let m16 = Model::load(&knot, None)
        .expect("load")
        .with_kv_dtype(KvDtype::F16);
    let tokens = [785, 6722, 315, 9625, 374, 12095, 13, 576];
    let batched = with_threads(2, || chunked(&m16, &tokens, &[8]));
    let cases: [(&str, Vec<f32>); 3] = [
        ("1 thread", with_threads(1, || chunked(&m16, &tokens, &[8]))),
        (
            "token by token",
            with_threads(2, || chunked(&m16, &tokens, &[1; 8])),
        ),
        ("4+4", with_threads(2, || chunked(&m16, &tokens, &[4, 4]))),
    ];
    for (what, logits) in &cases {
        assert_eq!(
            bits(&batched),
            bits(logits),
            "f16: batched vs {what} differ"
        );
    }
    for at in [1, 12, 23] {
        let chain = with_threads(2, || split_chain(&knot, KvDtype::F16, &tokens, at, 3));
        assert_eq!(
            bits(&batched),
            bits(&chain),
            "f16: chain split at {at} differs"
        );
    }
    // The two settings differ (the rounding is in use) ...
    let f32_batched = with_threads(2, || chunked(&m32, &tokens, &[8]));
    assert_ne!(bits(&batched), bits(&f32_batched), "f16 storage not in use");
    // ... and f32 is still f32 through the split chain.
    let chain32 = with_threads(2, || split_chain(&knot, KvDtype::F32, &tokens, 12, 3));
    assert_eq!(bits(&f32_batched), bits(&chain32));

    // Bytes per position: 24 blocks x (k + v) x kv_dim 128 x 2 bytes = 12 KiB (f32: 24 KiB).
    let per_token = |m: &Model<'_>| {
        let mut s = m.new_session(64);
        let mut x = m.embed(&tokens).expect("embed");
        m.forward(&mut s, &mut x, m.holdings().layers)
            .expect("forward");
        s.kv_bytes() / tokens.len()
    };
    let (b16, b32) = (per_token(&m16), per_token(&m32));
    eprintln!("KV bytes per token: f16 {b16}, f32 {b32}");
    assert_eq!(b16, 24 * 2 * 128 * 2);
    assert_eq!(b32, 2 * b16);
}

/// The f16 cache's cost against f32 on the real Qwen, printed and bounded. The yardstick is
/// llama.cpp, whose default cache is f16, against the NumPy f32 reference on Paris (rms
/// 0.092): the accuracy users accept from llama.cpp's defaults as a whole. Storing keys and
/// values in f16 is one part of those defaults, so it may move our logits by no more than
/// that whole distance (rms) on any prompt; it must keep the top-5 ids (as a set, the first
/// in place) and the greedy pick at 97% of the positions of a 180-token text (teacher-forced).
#[test]
fn f16_kv_cache_costs_little_against_f32() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open");
    let m32 = Model::load(&knot, None).expect("load");
    let m16 = Model::load(&knot, None)
        .expect("load")
        .with_kv_dtype(KvDtype::F16);
    let golden = |name: &str| {
        read_f32(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden")
                .join(name),
        )
    };
    let (yard, _) = rms_max(
        &golden("qwen_paris_llamacpp.f32"),
        &golden("qwen_paris_numpy.f32"),
    );
    let bound = yard;
    eprintln!("llama.cpp vs numpy on paris: rms {yard:.4}; bound {bound:.4}");

    let data = knot.tokenizer().expect("tokenizer").expect("has one");
    let tok = fat_station::engine::tokenizer::Tokenizer::from_data(&data).expect("tokenizer");
    let mut prompts = vec![PARIS_PROMPT.to_vec()];
    let mut checks = Vec::new();
    prompts.extend(F16_PROMPTS.iter().map(|p| tok.encode(p, false)));
    for (i, ids) in prompts.iter().enumerate() {
        let p32 = m32.logits(&mut session(&m32), ids).expect("f32");
        let p16 = m16.logits(&mut session(&m16), ids).expect("f16");
        let (rms, max) = rms_max(&p16, &p32);
        let (t32, t16) = (top_ids(&p32, 5), top_ids(&p16, 5));
        eprintln!(
            "f16 vs f32 kv, prompt {i} ({} tokens): rms {rms:.4} max {max:.4}; top-5 f32 {t32:?} f16 {t16:?}",
            ids.len()
        );
        let mut sorted = (t16.clone(), t32.clone());
        sorted.0.sort_unstable();
        sorted.1.sort_unstable();
        checks.push((i, rms, t16[0] == t32[0], sorted.0 == sorted.1));
    }

    // A longer text, teacher-forced: every position's logits and greedy pick.
    let ids = tok.encode(LONG_TEXT, false);
    assert!(ids.len() > 150, "{} tokens", ids.len());
    let all = |m: &Model<'_>| {
        let mut s = m.new_session(ids.len());
        let mut x = m.embed(&ids).expect("embed");
        m.forward(&mut s, &mut x, m.holdings().layers)
            .expect("forward");
        m.lm_head_rows(&x, ids.len()).expect("rows")
    };
    let (a32, a16) = (all(&m32), all(&m16));
    let (rms, max) = rms_max(&a16, &a32);
    let vocab = a32.len() / ids.len();
    let agree = a32
        .chunks_exact(vocab)
        .zip(a16.chunks_exact(vocab))
        .filter(|(r32, r16)| argmax(r32) == argmax(r16))
        .count();
    eprintln!(
        "f16 vs f32 kv, {} tokens teacher-forced: rms {rms:.4} max {max:.4}; greedy pick agrees at {agree}",
        ids.len()
    );
    for (i, rms, first, top5) in checks {
        assert!(rms <= bound, "prompt {i}: rms {rms} > {bound}");
        assert!(first, "prompt {i}: greedy pick moved");
        assert!(top5, "prompt {i}: top-5 differ");
    }
    assert!(rms <= bound, "long text: rms {rms} > {bound}");
    assert!(
        agree * 100 >= ids.len() * 97,
        "greedy pick agrees at only {agree} of {}",
        ids.len()
    );
}
