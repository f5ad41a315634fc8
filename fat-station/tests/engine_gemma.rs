//! Gemma-3-270M (gemma3: sandwich norms, GeGLU, q/k norms, 5 local : 1 global layers) against
//! llama.cpp on the same GGUF, and the determinism properties every architecture keeps.
//!
//! The llama.cpp figures are the (llama.cpp on the same GGUF);
//! `scripts/reference/make-gemma-llamacpp-golden.py` is the script for full golden files
//! (PyPI llama-cpp-python 0.3.36 crashes in `llama_decode` on this machine, so none are
//! committed yet).

mod support;

use fat_station::engine::{Model, Session};
use knot_format::{Knot, LayerRange};
use support::*;

/// llama.cpp's logits on "<bos>The capital of France is" (issue 19): ' the' 19.00,
/// ' a' 18.49, ' Paris' 18.32.
const LLAMACPP_PARIS: [(usize, f32); 3] = [(506, 19.00), (496, 18.49), (9079, 18.32)];

fn session(m: &Model<'_>) -> Session {
    m.new_session(1024)
}

#[test]
fn gemma_paris_logits_match_llamacpp() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let logits = m
        .logits(&mut session(&m), &[2, 818, 5279, 529, 7001, 563])
        .expect("forward");
    assert_eq!(logits.len(), 262144);
    eprintln!(
        "paris: top-5 {:?}; ' the' {:.3} ' a' {:.3} ' Paris' {:.3}",
        top_ids(&logits, 5),
        logits[506],
        logits[496],
        logits[9079]
    );
    assert_eq!(top_ids(&logits, 2), [506, 496]);
    for (id, want) in LLAMACPP_PARIS {
        assert!(
            (logits[id] - want).abs() <= 0.2,
            "logit of {id}: ours {}, llama.cpp {want}",
            logits[id]
        );
    }
}

/// Logits for `tokens` fed in chunks of the given sizes through one session, each chunk
/// through the blocks in the given split (e.g. `[0, 7, 18]`: blocks 0..7, then 7..18).
fn chunked(m: &Model<'_>, tokens: &[u32], chunks: &[usize], split: &[u32]) -> Vec<f32> {
    let mut s = session(m);
    let mut at = 0;
    let mut logits = Vec::new();
    for &c in chunks {
        let mut x = m.embed(&tokens[at..at + c]).expect("embed");
        for w in split.windows(2) {
            m.forward(&mut s, &mut x, LayerRange::new(w[0], w[1]))
                .expect("forward");
        }
        logits = m.lm_head(&x).expect("head");
        at += c;
    }
    assert_eq!(at, tokens.len());
    logits
}

#[test]
fn gemma_logits_are_bit_identical_across_threads_chunking_and_split_points() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    // "<bos>The capital of France is Paris. The capital" in Gemma's ids.
    let tokens = [2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279];
    let n = tokens.len();
    let whole = [0, 18];
    let batched = with_threads(2, || chunked(&m, &tokens, &[n], &whole));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let runs: [(&str, Vec<f32>); 5] = [
        (
            "1 thread",
            with_threads(1, || chunked(&m, &tokens, &[n], &whole)),
        ),
        (
            "token by token",
            with_threads(2, || chunked(&m, &tokens, &[1; 10], &whole)),
        ),
        (
            "5 + 5 through the KV cache",
            with_threads(2, || chunked(&m, &tokens, &[5, 5], &whole)),
        ),
        // A split inside the first local run and one right after the first global layer (5).
        (
            "split at 3 and 6",
            with_threads(2, || chunked(&m, &tokens, &[n], &[0, 3, 6, 18])),
        ),
        (
            "split at 12, token by token",
            with_threads(2, || chunked(&m, &tokens, &[1; 10], &[0, 12, 18])),
        ),
    ];
    for (what, logits) in runs {
        assert_eq!(bits(&batched), bits(&logits), "batched vs {what} differ");
    }
}

#[test]
fn gemma_local_layers_forget_positions_outside_the_window() {
    let Some(path) = model(GEMMA) else { return };
    let knot = Knot::open(&path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let w = m.cfg.sliding_window.expect("gemma3 has a sliding window");
    assert_eq!(w, 512);
    // Block 0 is local: the last row of w + 1 positions cannot see position 0, so changing
    // token 0 leaves that row unchanged. (Through two local blocks it would change: the
    // other rows carry position 0 forward.) Block 5 alone is global and must see it.
    let mut tokens: Vec<u32> = (0..w as u32 + 1).map(|i| 1000 + (i * 37) % 5000).collect();
    let last_row = |tokens: &[u32], layers: LayerRange| {
        let mut s = session(&m);
        let mut x = m.embed(tokens).expect("embed");
        m.forward(&mut s, &mut x, layers).expect("forward");
        x[x.len() - m.cfg.hidden..].to_vec()
    };
    let local = LayerRange::new(0, 1);
    let with_global = LayerRange::new(5, 6);
    let (a_local, a_global) = (last_row(&tokens, local), last_row(&tokens, with_global));
    tokens[0] = 2;
    let (b_local, b_global) = (last_row(&tokens, local), last_row(&tokens, with_global));
    assert_eq!(
        a_local, b_local,
        "a local layer saw a position outside its window"
    );
    assert_ne!(a_global, b_global, "the global layer must see position 0");
    // One position later, token 1 is the oldest one outside the window of the last row.
    tokens.push(1234);
    let c = last_row(&tokens, local);
    tokens[1] = 77;
    assert_eq!(c, last_row(&tokens, local));
}
