//! The engine on a synthetic qwen3moe model: `scripts/make-synthetic-model.py --preset tiny-moe
//! --type q8_0 --seed 0` (4 layers, hidden 128, 8 experts, top-2, seeded random weights,
//! Qwen's tokenizer), imported with `knot import`: against llama.cpp on the same GGUF (golden
//! from scripts/reference/make-moe-golden.sh), and bit-identical across threads, batching and
//! chunking.
//!
//! Needs python3 with PyPI `gguf` and `numpy` and the Qwen GGUF (its tokenizer is copied);
//! without them the test skips with a line on stderr, unless `AEON_REQUIRE_MODELS=1`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use fat_station::engine::moe::record_routes;
use fat_station::engine::{Ffn, Model};
use knot_format::Knot;
use support::*;

/// A prompt of 12 ids in Qwen's tokenizer ("The capital of France is Paris. The capital of
/// Germany is"): long enough that experts get several tokens of one batch.
const PROMPT: [u32; 12] = [
    785, 6722, 315, 9625, 374, 12095, 13, 576, 6722, 315, 9856, 374,
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Makes the tiny qwen3moe GGUF and its KNOT in `dir`; `None` (skipped) without the tools.
fn tiny_moe(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let tokenizer = model(test_support::QWEN_GGUF)?;
    if !python_with_gguf() {
        return None;
    }
    let gguf = dir.join("tiny-moe.gguf");
    run_ok(
        Command::new("python3")
            .arg(repo().join("scripts/make-synthetic-model.py"))
            .arg(&gguf)
            .args([
                "--preset",
                "tiny-moe",
                "--type",
                "q8_0",
                "--seed",
                "0",
                "-q",
                "--tokenizer",
            ])
            .arg(&tokenizer),
    );
    let knot = dir.join("tiny-moe.knot");
    let summary = knot_format::import_gguf(&gguf, &knot, &mut |_| {}).expect("knot import");
    assert!(summary.runs_here, "qwen3moe must be runnable");
    Some((gguf, knot))
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
fn tiny_moe_matches_llamacpp_and_is_bit_identical_across_threads_and_chunking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((gguf, knot_path)) = tiny_moe(dir.path()) else {
        return;
    };
    let knot = Knot::open(&knot_path).expect("open");
    // KNOT holds the 3-D expert tensors as GGUF shapes them, and verifies their bytes.
    let exps = knot.tensor("blk.0.ffn_gate_exps.weight").expect("experts");
    assert_eq!(exps.entry.shape, [128, 64, 8]);
    knot.verify(&mut |_| {}).expect("verify");

    let m = Model::load(&knot, None).expect("load");
    let Ffn::Moe(moe) = &m.weights.layers[0].ffn else {
        panic!("block 0 is not a mixture of experts");
    };
    assert_eq!((moe.n_experts(), moe.n_used), (8, 2));

    let batched = with_threads(2, || chunked(&m, &PROMPT, &[12]));
    assert_eq!(batched.len(), 151936);
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
        assert_eq!(bits(&batched), bits(&other), "batched vs {what} differ");
    }

    // The router's choice is not uniform: over the prompt, some expert of block 0 gets more
    // tokens than another.
    let x = m.embed(&PROMPT).expect("embed");
    let mut xn = vec![0f32; x.len()];
    for (o, r) in xn.chunks_exact_mut(128).zip(x.chunks_exact(128)) {
        fat_station::engine::ops::rmsnorm(o, r, m.weights.layers[0].ffn_norm, 1e-6);
    }
    let mut counts = [0usize; 8];
    moe.route(&xn, PROMPT.len())
        .iter()
        .for_each(|&(e, _)| counts[e as usize] += 1);
    eprintln!("tiny-moe: block 0 (ffn norm of the embeddings) tokens per expert {counts:?}");
    assert!(counts.iter().max() > counts.iter().min());

    // Against llama.cpp, when this is the GGUF the golden was made from.
    let golden = golden_dir("moe");
    if !is_golden_file(&gguf, &golden, "tiny_moe") {
        return;
    }
    // The NumPy reference (scripts/reference/ref_forward.py, f32 activations, the same
    // routing rule): the same top-3, close logits.
    let numpy = read_f32(&golden.join("tiny_moe_seed0_numpy.f32"));
    let (rms, max) = rms_max(&batched, &numpy);
    eprintln!(
        "tiny-moe: vs numpy rms {rms:.4} max {max:.4}; top-5 ours {:?} numpy {:?}",
        top_ids(&batched, 5),
        top_ids(&numpy, 5)
    );
    assert_near_reference(&batched, &numpy, 0.1, 0.4);
    if !golden.join("tiny_moe_seed0_llamacpp.f32").exists() {
        eprintln!("tiny-moe: no llama.cpp golden (scripts/reference/make-moe-golden.sh)");
        return;
    }
    let peer = read_f32(&golden.join("tiny_moe_seed0_llamacpp.f32"));
    let peer_tbt = read_f32(&golden.join("tiny_moe_seed0_llamacpp_tbt.f32"));
    let (rms, max) = rms_max(&batched, &peer);
    let (tbt, _) = rms_max(&peer, &peer_tbt);
    let (peer_numpy, _) = rms_max(&peer, &numpy);
    eprintln!(
        "tiny-moe: vs llama.cpp rms {rms:.4} max {max:.4}; llama.cpp batched vs token-by-token \
         rms {tbt:.4}, llama.cpp vs numpy rms {peer_numpy:.4}; top-5 ours {:?} llama.cpp {:?}",
        top_ids(&batched, 5),
        top_ids(&peer, 5)
    );
    assert_eq!(
        argmax(&batched),
        argmax(&peer),
        "top-1 differs from llama.cpp"
    );
    // llama.cpp's own noise: its batched vs token-by-token difference, which on this model is
    // 0 (q8_0 weights, activations quantized per row either way), so also its distance from
    // the f32 reference. Measured: ours vs llama.cpp 0.051, llama.cpp vs numpy 0.042.
    let noise = tbt.max(peer_numpy);
    assert!(
        rms <= 1.5 * noise,
        "rms {rms} against llama.cpp is over 1.5x its own noise {noise}"
    );

    // Expert choice per token and block equal to llama.cpp's (same top-k order). llama.cpp
    // runs its last block for the output row only, so it has that block's choice for the
    // last token alone.
    let (_, routes) = record_routes(|| chunked(&m, &PROMPT, &[12]));
    assert_eq!(routes.len(), 4);
    let k = 2;
    let ours: Vec<i32> = routes
        .iter()
        .enumerate()
        .flat_map(|(l, r)| {
            let from = if l == 3 { (PROMPT.len() - 1) * k } else { 0 };
            r[from..].iter().map(|&(e, _)| e as i32)
        })
        .collect();
    let theirs: Vec<i32> = std::fs::read(golden.join("tiny_moe_seed0_experts.i32"))
        .expect("experts golden")
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(ours.len(), 3 * PROMPT.len() * k + k);
    assert_eq!(theirs.len(), ours.len(), "llama.cpp's expert golden");
    let weights: Vec<f32> = routes
        .iter()
        .enumerate()
        .flat_map(|(l, r)| {
            let from = if l == 3 { (PROMPT.len() - 1) * k } else { 0 };
            r[from..].iter().map(|&(_, w)| w)
        })
        .collect();
    // Each token's set of experts is llama.cpp's; the order too, except at a near-tie (two
    // weights within 2%: which is first then only changes the order of a two-term sum).
    let mut ties = 0;
    for ((o, t), w) in ours
        .chunks_exact(k)
        .zip(theirs.chunks_exact(k))
        .zip(weights.chunks_exact(k))
    {
        let (mut so, mut st) = (o.to_vec(), t.to_vec());
        so.sort_unstable();
        st.sort_unstable();
        assert_eq!(so, st, "experts {o:?}, llama.cpp's {t:?}");
        if o != t {
            assert!(
                (w[0] - w[1]).abs() < 0.02 * w[0],
                "order {o:?} vs {t:?}, weights {w:?}"
            );
            ties += 1;
        }
    }
    eprintln!(
        "tiny-moe: expert choice equal to llama.cpp's at {}/{} slots; {ties} token(s) a near-tie \
         in order",
        ours.iter().zip(&theirs).filter(|(a, b)| a == b).count(),
        ours.len()
    );
    assert!(ties <= 1, "{ties} near-ties");
}

/// A header whose expert config disagrees with the tensors, or is out of range, is refused
/// with an error naming what is wrong: no panic, no out-of-bounds read of the expert bytes.
#[test]
fn bad_expert_config_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_, knot_path)) = tiny_moe(dir.path()) else {
        return;
    };
    let edited = |f: &dyn Fn(&mut serde_json::Value)| {
        let p = dir.path().join("edited.knot");
        std::fs::copy(&knot_path, &p).expect("copy");
        test_support::reseal(&p, |v| f(&mut v["arch"]["moe"]));
        p
    };
    // 16 experts claimed, 8 stored: the stacked tensor's shape says so.
    let p = edited(&|m| m["n_experts"] = 16.into());
    let knot = Knot::open(&p).expect("open");
    let e = Model::load(&knot, None).err().expect("refused").to_string();
    assert!(
        e.contains("blk.0.ffn_gate_exps.weight") && e.contains("[128, 64, 16]"),
        "{e}"
    );
    // An expert width the tensors do not have.
    let p = edited(&|m| m["expert_ffn"] = 32.into());
    let knot = Knot::open(&p).expect("open");
    let e = Model::load(&knot, None).err().expect("refused").to_string();
    assert!(e.contains("ffn_gate_exps") && e.contains("expected"), "{e}");
    // More experts per token than there are: the header check refuses the file.
    let p = edited(&|m| m["n_experts_used"] = 9.into());
    let e = Knot::open(&p).expect_err("refused").to_string();
    assert!(e.contains("n_experts_used"), "{e}");
}

/// A lead (best logit minus the runner-up) under which two implementations may pick either
/// token on this q8_0 file: a few times the logit rms between ours and llama.cpp's (0.05 here;
/// llama.cpp quantizes the activations, as we do, but not alike). The floor of
/// `support::near_tie`.
const NEAR_TIE: f32 = 0.1;

/// Issue 34: a greedy run of 32 tokens after `PROMPT` against llama.cpp's (golden from
/// make-moe-golden.sh: each step's id and lead, one `llama_decode` per token), compared by
/// `support::assert_greedy_matches_llamacpp` (each step fed llama.cpp's token, every pick equal
/// except at reported near-ties), at most 2 near-ties broken otherwise.
#[test]
fn tiny_moe_greedy_run_equals_llamacpp_except_at_near_ties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((gguf, knot_path)) = tiny_moe(dir.path()) else {
        return;
    };
    let golden = golden_dir("moe");
    if !is_golden_file(&gguf, &golden, "tiny_moe") {
        return;
    }
    let knot = Knot::open(&knot_path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let r = assert_greedy_matches_llamacpp(
        "tiny-moe",
        &m,
        &PROMPT,
        &golden.join("tiny_moe_seed0_llamacpp_greedy.txt"),
        NEAR_TIE,
    );
    assert_eq!(r.steps, 32);
    assert!(r.broken_otherwise.len() <= 2, "{:?}", r.broken_otherwise);
}
