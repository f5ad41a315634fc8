//! The engine on synthetic hybrid mixture-of-experts models, imported with `knot import`:
//! `lfm2moe-tiny` (LFM2-8B-A1B's layout: short convolutions and GQA attention, blocks 0-1 a
//! dense FFN, then 8 experts top-2 with sigmoid routing and an `exp_probs_b` selection bias)
//! and `qwen35moe-tiny` (Qwen3.5-MoE's: Gated DeltaNets and gated attention, every FFN 8
//! experts top-2 plus a shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`), both from
//! `scripts/make-synthetic-model.py --type f16 --seed 0`. Against llama.cpp on the same GGUF
//! (goldens from scripts/reference/make-hybrid-moe-golden.sh): top-1, logit rms within 1.5x of
//! llama.cpp's own batched-vs-token-by-token difference, the experts each token chose; and
//! against itself: bit-identical across threads, chunking and token by token.
//!
//! Needs python3 with PyPI `gguf` and `numpy` and the Qwen GGUF (its tokenizer is copied);
//! without them the tests skip with a line on stderr, unless `AEON_REQUIRE_MODELS=1`.

mod support;

use std::path::PathBuf;

use fat_station::engine::moe::record_routes;
use fat_station::engine::{Ffn, Mixer, Model};
use knot_format::Knot;
use support::*;

/// "The capital of France is Paris. The capital of Germany is" in Qwen's tokenizer.
const PROMPT: [u32; 12] = [
    785, 6722, 315, 9625, 374, 12095, 13, 576, 6722, 315, 9856, 374,
];

fn golden(name: &str) -> PathBuf {
    golden_dir("hybrid_moe").join(name)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits for `tokens` fed in chunks of the given sizes through one session.
fn chunked(m: &Model<'_>, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let mut s = m.new_session(64);
    let mut at = 0;
    let mut logits = Vec::new();
    for &c in chunks {
        logits = m.logits(&mut s, &tokens[at..at + c]).expect("forward");
        at += c;
    }
    assert_eq!(at, tokens.len());
    logits
}

/// What one preset should look like once loaded.
struct Expect {
    preset: &'static str,
    n_layers: usize,
    /// Blocks whose FFN is routed experts.
    moe_blocks: &'static [usize],
    n_experts: usize,
    k: usize,
    shared: bool,
}

fn check(e: &Expect) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((gguf, knot_path)) =
        test_support::synthetic_model(dir.path(), e.preset, &["--type", "f16"])
    else {
        return;
    };
    let knot = Knot::open(&knot_path).expect("open");
    assert!(knot.arch().runs_here(), "{}: runs here", e.preset);
    knot.verify(&mut |_| {}).expect("verify");
    let m = Model::load(&knot, None).expect("load");
    assert_eq!(m.weights.layers.len(), e.n_layers);
    let mut recurrent = 0;
    for (l, w) in m.weights.layers.iter().enumerate() {
        recurrent += matches!(w.mixer, Mixer::ShortConv(_) | Mixer::DeltaNet(_)) as usize;
        match &w.ffn {
            Ffn::Moe(moe) => {
                assert!(e.moe_blocks.contains(&l), "{}: block {l} is MoE", e.preset);
                assert_eq!((moe.n_experts(), moe.n_used), (e.n_experts, e.k));
                assert_eq!(moe.shared.is_some(), e.shared);
                assert_eq!(moe.shared_gate.is_some(), e.shared);
            }
            Ffn::Dense { .. } => {
                assert!(!e.moe_blocks.contains(&l), "{}: block {l} dense", e.preset)
            }
            _ => panic!("{}: block {l}'s FFN", e.preset),
        }
    }
    assert!(
        recurrent > 0 && recurrent < e.n_layers,
        "{}: a hybrid",
        e.preset
    );

    let batched = with_threads(2, || chunked(&m, &PROMPT, &[12]));
    assert!(batched.iter().all(|x| x.is_finite()), "non-finite logits");
    for (what, other) in [
        ("1 thread", with_threads(1, || chunked(&m, &PROMPT, &[12]))),
        (
            "token by token",
            with_threads(2, || chunked(&m, &PROMPT, &[1; 12])),
        ),
        ("5+7", with_threads(2, || chunked(&m, &PROMPT, &[5, 7]))),
        (
            "3+1+8",
            with_threads(1, || chunked(&m, &PROMPT, &[3, 1, 8])),
        ),
    ] {
        assert_eq!(
            bits(&batched),
            bits(&other),
            "{}: batched vs {what} differ",
            e.preset
        );
    }

    let stem = e.preset.replace('-', "_");
    if !is_golden_file(&gguf, &golden_dir("hybrid_moe"), &stem) {
        return;
    }
    let peer = read_f32(&golden(&format!("{stem}_seed0_llamacpp.f32")));
    let peer_tbt = read_f32(&golden(&format!("{stem}_seed0_llamacpp_tbt.f32")));
    assert_matches_llamacpp(e.preset, &batched, &peer, &peer_tbt);
    // Issue 35: a greedy run of 16 tokens equal to llama.cpp's except at reported near-ties.
    let greedy = golden(&format!("{stem}_seed0_llamacpp_greedy.txt"));
    let r = assert_greedy_matches_llamacpp(e.preset, &m, &PROMPT, &greedy, 0.0);
    assert_eq!(r.steps, 16, "{}", e.preset);

    // Expert choice per token and MoE block equal to llama.cpp's (batched run). llama.cpp
    // may run its last block for the output row only: its golden then has k entries there.
    let (_, routes) = record_routes(|| chunked(&m, &PROMPT, &[12]));
    assert_eq!(
        routes.len(),
        e.moe_blocks.len(),
        "{}: MoE block calls",
        e.preset
    );
    let theirs: Vec<i32> = std::fs::read(golden(&format!("{stem}_seed0_experts.i32")))
        .expect("experts golden")
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (n, k) = (PROMPT.len(), e.k);
    let last_only = theirs.len() == (e.moe_blocks.len() - 1) * n * k + k;
    assert!(
        last_only || theirs.len() == e.moe_blocks.len() * n * k,
        "{}: {} expert ids in llama.cpp's golden",
        e.preset,
        theirs.len()
    );
    let last = routes.len() - 1;
    let ours: Vec<i32> = routes
        .iter()
        .enumerate()
        .flat_map(|(b, r)| {
            let from = if b == last && last_only {
                (n - 1) * k
            } else {
                0
            };
            r[from..].iter().map(|&(x, _)| x as i32)
        })
        .collect();
    assert_eq!(ours.len(), theirs.len());
    // Each token's set of experts is llama.cpp's; the order too but at near-ties.
    let mut reordered = 0;
    for (o, t) in ours.chunks_exact(k).zip(theirs.chunks_exact(k)) {
        let (mut so, mut st) = (o.to_vec(), t.to_vec());
        so.sort_unstable();
        st.sort_unstable();
        assert_eq!(so, st, "{}: experts {o:?}, llama.cpp's {t:?}", e.preset);
        reordered += (o != t) as usize;
    }
    // Not every token picks the same experts (the routers are non-uniform, not degenerate).
    let distinct: std::collections::BTreeSet<i32> = ours.iter().copied().collect();
    eprintln!(
        "{}: expert choice equal to llama.cpp's for {} tokens x blocks ({reordered} in another \
         order), {} distinct experts used",
        e.preset,
        ours.len() / k,
        distinct.len()
    );
    assert!(distinct.len() > k, "{}: routing is degenerate", e.preset);
    assert!(reordered <= 1, "{}: {reordered} reordered", e.preset);
}

#[test]
fn lfm2moe_matches_llamacpp_and_is_bit_identical_across_threads_and_chunking() {
    check(&Expect {
        preset: "lfm2moe-tiny",
        n_layers: 5,
        moe_blocks: &[2, 3, 4],
        n_experts: 8,
        k: 2,
        shared: false,
    });
}

#[test]
fn qwen35moe_matches_llamacpp_and_is_bit_identical_across_threads_and_chunking() {
    check(&Expect {
        preset: "qwen35moe-tiny",
        n_layers: 4,
        moe_blocks: &[0, 1, 2, 3],
        n_experts: 8,
        k: 2,
        shared: true,
    });
}
