//! The golden star on the real Qwen2.5-Coder-0.5B: " Paris", the logits against an
//! independent NumPy reference, KV-cache decode and bit-exact determinism.

mod support;

use fat_station::engine::{Model, Session};
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
    assert_eq!(
        top_ids(&logits, 3),
        top_ids(&golden, 3),
        "top-3 ids differ from the reference"
    );
    assert!(rms <= 0.15, "rms {rms} > 0.15 against the NumPy reference");
    assert!(
        max <= 0.6,
        "max abs delta {max} > 0.6 against the NumPy reference"
    );

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
