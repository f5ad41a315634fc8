//! Validated hyper-parameters of the forward pass, derived from the KNOT header.

use knot_format::{ArchConfig, MoeConfig, RopeStyle};

use super::mla::MlaShape;
use super::ssm::{SsmConfig, SsmKind};
use super::EngineError;

/// Architectures the forward pass implements (`knot_format::RUNNABLE_ARCHS` names them for
/// tools that do not link the engine; a test keeps the two lists equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: q, k, v biases, NeoX RoPE.
    Qwen2,
    /// Llama family (SmolLM2): no biases, normal RoPE (GGUF permutes q/k for it).
    Llama,
    /// Qwen3: per-head RMSNorm on q and k, `n_heads * head_dim` may differ from `hidden`.
    Qwen3,
    /// Gemma 3: see [`Recipe::GEMMA3`].
    Gemma3,
    /// Gemma 2: see [`Recipe::GEMMA2`].
    Gemma2,
    /// Phi-3: see [`Recipe::PHI3`].
    Phi3,
    /// IBM Granite (3.x dense): see [`Recipe::GRANITE`].
    Granite,
    /// SmolLM3: see [`Recipe::SMOLLM3`].
    SmolLm3,
    /// GLM-4 (0414): see [`Recipe::GLM4`].
    Glm4,
    /// StarCoder2: see [`Recipe::STARCODER2`].
    Starcoder2,
    /// Qwen3-MoE: qwen3's attention, every FFN a softmax top-k router over SiLU-gated
    /// experts, the top-k weights renormalised (see [`crate::moe`]).
    Qwen3Moe,
    /// Liquid LFM2: see [`Recipe::LFM2`].
    Lfm2,
    /// Mamba (Mamba-1): every layer a selective state-space layer (`ssm.rs`), no attention,
    /// no FFN; the baseline's norms and head.
    Mamba,
    /// Mamba-2: as [`Arch::Mamba`] with Mamba-2's layer (heads, groups, grouped norm).
    Mamba2,
    /// IBM Granite 4.0-H: Mamba-2 layers where `head_count_kv` is 0, granite's GQA attention
    /// on the others, every layer with its SwiGLU FFN; granite's multipliers
    /// ([`Recipe::GRANITE`]).
    GraniteHybrid,
    /// Qwen3.5: see [`Recipe::QWEN35`].
    Qwen35,
    /// DeepSeek-V2/V3 (llama.cpp `deepseek2`): Multi-head Latent Attention (`crate::mla`),
    /// the first `leading_dense` blocks a dense FFN, the others routed experts plus shared
    /// ones, softmax or sigmoid routing, optionally group-limited (see [`crate::moe`]).
    DeepSeek2,
    /// Liquid LFM2-MoE (LFM2-8B-A1B): see [`Recipe::LFM2MOE`]; the FFNs after the first
    /// `leading_dense` are routed experts, sigmoid-gated with an `exp_probs_b` selection bias,
    /// the top-k weights renormalised ([`Arch::moe_rules`]).
    Lfm2Moe,
    /// Qwen3.5-MoE: qwen35's hybrid ([`Recipe::QWEN35`]) with every FFN routed experts
    /// (softmax, top-k renormalised) plus one shared expert whose output is scaled by
    /// `sigmoid(ffn_gate_inp_shexp · n)` ([`Arch::moe_rules`]).
    Qwen35Moe,
    /// Llama 4 (Scout, Maverick): see [`Recipe::LLAMA4`].
    Llama4,
}

/// What an architecture's routed-experts FFN may have beyond qwen3moe's (softmax top-k):
/// anything else in a file is refused by name rather than run as a different model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeRules {
    /// `expert_gating_func` sigmoid is allowed.
    pub sigmoid: bool,
    /// Shared experts (`*_shexp`), `n_shared * expert_ffn` wide (deepseek2).
    pub shared: bool,
    /// One shared expert scaled by `sigmoid(ffn_gate_inp_shexp · n)` (qwen35moe).
    pub gated_shared: bool,
    /// The first `leading_dense` blocks keep a dense FFN.
    pub leading_dense: bool,
    /// Group-limited routing.
    pub groups: bool,
    /// llama4's routing: top-1 on the raw router logits, the expert's input scaled by the
    /// sigmoid of its logit, and exactly one shared expert; the file names no gating function.
    pub input_weighted: bool,
}

impl Arch {
    /// Every architecture, with its `general.architecture` name.
    pub const ALL: [(Arch, &'static str); 20] = [
        (Arch::Qwen2, "qwen2"),
        (Arch::Llama, "llama"),
        (Arch::Qwen3, "qwen3"),
        (Arch::Gemma3, "gemma3"),
        (Arch::Qwen3Moe, "qwen3moe"),
        (Arch::Lfm2, "lfm2"),
        (Arch::Gemma2, "gemma2"),
        (Arch::Phi3, "phi3"),
        (Arch::Granite, "granite"),
        (Arch::SmolLm3, "smollm3"),
        (Arch::Starcoder2, "starcoder2"),
        (Arch::Glm4, "glm4"),
        (Arch::Mamba, "mamba"),
        (Arch::Mamba2, "mamba2"),
        (Arch::GraniteHybrid, "granitehybrid"),
        (Arch::Qwen35, "qwen35"),
        (Arch::DeepSeek2, "deepseek2"),
        (Arch::Lfm2Moe, "lfm2moe"),
        (Arch::Qwen35Moe, "qwen35moe"),
        (Arch::Llama4, "llama4"),
    ];

    /// The architecture named `name` in GGUF's `general.architecture`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.iter().find(|(_, n)| *n == name).map(|&(a, _)| a)
    }

    /// What the block does beyond the llama/qwen2 baseline. Everything an architecture
    /// changes in the forward pass is in this table; weights (biases, q/k norms) are
    /// detected from the file.
    pub fn recipe(self) -> Recipe {
        match self {
            Arch::Qwen2 | Arch::Llama | Arch::Qwen3 | Arch::Qwen3Moe => Recipe::BASELINE,
            Arch::Mamba | Arch::Mamba2 => Recipe::BASELINE,
            Arch::GraniteHybrid => Recipe::GRANITE,
            Arch::DeepSeek2 => Recipe::BASELINE,
            Arch::Gemma3 => Recipe::GEMMA3,
            Arch::Gemma2 => Recipe::GEMMA2,
            Arch::Phi3 => Recipe::PHI3,
            Arch::Granite => Recipe::GRANITE,
            Arch::SmolLm3 => Recipe::SMOLLM3,
            Arch::Starcoder2 => Recipe::STARCODER2,
            Arch::Glm4 => Recipe::GLM4,
            Arch::Lfm2 => Recipe::LFM2,
            Arch::Qwen35 => Recipe::QWEN35,
            Arch::Lfm2Moe => Recipe::LFM2MOE,
            Arch::Qwen35Moe => Recipe::QWEN35,
            Arch::Llama4 => Recipe::LLAMA4,
        }
    }

    /// Its routed experts' variations, `None` for an architecture without experts.
    pub fn moe_rules(self) -> Option<MoeRules> {
        let none = MoeRules {
            sigmoid: false,
            shared: false,
            gated_shared: false,
            leading_dense: false,
            groups: false,
            input_weighted: false,
        };
        match self {
            Arch::Qwen3Moe => Some(none),
            Arch::DeepSeek2 => Some(MoeRules {
                sigmoid: true,
                shared: true,
                leading_dense: true,
                groups: true,
                ..none
            }),
            Arch::Lfm2Moe => Some(MoeRules {
                sigmoid: true,
                leading_dense: true,
                ..none
            }),
            Arch::Qwen35Moe => Some(MoeRules {
                gated_shared: true,
                ..none
            }),
            Arch::Llama4 => Some(MoeRules {
                shared: true,
                input_weighted: true,
                ..none
            }),
            _ => None,
        }
    }

    /// Liquid's short-convolution hybrids.
    pub fn is_lfm2(self) -> bool {
        matches!(self, Arch::Lfm2 | Arch::Lfm2Moe)
    }

    /// Qwen3.5's Gated DeltaNet hybrids.
    pub fn is_qwen35(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }
}

/// FFN activation of the gated unit `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(g) = g * sigmoid(g)` (llama, qwen).
    Silu,
    /// GeGLU: GELU, tanh approximation (gemma; llama.cpp `LLM_FFN_GELU`).
    GeluTanh,
}

/// What the attention scores are scaled by: `1 / sqrt(query_pre_attn_scalar)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryScale {
    /// `1 / sqrt(head_dim)`.
    HeadDim,
    /// Gemma 2: `query_pre_attn_scalar` is `head_dim`, except in the 27B (46 layers), where
    /// it is `hidden / n_heads` (144, not its head_dim 128). GGUF carries no key for it; this
    /// is llama.cpp's rule, from the reference implementation's per-size configs.
    Gemma2,
}

/// How one architecture's block differs from the llama/qwen2 baseline.
///
/// Baseline block: `x += Wo·attn(rope(q), rope(k), v)` over `rmsnorm(x)`, then
/// `x += Wdown·(silu(Wgate·n) * Wup·n)` with `n = rmsnorm(x)`; logits = `Wout·rmsnorm(x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recipe {
    /// Embedding rows are multiplied by `sqrt(hidden)` (gemma). Applied in `embed`, so a
    /// residual passed between stations already carries it.
    pub scale_embedding: bool,
    /// The attention and FFN outputs are RMSNormed (`post_attention_norm`,
    /// `post_ffw_norm`) before they are added to the residual (gemma2/3 "sandwich" norms).
    pub post_norms: bool,
    pub activation: Activation,
    /// When the file has a sliding window but no per-layer pattern: every `n`th layer
    /// (`l % n == n - 1`) is global, the others local (llama.cpp's gemma3 default, 6).
    pub default_swa_period: Option<u32>,
    /// RoPE base of local layers when the file has no `rope.freq_base_swa` (gemma3: 10k,
    /// while the global layers use `rope.freq_base`, 1M).
    pub default_rope_base_swa: Option<f32>,
    /// Name of the final norm's weight (LFM2's converter calls it `token_embd_norm`).
    pub output_norm: &'static str,
    /// Sliding window when the file names none (gemma2: 4096, as llama.cpp assumes).
    pub default_sliding_window: Option<u32>,
    /// Attention logit soft-capping when the file has no `attn_logit_softcapping` (gemma2: 50).
    pub default_attn_softcap: Option<f32>,
    /// Final logit soft-capping when the file has no `final_logit_softcapping` (gemma2: 30).
    pub default_final_softcap: Option<f32>,
    pub query_scale: QueryScale,
    /// The gate and up projections are one `ffn_up` matrix, gate rows first (phi3); used
    /// as two row ranges of it, not copied.
    pub fused_gate_up: bool,
    /// The file's sliding window is not applied. llama.cpp builds a windowed mask only for
    /// the architectures whose graph has one (gemma2/3, lfm2 here); the llama graph (Mistral
    /// v0.1's files carry `llama.attention.sliding_window` 4096), qwen2/3, granite, smollm3
    /// and phi3 (its converters' window being unreliable) attend to every position, whatever
    /// the file says. Matching llama.cpp is the contract: a Mistral-v0.1-shaped file with a
    /// window of 4 gives llama.cpp's logits only without it (`engine_dense.rs`).
    pub ignore_sliding_window: bool,
    /// The file's multipliers (`embedding_scale`, `residual_scale`, `attention.scale`,
    /// `logit_scale`) apply (granite); other architectures ignore them, as llama.cpp does.
    pub multipliers: bool,
    /// Every `n`th layer (`(l + 1) % n == 0`) rotates no q or k (smollm3: 4, "NoPE" layers).
    pub no_rope_every: Option<usize>,
    /// Every norm is a LayerNorm (mean removed, `*_norm.bias` added) instead of RMSNorm
    /// (starcoder2).
    pub layer_norm: bool,
    /// The FFN is `down(act(up(x)))`, no gate (starcoder2), instead of `act(gate) * up`.
    pub ungated_ffn: bool,
    /// Name of the norm before the FFN (qwen35 calls it `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// `attn_q` gives each head its query and then a gate of the same width; the attention
    /// output is multiplied by `sigmoid(gate)` before `attn_output` (qwen35).
    pub attn_output_gate: bool,
    /// The local layers (`swa_layers`, from the file's pattern or `default_swa_period`)
    /// attend within chunks of this many positions (llama4: 8192, a constant in llama.cpp,
    /// which reads no key for it).
    pub attn_chunk: Option<u32>,
    /// The RoPE layers' q and k heads are RMS-normed without a weight after RoPE (llama4's
    /// "L2 norm"; llama.cpp leaves it out for 128 experts, Maverick).
    pub kq_l2_norm: bool,
    /// The NoPE layers' queries are scaled by `1 + s ln(floor((p + 1) / n) + 1)` at position
    /// `p`, `(s, n)` (llama4's attention temperature tuning: 0.1, 8192).
    pub nope_temperature: Option<(f32, u32)>,
}

impl Recipe {
    /// qwen2, llama, qwen3.
    pub const BASELINE: Recipe = Recipe {
        scale_embedding: false,
        post_norms: false,
        activation: Activation::Silu,
        default_swa_period: None,
        default_rope_base_swa: None,
        output_norm: "output_norm.weight",
        default_sliding_window: None,
        default_attn_softcap: None,
        default_final_softcap: None,
        query_scale: QueryScale::HeadDim,
        fused_gate_up: false,
        ignore_sliding_window: true,
        multipliers: false,
        no_rope_every: None,
        layer_norm: false,
        ungated_ffn: false,
        ffn_norm: "ffn_norm.weight",
        attn_output_gate: false,
        attn_chunk: None,
        kq_l2_norm: false,
        nope_temperature: None,
    };
    /// Gemma 3 (llama.cpp `gemma3-iswa`): embedding scaled by sqrt(hidden); per-head q/k
    /// RMSNorm (weights in the file); pre- and post-norms around attention and FFN; GeGLU;
    /// 5 local layers (window from the file, RoPE base 10k) to 1 global (RoPE base from the
    /// file); optional final logit soft-capping; tied output.
    ///
    /// Trap: Gemma's RMSNorm multiplies by `1 + w`, but llama.cpp's converter already added
    /// the 1 to every `*norm.weight` in the GGUF, so the stored weights are used as they are
    /// (adding 1 again roughly doubles every normed activation and the output is garbage).
    pub const GEMMA3: Recipe = Recipe {
        scale_embedding: true,
        post_norms: true,
        activation: Activation::GeluTanh,
        default_swa_period: Some(6),
        default_rope_base_swa: Some(10_000.0),
        ignore_sliding_window: false,
        ..Recipe::BASELINE
    };
    /// Gemma 2 (llama.cpp `gemma2`): gemma3's embedding scale, sandwich norms, GeGLU and
    /// tied head, without q/k norms; local and global layers alternate (layer 0 local,
    /// window 4096) at one RoPE base; the scaled attention scores are soft-capped
    /// (`50 tanh(s / 50)`) before the softmax and the output logits too (`30 tanh(l / 30)`);
    /// scores scaled by `query_pre_attn_scalar` ([`QueryScale::Gemma2`]). Its norm weights
    /// carry the converter's `+ 1` as gemma3's do.
    pub const GEMMA2: Recipe = Recipe {
        scale_embedding: true,
        post_norms: true,
        activation: Activation::GeluTanh,
        default_swa_period: Some(2),
        default_sliding_window: Some(4096),
        default_attn_softcap: Some(50.0),
        default_final_softcap: Some(30.0),
        query_scale: QueryScale::Gemma2,
        ignore_sliding_window: false,
        ..Recipe::BASELINE
    };
    /// Phi-3 (llama.cpp `phi3`): the llama block with NeoX RoPE, q/k/v fused in one
    /// `attn_qkv` matrix (split by rows in `weights.rs`) and gate/up fused in `ffn_up`;
    /// LongRoPE's per-frequency factors (`rope_factors_short`, or `rope_factors_long` when the
    /// sessions' context exceeds the original one: `Model::with_context`) divide RoPE's
    /// frequencies and
    /// `rope.scaling.attn_factor` scales its cosines and sines. No sliding window.
    pub const PHI3: Recipe = Recipe {
        fused_gate_up: true,
        ..Recipe::BASELINE
    };
    /// IBM Granite (llama.cpp `granite`): the llama block (normal RoPE) with four scalars
    /// from the file: embedding rows times `embedding_scale`, each attention and FFN output
    /// times `residual_scale` before its residual add, attention scores times
    /// `attention.scale` (not `1 / sqrt(head_dim)`), logits divided by `logit_scale`.
    pub const GRANITE: Recipe = Recipe {
        multipliers: true,
        ..Recipe::BASELINE
    };
    /// SmolLM3 (llama.cpp `smollm3`): the llama block, except that every fourth layer
    /// (3, 7, 11, ...) applies no RoPE to q and k.
    pub const SMOLLM3: Recipe = Recipe {
        no_rope_every: Some(4),
        ..Recipe::BASELINE
    };
    /// StarCoder2 (llama.cpp `starcoder2`): LayerNorms with biases (before attention, before
    /// the FFN, the final one; eps from `attention.layer_norm_epsilon`), NeoX RoPE, biases on
    /// q, k, v and the attention output, an ungated MLP `down(gelu(up x + b)) + b` (GELU's
    /// tanh form, as llama.cpp's `ggml_gelu`); no sliding window (llama.cpp applies none).
    pub const STARCODER2: Recipe = Recipe {
        layer_norm: true,
        ungated_ffn: true,
        activation: Activation::GeluTanh,
        ..Recipe::BASELINE
    };
    /// GLM-4 (llama.cpp `glm4`, 0.3.36's loader): RMSNorms; q/k/v biases when the file has
    /// them, none on the output; partial normal-style RoPE (`rope.dimension_count`, half of
    /// GLM-4-9B's 128-wide heads); `post_attention_norm` and `post_ffw_norm` on the attention
    /// and FFN outputs before their residual adds; gate and up fused in `ffn_up` (gate rows
    /// first, SwiGLU). Not read: the M-RoPE sections (`rope.dimension_sections`) of the
    /// multimodal GLM-4V files, which text-only files do not carry.
    pub const GLM4: Recipe = Recipe {
        post_norms: true,
        fused_gate_up: true,
        ..Recipe::BASELINE
    };
    /// Liquid LFM2 (llama.cpp `lfm2`): a hybrid. Each layer's mixer is either GQA attention
    /// with per-head q/k RMSNorm and NeoX RoPE (as qwen3), or a gated short convolution
    /// (`Config::recurrent_layers`, see `shortconv.rs`); every layer then has the SwiGLU FFN.
    /// The final norm is `token_embd_norm.weight`; the output head is tied.
    pub const LFM2: Recipe = Recipe {
        output_norm: "token_embd_norm.weight",
        ignore_sliding_window: false,
        ..Recipe::BASELINE
    };
    /// Qwen3.5 (llama.cpp `qwen35`): a hybrid. Three of four layers (`Config::recurrent_layers`)
    /// mix with a Gated DeltaNet (`deltanet.rs`); the others with gated attention: per-head
    /// q/k RMSNorm, partial NeoX RoPE over `rope_dim` (IMROPE with one position for text),
    /// the output times `sigmoid(gate)`. The FFN's norm is `post_attention_norm`.
    pub const QWEN35: Recipe = Recipe {
        ffn_norm: "post_attention_norm.weight",
        attn_output_gate: true,
        ..Recipe::BASELINE
    };
    /// Liquid LFM2-MoE (llama.cpp `lfm2moe`): LFM2's block, but llama.cpp's lfm2moe loader
    /// reads no sliding window, so its attention sees every position whatever the file says.
    pub const LFM2MOE: Recipe = Recipe {
        ignore_sliding_window: true,
        ..Recipe::LFM2
    };
}

impl Recipe {
    /// Llama 4 (llama.cpp `llama4`, its chunked-attention graph): the llama block (normal
    /// RoPE, unpermuted q/k) where every fourth layer (3, 7, ...) is NoPE and sees every
    /// earlier position, its queries scaled by the temperature rule, and the other layers
    /// rotate, L2-norm q and k after RoPE, and attend within chunks of 8192 positions; every
    /// `interleave_moe_layer_step`th block's FFN is one routed expert of many (top-1, chosen
    /// on the router's logits, its sigmoid weighting the expert's input) plus a shared
    /// expert, the other blocks a dense SwiGLU FFN.
    pub const LLAMA4: Recipe = Recipe {
        no_rope_every: Some(4),
        default_swa_period: Some(4),
        attn_chunk: Some(8192),
        kq_l2_norm: true,
        nope_temperature: Some((0.1, 8192)),
        ..Recipe::BASELINE
    };
}

/// RoPE context scaling from the file's `rope.scaling.*` (llama.cpp's rules): every
/// frequency times `freq_scale` (`1 / rope.scaling.factor`), and with YaRN only the low
/// frequencies, blended per dimension by a ramp between the dimensions that turn
/// `beta_fast` (32) and `beta_slow` (1) times over the original context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScale {
    pub freq_scale: f32,
    pub yarn: Option<Yarn>,
}

/// YaRN's ramp (llama.cpp's `ggml_rope_yarn_corr_dims`; beta_fast 32, beta_slow 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.original_context_length` (else the trained context).
    pub original_context: u32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl RopeScale {
    /// No scaling.
    pub const NONE: RopeScale = RopeScale {
        freq_scale: 1.0,
        yarn: None,
    };

    /// From the header; an unknown scaling type is refused by name (running it unscaled
    /// would be a quietly different model).
    fn from_arch(a: &ArchConfig) -> Result<RopeScale, EngineError> {
        let Some(s) = &a.rope_scaling else {
            return Ok(RopeScale::NONE);
        };
        if !(s.factor.is_finite() && s.factor > 0.0) {
            return Err(EngineError::BadConfig(format!(
                "rope.scaling.factor {} is not a positive number",
                s.factor
            )));
        }
        let freq_scale = 1.0 / s.factor;
        match s.kind.as_str() {
            // longrope: the factor tensors carry it; llama.cpp still applies a file's factor.
            "linear" | "longrope" => Ok(RopeScale {
                freq_scale,
                yarn: None,
            }),
            "yarn" => Ok(RopeScale {
                freq_scale,
                yarn: Some(Yarn {
                    original_context: match s.original_context {
                        0 => a.context_len,
                        n => n,
                    },
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
            }),
            other => Err(EngineError::Unsupported(format!(
                "rope.scaling.type {other:?} (the engine scales linear, yarn, longrope)"
            ))),
        }
    }
}

/// Hyper-parameters, checked once so the forward pass can index without surprises.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layers: usize,
    /// Residual width.
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// FFN inner width.
    pub ffn: usize,
    pub vocab: usize,
    pub norm_eps: f32,
    pub rope_base: f32,
    /// Which dimension pairs RoPE rotates. The wrong one still runs but scrambles every head.
    pub rope_style: RopeStyle,
    /// The first `rope_dim` dimensions of each head are rotated (`head_dim` but for glm4's
    /// partial RoPE); RoPE's frequencies are spaced over `rope_dim`.
    pub rope_dim: usize,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// The output head is the token embedding.
    pub tied_embeddings: bool,
    /// What the block does beyond the baseline ([`Arch::recipe`]).
    pub recipe: Recipe,
    /// Multiplier of embedding rows: `sqrt(hidden)` or 1.
    pub embed_scale: f32,
    /// Attention logit scale, `1 / sqrt(head_dim)`.
    pub attn_scale: f32,
    /// Sliding-window span of local layers (positions a row sees, itself included).
    pub sliding_window: Option<usize>,
    /// (n_layers) true for a local (sliding-window) layer; all false without a window.
    pub swa_layers: Vec<bool>,
    /// RoPE base of local layers (equals `rope_base` without a window).
    pub rope_base_swa: f32,
    /// Chunked attention of the local layers (llama4): positions per chunk.
    pub attn_chunk: Option<usize>,
    /// L2 norm of q and k after RoPE on the RoPE layers (llama4 but Maverick).
    pub kq_l2_norm: bool,
    /// Attention temperature of the NoPE layers (llama4), see [`Recipe::nope_temperature`].
    pub nope_temperature: Option<(f32, u32)>,
    /// `cap * tanh(logit / cap)` on the output logits, when set.
    pub final_logit_softcap: Option<f32>,
    /// `cap * tanh(score / cap)` on the scaled attention scores, when set (gemma2).
    pub attn_softcap: Option<f32>,
    /// Multiplier of RoPE's cosines and sines: `rope.scaling.attn_factor` (else 1), times
    /// YaRN's `1 + 0.1 ln(factor)`.
    pub rope_attn_factor: f32,
    /// Context scaling of RoPE's frequencies.
    pub rope_scale: RopeScale,
    /// Multiplier of each block's attention and FFN outputs before the residual add (granite).
    pub residual_scale: Option<f32>,
    /// The output logits are multiplied by this (`1 / logit_scale`, granite).
    pub logit_mul: Option<f32>,
    /// Routed experts instead of a dense FFN in every block (qwen3moe).
    pub moe: Option<MoeConfig>,
    /// (n_layers) true for a recurrent layer (LFM2's short convolution) in place of
    /// attention; all false for a transformer.
    pub recurrent_layers: Vec<bool>,
    /// Taps of a recurrent layer's causal convolution (0 without recurrent layers).
    pub conv_kernel: usize,
    /// The recurrent layers' state-space shape (mamba, mamba2, granitehybrid); `None`: they
    /// are LFM2's short convolutions or Gated DeltaNets.
    pub ssm: Option<SsmConfig>,
    /// The recurrent layers are Gated DeltaNets of this shape (qwen35), not short
    /// convolutions.
    pub delta_net: Option<knot_format::DeltaNetShape>,
    /// Multi-head Latent Attention's widths (deepseek2); `head_dim` is then a head's key
    /// width (nope + rope) and RoPE turns only `rope` of it.
    pub mla: Option<MlaShape>,
}

impl Config {
    /// Width of all query heads together (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_heads * head_dim`): a cached key
    /// row (with MLA's latent cache, the latent row).
    pub fn kv_dim(&self) -> usize {
        match &self.mla {
            Some(m) if m.latent_cache => m.latent(),
            _ => self.n_kv_heads * self.head_dim,
        }
    }

    /// The attention window of layer `l`: `Some(span)` on a local layer, `None` when it
    /// sees every earlier position.
    pub fn window(&self, l: usize) -> Option<usize> {
        match self.swa_layers.get(l) {
            Some(true) => self.sliding_window,
            _ => None,
        }
    }

    /// The attention chunk of layer `l`: `Some(n)` on a chunked layer (llama4's local ones).
    pub fn chunk(&self, l: usize) -> Option<usize> {
        match self.swa_layers.get(l) {
            Some(true) => self.attn_chunk,
            _ => None,
        }
    }

    /// Whether layer `l` is local (windowed or chunked), rotating at `rope_base_swa`.
    pub fn is_local(&self, l: usize) -> bool {
        self.window(l).is_some() || self.chunk(l).is_some()
    }

    /// The NoPE layers' query multiplier at position `pos` (1 without temperature tuning),
    /// computed as llama.cpp does (in double, then rounded to f32).
    pub fn query_temperature(&self, pos: usize) -> f32 {
        match self.nope_temperature {
            Some((s, n)) => {
                let steps = ((pos as f32 + 1.0) / n as f32).floor() as f64;
                ((steps + 1.0).ln() * s as f64 + 1.0) as f32
            }
            None => 1.0,
        }
    }

    /// Whether layer `l` rotates q and k (all but smollm3's every fourth).
    pub fn has_rope(&self, l: usize) -> bool {
        self.recipe
            .no_rope_every
            .is_none_or(|n| !(l + 1).is_multiple_of(n))
    }

    /// Width of a cached value row (`kv_dim`, or MLA's `n_heads * v_head`; 0 with MLA's
    /// latent cache, whose latent rows serve as keys and values).
    pub fn v_dim(&self) -> usize {
        match &self.mla {
            Some(m) if m.latent_cache => 0,
            Some(m) => m.n_heads * m.v_head,
            None => self.kv_dim(),
        }
    }

    /// Whether block `l`'s FFN is routed experts (deepseek2's leading blocks are dense).
    pub fn is_moe(&self, l: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| {
            l >= m.leading_dense as usize
                && (m.interleave <= 1 || (l + 1).is_multiple_of(m.interleave as usize))
        })
    }

    /// Whether layer `l` is recurrent (a short convolution) rather than attention.
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.recurrent_layers.get(l).copied().unwrap_or(false)
    }
}

impl TryFrom<&ArchConfig> for Config {
    type Error = EngineError;

    fn try_from(a: &ArchConfig) -> Result<Self, EngineError> {
        let arch = Arch::from_name(&a.arch).ok_or_else(|| {
            EngineError::Unsupported(format!(
                "architecture {:?} (supported: {})",
                a.arch,
                knot_format::RUNNABLE_ARCHS.join(", ")
            ))
        })?;
        let recipe = arch.recipe();
        // Counts and caps: knot-format's one check (the reader already ran it; an ArchConfig
        // built in memory goes through it here).
        a.check().map_err(EngineError::BadConfig)?;
        if !a.n_heads.is_multiple_of(a.n_kv_heads) {
            return Err(EngineError::BadConfig(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                a.n_heads, a.n_kv_heads
            )));
        }
        if let Some(d) = a
            .rope_dim
            .filter(|&d| d == 0 || d > a.head_dim || d % 2 == 1)
        {
            return Err(EngineError::BadConfig(format!(
                "rope dimension count {d} is not an even count of at most head_dim {}",
                a.head_dim
            )));
        }
        if !a.head_dim.is_multiple_of(2) {
            return Err(EngineError::BadConfig(format!(
                "head_dim {} must be even for RoPE",
                a.head_dim
            )));
        }
        if !(a.norm_eps.is_finite()
            && a.norm_eps > 0.0
            && a.rope_base.is_finite()
            && a.rope_base > 1.0)
        {
            return Err(EngineError::BadConfig(format!(
                "norm_eps {} / rope_base {} invalid",
                a.norm_eps, a.rope_base
            )));
        }
        let rules = arch.moe_rules();
        if rules.is_some() != a.moe.is_some() {
            return Err(EngineError::BadConfig(format!(
                "{}: expert_count {} (the engine runs experts for {} only)",
                a.arch,
                a.moe.as_ref().map_or(0, |m| m.n_experts),
                Arch::ALL
                    .iter()
                    .filter(|(x, _)| x.moe_rules().is_some())
                    .map(|&(_, n)| n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if let (Some(m), Some(r)) = (&a.moe, rules) {
            // What the MoE FFN implements; anything else is refused by name rather than run
            // as a quietly different model.
            match m.gating.as_deref() {
                None | Some("softmax") => {}
                // llama4's routing is its own (moe.rs): the file names none.
                Some(g) if r.input_weighted => {
                    return Err(EngineError::Unsupported(format!(
                        "expert_gating_func {g:?} in a llama4 model (its routing is fixed)"
                    )))
                }
                Some("sigmoid") if r.sigmoid => {}
                Some(g) => {
                    return Err(EngineError::Unsupported(format!(
                        "expert_gating_func {g:?} in a {} model (the engine gates with softmax, \
                         and sigmoid for deepseek2 and lfm2moe)",
                        a.arch
                    )))
                }
            }
            if r.input_weighted && m.n_shared != 1 {
                return Err(EngineError::Unsupported(format!(
                    "llama4 with {} shared experts (its MoE blocks have one)",
                    m.n_shared
                )));
            }
            if (m.n_shared > 0 && !r.shared)
                || (m.leading_dense > 0 && !r.leading_dense)
                || (m.groups.is_some() && !r.groups)
                || (m.shared_ffn.is_some() != r.gated_shared)
            {
                return Err(EngineError::Unsupported(format!(
                    "shared experts, leading dense blocks or expert groups in a {} model",
                    a.arch
                )));
            }
        }
        if (arch == Arch::DeepSeek2) != a.mla.is_some() {
            return Err(EngineError::BadConfig(format!(
                "{}: {} (the engine runs MLA for deepseek2 only, and deepseek2 only with MLA)",
                a.arch,
                if a.mla.is_some() {
                    "an arch.mla section"
                } else {
                    "no arch.mla section"
                }
            )));
        }
        let mla = match &a.mla {
            None => None,
            Some(m) => {
                if a.n_kv_heads != a.n_heads {
                    return Err(EngineError::BadConfig(format!(
                        "deepseek2 with {} KV heads for {} heads (MLA decompresses one per head)",
                        a.n_kv_heads, a.n_heads
                    )));
                }
                Some(MlaShape {
                    n_heads: a.n_heads as usize,
                    q_lora_rank: m.q_lora_rank as usize,
                    kv_lora_rank: m.kv_lora_rank as usize,
                    nope: (a.head_dim - m.rope_dim) as usize,
                    rope: m.rope_dim as usize,
                    v_head: m.v_head_dim as usize,
                    latent_cache: m.split_kv_b,
                    split_kv_b: m.split_kv_b,
                })
            }
        };
        let n_layers = a.n_layers as usize;
        let sliding_window = a
            .sliding_window
            .or(recipe.default_sliding_window)
            .filter(|_| !recipe.ignore_sliding_window)
            .map(|w| w as usize);
        // Chunked attention (llama4) takes the local layers' pattern as a window does.
        let attn_chunk = recipe.attn_chunk.map(|c| c as usize);
        let local = sliding_window.or(attn_chunk);
        let swa_layers = match (local, &a.swa_layers, recipe.default_swa_period) {
            (None, _, _) => vec![false; n_layers],
            (Some(_), Some(flags), _) => flags.clone(),
            (Some(_), None, Some(n)) => (0..n_layers as u32).map(|l| l % n < n - 1).collect(),
            // A window the architecture has no pattern for: every layer local.
            (Some(_), None, None) => vec![true; n_layers],
        };
        if swa_layers.len() != n_layers {
            return Err(EngineError::BadConfig(format!(
                "{} sliding-window flags for {n_layers} layers",
                swa_layers.len()
            )));
        }
        let rope_base_swa = match local {
            None => a.rope_base,
            Some(_) => a
                .rope_base_swa
                .or(recipe.default_rope_base_swa)
                .unwrap_or(a.rope_base),
        };
        if !(rope_base_swa.is_finite() && rope_base_swa > 1.0) {
            return Err(EngineError::BadConfig(format!(
                "rope_base_swa {rope_base_swa} invalid"
            )));
        }
        let rope_scale = RopeScale::from_arch(a)?;
        let (recurrent_layers, conv_kernel) = match &a.recurrent {
            Some(r) => (r.layers.clone(), r.conv_kernel as usize),
            None => (vec![false; n_layers], 0),
        };
        if recurrent_layers.len() != n_layers {
            return Err(EngineError::BadConfig(format!(
                "{} recurrent-layer flags for {n_layers} layers",
                recurrent_layers.len()
            )));
        }
        let ssm = ssm_config(arch, a)?;
        if conv_kernel > 0 && !(arch.is_lfm2() || arch.is_qwen35()) && ssm.is_none() {
            return Err(EngineError::Unsupported(format!(
                "recurrent layers in a {:?} model",
                a.arch
            )));
        }
        if arch.is_qwen35() != a.delta_net.is_some() {
            return Err(EngineError::BadConfig(format!(
                "{}: Gated DeltaNet layers are qwen35's (delta_net {})",
                a.arch,
                if a.delta_net.is_some() {
                    "set"
                } else {
                    "missing"
                }
            )));
        }
        // A pure state-space model has no heads (head_dim 0) and so nothing to rotate.
        // MLA turns the rope part of each key (its own section); others the first `rope_dim`.
        let rope_dim = match &mla {
            Some(m) => m.rope,
            None => a.rope_dim.map_or(a.head_dim as usize, |r| r as usize),
        };
        if rope_dim % 2 != 0
            || rope_dim > a.head_dim as usize
            || (rope_dim == 0) != (a.head_dim == 0)
        {
            return Err(EngineError::BadConfig(format!(
                "rope_dim {rope_dim} is not even and at most head_dim {}",
                a.head_dim
            )));
        }
        if arch.is_lfm2() && conv_kernel < 2 {
            return Err(EngineError::BadConfig(
                "lfm2 without short-convolution layers (shortconv.l_cache)".into(),
            ));
        }
        // deepseek2 (llama.cpp's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]): RoPE's cosines and sines
        // carry only `rope.scaling.attn_factor` (llama.cpp cancels YaRN's own magnitude), and
        // the scores are scaled by mscale^2 / sqrt(head_dim), mscale = attn_factor (times
        // 1 + 0.1 ln(factor) without YaRN) times 1 + 0.1 mscale_all_dim ln(factor), where
        // the file's yarn_log_multiplier is 0.1 mscale_all_dim.
        let mla_scales = a.mla.as_ref().map(|m| {
            let raf = a.rope_attn_factor.unwrap_or(1.0);
            let ln_f = (1.0 / rope_scale.freq_scale).ln();
            let org = match rope_scale.yarn {
                Some(_) => raf,
                None => raf * (1.0 + 0.1 * ln_f),
            };
            let log_mul = m.yarn_log_mul.unwrap_or(0.0) / 0.1;
            let mscale = org * (1.0 + 0.1 * log_mul * ln_f);
            (raf, mscale * mscale / (a.head_dim as f32).sqrt())
        });
        let mult = match (&a.multipliers, recipe.multipliers) {
            (Some(m), true) => m.clone(),
            _ => Default::default(),
        };
        Ok(Config {
            ssm,
            residual_scale: mult.residual,
            logit_mul: mult.logit.map(|s| 1.0 / s),
            recurrent_layers,
            conv_kernel,
            rope_dim,
            delta_net: a.delta_net.clone(),
            arch,
            recipe,
            embed_scale: match (recipe.scale_embedding, mult.embedding) {
                (true, _) => (a.hidden as f32).sqrt(),
                (false, Some(m)) => m,
                (false, None) => 1.0,
            },
            attn_scale: match mla_scales {
                Some((_, scale)) => scale,
                None => mult.attention.unwrap_or(
                    1.0 / match recipe.query_scale {
                        QueryScale::Gemma2 if a.n_layers == 46 => (a.hidden / a.n_heads) as f32,
                        _ => a.head_dim as f32,
                    }
                    .sqrt(),
                ),
            },
            sliding_window,
            swa_layers,
            rope_base_swa,
            attn_chunk,
            // llama.cpp: no L2 norm for 128 experts (Maverick).
            kq_l2_norm: recipe.kq_l2_norm && a.moe.as_ref().is_none_or(|m| m.n_experts != 128),
            nope_temperature: recipe.nope_temperature,
            final_logit_softcap: a.final_logit_softcap.or(recipe.default_final_softcap),
            attn_softcap: a.attn_logit_softcap.or(recipe.default_attn_softcap),
            rope_attn_factor: match mla_scales {
                Some((raf, _)) => raf,
                None => {
                    a.rope_attn_factor.unwrap_or(1.0)
                        * match rope_scale.yarn {
                            // llama.cpp: YaRN's magnitude correction, for a factor above 1.
                            Some(_) if rope_scale.freq_scale < 1.0 => {
                                1.0 + 0.1 * (1.0 / rope_scale.freq_scale).ln()
                            }
                            _ => 1.0,
                        }
                }
            },
            mla,
            rope_scale,
            moe: a.moe.clone(),
            n_layers: a.n_layers as usize,
            hidden: a.hidden as usize,
            n_heads: a.n_heads as usize,
            n_kv_heads: a.n_kv_heads as usize,
            head_dim: a.head_dim as usize,
            ffn: a.ffn as usize,
            vocab: a.vocab as usize,
            norm_eps: a.norm_eps,
            rope_base: a.rope_base,
            rope_style: a.rope_style,
            qkv_bias: a.qkv_bias,
            qk_norm: a.qk_norm,
            tied_embeddings: a.tied_embeddings,
        })
    }
}

/// The state-space layers' shape of a mamba, mamba2 or granitehybrid file, checked; `None`
/// for other architectures (a file of theirs with an `ssm` shape is refused).
fn ssm_config(arch: Arch, a: &ArchConfig) -> Result<Option<SsmConfig>, EngineError> {
    let kind = match arch {
        Arch::Mamba => SsmKind::Mamba1,
        Arch::Mamba2 | Arch::GraniteHybrid => SsmKind::Mamba2,
        _ => {
            if a.recurrent.as_ref().is_some_and(|r| r.ssm.is_some()) {
                return Err(EngineError::Unsupported(format!(
                    "state-space layers in a {:?} model",
                    a.arch
                )));
            }
            return Ok(None);
        }
    };
    let bad = |why: String| EngineError::BadConfig(format!("{}: {why}", a.arch));
    let Some((r, s)) = a
        .recurrent
        .as_ref()
        .and_then(|r| r.ssm.as_ref().map(|s| (r, s)))
    else {
        return Err(bad("no state-space layer shape (ssm.*)".into()));
    };
    let c = SsmConfig {
        kind,
        conv_kernel: r.conv_kernel as usize,
        inner: s.inner as usize,
        state: s.state as usize,
        dt_rank: s.dt_rank as usize,
        groups: match kind {
            SsmKind::Mamba1 => 1,
            SsmKind::Mamba2 => s.groups as usize,
        },
        dt_b_c_rms: s.dt_b_c_rms,
    };
    if kind == SsmKind::Mamba2 {
        if s.dt_b_c_rms {
            return Err(EngineError::Unsupported(format!(
                "{}: ssm.dt_b_c_rms (a Mamba-1 variant's norms)",
                a.arch
            )));
        }
        if c.groups == 0
            || !c.dt_rank.is_multiple_of(c.groups)
            || !c.inner.is_multiple_of(c.dt_rank)
        {
            return Err(bad(format!(
                "{} heads (ssm.time_step_rank) and {} groups do not divide inner size {}",
                c.dt_rank, c.groups, c.inner
            )));
        }
    }
    if arch == Arch::GraniteHybrid && r.layers.iter().all(|&l| l) {
        return Err(bad("no attention layer (head_count_kv)".into()));
    }
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma3_270m() -> ArchConfig {
        ArchConfig {
            arch: "gemma3".into(),
            n_layers: 18,
            hidden: 640,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            ffn: 2048,
            vocab: 262144,
            context_len: 32768,
            norm_eps: 1e-6,
            rope_base: 1e6,
            rope_style: RopeStyle::Neox,
            tied_embeddings: true,
            qk_norm: true,
            sliding_window: Some(512),
            ..Default::default()
        }
    }

    #[test]
    fn runnable_architectures_are_the_ones_the_engine_implements() {
        let ours: Vec<&str> = Arch::ALL.iter().map(|&(_, n)| n).collect();
        assert_eq!(ours, knot_format::RUNNABLE_ARCHS);
        for (arch, name) in Arch::ALL {
            assert_eq!(Arch::from_name(name), Some(arch));
        }
        let mut a = gemma3_270m();
        a.arch = "gemma".into();
        let e = Config::try_from(&a).unwrap_err().to_string();
        assert!(e.contains("\"gemma\"") && e.contains("gemma3"), "{e}");
    }

    #[test]
    fn gemma3_defaults_five_local_layers_to_one_global_with_two_rope_bases() {
        let c = Config::try_from(&gemma3_270m()).unwrap();
        let global: Vec<usize> = (0..18).filter(|&l| c.window(l).is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(c.window(0), Some(512));
        assert_eq!((c.rope_base, c.rope_base_swa), (1e6, 10_000.0));
        assert_eq!(c.embed_scale, 640f32.sqrt());
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        assert!(c.recipe.post_norms && c.recipe.activation == Activation::GeluTanh);

        // The file's own pattern and local base win over the defaults.
        let mut a = gemma3_270m();
        a.swa_layers = Some((0..18).map(|l| l % 2 == 0).collect());
        a.rope_base_swa = Some(5e4);
        let c = Config::try_from(&a).unwrap();
        assert_eq!((c.window(0), c.window(1)), (Some(512), None));
        assert_eq!(c.rope_base_swa, 5e4);

        // No window: every layer global, one RoPE base; qwen2 keeps the baseline.
        a.sliding_window = None;
        let c = Config::try_from(&a).unwrap();
        assert!((0..18).all(|l| c.window(l).is_none()));
        assert_eq!(c.rope_base_swa, c.rope_base);
        a.arch = "qwen2".into();
        let c = Config::try_from(&a).unwrap();
        assert_eq!((c.recipe, c.embed_scale), (Recipe::BASELINE, 1.0));
    }

    #[test]
    fn a_window_applies_only_where_llama_cpp_builds_a_windowed_mask() {
        // Mistral v0.1's header (llama arch, llama.attention.sliding_window 4096).
        let mut a = gemma3_270m();
        (a.arch, a.qk_norm, a.tied_embeddings) = ("llama".into(), false, false);
        (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim) = (32, 4096, 32, 8, 128);
        a.sliding_window = Some(4096);
        for arch in ["llama", "qwen2", "qwen3", "granite", "smollm3", "phi3"] {
            a.arch = arch.into();
            let c = Config::try_from(&a).unwrap();
            assert!((0..32).all(|l| c.window(l).is_none()), "{arch}");
        }
        // gemma3 (its pattern) and lfm2 (every attention layer) apply the file's window.
        a.arch = "gemma3".into();
        assert_eq!(Config::try_from(&a).unwrap().window(0), Some(4096));
        a.arch = "lfm2".into();
        a.recurrent = Some(knot_format::RecurrentLayers {
            layers: (0..32).map(|l| l % 2 == 0).collect(),
            conv_kernel: 3,
            ssm: None,
        });
        let c = Config::try_from(&a).unwrap();
        assert!((0..32).all(|l| c.window(l) == Some(4096)));
    }

    #[test]
    fn gemma2_alternates_local_and_global_layers_and_caps_by_default() {
        // Gemma-2-2B's header as llama.cpp's converter writes it, less the optional keys.
        let mut a = gemma3_270m();
        a.arch = "gemma2".into();
        (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim) = (26, 2304, 8, 4, 256);
        (a.qk_norm, a.rope_base, a.sliding_window) = (false, 10_000.0, None);
        let c = Config::try_from(&a).unwrap();
        // Layer 0 local, then every other one; the window llama.cpp assumes; one RoPE base.
        let local: Vec<usize> = (0..26).filter(|&l| c.window(l).is_some()).collect();
        assert_eq!(local, (0..26).step_by(2).collect::<Vec<_>>());
        assert_eq!(c.window(0), Some(4096));
        assert_eq!(c.rope_base_swa, c.rope_base);
        assert_eq!(
            (c.attn_softcap, c.final_logit_softcap),
            (Some(50.0), Some(30.0))
        );
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        assert_eq!(c.embed_scale, 2304f32.sqrt());
        assert!(c.recipe.post_norms && c.recipe.activation == Activation::GeluTanh);

        // The file's values win; the 27B (46 layers) scales by hidden / heads = 144, not 128.
        a.sliding_window = Some(7);
        a.attn_logit_softcap = Some(20.0);
        a.final_logit_softcap = Some(5.0);
        let c = Config::try_from(&a).unwrap();
        assert_eq!(c.window(2), Some(7));
        assert_eq!(
            (c.attn_softcap, c.final_logit_softcap),
            (Some(20.0), Some(5.0))
        );
        (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim) = (46, 4608, 32, 16, 128);
        let c = Config::try_from(&a).unwrap();
        assert_eq!(c.attn_scale, 1.0 / 12.0);
        // Gemma 3 and qwen2 have no attention soft-cap.
        a.arch = "gemma3".into();
        a.attn_logit_softcap = None;
        assert_eq!(Config::try_from(&a).unwrap().attn_softcap, None);
    }

    /// Llama-4-Scout's header (16 experts, every block MoE) and Maverick's (128 experts,
    /// MoE every second block): NoPE every fourth layer, chunks of 8192 on the others, L2 q/k
    /// norm but for Maverick, one shared expert required.
    #[test]
    fn llama4_chunks_rope_layers_and_interleaves_experts() {
        let mut a = gemma3_270m();
        a.arch = "llama4".into();
        (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim) = (48, 5120, 40, 8, 128);
        (a.qk_norm, a.sliding_window, a.rope_style) = (false, None, RopeStyle::Normal);
        a.moe = Some(MoeConfig {
            n_experts: 16,
            n_experts_used: 1,
            expert_ffn: 8192,
            n_shared: 1,
            interleave: 1,
            ..Default::default()
        });
        let c = Config::try_from(&a).unwrap();
        let nope: Vec<usize> = (0..48).filter(|&l| !c.has_rope(l)).collect();
        assert_eq!(nope, (3..48).step_by(4).collect::<Vec<_>>());
        assert!((0..48).all(|l| (c.chunk(l) == Some(8192)) == c.has_rope(l)));
        assert!((0..48).all(|l| c.window(l).is_none() && c.is_moe(l)));
        assert!(c.kq_l2_norm);
        assert_eq!(c.query_temperature(0), 1.0);
        assert_eq!(c.query_temperature(16383), 1.0 + 0.1 * 3f32.ln());
        let m = a.moe.as_mut().unwrap();
        (m.n_experts, m.interleave) = (128, 2);
        let c = Config::try_from(&a).unwrap();
        assert!(!c.kq_l2_norm);
        let moe: Vec<usize> = (0..6).filter(|&l| c.is_moe(l)).collect();
        assert_eq!(moe, [1, 3, 5]);
        a.moe.as_mut().unwrap().n_shared = 0;
        let e = Config::try_from(&a).unwrap_err().to_string();
        assert!(e.contains("llama4 with 0 shared"), "{e}");
    }

    /// DeepSeek-V2-Lite's header: MLA widths, YaRN 40 over 4096 with yarn_log_multiplier
    /// 0.0707: RoPE's magnitude stays 1 (llama.cpp cancels YaRN's own), the scores are scaled
    /// by mscale^2 / sqrt(192) with mscale = 1 + 0.707 * 0.1 * ln 40; a gating function the
    /// engine does not implement is refused by name.
    #[test]
    fn deepseek2_scales_scores_by_yarn_mscale_and_refuses_unknown_gating() {
        let mut a = gemma3_270m();
        a.arch = "deepseek2".into();
        (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.head_dim) = (27, 2048, 16, 16, 192);
        (a.qk_norm, a.sliding_window, a.rope_style) = (false, None, RopeStyle::Normal);
        a.rope_scaling = Some(knot_format::RopeScaling {
            kind: "yarn".into(),
            factor: 40.0,
            original_context: 4096,
        });
        a.mla = Some(knot_format::MlaConfig {
            q_lora_rank: 0,
            kv_lora_rank: 512,
            rope_dim: 64,
            v_head_dim: 128,
            yarn_log_mul: Some(0.0707),
            split_kv_b: false,
        });
        a.moe = Some(MoeConfig {
            n_experts: 64,
            n_experts_used: 6,
            expert_ffn: 1408,
            n_shared: 2,
            leading_dense: 1,
            ..Default::default()
        });
        let c = Config::try_from(&a).unwrap();
        let m = c.mla.unwrap();
        assert_eq!(
            (m.nope, m.rope, m.v_head, m.kv_lora_rank),
            (128, 64, 128, 512)
        );
        assert_eq!(
            (c.kv_dim(), c.v_dim(), c.rope_dim),
            (16 * 192, 16 * 128, 64)
        );
        assert_eq!(c.rope_attn_factor, 1.0);
        let mscale = 1.0 + 0.1 * 0.707f32 * 40f32.ln();
        assert!((c.attn_scale - mscale * mscale / 192f32.sqrt()).abs() < 1e-6);
        assert!(!c.is_moe(0) && c.is_moe(1));
        a.moe.as_mut().unwrap().gating = Some("softmax_weight".into());
        let e = Config::try_from(&a).unwrap_err().to_string();
        assert!(e.contains("softmax_weight"), "{e}");
        // A qwen3moe header with shared experts is refused too.
        a.arch = "qwen3moe".into();
        a.mla = None;
        a.moe.as_mut().unwrap().gating = None;
        let e = Config::try_from(&a).unwrap_err().to_string();
        assert!(e.contains("shared experts"), "{e}");
    }
}
