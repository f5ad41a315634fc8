//! The engine on a synthetic qwen2 model: `scripts/make-synthetic-model.py --preset tiny --seed 0`
//! (2 layers, hidden 256, seeded random weights in Q4_K_M's legacy mix of Q5_0 and Q8_0, Qwen's
//! tokenizer), imported with `knot import`, against the independent NumPy reference and against
//! llama.cpp on the same GGUF (golden from scripts/reference/make-synthetic-golden.sh).
//!
//! Needs python3 with PyPI `gguf` and `numpy` (scripts/test.sh installs them) and the Qwen GGUF
//! (its tokenizer is copied); without them the test skips with a line on stderr, unless
//! `AEON_REQUIRE_MODELS=1`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use fat_station::engine::Model;
use knot_format::Knot;
use support::*;

/// "The capital of France is" in Qwen's tokenizer (the real model's golden prompt).
const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];

/// Bounds against llama.cpp on the same GGUF. Measured: rms 0.034, max 0.161 (both engines
/// quantize activations, each its own way, so they sit as far from each other as from NumPy);
/// ~3x of that, as for NumPy.
const LLAMACPP_RMS: f64 = 0.1;
const LLAMACPP_MAX: f64 = 0.45;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The NumPy reference's logits for `gguf` and llama.cpp's: the committed goldens when the file
/// is the one they were made from (scripts/reference/make-synthetic-golden.sh), else
/// ref_forward.py run now (another numpy or gguf version may draw or round differently; ~30 s)
/// and no llama.cpp logits (the test does not build llama.cpp).
fn reference_logits(gguf: &Path, dir: &Path) -> (Vec<f32>, Option<Vec<f32>>) {
    let golden = repo().join("fat-station/tests/golden/synthetic");
    let want = std::fs::read_to_string(golden.join("tiny_seed0.sha256")).expect("golden sha256");
    let got = sha256_file(gguf);
    if got == want.trim() {
        return (
            read_f32(&golden.join("tiny_seed0_numpy.f32")),
            Some(read_f32(&golden.join("tiny_seed0_llamacpp.f32"))),
        );
    }
    eprintln!(
        "synthetic: the tiny GGUF's sha256 {got} is not the golden's {}: running ref_forward.py",
        want.trim()
    );
    let out = dir.join("ref.f32");
    let ids: Vec<String> = PROMPT.iter().map(u32::to_string).collect();
    run_ok(
        Command::new("python3")
            .arg(repo().join("scripts/reference/ref_forward.py"))
            .arg(gguf)
            .args(&ids)
            .arg("--logits-out")
            .arg(&out),
    );
    (read_f32(&out), None)
}

#[test]
fn tiny_synthetic_logits_match_the_numpy_reference() {
    let Some(tokenizer) = model(test_support::QWEN_GGUF) else {
        return;
    };
    if !python_with_gguf() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = dir.path().join("tiny.gguf");
    run_ok(
        Command::new("python3")
            .arg(repo().join("scripts/make-synthetic-model.py"))
            .arg(&gguf)
            .args(["--preset", "tiny", "--seed", "0", "-q", "--tokenizer"])
            .arg(&tokenizer),
    );
    let knot_path = dir.path().join("tiny.knot");
    knot_format::import_gguf(&gguf, &knot_path, &mut |_| {}).expect("knot import");

    let knot = Knot::open(&knot_path).expect("open");
    let m = Model::load(&knot, None).expect("load");
    let logits = m.logits(&mut m.new_session(64), &PROMPT).expect("forward");
    let (golden, llamacpp) = reference_logits(&gguf, dir.path());
    assert_eq!(logits.len(), 151936, "the vocabulary is the tokenizer's");
    assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits");
    let (rms, max) = rms_max(&logits, &golden);
    eprintln!(
        "synthetic tiny: vs numpy rms {rms:.4} max {max:.4}; top-5 ours {:?} numpy {:?}",
        top_ids(&logits, 5),
        top_ids(&golden, 5)
    );
    // Measured: rms 0.033, max 0.147 (logit std 3); the bounds leave ~3x of that, tighter
    // than the real Qwen's (rms 0.15, max 0.6).
    assert_near_reference(&logits, &golden, 0.1, 0.4);
    match llamacpp {
        Some(peer) => {
            let (rms, max) = rms_max(&logits, &peer);
            eprintln!(
                "synthetic tiny: vs llama.cpp rms {rms:.4} max {max:.4}; top-5 llama.cpp {:?}",
                top_ids(&peer, 5)
            );
            // llama.cpp vs NumPy: rms 0.032, max 0.142; we are as close to it as to NumPy.
            assert_near_reference(&logits, &peer, LLAMACPP_RMS, LLAMACPP_MAX);
        }
        None => eprintln!("synthetic tiny: no llama.cpp golden for this GGUF: not compared"),
    }
}
