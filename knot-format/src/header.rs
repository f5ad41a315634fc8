//! The KNOT header: architecture, tokenizer location, tensor table and shard record.
//!
//! The header is JSON (see `specs/knot-format.md`); these are its types. The tokenizer is
//! kept in its own section so that opening a model does not parse 150k vocabulary strings.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// Hyper-parameters the forward pass needs, taken from GGUF metadata at import.
/// `Default` is an empty header (no layers, zero widths) that does not validate: for code
/// that builds one field by field, such as tests' `ArchConfig { .., ..Default::default() }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArchConfig {
    /// GGUF `general.architecture`: `qwen2`, `llama`, `qwen3`, `gemma3`, ...
    pub arch: String,
    /// Number of transformer blocks.
    pub n_layers: u32,
    /// Residual width (`embedding_length`).
    pub hidden: u32,
    /// Query heads.
    pub n_heads: u32,
    /// Key/value heads (GQA when < `n_heads`).
    pub n_kv_heads: u32,
    /// Width of one head; `n_heads * head_dim` may differ from `hidden` (qwen3).
    pub head_dim: u32,
    /// FFN inner width (`feed_forward_length`).
    pub ffn: u32,
    /// Vocabulary size (rows of the token embedding).
    pub vocab: u32,
    /// Trained context length.
    pub context_len: u32,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RoPE pairing: NeoX (rotate halves: qwen2, qwen3, gemma) or normal (adjacent pairs: llama).
    pub rope_style: RopeStyle,
    /// Optional RoPE scaling (`rope.scaling.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// The output head is the token embedding (no `output.weight`).
    pub tied_embeddings: bool,
    /// Per-head RMSNorm on q and k before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    /// q, k, v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Sliding-window attention span (`attention.sliding_window`, gemma3: 512): on a local
    /// layer, position `p` sees positions `p0` with `p - p0 < window`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u32>,
    /// Which layers are local (sliding-window), one flag per layer, when the file says
    /// (`attention.sliding_window_pattern`, a period `n`: layer `l` is local unless
    /// `l % n == n - 1`; or a per-layer array). `None`: the architecture's default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swa_layers: Option<Vec<bool>>,
    /// RoPE base of the local layers (`rope.freq_base_swa`); `None`: the architecture's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_base_swa: Option<f32>,
    /// Final logit soft-capping `cap * tanh(logit / cap)` (`final_logit_softcapping`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcap: Option<f32>,
    /// Attention logit soft-capping `cap * tanh(score / cap)` on every scaled q·k score
    /// before the softmax (`attn_logit_softcapping`, gemma2: 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcap: Option<f32>,
    /// Multiplier of RoPE's cosines and sines (`rope.scaling.attn_factor`; Phi-3's LongRoPE
    /// writes `sqrt(1 + ln(scale) / ln(original_context))`): q and k are each scaled by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_attn_factor: Option<f32>,
    /// Granite's multipliers: of the embedding rows (`embedding_scale`), of each block's
    /// attention and FFN outputs before the residual add (`residual_scale`), the attention
    /// score scale in place of `1 / sqrt(head_dim)` (`attention.scale`), and the divisor of
    /// the output logits (`logit_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipliers: Option<Multipliers>,
    /// Mixture-of-experts FFN (`expert_count` > 0 in GGUF): every block's FFN is a router
    /// over stacked experts (`ffn_{gate,up,down}_exps`, 3-D) instead of one dense FFN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// Multi-head Latent Attention (deepseek2): q and kv through low-rank projections, each
    /// head's key a "nope" part from the latent and a RoPE part shared by all heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaConfig>,
    /// Hybrid models: which layers are recurrent instead of attention, and their shape
    /// (`None`: every layer is attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrent: Option<RecurrentLayers>,
    /// Dimensions of each head RoPE rotates (`rope.dimension_count`) when fewer than
    /// `head_dim` (glm4's and qwen35's partial RoPE: the first `rope_dim`, the rest pass unrotated);
    /// `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_dim: Option<u32>,
    /// Qwen3.5's Gated DeltaNet: the shape of its recurrent layers (`ssm.*` keys); `None`
    /// for every other architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_net: Option<DeltaNetShape>,
}

/// The heads of a Gated DeltaNet layer (qwen35's `ssm.state_size`, `ssm.group_count`,
/// `ssm.time_step_rank`): `k_heads` query/key heads and `v_heads` value heads, all of width
/// `head_dim`; value head `h` reads key head `h % k_heads`. Its recurrent state is one
/// `head_dim x head_dim` matrix per value head, plus the short convolution's last
/// `conv_kernel - 1` inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeltaNetShape {
    pub head_dim: u32,
    pub k_heads: u32,
    pub v_heads: u32,
}

/// Granite's scalar multipliers (llama.cpp reads them for `granite`; 0 or absent: unused).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Multipliers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit: Option<f32>,
}

/// The routed-experts FFN of a mixture-of-experts model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Experts per block (`expert_count`).
    pub n_experts: u32,
    /// Experts each token runs (`expert_used_count`, top-k).
    pub n_experts_used: u32,
    /// Inner width of one expert (`expert_feed_forward_length`).
    pub expert_ffn: u32,
    /// The top-k routing weights are renormalised to sum to 1 (qwen3moe always).
    pub norm_topk: bool,
    /// Experts every token runs besides the routed ones, as one FFN of `n_shared *
    /// expert_ffn` (`expert_shared_count`, deepseek2: `ffn_{gate,up,down}_shexp`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_shared: u32,
    /// The first blocks have a dense FFN instead (`leading_dense_block_count`, deepseek2,
    /// lfm2moe).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub leading_dense: u32,
    /// Inner width of the one shared expert when the file names it
    /// (`expert_shared_feed_forward_length`, qwen35moe: else `feed_forward_length`); absent
    /// for deepseek2, whose shared experts are `n_shared * expert_ffn` wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_ffn: Option<u32>,
    /// Multiplier of the routing weights (`expert_weights_scale`, DeepSeek's routed scaling
    /// factor); absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_scale: Option<f32>,
    /// How router logits become weights (`expert_gating_func`): `softmax` or `sigmoid`;
    /// absent: softmax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gating: Option<String>,
    /// Group-limited routing (`expert_group_count` / `expert_group_used_count`, DeepSeek-V3):
    /// experts are split into `count` groups and a token picks its experts from the `used`
    /// groups with the highest top-2 sums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<ExpertGroups>,
    /// Only every `n`th block (`(l + 1) % n == 0`) has experts, the others a dense FFN of
    /// `feed_forward_length` (`interleave_moe_layer_step`, llama4's Maverick: 2); 0 or 1:
    /// every block.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub interleave: u32,
}

/// Group-limited routing's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertGroups {
    pub count: u32,
    pub used: u32,
}

/// Multi-head Latent Attention's shape (deepseek2). Each head's key is `head_dim` wide:
/// `head_dim - rope_dim` "nope" dimensions decompressed from the latent plus `rope_dim`
/// rotated ones shared by all heads; its value is `v_head_dim` wide.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlaConfig {
    /// Rank of q's low-rank pair `attn_q_a` / `attn_q_b` (`attention.q_lora_rank`); 0: q
    /// straight from `attn_q` (DeepSeek-V2-Lite).
    pub q_lora_rank: u32,
    /// Width of the compressed kv latent (`attention.kv_lora_rank`).
    pub kv_lora_rank: u32,
    /// Rotated dimensions of each head's q and k (`rope.dimension_count`).
    pub rope_dim: u32,
    /// Width of one head's value (`attention.value_length`).
    pub v_head_dim: u32,
    /// `rope.scaling.yarn_log_multiplier` as the converter writes it (`0.1 *
    /// mscale_all_dim`): YaRN's attention-scale correction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yarn_log_mul: Option<f32>,
    /// The file has each head's key and value up-projections apart (`attn_k_b`, `attn_v_b`,
    /// newer converters) instead of one `attn_kv_b`: llama.cpp then runs the absorbed form
    /// over a latent cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split_kv_b: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The recurrent layers of a hybrid model (LFM2: gated short convolutions between GQA
/// attention layers). GGUF says which layers they are with a per-layer
/// `attention.head_count_kv` array whose recurrent entries are 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecurrentLayers {
    /// One flag per layer: true for a recurrent layer.
    pub layers: Vec<bool>,
    /// Taps of the depthwise causal convolution (LFM2's `shortconv.l_cache`, 3); the state
    /// a layer carries between tokens is the last `conv_kernel - 1` inputs.
    pub conv_kernel: u32,
    /// A selective state-space layer's shape (`mamba`, `mamba2`, `granitehybrid`: GGUF's
    /// `ssm.*` keys); `None` for LFM2's short convolution. Absent from older headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm: Option<SsmShape>,
}

/// The shape of a Mamba layer (llama.cpp `ssm_d_inner`, `ssm_d_state`, `ssm_dt_rank`,
/// `ssm_n_group`): `conv_kernel` above is its `ssm.conv_kernel`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SsmShape {
    /// Width of the layer's inner activations (`ssm.inner_size`, 2 x hidden).
    pub inner: u32,
    /// State values per channel (`ssm.state_size`: Mamba 16, Mamba-2 64..128).
    pub state: u32,
    /// `ssm.time_step_rank`: Mamba's rank of the time-step projection; Mamba-2's head count.
    pub dt_rank: u32,
    /// `ssm.group_count`: Mamba-2's groups of B and C (0 when absent: Mamba-1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub groups: u32,
    /// `ssm.dt_b_c_rms`: dt, B and C are RMS-normed (FalconMamba).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dt_b_c_rms: bool,
}

/// Architectures the engine (fat-station) can run. Kept here, in the format crate, so that
/// `knot import` and `knot inspect` can tell without depending on the engine; the engine has
/// a test that its own list is exactly this one.
pub const RUNNABLE_ARCHS: &[&str] = &[
    "qwen2",
    "llama",
    "qwen3",
    "gemma3",
    "qwen3moe",
    "lfm2",
    "gemma2",
    "phi3",
    "granite",
    "smollm3",
    "starcoder2",
    "glm4",
    "mamba",
    "mamba2",
    "granitehybrid",
    "qwen35",
    "deepseek2",
    "lfm2moe",
    "qwen35moe",
    "llama4",
];

/// Most transformer blocks a header may claim (the largest released models have under 200).
pub const MAX_LAYERS: u32 = 1 << 16;
/// Largest width a header may give `hidden`, `ffn`, `vocab`, the head counts or `head_dim`.
pub const MAX_DIM: u32 = 1 << 20;
/// Largest trained context length a header may claim.
pub const MAX_CONTEXT: u32 = 1 << 24;
/// Most experts a block may have (the largest released models have 384).
pub const MAX_EXPERTS: u32 = 1 << 12;
/// Most taps a recurrent layer's convolution may have (LFM2: 3, Mamba: 4).
pub const MAX_CONV_KERNEL: u32 = 64;
/// Longest architecture name.
pub const MAX_ARCH_NAME: usize = 64;

impl ArchConfig {
    /// Checks every count against its cap, so a reader can size buffers from the header
    /// without trusting it: `n_layers` in `1..=`[`MAX_LAYERS`], the widths in
    /// `1..=`[`MAX_DIM`], `context_len` in `1..=`[`MAX_CONTEXT`], an architecture name of
    /// 1..=[`MAX_ARCH_NAME`] bytes. [`crate::Knot::open`] and [`crate::KnotWriter::write`]
    /// call it; the error names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.arch.is_empty() || self.arch.len() > MAX_ARCH_NAME {
            return Err(format!(
                "arch name of {} bytes (1..={MAX_ARCH_NAME} allowed)",
                self.arch.len()
            ));
        }
        // A pure state-space model (mamba, mamba2) has no attention and no FFN: its head
        // counts and FFN width are 0.
        let pure_ssm = self
            .recurrent
            .as_ref()
            .is_some_and(|r| r.ssm.is_some() && r.layers.iter().all(|&l| l));
        let caps = [
            ("n_layers", self.n_layers, MAX_LAYERS),
            ("hidden", self.hidden, MAX_DIM),
            ("n_heads", self.n_heads, MAX_DIM),
            ("n_kv_heads", self.n_kv_heads, MAX_DIM),
            ("head_dim", self.head_dim, MAX_DIM),
            ("ffn", self.ffn, MAX_DIM),
            ("vocab", self.vocab, MAX_DIM),
            ("context_len", self.context_len, MAX_CONTEXT),
        ];
        for (name, v, max) in caps {
            let may_be_zero =
                pure_ssm && matches!(name, "n_heads" | "n_kv_heads" | "head_dim" | "ffn");
            if (v == 0 && !may_be_zero) || v > max {
                return Err(format!("arch.{name} = {v} is outside 1..={max}"));
            }
        }
        if let Some(w) = self.sliding_window {
            if w == 0 || w > MAX_CONTEXT {
                return Err(format!(
                    "arch.sliding_window = {w} is outside 1..={MAX_CONTEXT}"
                ));
            }
        }
        if let Some(l) = &self.swa_layers {
            if l.len() != self.n_layers as usize {
                return Err(format!(
                    "arch.swa_layers has {} flags for {} layers",
                    l.len(),
                    self.n_layers
                ));
            }
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0 || m.n_experts > MAX_EXPERTS {
                return Err(format!(
                    "arch.moe.n_experts = {} is outside 1..={MAX_EXPERTS}",
                    m.n_experts
                ));
            }
            if m.n_experts_used == 0 || m.n_experts_used > m.n_experts {
                return Err(format!(
                    "arch.moe.n_experts_used = {} is outside 1..={}",
                    m.n_experts_used, m.n_experts
                ));
            }
            if m.expert_ffn == 0 || m.expert_ffn > MAX_DIM {
                return Err(format!(
                    "arch.moe.expert_ffn = {} is outside 1..={MAX_DIM}",
                    m.expert_ffn
                ));
            }
            if m.n_shared > MAX_EXPERTS {
                return Err(format!(
                    "arch.moe.n_shared = {} is outside 0..={MAX_EXPERTS}",
                    m.n_shared
                ));
            }
            if m.shared_ffn.is_some_and(|w| w == 0 || w > MAX_DIM) {
                return Err(format!(
                    "arch.moe.shared_ffn = {:?} is outside 1..={MAX_DIM}",
                    m.shared_ffn
                ));
            }
            if m.leading_dense > self.n_layers {
                return Err(format!(
                    "arch.moe.leading_dense = {} is more than the {} layers",
                    m.leading_dense, self.n_layers
                ));
            }
            if let Some(g) = &m.groups {
                if g.count == 0 || !m.n_experts.is_multiple_of(g.count) {
                    return Err(format!(
                        "arch.moe.groups.count = {} does not divide {} experts",
                        g.count, m.n_experts
                    ));
                }
                if g.used == 0 || g.used > g.count {
                    return Err(format!(
                        "arch.moe.groups.used = {} is outside 1..={}",
                        g.used, g.count
                    ));
                }
                if m.n_experts_used > g.used * (m.n_experts / g.count) {
                    return Err(format!(
                        "arch.moe.n_experts_used = {} is more than the {} experts of {} groups",
                        m.n_experts_used,
                        g.used * (m.n_experts / g.count),
                        g.used
                    ));
                }
            }
        }
        if let Some(m) = &self.mla {
            for (name, v) in [
                ("q_lora_rank", m.q_lora_rank),
                ("kv_lora_rank", m.kv_lora_rank),
                ("rope_dim", m.rope_dim),
                ("v_head_dim", m.v_head_dim),
            ] {
                if v > MAX_DIM || (v == 0 && name != "q_lora_rank") {
                    return Err(format!("arch.mla.{name} = {v} is outside 1..={MAX_DIM}"));
                }
            }
            if m.rope_dim >= self.head_dim || !m.rope_dim.is_multiple_of(2) {
                return Err(format!(
                    "arch.mla.rope_dim = {} must be even and below head_dim {}",
                    m.rope_dim, self.head_dim
                ));
            }
        }
        if let Some(r) = &self.recurrent {
            if r.layers.len() != self.n_layers as usize {
                return Err(format!(
                    "arch.recurrent has {} flags for {} layers",
                    r.layers.len(),
                    self.n_layers
                ));
            }
            if !(2..=MAX_CONV_KERNEL).contains(&r.conv_kernel) {
                return Err(format!(
                    "arch.recurrent.conv_kernel = {} is outside 2..={MAX_CONV_KERNEL}",
                    r.conv_kernel
                ));
            }
            if let Some(s) = &r.ssm {
                for (name, v) in [
                    ("inner", s.inner),
                    ("state", s.state),
                    ("dt_rank", s.dt_rank),
                ] {
                    if v == 0 || v > MAX_DIM {
                        return Err(format!(
                            "arch.recurrent.ssm.{name} = {v} is outside 1..={MAX_DIM}"
                        ));
                    }
                }
                if s.groups > MAX_DIM {
                    return Err(format!(
                        "arch.recurrent.ssm.groups = {} is over {MAX_DIM}",
                        s.groups
                    ));
                }
            }
        }
        if let Some(r) = self.rope_dim {
            if r == 0 || r % 2 != 0 || r > self.head_dim {
                return Err(format!(
                    "arch.rope_dim = {r} is not an even number in 2..={}",
                    self.head_dim
                ));
            }
        }
        if let Some(d) = &self.delta_net {
            for (name, v) in [
                ("head_dim", d.head_dim),
                ("k_heads", d.k_heads),
                ("v_heads", d.v_heads),
            ] {
                if v == 0 || v > MAX_DIM {
                    return Err(format!(
                        "arch.delta_net.{name} = {v} is outside 1..={MAX_DIM}"
                    ));
                }
            }
            if d.v_heads % d.k_heads != 0 {
                return Err(format!(
                    "arch.delta_net: {} value heads are not a multiple of {} key heads",
                    d.v_heads, d.k_heads
                ));
            }
            if self.recurrent.is_none() {
                return Err("arch.delta_net without recurrent layers".into());
            }
        }
        for (name, v) in [
            ("rope_base_swa", self.rope_base_swa),
            ("final_logit_softcap", self.final_logit_softcap),
            ("attn_logit_softcap", self.attn_logit_softcap),
            ("rope_attn_factor", self.rope_attn_factor),
            (
                "moe.weights_scale",
                self.moe.as_ref().and_then(|m| m.weights_scale),
            ),
            (
                "multipliers.embedding",
                self.multipliers.as_ref().and_then(|m| m.embedding),
            ),
            (
                "multipliers.residual",
                self.multipliers.as_ref().and_then(|m| m.residual),
            ),
            (
                "multipliers.attention",
                self.multipliers.as_ref().and_then(|m| m.attention),
            ),
            (
                "multipliers.logit",
                self.multipliers.as_ref().and_then(|m| m.logit),
            ),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(format!("arch.{name} = {v} is not a positive number"));
                }
            }
        }
        Ok(())
    }

    /// Whether the engine can run this architecture ([`RUNNABLE_ARCHS`]).
    pub fn runs_here(&self) -> bool {
        RUNNABLE_ARCHS.contains(&self.arch.as_str())
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeStyle {
    /// Pairs (i, i + head_dim/2). Using `Normal` for a NeoX model scrambles every head.
    Neox,
    /// Pairs (2i, 2i + 1), as GGUF's llama tensors are permuted for.
    #[default]
    Normal,
}

/// RoPE scaling as GGUF describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `linear`, `yarn`, ...
    pub kind: String,
    pub factor: f32,
    #[serde(default)]
    pub original_context: u32,
}

/// Everything a tokenizer (byte-level BPE or SentencePiece) needs, as GGUF's `tokenizer.ggml.*` carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizerData {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer name (`qwen2`, `smollm`, `llama-bpe`, ...).
    pub pre: String,
    /// Token strings, index = id.
    pub tokens: Vec<String>,
    /// GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Vec<i32>,
    /// BPE merges `"a b"`, in rank order.
    pub merges: Vec<String>,
    /// SentencePiece piece scores (`tokenizer.ggml.scores`), index = id; empty for BPE.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<f32>,
    /// SentencePiece: prefix the text with a space (`tokenizer.ggml.add_space_prefix`);
    /// `None` when the file does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_space_prefix: Option<bool>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// The Jinja chat template, when the model has one.
    pub chat_template: Option<String>,
}

/// One tensor in the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// GGUF name, e.g. `blk.12.attn_q.weight`.
    pub name: String,
    pub dtype: DType,
    /// Dimensions in GGML order: `shape[0]` is the contiguous (row) length.
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte; a multiple of 4096.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
    /// BLAKE3 of the bytes, lowercase hex.
    pub blake3: String,
}

impl TensorEntry {
    /// Number of elements.
    pub fn elems(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A half-open range of original layer indices, `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerRange {
    pub start: u32,
    pub end: u32,
}

impl LayerRange {
    pub fn new(start: u32, end: u32) -> Self {
        LayerRange { start, end }
    }
    pub fn len(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
    pub fn contains_range(&self, other: &LayerRange) -> bool {
        other.start >= self.start && other.end <= self.end
    }
    /// Parses `a-b` or `a..b`.
    pub fn parse(s: &str) -> Option<LayerRange> {
        let (a, b) = s.split_once("..").or_else(|| s.split_once('-'))?;
        let r = LayerRange::new(a.trim().parse().ok()?, b.trim().parse().ok()?);
        (r.start <= r.end).then_some(r)
    }
}

impl std::fmt::Display for LayerRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// What part of the pipeline a shard serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Token embedding + layers `[0, a)`.
    Entry,
    /// Layers only.
    Mid,
    /// Layers + final norm + output head.
    Exit,
    /// Everything (a whole model).
    Full,
}

/// What part of a model a station holds: the embedding, a range of blocks, the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holdings {
    /// Token embedding (serves `/embed`).
    pub embed: bool,
    /// Transformer blocks, original indices.
    pub layers: LayerRange,
    /// Final norm + output head (serves `/lm-head`).
    pub head: bool,
}

impl Holdings {
    /// Everything a model of `n_layers` blocks has.
    pub fn full(n_layers: usize) -> Self {
        Holdings {
            embed: true,
            layers: LayerRange::new(0, n_layers as u32),
            head: true,
        }
    }

    /// What a node of `role` running `layers` holds.
    pub fn of_role(role: Role, layers: LayerRange) -> Self {
        let (embed, head) = match role {
            Role::Entry => (true, false),
            Role::Mid => (false, false),
            Role::Exit => (false, true),
            Role::Full => (true, true),
        };
        Holdings {
            embed,
            layers,
            head,
        }
    }
}

/// Present when the file is a per-node shard of a larger model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub role: Role,
    pub layers: LayerRange,
    /// Header hash (`Knot::model_hash`) of the model this shard was cut from.
    pub parent_hash: String,
    /// Layer count of the parent model.
    pub parent_layers: u32,
}

/// A byte section of the file (e.g. the tokenizer JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SectionRef {
    pub offset: u64,
    pub len: u64,
    pub blake3: String,
}

/// The whole header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Human-readable model id (`general.name` or the source file stem).
    pub model_id: String,
    pub arch: ArchConfig,
    /// Tokenizer section (JSON-encoded [`TokenizerData`]), absent in tokenizer-less files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<SectionRef>,
    pub tensors: Vec<TensorEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardRecord>,
}
