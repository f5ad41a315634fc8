//! The R1 Mesh Scaling Plan's coverage table (specs/mesh.md), row by row, and its two 6-R1
//! claims, planned from the real shapes of the models (no weights): issue 18 item 7.

use knot_format::{ArchConfig, DType, RopeStyle};
use shard_knot::plan::{plan, Budget, ModelCosts, Plan, PlanError, PlanRequest};

/// A model's shape as its `config.json` gives it, and the published size of its Q8_0 GGUF.
struct Shape {
    /// The name in the specs/mesh.md table.
    name: &'static str,
    n_layers: u32,
    hidden: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    ffn: u32,
    vocab: u32,
    tied: bool,
    qkv_bias: bool,
    /// Size of the published Q8_0 file in decimal GB (weights plus tokenizer metadata).
    q8_0_file_gb: f64,
    /// Where the shape (config.json) and the file size come from.
    source: &'static str,
}

#[rustfmt::skip]
const SHAPES: &[Shape] = &[
    Shape { name: "Qwen2.5-0.5B", n_layers: 24, hidden: 896, n_heads: 14, n_kv_heads: 2, head_dim: 64,
            ffn: 4864, vocab: 151936, tied: true, qkv_bias: true, q8_0_file_gb: 0.531,
            source: "Qwen/Qwen2.5-0.5B-Instruct config.json; bartowski/Qwen2.5-0.5B-Instruct-GGUF Q8_0" },
    Shape { name: "Qwen2.5-1.5B", n_layers: 28, hidden: 1536, n_heads: 12, n_kv_heads: 2, head_dim: 128,
            ffn: 8960, vocab: 151936, tied: true, qkv_bias: true, q8_0_file_gb: 1.65,
            source: "Qwen/Qwen2.5-1.5B-Instruct config.json; bartowski/Qwen2.5-1.5B-Instruct-GGUF Q8_0" },
    Shape { name: "Qwen2.5-3B", n_layers: 36, hidden: 2048, n_heads: 16, n_kv_heads: 2, head_dim: 128,
            ffn: 11008, vocab: 151936, tied: true, qkv_bias: true, q8_0_file_gb: 3.29,
            source: "Qwen/Qwen2.5-3B-Instruct config.json; bartowski/Qwen2.5-3B-Instruct-GGUF Q8_0" },
    Shape { name: "Phi-3-mini (3.8B)", n_layers: 32, hidden: 3072, n_heads: 32, n_kv_heads: 32, head_dim: 96,
            ffn: 8192, vocab: 32064, tied: false, qkv_bias: false, q8_0_file_gb: 4.06,
            source: "microsoft/Phi-3-mini-4k-instruct config.json; bartowski/Phi-3-mini-4k-instruct-GGUF Q8_0" },
    Shape { name: "Mistral-7B", n_layers: 32, hidden: 4096, n_heads: 32, n_kv_heads: 8, head_dim: 128,
            ffn: 14336, vocab: 32768, tied: false, qkv_bias: false, q8_0_file_gb: 7.70,
            source: "mistralai/Mistral-7B-Instruct-v0.3 config.json; bartowski/Mistral-7B-Instruct-v0.3-GGUF Q8_0" },
    Shape { name: "Llama-3-8B", n_layers: 32, hidden: 4096, n_heads: 32, n_kv_heads: 8, head_dim: 128,
            ffn: 14336, vocab: 128256, tied: false, qkv_bias: false, q8_0_file_gb: 8.54,
            source: "meta-llama/Meta-Llama-3-8B-Instruct config.json; bartowski/Meta-Llama-3-8B-Instruct-GGUF Q8_0" },
    Shape { name: "Llama-2-13B", n_layers: 40, hidden: 5120, n_heads: 40, n_kv_heads: 40, head_dim: 128,
            ffn: 13824, vocab: 32000, tied: false, qkv_bias: false, q8_0_file_gb: 13.83,
            source: "meta-llama/Llama-2-13b-chat-hf config.json; TheBloke/Llama-2-13B-chat-GGUF Q8_0" },
    Shape { name: "Phi-3-medium (14B)", n_layers: 40, hidden: 5120, n_heads: 40, n_kv_heads: 10, head_dim: 128,
            ffn: 17920, vocab: 32064, tied: false, qkv_bias: false, q8_0_file_gb: 14.83,
            source: "microsoft/Phi-3-medium-4k-instruct config.json; bartowski/Phi-3-medium-4k-instruct-GGUF Q8_0" },
    Shape { name: "Qwen2.5-14B", n_layers: 48, hidden: 5120, n_heads: 40, n_kv_heads: 8, head_dim: 128,
            ffn: 13824, vocab: 152064, tied: false, qkv_bias: true, q8_0_file_gb: 15.70,
            source: "Qwen/Qwen2.5-14B-Instruct config.json; bartowski/Qwen2.5-14B-Instruct-GGUF Q8_0" },
    Shape { name: "Llama-3-70B", n_layers: 80, hidden: 8192, n_heads: 64, n_kv_heads: 8, head_dim: 128,
            ffn: 28672, vocab: 128256, tied: false, qkv_bias: false, q8_0_file_gb: 74.98,
            source: "meta-llama/Meta-Llama-3-70B-Instruct config.json; bartowski/Meta-Llama-3-70B-Instruct-GGUF Q8_0" },
];

/// R1s in the plan's mesh.
const R1S: u32 = 6;

/// A synthetic header of `s`'s shape.
fn header(s: &Shape) -> ArchConfig {
    ArchConfig {
        arch: "llama".into(),
        n_layers: s.n_layers,
        hidden: s.hidden,
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        ffn: s.ffn,
        vocab: s.vocab,
        context_len: 4096,
        norm_eps: 1e-5,
        rope_base: 10000.0,
        rope_style: RopeStyle::Normal,
        tied_embeddings: s.tied,
        qkv_bias: s.qkv_bias,
        ..Default::default()
    }
}

fn costs(name: &str) -> ModelCosts {
    let s = SHAPES
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no shape for {name:?}"));
    ModelCosts::from_arch(s.name, &header(s), DType::Q8_0).expect("whole Q8_0 blocks")
}

/// The plan's "2.4 GB per node", as `--node-ram 2.4G` reads it.
fn budget() -> u64 {
    aeon_cli::size::parse_size("2.4G").expect("size")
}

fn request(budget_kind: Budget, nodes: Option<u32>, replicas: u32) -> PlanRequest {
    PlanRequest {
        node_ram: Some(budget()),
        budget: budget_kind,
        nodes,
        node_list: vec![],
        replicas,
        disk_paged: false,
        kv_tokens: shard_knot::plan::DEFAULT_KV_TOKENS,
    }
}

/// Every node within its budget, each chain tiling the layers contiguously.
fn assert_sound(p: &Plan) {
    for n in &p.nodes {
        assert!(n.bytes <= n.usable, "{}: {n:?}", p.model_id);
        assert_eq!(n.paged_bytes, 0);
    }
    for chain in 0..p.replicas {
        let mut next = 0;
        for n in p.nodes.iter().filter(|n| n.chain == chain) {
            assert_eq!(n.layers.start, next, "{}: chain {chain}", p.model_id);
            next = n.layers.end;
        }
        assert_eq!(next, p.n_layers, "{}: chain {chain}", p.model_id);
    }
}

/// The table's rows: (model, weights, nodes needed, fits on 6 R1s).
fn table() -> Vec<(String, String, u32, bool)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../specs/mesh.md");
    let text = std::fs::read_to_string(path).expect("specs/mesh.md");
    let start = text
        .find("### The R1 Mesh Scaling Plan's coverage table")
        .expect("the coverage table's heading");
    let rows: Vec<_> = text[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| model |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let c: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(c.len(), 4, "{l}");
            let fits = match c[3] {
                "fits" => true,
                "does not fit" => false,
                other => panic!("{l}: {other:?}"),
            };
            (
                c[0].to_string(),
                c[1].to_string(),
                c[2].parse().expect("nodes"),
                fits,
            )
        })
        .collect();
    assert_eq!(rows.len(), SHAPES.len(), "one row per shape");
    rows
}

#[test]
fn shapes_match_the_published_q8_0_files() {
    for s in SHAPES {
        let w = costs(s.name).file_bytes() as f64 / 1e9;
        let off = (w / s.q8_0_file_gb - 1.0).abs();
        assert!(
            off < 0.015,
            "{}: {w:.3} GB of weights vs the {} GB file ({})",
            s.name,
            s.q8_0_file_gb,
            s.source
        );
    }
}

/// Both columns of the table, row by row, with `--node-ram 2.4G` (a weight budget).
#[test]
fn coverage_table_rows() {
    for (model, weights, needed, fits) in table() {
        let m = costs(&model);
        assert_eq!(
            format!("{:.2} GB", m.file_bytes() as f64 / 1e9),
            weights,
            "{model}: weights"
        );
        let p =
            plan(&m, &request(Budget::Weights, None, 1)).unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_sound(&p);
        assert_eq!(p.nodes_needed, Some(needed), "{model}: {}", p.why);
        assert_eq!(p.nodes_per_chain <= R1S, fits, "{model}: {}", p.why);
        if fits {
            // The rule is honest where the model fits: whole layers need no more nodes.
            assert_eq!(p.nodes_per_chain, needed, "{model}: {}", p.why);
            let on_six = plan(&m, &request(Budget::Weights, Some(R1S.min(p.n_layers)), 1));
            assert!(on_six.is_ok(), "{model} on 6 R1s: {on_six:?}");
        } else {
            let e = plan(&m, &request(Budget::Weights, Some(R1S), 1)).unwrap_err();
            assert!(matches!(e, PlanError::DoesNotFit(_)), "{model}: {e}");
        }
    }
}

/// "mistral-7b as two 3-node replicas on 6 R1s".
#[test]
fn mistral_7b_runs_as_two_3_node_replicas_on_6_r1s() {
    let m = costs("Mistral-7B");
    let p = plan(&m, &request(Budget::Weights, Some(3), 2)).expect("two 3-node chains");
    assert_eq!((p.nodes_per_chain, p.replicas, p.nodes.len()), (3, 2, 6));
    assert_sound(&p);
    // As few nodes as fit is 3 as well, and the old free-RAM reading of 2.4G refuses it.
    let p = plan(&m, &request(Budget::Weights, None, 2)).expect("plan");
    assert_eq!(p.nodes.len(), 6);
    let e = plan(&m, &request(Budget::Free, Some(3), 2)).unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
}

/// "the 6-node ceiling is 13-14B".
#[test]
fn six_r1s_hold_up_to_13_14b() {
    let six = R1S as u64 * budget();
    // At Q8_0 (34 bytes per 32 weights) six budgets hold 14.5B parameters.
    let params = six as f64 * 32.0 / 34.0;
    assert!((14.0e9..15.0e9).contains(&params), "{params:e}");
    for (model, fits) in [
        ("Llama-3-8B", true),
        ("Llama-2-13B", true),
        ("Phi-3-medium (14B)", true),
        ("Qwen2.5-14B", false),
        ("Llama-3-70B", false),
    ] {
        let r = plan(&costs(model), &request(Budget::Weights, Some(R1S), 1));
        assert_eq!(r.is_ok(), fits, "{model}: {r:?}");
    }
}

/// Qwen3-30B-A3B (48 layers, hidden 2048, 32 / 4 heads of 128, 128 experts of 768, top-8) at
/// Q4_K: the planner sizes the nodes by all the experts' bytes, and reports that a decoded
/// token reads only the active ones (~3.3B of ~30.5B parameters).
#[test]
fn qwen3_30b_a3b_is_sized_by_total_bytes_and_reads_its_active_bytes() {
    let a = ArchConfig {
        arch: "qwen3moe".into(),
        n_layers: 48,
        hidden: 2048,
        n_heads: 32,
        n_kv_heads: 4,
        head_dim: 128,
        ffn: 6144,
        vocab: 151936,
        rope_style: RopeStyle::Neox,
        tied_embeddings: false,
        qk_norm: true,
        qkv_bias: false,
        moe: Some(knot_format::MoeConfig {
            n_experts: 128,
            n_experts_used: 8,
            expert_ffn: 768,
            norm_topk: true,
            ..Default::default()
        }),
        ..header(&SHAPES[0])
    };
    let m = ModelCosts::from_arch("qwen3-30b-a3b", &a, DType::Q4_K).expect("whole Q4_K blocks");
    let p = plan(&m, &request(Budget::Weights, None, 1)).expect("plan");
    assert_sound(&p);
    // 30.5B parameters at 4.5 bits: ~17.2 GB; a 2.4 GiB budget holds ~2.58 GB: 7 nodes.
    let gb = |b: u64| b as f64 / 1e9;
    eprintln!(
        "qwen3-30b-a3b Q4_K: {:.2} GB weights on {} nodes of 2.4 GiB, {:.2} GB read per token",
        gb(p.weight_bytes),
        p.nodes_per_chain,
        gb(p.active_bytes_per_token)
    );
    assert!(
        (16.5..18.0).contains(&gb(p.weight_bytes)),
        "{}",
        gb(p.weight_bytes)
    );
    assert_eq!(
        p.nodes_needed,
        Some(p.weight_bytes.div_ceil(budget()) as u32)
    );
    // Active: attention (48 x 2048 x 12288 at Q4_K) + 8 of 128 experts + routers + the head:
    // ~3.3B parameters, ~1.9 GB; a node reads about its share of that.
    assert!(
        (1.7..2.1).contains(&gb(p.active_bytes_per_token)),
        "{}",
        gb(p.active_bytes_per_token)
    );
    assert_eq!(
        p.active_bytes_per_token,
        p.nodes.iter().map(|n| n.active_bytes).sum::<u64>()
    );
    for n in &p.nodes {
        assert!(n.active_bytes < n.bytes / 4, "{n:?}");
    }
}
