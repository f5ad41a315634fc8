//! A mixture-of-experts model split at every layer gives the logits of one process, bit for
//! bit: `shard-knot split` keeps each block's stacked experts (`ffn_*_exps`, 3-D) and router
//! with it, and the chained shards compute what the whole model computes.
//!
//! The models: `scripts/make-synthetic-model.py --preset tiny-moe --type q8_0` (qwen3moe,
//! 4 layers, 8 experts, top-2) and `--preset tiny-deepseek3` (deepseek2: MLA, block 0 dense,
//! then 16 experts in 4 groups, a selection bias and a shared expert). Needs python3 with PyPI `gguf` and `numpy` and the Qwen GGUF
//! (its tokenizer is copied); without them the test skips, unless `AEON_REQUIRE_MODELS=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use fat_station::engine::Model;
use knot_format::{Knot, LayerRange};

/// "The capital of France is Paris. The capital" in Qwen's tokenizer.
const TOKENS: [u32; 8] = [785, 6722, 315, 9625, 374, 12095, 13, 576];

fn synthetic(dir: &Path, preset: &str) -> Option<PathBuf> {
    let tokenizer = test_support::model(test_support::QWEN_GGUF)?;
    if !test_support::python_with_gguf() {
        return None;
    }
    let gguf = dir.join(format!("{preset}.gguf"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-synthetic-model.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&gguf)
        .args(["--preset", preset, "--type", "q8_0", "-q", "--tokenizer"])
        .arg(&tokenizer)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let knot = dir.join(format!("{preset}.knot"));
    knot_format::import_gguf(&gguf, &knot, &mut |_| {}).expect("import");
    Some(knot)
}

/// Logits of the last token after the prompt (all but 3 tokens) in one batch, then 3 tokens
/// one at a time, through `models` chained in order, each with its own session.
fn chain(models: &[Model<'_>]) -> Vec<f32> {
    let mut sessions: Vec<_> = models.iter().map(|m| m.new_session(32)).collect();
    let (prompt, rest) = TOKENS.split_at(TOKENS.len() - 3);
    let mut logits = Vec::new();
    for chunk in std::iter::once(prompt).chain(rest.chunks(1)) {
        let mut x = models[0].embed(chunk).expect("embed");
        for (m, s) in models.iter().zip(&mut sessions) {
            m.forward(s, &mut x, m.holdings().layers).expect("forward");
        }
        logits = models[models.len() - 1].lm_head(&x).expect("head");
    }
    logits
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn moe_shards_split_at_any_layer_equal_one_process() {
    splits_equal_one_process("tiny-moe");
}

#[test]
fn deepseek2_shards_split_at_any_layer_equal_one_process() {
    splits_equal_one_process("tiny-deepseek3");
}

fn splits_equal_one_process(preset: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(path) = synthetic(dir.path(), preset) else {
        return;
    };
    let parent = Knot::open(&path).expect("open");
    let whole = chain(&[Model::load(&parent, None).expect("load")]);
    assert!(whole.iter().all(|v| v.is_finite()));
    let n = parent.arch().n_layers;
    let mut splits: Vec<Vec<u32>> = (1..n).map(|a| vec![a]).collect();
    splits.push(vec![1, 3]);
    splits.push((1..n).collect());
    for cuts in splits {
        let bounds: Vec<u32> = std::iter::once(0)
            .chain(cuts.iter().copied())
            .chain(std::iter::once(n))
            .collect();
        let ranges: Vec<LayerRange> = bounds
            .windows(2)
            .map(|w| LayerRange::new(w[0], w[1]))
            .collect();
        let out = dir.path().join(format!("split-{cuts:?}"));
        std::fs::create_dir_all(&out).expect("mkdir");
        let shards =
            shard_knot::split::split(&parent, &ranges, &out, preset, &mut |_| {}).expect("split");
        let knots: Vec<Knot> = shards
            .iter()
            .map(|s| Knot::open(&s.path).expect("open shard"))
            .collect();
        for (k, r) in knots.iter().zip(&ranges) {
            // Every block of the shard carries all its tensors (router, stacked and shared
            // experts, selection bias, MLA's projections), bit for bit, verified.
            for l in r.start..r.end {
                let prefix = format!("blk.{l}.");
                let names: Vec<&str> = parent
                    .tensors()
                    .map(|t| t.name())
                    .filter(|n| n.starts_with(&prefix))
                    .collect();
                assert!(names.iter().any(|n| n.contains("ffn_gate_inp")) || l == 0);
                for name in names {
                    let (a, b) = (k.tensor(name), parent.tensor(name));
                    let (a, b) = (a.expect("in the shard"), b.expect("in the parent"));
                    assert_eq!(a.entry.shape, b.entry.shape, "{name}");
                    assert_eq!(a.bytes, b.bytes, "{name}");
                }
            }
            k.verify(&mut |_| {}).expect("verify shard");
        }
        let models: Vec<Model> = knots
            .iter()
            .map(|k| Model::load(k, None).expect("load shard"))
            .collect();
        assert_eq!(
            bits(&chain(&models)),
            bits(&whole),
            "{preset}: split at {cuts:?} differs from one process"
        );
    }
}
