//! A mixture-of-experts model split at every layer gives the logits of one process, bit for
//! bit: `shard-knot split` keeps each block's stacked experts (`ffn_*_exps`, 3-D) and router
//! with it, and the chained shards compute what the whole model computes.
//!
//! The models: `scripts/make-synthetic-model.py --preset tiny-moe --type q8_0` (qwen3moe,
//! 4 layers, 8 experts, top-2) and `--preset tiny-deepseek3` (deepseek2: MLA, block 0 dense,
//! then 16 experts in 4 groups, a selection bias and a shared expert), and the hybrids
//! `lfm2moe-tiny`, `qwen35moe-tiny` and `tiny-deepseek2-split`. Needs python3 with PyPI `gguf` and `numpy` and the Qwen GGUF
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

/// lfm2moe: short convolutions and attention, blocks 0-1 dense, then sigmoid-routed experts.
#[test]
fn lfm2moe_shards_split_at_any_layer_equal_one_process() {
    splits_equal_one_process("lfm2moe-tiny");
}

/// qwen35moe: Gated DeltaNets and gated attention, routed experts and a gated shared expert.
#[test]
fn qwen35moe_shards_split_at_any_layer_equal_one_process() {
    splits_equal_one_process("qwen35moe-tiny");
}

/// deepseek2 with split attn_k_b / attn_v_b (its latent cache on every node).
#[test]
fn deepseek2_split_k_b_shards_split_at_any_layer_equal_one_process() {
    splits_equal_one_process("tiny-deepseek2-split");
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
                let lead = parent.arch().moe.as_ref().map_or(0, |m| m.leading_dense);
                assert!(names.iter().any(|n| n.contains("ffn_gate_inp")) || l < lead);
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

/// `shard-knot plan` on the MoE files: nodes sized by total bytes, the bytes a decoded token
/// reads (the experts it runs: k / E of each `*_exps` tensor, everything else whole), and the
/// KV cache per position counted only where a block caches: every head's key and value for
/// deepseek2 (its latent row with MLA's latent cache, or always for a split-`attn_k_b` file),
/// nothing for a hybrid's recurrent blocks.
#[test]
fn plan_sizes_moe_by_total_bytes_reads_active_ones_and_counts_the_real_kv_cache() {
    use shard_knot::plan::{plan, Budget, ModelCosts, PlanRequest};
    let dir = tempfile::tempdir().expect("tempdir");
    // (preset, f32 KV bytes per position of each block, with MLA's latent cache)
    type Case = (&'static str, Vec<u64>, Option<Vec<u64>>);
    let cases: [Case; 5] = [
        ("tiny-moe", vec![2 * 2 * 32 * 4; 4], None),
        (
            "tiny-deepseek2",
            vec![4 * (48 + 32) * 4; 4],
            Some(vec![(64 + 16) * 4; 4]),
        ),
        (
            "tiny-deepseek2-split",
            vec![(64 + 16) * 4; 4],
            Some(vec![(64 + 16) * 4; 4]),
        ),
        (
            "lfm2moe-tiny",
            vec![0, 0, 2 * 128 * 4, 0, 2 * 128 * 4],
            None,
        ),
        ("qwen35moe-tiny", vec![0, 0, 0, 2 * 128 * 4], None),
    ];
    for (preset, kv, latent) in cases {
        let Some(path) = synthetic(dir.path(), preset) else {
            return;
        };
        let knot = Knot::open(&path).expect("open");
        let a = knot.arch();
        let moe = a.moe.as_ref().expect("experts");
        let m = ModelCosts::from_knot(&knot);
        assert_eq!(
            m.layer_kv_bytes, kv,
            "{preset}: KV bytes per position and block"
        );
        assert_eq!(m.latent_kv_bytes, latent, "{preset}: with the latent cache");
        // Total and active bytes from the tensor table itself.
        let (mut total, mut active) = (0u64, 0u64);
        for t in knot.tensors() {
            total += t.entry.len;
            active += if t.name().contains("_exps.") {
                t.entry.len * moe.n_experts_used as u64 / moe.n_experts as u64
            } else if t.name() == "token_embd.weight" {
                0 // one row per token, not a matrix read
            } else {
                t.entry.len
            };
        }
        if m.tied {
            active += m.embed_bytes; // the head reads the embedding whole
        }
        assert_eq!(m.file_bytes(), total, "{preset}: sized by total bytes");
        let p = plan(
            &m,
            &PlanRequest {
                node_ram: Some(1 << 30),
                budget: Budget::Weights,
                nodes: Some(2),
                node_list: vec![],
                replicas: 1,
                disk_paged: false,
                kv_tokens: 1000,
            },
        )
        .expect("plan");
        assert_eq!(p.nodes.len(), 2);
        assert_eq!(p.active_bytes_per_token, active, "{preset}: read per token");
        assert!(
            active < total,
            "{preset}: a token reads less than the model"
        );
        assert_eq!(p.kv_bytes_per_position, kv.iter().sum::<u64>());
        assert_eq!(
            p.nodes.iter().map(|n| n.kv_bytes_per_position).sum::<u64>(),
            p.kv_bytes_per_position
        );
        for n in &p.nodes {
            let want: u64 = kv[n.layers.start as usize..n.layers.end as usize]
                .iter()
                .sum();
            assert_eq!(n.kv_bytes_per_position, want, "{preset}: {n:?}");
        }
        assert_eq!(
            p.latent_kv_bytes_per_position,
            latent.map(|v| v.iter().sum::<u64>())
        );
        eprintln!(
            "{preset}: {} B total, {} B read per token, KV {} B per position{}",
            total,
            active,
            p.kv_bytes_per_position,
            p.latent_kv_bytes_per_position
                .map(|l| format!(" ({l} B latent)"))
                .unwrap_or_default()
        );
    }
}
