//! GGUF -> KNOT: architecture config and tokenizer from metadata, tensors copied bit-for-bit.

use std::path::Path;
use std::time::Instant;

use crate::container::Knot;
use crate::error::KnotError;
use crate::gguf::{Gguf, GgufFile, GgufValue};
use crate::header::{
    ArchConfig, ExpertGroups, MlaConfig, RecurrentLayers, RopeScaling, RopeStyle, SsmShape,
    TokenizerData,
};
use crate::writer::KnotWriter;
use crate::DType;

/// Architectures whose GGUF q/k weights expect NeoX RoPE: dimension `i` pairs with
/// `i + head_dim/2` (llama.cpp `LLAMA_ROPE_TYPE_NEOX`).
///
/// Trap: llama.cpp's converter permutes the q/k rows of *llama-family* checkpoints so that
/// those use normal (adjacent-pair) RoPE, but leaves qwen2/qwen3/gemma/phi unpermuted, so
/// they need NeoX. Choosing wrong raises no error: every head is rotated by the wrong angles
/// and the model emits fluent-looking garbage. Hence the explicit lists, and no default.
const NEOX_ARCHS: &[&str] = &[
    "qwen",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "gemma",
    "gemma2",
    "gemma3",
    "phi2",
    "phi3",
    "phimoe",
    "stablelm",
    "falcon",
    "gptneox",
    "starcoder2",
    "olmo2",
    "olmoe",
    "openelm",
    "exaone",
    "nemotron",
    "minicpm3",
    "orion",
    "codeshell",
    "plamo",
    "lfm2",
    // IMROPE (llama.cpp's interleaved M-RoPE) rotates NeoX's pairs; text tokens give all its
    // sections the same position.
    "qwen35",
    "lfm2moe",
    "qwen35moe",
];
/// Architectures with normal RoPE: dimension `2i` pairs with `2i + 1` (llama.cpp
/// `LLAMA_ROPE_TYPE_NORM`).
const NORMAL_ARCHS: &[&str] = &[
    "llama",
    "mistral",
    "deci",
    "baichuan",
    "internlm2",
    "minicpm",
    "xverse",
    "command-r",
    "cohere2",
    "olmo",
    "deepseek",
    "deepseek2",
    "granite",
    "granitemoe",
    "smollm3",
    "glm4",
    "granitehybrid",
    "llama4",
];
/// Pure state-space models: no attention, so no RoPE (recorded as normal, never applied), and
/// their GGUF's head count and FFN width are 0 (llama.cpp's converter writes them so).
const SSM_ARCHS: &[&str] = &["mamba", "mamba2"];

/// `{arch}.` keys every model must carry; all other keys have defaults (see `from_gguf`).
/// The norm's epsilon too: `attention.layer_norm_rms_epsilon`, or `layer_norm_epsilon` for
/// an architecture whose norms are LayerNorms (starcoder2).
const REQUIRED_KEYS: [&str; 5] = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
];

/// The RoPE pairing an architecture uses, or `None` when unknown.
pub fn rope_style_for(arch: &str) -> Option<RopeStyle> {
    if NEOX_ARCHS.contains(&arch) {
        Some(RopeStyle::Neox)
    } else if NORMAL_ARCHS.contains(&arch) || SSM_ARCHS.contains(&arch) {
        Some(RopeStyle::Normal)
    } else {
        None
    }
}

/// Typed metadata access with errors naming the key.
struct Meta<'a> {
    g: &'a Gguf,
    path: &'a Path,
}

impl<'a> Meta<'a> {
    fn err(&self, key: &str, reason: impl Into<String>) -> KnotError {
        KnotError::GgufMetadata {
            path: self.path.into(),
            key: key.into(),
            reason: reason.into(),
        }
    }
    fn typed<T>(
        &self,
        key: &str,
        want: &str,
        f: impl Fn(&'a GgufValue) -> Option<T>,
    ) -> Result<Option<T>, KnotError> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected {want}, found {}", v.type_name()))),
        }
    }
    fn u32(&self, key: &str) -> Result<Option<u32>, KnotError> {
        self.typed(key, "an integer in 0..2^32", |v| {
            v.as_u64().and_then(|n| u32::try_from(n).ok())
        })
    }
    fn f32(&self, key: &str) -> Result<Option<f32>, KnotError> {
        self.typed(key, "a finite number", |v| {
            v.as_f32().filter(|x| x.is_finite())
        })
    }
    fn str(&self, key: &str) -> Result<Option<&'a str>, KnotError> {
        self.typed(key, "a string", |v| v.as_str())
    }
    fn bool(&self, key: &str) -> Result<Option<bool>, KnotError> {
        self.typed(key, "a bool", |v| v.as_bool())
    }
    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, KnotError> {
        self.typed(key, "an array of strings", |v| {
            Some(v.as_array()?.as_strs()?.iter().map(str::to_owned).collect())
        })
    }
    fn f32s(&self, key: &str) -> Result<Option<Vec<f32>>, KnotError> {
        self.typed(key, "an array of f32", |v| match v.as_array()? {
            crate::gguf::GgufArray::F32(a) => Some(a.clone()),
            _ => None,
        })
    }
    /// `attention.sliding_window_pattern` as one flag per layer (true: local). GGUF holds a
    /// period `n` (layer `l` is local unless `l % n == n - 1`, llama.cpp's
    /// `set_swa_pattern`) or an array of bools.
    fn swa_layers(&self, key: &str, n_layers: u32) -> Result<Option<Vec<bool>>, KnotError> {
        let Some(v) = self.g.get(key) else {
            return Ok(None);
        };
        if let Some(n) = v.as_u64() {
            let n = u32::try_from(n).map_err(|_| self.err(key, "period out of range"))?;
            return Ok(Some(
                (0..n_layers).map(|l| n == 0 || l % n < n - 1).collect(),
            ));
        }
        match v.as_array() {
            Some(crate::gguf::GgufArray::Bool(b)) if b.len() == n_layers as usize => {
                Ok(Some(b.clone()))
            }
            Some(a) => Err(self.err(key, format!("{} entries for {n_layers} layers", a.len()))),
            None => Err(self.err(
                key,
                format!("expected a period or bools, found {}", v.type_name()),
            )),
        }
    }
    /// `attention.head_count_kv`: one count for every layer, or one per layer (hybrids,
    /// whose recurrent layers have 0). Returns the attention layers' count (which must be the
    /// same on every attention layer) and one flag per layer, true where the count is 0.
    fn kv_heads(&self, key: &str, n_layers: u32) -> Result<(Option<u32>, Vec<bool>), KnotError> {
        // The layer count is the file's word: bound it before a flag per layer is allocated.
        if n_layers > crate::header::MAX_LAYERS {
            return Err(self.err(
                key,
                format!(
                    "the file claims {n_layers} blocks, over the limit of {}",
                    crate::header::MAX_LAYERS
                ),
            ));
        }
        let none = vec![false; n_layers as usize];
        let Some(v) = self.g.get(key) else {
            return Ok((None, none));
        };
        if v.as_u64().is_some() {
            return Ok((self.u32(key)?, none));
        }
        let Some(a) = v.as_array() else {
            return Err(self.err(
                key,
                format!("expected an integer or an array, found {}", v.type_name()),
            ));
        };
        if a.len() != n_layers as usize {
            return Err(self.err(key, format!("{} entries for {n_layers} layers", a.len())));
        }
        let counts: Vec<u32> = (0..a.len())
            .map(|i| a.u64_at(i).and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| self.err(key, "expected non-negative integers"))?;
        let mut attn = counts.iter().copied().filter(|&n| n > 0);
        let first = attn
            .next()
            .ok_or_else(|| self.err(key, "no layer has KV heads"))?;
        if attn.any(|n| n != first) {
            return Err(self.err(
                key,
                format!("attention layers differ in KV heads: {counts:?}"),
            ));
        }
        Ok((Some(first), counts.iter().map(|&n| n == 0).collect()))
    }
    fn i32s(&self, key: &str) -> Result<Option<Vec<i32>>, KnotError> {
        self.typed(key, "an array of integers", |v| {
            let a = v.as_array()?;
            (0..a.len())
                .map(|i| a.i64_at(i).and_then(|n| i32::try_from(n).ok()))
                .collect()
        })
    }
}

impl ArchConfig {
    /// Reads the config from GGUF metadata and tensor names. One place, required keys in
    /// [`REQUIRED_KEYS`], defaults beside their keys.
    pub fn from_gguf(g: &Gguf, path: &Path) -> Result<ArchConfig, KnotError> {
        let m = Meta { g, path };
        let arch = m
            .str("general.architecture")?
            .ok_or_else(|| m.err("general.architecture", "missing"))?
            .to_string();
        let rope_style = rope_style_for(&arch).ok_or_else(|| KnotError::UnsupportedArch {
            path: path.into(),
            arch: arch.clone(),
            known: [NEOX_ARCHS, NORMAL_ARCHS, SSM_ARCHS].concat().join(", "),
        })?;
        let k = |s: &str| format!("{arch}.{s}");
        let missing: Vec<String> = REQUIRED_KEYS
            .iter()
            .map(|s| k(s))
            .filter(|key| g.get(key).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(m.err(&missing.join(", "), "required key(s) missing"));
        }
        let req_u32 = |s: &str| -> Result<u32, KnotError> {
            match m.u32(&k(s))? {
                Some(0) | None => Err(m.err(&k(s), "must be a positive integer")),
                Some(v) => Ok(v),
            }
        };
        let pure_ssm = SSM_ARCHS.contains(&arch.as_str());
        // A pure state-space model's head count and FFN width are 0 in the file.
        let ssm_u32 = |s: &str| -> Result<u32, KnotError> {
            if pure_ssm {
                Ok(m.u32(&k(s))?.unwrap_or(0))
            } else {
                req_u32(s)
            }
        };
        let n_layers = req_u32("block_count")?;
        let context_len = req_u32("context_length")?;
        let hidden = req_u32("embedding_length")?;
        let ffn = ssm_u32("feed_forward_length")?;
        let n_heads = ssm_u32("attention.head_count")?;
        let norm_eps = match m.f32(&k("attention.layer_norm_rms_epsilon"))? {
            Some(e) => e,
            None => m.f32(&k("attention.layer_norm_epsilon"))?.ok_or_else(|| {
                m.err(
                    &k("attention.layer_norm_rms_epsilon"),
                    "required key missing (nor is there a layer_norm_epsilon)",
                )
            })?,
        };
        // Defaults beside their keys.
        let (n_kv_heads, kv_zero) = if pure_ssm {
            (Some(0), vec![true; n_layers as usize])
        } else {
            m.kv_heads(&k("attention.head_count_kv"), n_layers)?
        };
        let n_kv_heads = n_kv_heads.unwrap_or(n_heads);
        // Mamba layers' shape (`ssm.*`): on every layer of a pure state-space model, on the
        // layers without KV heads of a hybrid (granitehybrid).
        let ssm_kernel = m.u32(&k("ssm.conv_kernel"))?;
        let ssm = match ssm_kernel {
            None => None,
            Some(_) => {
                let need = |s: &str| -> Result<u32, KnotError> {
                    match m.u32(&k(s))? {
                        Some(0) | None => Err(m.err(&k(s), "must be a positive integer")),
                        Some(v) => Ok(v),
                    }
                };
                Some(SsmShape {
                    inner: need("ssm.inner_size")?,
                    state: need("ssm.state_size")?,
                    dt_rank: need("ssm.time_step_rank")?,
                    groups: m.u32(&k("ssm.group_count"))?.unwrap_or(0),
                    dt_b_c_rms: m.bool(&k("ssm.dt_b_c_rms"))?.unwrap_or(false),
                })
            }
        };
        // Hybrids (LFM2, granitehybrid): layers with no KV heads are recurrent (short
        // convolutions, or Mamba layers).
        let recurrent = match m.u32(&k("shortconv.l_cache"))?.or(ssm_kernel) {
            Some(conv_kernel) if kv_zero.iter().any(|&z| z) => Some(RecurrentLayers {
                layers: kv_zero,
                conv_kernel,
                ssm,
            }),
            Some(_) => None,
            None if kv_zero.iter().any(|&z| z) => {
                return Err(m.err(
                    &k("attention.head_count_kv"),
                    "layers without KV heads but no recurrent layer shape (shortconv.l_cache, ssm.conv_kernel)",
                ))
            }
            None => None,
        };
        // Multi-head Latent Attention (deepseek2): newer converters store the latent-space
        // shapes in key_length / value_length and a head's own in the `_mla` keys.
        let mla = if arch == "deepseek2" {
            let req = |s: &str| -> Result<u32, KnotError> {
                m.u32(&k(s))?
                    .filter(|&v| v > 0)
                    .ok_or_else(|| m.err(&k(s), "missing or 0 (deepseek2 needs it)"))
            };
            Some(MlaConfig {
                q_lora_rank: m.u32(&k("attention.q_lora_rank"))?.unwrap_or(0),
                kv_lora_rank: req("attention.kv_lora_rank")?,
                rope_dim: req("rope.dimension_count")?,
                v_head_dim: match m.u32(&k("attention.value_length_mla"))? {
                    Some(v) => v,
                    None => req("attention.value_length")?,
                },
                yarn_log_mul: m.f32(&k("rope.scaling.yarn_log_multiplier"))?,
                split_kv_b: g.tensor("blk.0.attn_k_b.weight").is_some(),
            })
        } else {
            None
        };
        let head_dim = m
            .u32(&k("attention.key_length_mla"))?
            .filter(|_| mla.is_some())
            .or(m.u32(&k("attention.key_length"))?)
            .unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
        // MLA's every head has its own decompressed key and value (an MLA-split file says 1
        // KV head: the latent's).
        let n_kv_heads = if mla.is_some() { n_heads } else { n_kv_heads };
        // Qwen3.5: Gated DeltaNet layers between gated attention layers.
        let (recurrent, delta_net) = if arch == "qwen35" || arch == "qwen35moe" {
            qwen35_layers(&m, &k, n_layers, head_dim)?
        } else {
            (recurrent, None)
        };
        let rope_base = m.f32(&k("rope.freq_base"))?.unwrap_or(10_000.0);
        if !pure_ssm && (n_kv_heads == 0 || n_heads % n_kv_heads != 0) {
            return Err(m.err(
                &k("attention.head_count_kv"),
                format!("{n_kv_heads} does not divide {n_heads} heads"),
            ));
        }
        if head_dim == 0 && !pure_ssm {
            return Err(m.err(&k("attention.key_length"), "head dimension is 0"));
        }
        let tokens_len = match g.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array) {
            Some(a) => u32::try_from(a.len()).ok(),
            None => None,
        };
        let embd_rows = g
            .tensor("token_embd.weight")
            .and_then(|t| t.shape.get(1).copied())
            .and_then(|r| u32::try_from(r).ok());
        let vocab = m
            .u32(&k("vocab_size"))?
            .or(tokens_len)
            .or(embd_rows)
            .ok_or_else(|| {
                m.err(
                    &k("vocab_size"),
                    "missing, and neither tokenizer.ggml.tokens nor token_embd.weight gives it",
                )
            })?;
        let rope_scaling = match m.str(&k("rope.scaling.type"))? {
            Some(kind) if kind != "none" => Some(RopeScaling {
                kind: kind.to_string(),
                factor: m.f32(&k("rope.scaling.factor"))?.unwrap_or(1.0),
                original_context: m
                    .u32(&k("rope.scaling.original_context_length"))?
                    .unwrap_or(0),
            }),
            Some(_) => None,
            // Phi-3 LongRoPE: its converter writes the factor tensors and the original
            // context, no type; the engine picks long or short factors by it (llama.cpp's
            // `n_ctx_orig_yarn`), so the header keeps it.
            None if g.tensor("rope_factors_long.weight").is_some() => Some(RopeScaling {
                kind: "longrope".into(),
                factor: m.f32(&k("rope.scaling.factor"))?.unwrap_or(1.0),
                original_context: m
                    .u32(&k("rope.scaling.original_context_length"))?
                    .unwrap_or(0),
            }),
            // Old converters wrote only a linear scale.
            None => m
                .f32(&k("rope.scale_linear"))?
                .filter(|&f| f != 1.0)
                .map(|factor| RopeScaling {
                    kind: "linear".into(),
                    factor,
                    original_context: 0,
                }),
        };
        // llama4 with a window of 0 (MobileLLM-R1's converter) is llama.cpp's other llama4
        // graph (no chunking, RoPE on all but the last layer): not implemented, refused.
        if arch == "llama4" && m.u32(&k("attention.sliding_window"))? == Some(0) {
            return Err(m.err(
                &k("attention.sliding_window"),
                "0 (llama4 without chunked attention) is not implemented",
            ));
        }
        // Gemma-style attention: local (sliding-window) layers with their own RoPE base.
        let sliding_window = m.u32(&k("attention.sliding_window"))?.filter(|&w| w > 0);
        let swa_layers = m.swa_layers(&k("attention.sliding_window_pattern"), n_layers)?;
        let rope_base_swa = m.f32(&k("rope.freq_base_swa"))?;
        let final_logit_softcap = m.f32(&k("final_logit_softcapping"))?.filter(|&c| c > 0.0);
        let attn_logit_softcap = m.f32(&k("attn_logit_softcapping"))?.filter(|&c| c > 0.0);
        let rope_attn_factor = m.f32(&k("rope.scaling.attn_factor"))?.filter(|&f| f > 0.0);
        // Granite's multipliers (0 means unused, as in llama.cpp).
        let mult = |key: &str| -> Result<Option<f32>, KnotError> {
            Ok(m.f32(&k(key))?.filter(|&v| v != 0.0))
        };
        let multipliers = crate::header::Multipliers {
            embedding: mult("embedding_scale")?,
            residual: mult("residual_scale")?,
            attention: mult("attention.scale")?,
            logit: mult("logit_scale")?,
        };
        let multipliers = (multipliers != Default::default()).then_some(multipliers);
        // Mixture of experts: an expert count > 0. The expert width defaults as llama.cpp's
        // does (`feed_forward_length / expert_used_count`); qwen3moe renormalises its top-k
        // weights whatever the file says (llama.cpp passes norm_w = true for it).
        let moe = match m.u32(&k("expert_count"))?.filter(|&n| n > 0) {
            None => None,
            Some(n_experts) => {
                let n_experts_used = m.u32(&k("expert_used_count"))?.unwrap_or(0);
                if n_experts_used == 0 || n_experts_used > n_experts {
                    return Err(m.err(
                        &k("expert_used_count"),
                        format!("{n_experts_used} is outside 1..={n_experts} experts"),
                    ));
                }
                let expert_ffn = m
                    .u32(&k("expert_feed_forward_length"))?
                    .unwrap_or(ffn / n_experts_used);
                // llama.cpp renormalises for these whatever the file says.
                let norm_topk = matches!(arch.as_str(), "qwen3moe" | "lfm2moe" | "qwen35moe")
                    || m.bool(&k("expert_weights_norm"))?.unwrap_or(false);
                // qwen35moe: one gated shared expert, `expert_shared_feed_forward_length`
                // wide (llama.cpp: else `feed_forward_length`).
                let shared_ffn = match arch.as_str() {
                    "qwen35moe" => Some(
                        m.u32(&k("expert_shared_feed_forward_length"))?
                            .filter(|&w| w > 0)
                            .unwrap_or(ffn),
                    ),
                    _ => None,
                };
                // deepseek2's keys; absent in other files, so their headers (and hashes) hold.
                let groups = match m.u32(&k("expert_group_count"))? {
                    Some(count) if count > 1 => Some(ExpertGroups {
                        count,
                        used: m.u32(&k("expert_group_used_count"))?.unwrap_or(0),
                    }),
                    _ => None,
                };
                Some(crate::MoeConfig {
                    n_experts,
                    n_experts_used,
                    expert_ffn,
                    norm_topk,
                    // llama4: one shared expert of the routed width in every MoE block (its
                    // files carry no count; llama.cpp always loads `*_shexp`).
                    n_shared: match arch.as_str() {
                        "llama4" => 1,
                        _ => m.u32(&k("expert_shared_count"))?.unwrap_or(0),
                    },
                    leading_dense: m.u32(&k("leading_dense_block_count"))?.unwrap_or(0),
                    shared_ffn,
                    // llama.cpp applies a scale other than 0 and 1.
                    weights_scale: m
                        .f32(&k("expert_weights_scale"))?
                        .filter(|&s| s != 0.0 && s != 1.0),
                    // qwen35moe's graph gates with softmax whatever the file says.
                    gating: match m
                        .u32(&k("expert_gating_func"))?
                        .filter(|_| arch != "qwen35moe")
                    {
                        None | Some(0) => None,
                        Some(1) => Some("softmax".into()),
                        Some(2) => Some("sigmoid".into()),
                        Some(3) => Some("softmax_weight".into()),
                        Some(4) => Some("sqrt_softplus".into()),
                        Some(n) => Some(format!("gating function {n}")),
                    },
                    groups,
                    interleave: m.u32(&k("interleave_moe_layer_step"))?.unwrap_or(0),
                })
            }
        };
        // Partial RoPE (glm4): fewer rotated dimensions than the head has; an even count
        // within the head, else the file is refused.
        let rope_dim = match m.u32(&k("rope.dimension_count"))? {
            Some(d) if d == head_dim => None,
            Some(d) if d > 0 && d < head_dim && d % 2 == 0 => Some(d),
            Some(d) => {
                return Err(m.err(
                    &k("rope.dimension_count"),
                    format!("{d} is not an even count of at most head_dim {head_dim}"),
                ))
            }
            None => None,
        };
        Ok(ArchConfig {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            vocab,
            context_len,
            norm_eps,
            rope_base,
            rope_style,
            rope_scaling,
            tied_embeddings: g.tensor("output.weight").is_none(),
            qk_norm: g.tensor("blk.0.attn_q_norm.weight").is_some(),
            qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
            sliding_window,
            swa_layers,
            rope_base_swa,
            final_logit_softcap,
            attn_logit_softcap,
            rope_attn_factor,
            multipliers,
            moe,
            mla,
            recurrent,
            rope_dim,
            delta_net,
        })
    }
}

/// Qwen3.5's recurrent layers (`attention.recurrent_layers`, else every layer but each
/// `full_attention_interval`th, 4 by default, as llama.cpp reads them), their Gated DeltaNet
/// shape (`ssm.*`). Text tokens give every IMROPE section the same position, so the rotation
/// is NeoX's over `rope.dimension_count` (read for every architecture as `rope_dim`) as long as
/// the sections cover every rotated pair (checked: a pair left to the fourth section would not
/// rotate).
fn qwen35_layers(
    m: &Meta<'_>,
    k: &dyn Fn(&str) -> String,
    n_layers: u32,
    head_dim: u32,
) -> Result<(Option<RecurrentLayers>, Option<crate::DeltaNetShape>), KnotError> {
    let req = |s: &str| -> Result<u32, KnotError> {
        match m.u32(&k(s))? {
            Some(v) if v > 0 => Ok(v),
            _ => Err(m.err(&k(s), "missing or 0 (a Gated DeltaNet needs it)")),
        }
    };
    let conv_kernel = req("ssm.conv_kernel")?;
    let state = req("ssm.state_size")?;
    let k_heads = req("ssm.group_count")?;
    let v_heads = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    if inner != state.saturating_mul(v_heads) {
        return Err(m.err(
            &k("ssm.inner_size"),
            format!("{inner} is not state_size {state} x time_step_rank {v_heads}"),
        ));
    }
    if n_layers > crate::header::MAX_LAYERS {
        return Err(m.err(&k("block_count"), "too many layers"));
    }
    let key = k("attention.recurrent_layers");
    let layers = match m.g.get(&key) {
        Some(v) => match v.as_array() {
            Some(crate::gguf::GgufArray::Bool(b)) if b.len() >= n_layers as usize => {
                b[..n_layers as usize].to_vec()
            }
            _ => return Err(m.err(&key, format!("expected {n_layers} bools"))),
        },
        None => {
            let every = m.u32(&k("full_attention_interval"))?.unwrap_or(4);
            if every == 0 {
                return Err(m.err(&k("full_attention_interval"), "must be positive"));
            }
            (0..n_layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let rope_dims = m.u32(&k("rope.dimension_count"))?.unwrap_or(head_dim);
    if rope_dims == 0 || rope_dims % 2 != 0 || rope_dims > head_dim {
        return Err(m.err(
            &k("rope.dimension_count"),
            format!("{rope_dims} is not an even number up to head_dim {head_dim}"),
        ));
    }
    let skey = k("rope.dimension_sections");
    if let Some(v) = m.g.get(&skey) {
        let a = v
            .as_array()
            .ok_or_else(|| m.err(&skey, "expected an array of 4 integers"))?;
        let s: Vec<i64> = (0..a.len().min(4))
            .map(|i| a.i64_at(i).unwrap_or(-1))
            .collect();
        let total: i64 = s.iter().sum();
        if s.len() != 4 || s.iter().any(|&x| x < 0) || total <= 0 {
            return Err(m.err(&skey, format!("{s:?} are not 4 sections")));
        }
        // llama.cpp's IMROPE: pair `i` takes section `i % total`; sections 0-2 interleave
        // (t, h, w), the rest is the fourth (position 0 for text: no rotation).
        let fourth = (0..rope_dims as i64 / 2).map(|i| i % total).any(|c| {
            !((c % 3 == 0 && c < 3 * s[0])
                || (c % 3 == 1 && c < 3 * s[1])
                || (c % 3 == 2 && c < 3 * s[2]))
        });
        if fourth {
            return Err(m.err(
                &skey,
                format!("{s:?} leave some of the {rope_dims} rotated dimensions unrotated"),
            ));
        }
    }
    Ok((
        Some(RecurrentLayers {
            layers,
            conv_kernel,
            ssm: None,
        }),
        Some(crate::DeltaNetShape {
            head_dim: state,
            k_heads,
            v_heads,
        }),
    ))
}

impl TokenizerData {
    /// Reads `tokenizer.ggml.*` and `tokenizer.chat_template`; `None` when the file has no
    /// vocabulary.
    pub fn from_gguf(g: &Gguf, path: &Path) -> Result<Option<TokenizerData>, KnotError> {
        let m = Meta { g, path };
        let Some(tokens) = m.strings("tokenizer.ggml.tokens")? else {
            return Ok(None);
        };
        let n = tokens.len();
        let token_types = m.i32s("tokenizer.ggml.token_type")?.unwrap_or_default();
        if !token_types.is_empty() && token_types.len() != n {
            return Err(m.err(
                "tokenizer.ggml.token_type",
                format!("{} entries for {n} tokens", token_types.len()),
            ));
        }
        let scores = m.f32s("tokenizer.ggml.scores")?.unwrap_or_default();
        if !scores.is_empty() && scores.len() != n {
            return Err(m.err(
                "tokenizer.ggml.scores",
                format!("{} entries for {n} tokens", scores.len()),
            ));
        }
        let id = |key: &str| -> Result<Option<u32>, KnotError> {
            match m.u32(key)? {
                Some(i) if i as usize >= n => {
                    Err(m.err(key, format!("id {i} is outside the {n}-token vocabulary")))
                }
                v => Ok(v),
            }
        };
        Ok(Some(TokenizerData {
            model: m
                .str("tokenizer.ggml.model")?
                .ok_or_else(|| m.err("tokenizer.ggml.model", "missing"))?
                .to_string(),
            pre: m.str("tokenizer.ggml.pre")?.unwrap_or_default().to_string(),
            merges: m.strings("tokenizer.ggml.merges")?.unwrap_or_default(),
            scores,
            add_space_prefix: m.bool("tokenizer.ggml.add_space_prefix")?,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            add_bos: m.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: m.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template: m.str("tokenizer.chat_template")?.map(str::to_owned),
            tokens,
            token_types,
        }))
    }
}

/// What [`import_gguf`] produced.
#[derive(Clone, Debug)]
pub struct ImportSummary {
    /// `general.architecture`.
    pub arch: String,
    /// Whether the engine can run it ([`crate::RUNNABLE_ARCHS`]); a KNOT of any known
    /// architecture is still written, for inspection and sharding.
    pub runs_here: bool,
    pub n_layers: u32,
    pub tensors: usize,
    /// Sum of tensor bytes.
    pub tensor_bytes: u64,
    /// Size of the written KNOT.
    pub file_len: u64,
    /// `Knot::model_hash` of the written file.
    pub model_hash: String,
    pub elapsed: std::time::Duration,
}

/// Imports a GGUF file into a KNOT at `out` (atomically). Tensor bytes are copied unchanged
/// straight from the mapped GGUF. `progress` gets cumulative tensor bytes written
/// (total: [`GgufFile::tensor_data_len`]).
pub fn import_gguf(
    gguf: &Path,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportSummary, KnotError> {
    let t0 = Instant::now();
    let src = GgufFile::open(gguf)?;
    let g = &src.gguf;
    let arch = ArchConfig::from_gguf(g, gguf)?;
    let tokenizer = TokenizerData::from_gguf(g, gguf)?;
    let model_id = match g.get("general.name").and_then(GgufValue::as_str) {
        Some(n) if !n.trim().is_empty() => n.trim().to_string(),
        _ => gguf
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned()),
    };
    tracing::info!(arch = %arch.arch, layers = arch.n_layers, tensors = g.tensors.len(), "importing {}", gguf.display());
    let mut w = KnotWriter::new(model_id, arch);
    if let Some(t) = tokenizer {
        w.tokenizer(t);
    }
    for t in &g.tensors {
        let dtype: DType = t.dtype().ok_or_else(|| KnotError::UnsupportedDType {
            path: gguf.into(),
            tensor: t.name.clone(),
            ggml_type: t.ggml_type,
        })?;
        let bytes = src.tensor_bytes(t).ok_or_else(|| KnotError::Gguf {
            path: gguf.into(),
            offset: g.data_offset.saturating_add(t.offset),
            reason: format!("tensor {:?} bytes out of range", t.name),
        })?;
        w.add_tensor(&t.name, dtype, t.shape.clone(), bytes)?;
    }
    w.write(out, progress)?;
    let k = Knot::open(out)?;
    Ok(ImportSummary {
        arch: k.arch().arch.clone(),
        runs_here: k.arch().runs_here(),
        n_layers: k.arch().n_layers,
        tensors: k.header().tensors.len(),
        tensor_bytes: k.tensor_bytes(),
        file_len: k.file_len(),
        model_hash: k.model_hash().to_string(),
        elapsed: t0.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::{gstr, Builder};

    fn qwen_like() -> Builder {
        let mut g = Builder::new();
        g.string("general.architecture", "qwen2")
            .string("general.name", "tiny qwen")
            .u32("qwen2.block_count", 1)
            .u32("qwen2.context_length", 128)
            .u32("qwen2.embedding_length", 64)
            .u32("qwen2.feed_forward_length", 96)
            .u32("qwen2.attention.head_count", 4)
            .f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
            .string("tokenizer.ggml.model", "gpt2")
            .string("tokenizer.ggml.pre", "qwen2")
            .strings("tokenizer.ggml.tokens", &["a", "b", "ab", "<eos>"])
            .strings("tokenizer.ggml.merges", &["a b"])
            .u32("tokenizer.ggml.eos_token_id", 3)
            .string("tokenizer.chat_template", "{{x}}")
            .tensor("token_embd.weight", DType::Q8_0, &[64, 4], 1)
            .tensor("blk.0.attn_q.weight", DType::Q4_K, &[256, 64], 2)
            .tensor("blk.0.attn_q.bias", DType::F32, &[64], 3);
        g
    }

    fn import(g: &Builder) -> Result<(tempfile::TempDir, Knot), KnotError> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("m.gguf");
        std::fs::write(&src, g.build()).unwrap();
        let out = dir.path().join("m.knot");
        import_gguf(&src, &out, &mut |_| {})?;
        let k = Knot::open(&out)?;
        Ok((dir, k))
    }

    #[test]
    fn imports_config_tokenizer_and_bytes() {
        let g = qwen_like();
        let raw = g.build();
        let parsed = Gguf::parse(&raw, Path::new("m.gguf")).unwrap();
        let (_dir, k) = import(&g).unwrap();
        let a = k.arch();
        assert_eq!(
            (a.arch.as_str(), a.n_layers, a.hidden, a.ffn, a.context_len),
            ("qwen2", 1, 64, 96, 128)
        );
        assert_eq!(
            (a.n_heads, a.n_kv_heads, a.head_dim),
            (4, 4, 16),
            "kv heads and head dim default"
        );
        assert_eq!(a.rope_base, 10_000.0, "rope base default");
        assert_eq!(a.rope_style, RopeStyle::Neox);
        assert_eq!(a.vocab, 4, "vocab from the token list");
        assert!(a.tied_embeddings && a.qkv_bias && !a.qk_norm);
        assert_eq!(k.header().model_id, "tiny qwen");
        let t = k.tokenizer().unwrap().unwrap();
        assert_eq!(t.tokens, ["a", "b", "ab", "<eos>"]);
        assert_eq!((t.eos_id, t.bos_id, t.add_bos), (Some(3), None, false));
        assert_eq!(t.merges, ["a b"]);
        assert_eq!(t.chat_template.as_deref(), Some("{{x}}"));
        for info in &parsed.tensors {
            let v = k.tensor(&info.name).unwrap();
            assert_eq!(
                v.bytes,
                parsed.tensor_bytes(info, &raw).unwrap(),
                "{}",
                info.name
            );
            assert_eq!(v.entry.shape, info.shape);
        }
        k.verify(&mut |_| {}).unwrap();
    }

    #[test]
    fn qwen3moe_reads_the_expert_config_and_keeps_3d_experts_bit_for_bit() {
        let moe = |used: u32| {
            let mut g = Builder::new();
            g.string("general.architecture", "qwen3moe")
                .u32("qwen3moe.block_count", 1)
                .u32("qwen3moe.context_length", 128)
                .u32("qwen3moe.embedding_length", 64)
                .u32("qwen3moe.feed_forward_length", 256)
                .u32("qwen3moe.attention.head_count", 4)
                .f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
                .u32("qwen3moe.expert_count", 4)
                .u32("qwen3moe.expert_used_count", used)
                .u32("qwen3moe.vocab_size", 4)
                .tensor("blk.0.ffn_gate_inp.weight", DType::F32, &[64, 4], 1)
                .tensor("blk.0.ffn_gate_exps.weight", DType::Q8_0, &[64, 32, 4], 2)
                .tensor("blk.0.ffn_down_exps.weight", DType::Q4_K, &[256, 64, 4], 3);
            g
        };
        let g = moe(2);
        let raw = g.build();
        let parsed = Gguf::parse(&raw, Path::new("m.gguf")).unwrap();
        let (_dir, k) = import(&g).unwrap();
        let a = k.arch();
        // No expert_feed_forward_length: llama.cpp's default, feed_forward_length / used.
        assert_eq!(
            a.moe,
            Some(crate::MoeConfig {
                n_experts: 4,
                n_experts_used: 2,
                expert_ffn: 128,
                norm_topk: true,
                ..Default::default()
            })
        );
        assert!(a.runs_here());
        for info in &parsed.tensors {
            let v = k.tensor(&info.name).unwrap();
            assert_eq!(v.entry.shape, info.shape, "{}", info.name);
            assert_eq!(v.bytes, parsed.tensor_bytes(info, &raw).unwrap());
        }
        k.verify(&mut |_| {}).unwrap();
        // More experts used than there are: refused, naming the key.
        let Err(e) = import(&moe(5)) else {
            panic!("5 of 4 experts accepted")
        };
        let e = e.to_string();
        assert!(e.contains("expert_used_count"), "{e}");
    }

    /// deepseek2 (V3's layout): the MLA shape and the routing keys land in the header; a
    /// group config that cannot hold the experts used is refused by name.
    #[test]
    fn deepseek2_reads_mla_and_routing() {
        let ds = |groups_used: u32| {
            let mut g = Builder::new();
            g.string("general.architecture", "deepseek2")
                .u32("deepseek2.block_count", 2)
                .u32("deepseek2.context_length", 128)
                .u32("deepseek2.embedding_length", 64)
                .u32("deepseek2.feed_forward_length", 256)
                .u32("deepseek2.attention.head_count", 4)
                .u32("deepseek2.attention.head_count_kv", 4)
                .u32("deepseek2.attention.key_length", 48)
                .u32("deepseek2.attention.value_length", 32)
                .u32("deepseek2.attention.q_lora_rank", 32)
                .u32("deepseek2.attention.kv_lora_rank", 64)
                .u32("deepseek2.rope.dimension_count", 16)
                .f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1)
                .f32("deepseek2.attention.layer_norm_rms_epsilon", 1e-6)
                .u32("deepseek2.leading_dense_block_count", 1)
                .u32("deepseek2.expert_count", 16)
                .u32("deepseek2.expert_used_count", 4)
                .u32("deepseek2.expert_shared_count", 1)
                .u32("deepseek2.expert_feed_forward_length", 32)
                .f32("deepseek2.expert_weights_scale", 2.5)
                .raw_kv("deepseek2.expert_weights_norm", 7, &[1])
                .u32("deepseek2.expert_gating_func", 2)
                .u32("deepseek2.expert_group_count", 4)
                .u32("deepseek2.expert_group_used_count", groups_used)
                .u32("deepseek2.vocab_size", 4)
                .tensor("blk.1.ffn_gate_inp.weight", DType::F32, &[64, 16], 1);
            g
        };
        let (_dir, k) = import(&ds(2)).unwrap();
        let a = k.arch();
        assert!(a.runs_here());
        assert_eq!((a.head_dim, a.n_kv_heads), (48, 4));
        assert_eq!(
            a.mla,
            Some(crate::MlaConfig {
                q_lora_rank: 32,
                kv_lora_rank: 64,
                rope_dim: 16,
                v_head_dim: 32,
                yarn_log_mul: Some(0.1),
                split_kv_b: false,
            })
        );
        assert_eq!(
            a.moe,
            Some(crate::MoeConfig {
                n_experts: 16,
                n_experts_used: 4,
                expert_ffn: 32,
                norm_topk: true,
                n_shared: 1,
                leading_dense: 1,
                weights_scale: Some(2.5),
                gating: Some("sigmoid".into()),
                groups: Some(crate::ExpertGroups { count: 4, used: 2 }),
                shared_ffn: None,
                interleave: 0,
            })
        );
        // No group to choose from: refused, naming the field.
        let Err(e) = import(&ds(0)) else {
            panic!("0 groups used accepted")
        };
        let e = e.to_string();
        assert!(e.contains("groups.used"), "{e}");
    }

    #[test]
    fn llama_is_normal_rope_and_untied_with_output() {
        let mut g = Builder::new();
        g.string("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .u32("llama.context_length", 64)
            .u32("llama.embedding_length", 32)
            .u32("llama.feed_forward_length", 64)
            .u32("llama.attention.head_count", 4)
            .u32("llama.attention.head_count_kv", 2)
            .u32("llama.vocab_size", 7)
            .f32("llama.rope.freq_base", 5e5)
            .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
            .string("llama.rope.scaling.type", "linear")
            .f32("llama.rope.scaling.factor", 2.0)
            .tensor("output.weight", DType::F16, &[32, 7], 1)
            .tensor("blk.0.attn_q_norm.weight", DType::F32, &[8], 2);
        let (_dir, k) = import(&g).unwrap();
        let a = k.arch();
        assert_eq!(a.rope_style, RopeStyle::Normal);
        assert_eq!((a.n_kv_heads, a.vocab, a.rope_base), (2, 7, 5e5));
        assert!(!a.tied_embeddings && a.qk_norm && !a.qkv_bias);
        assert_eq!(
            a.rope_scaling,
            Some(RopeScaling {
                kind: "linear".into(),
                factor: 2.0,
                original_context: 0
            })
        );
        assert_eq!(k.tokenizer().unwrap(), None);
    }

    /// A GGUF array of f32 as `raw_kv` takes it.
    fn f32_array(v: &[f32]) -> Vec<u8> {
        let mut b = 6u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        b
    }

    fn gemma_like(scores: &[f32]) -> Builder {
        let mut g = Builder::new();
        g.string("general.architecture", "gemma3")
            .u32("gemma3.block_count", 6)
            .u32("gemma3.context_length", 64)
            .u32("gemma3.embedding_length", 32)
            .u32("gemma3.feed_forward_length", 64)
            .u32("gemma3.attention.head_count", 2)
            .f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
            .u32("gemma3.attention.sliding_window", 16)
            .u32("gemma3.attention.sliding_window_pattern", 3)
            .f32("gemma3.rope.freq_base_swa", 20_000.0)
            .f32("gemma3.final_logit_softcapping", 30.0)
            .string("tokenizer.ggml.model", "llama")
            .strings("tokenizer.ggml.tokens", &["<pad>", "\u{2581}a", "b"])
            .raw_kv("tokenizer.ggml.scores", 9, &f32_array(scores))
            .raw_kv("tokenizer.ggml.add_space_prefix", 7, &[0]);
        g
    }

    #[test]
    fn gemma2_attention_softcap_and_phi3_rope_attn_factor_are_read() {
        let mut g = Builder::new();
        g.string("general.architecture", "gemma2")
            .u32("gemma2.block_count", 2)
            .u32("gemma2.context_length", 64)
            .u32("gemma2.embedding_length", 32)
            .u32("gemma2.feed_forward_length", 64)
            .u32("gemma2.attention.head_count", 2)
            .f32("gemma2.attention.layer_norm_rms_epsilon", 1e-6)
            .f32("gemma2.attn_logit_softcapping", 50.0)
            .f32("gemma2.rope.scaling.attn_factor", 1.19)
            .string("tokenizer.ggml.model", "gpt2")
            .strings("tokenizer.ggml.tokens", &["a", "b"]);
        let (_dir, k) = import(&g).unwrap();
        let a = k.arch();
        assert_eq!(
            (a.attn_logit_softcap, a.rope_attn_factor),
            (Some(50.0), Some(1.19))
        );
        assert!(a.runs_here());
        // Absent: neither is serialized (older files keep their model hash).
        let (_dir, k) = import(&qwen_like()).unwrap();
        let json = serde_json::to_string(k.arch()).unwrap();
        assert!(!json.contains("attn_logit_softcap") && !json.contains("rope_attn_factor"));
    }

    #[test]
    fn starcoder2_layer_norm_eps_and_glm4_partial_rope_dims_are_read() {
        let header = |arch: &str, eps_key: &str, rope_dims: Option<u32>| {
            let mut g = Builder::new();
            g.string("general.architecture", arch)
                .u32(&format!("{arch}.block_count"), 2)
                .u32(&format!("{arch}.context_length"), 64)
                .u32(&format!("{arch}.embedding_length"), 32)
                .u32(&format!("{arch}.feed_forward_length"), 64)
                .u32(&format!("{arch}.attention.head_count"), 2)
                .f32(&format!("{arch}.attention.{eps_key}"), 1e-5)
                .string("tokenizer.ggml.model", "gpt2")
                .strings("tokenizer.ggml.tokens", &["a", "b"]);
            if let Some(d) = rope_dims {
                g.u32(&format!("{arch}.rope.dimension_count"), d);
            }
            g
        };
        // StarCoder2 names its LayerNorm's epsilon layer_norm_epsilon.
        let (_dir, k) = import(&header("starcoder2", "layer_norm_epsilon", None)).unwrap();
        assert_eq!(k.arch().norm_eps, 1e-5);
        assert!(k.arch().runs_here());
        // Neither epsilon: refused, naming the key.
        let Err(e) = import(&header("starcoder2", "no_such_epsilon", None)) else {
            panic!("a file without an epsilon was imported");
        };
        let e = e.to_string();
        assert!(e.contains("layer_norm_rms_epsilon"), "{e}");
        // glm4: 8 of a 16-wide head rotated; the full head is no field; odd or wider refused.
        let (_dir, k) = import(&header("glm4", "layer_norm_rms_epsilon", Some(8))).unwrap();
        assert_eq!((k.arch().rope_dim, k.arch().head_dim), (Some(8), 16));
        let (_dir, k) = import(&header("glm4", "layer_norm_rms_epsilon", Some(16))).unwrap();
        assert_eq!(k.arch().rope_dim, None);
        for bad in [7, 18] {
            assert!(import(&header("glm4", "layer_norm_rms_epsilon", Some(bad))).is_err());
        }
    }

    #[test]
    fn gemma3_keeps_sliding_window_softcap_and_sentencepiece_fields() {
        let (_dir, k) = import(&gemma_like(&[0.0, -1.5, -2.0])).unwrap();
        let a = k.arch();
        assert_eq!(a.sliding_window, Some(16));
        // Period 3: every third layer (2, 5) is global.
        assert_eq!(
            a.swa_layers.as_deref(),
            Some(&[true, true, false, true, true, false][..])
        );
        assert_eq!(
            (a.rope_base_swa, a.final_logit_softcap),
            (Some(20_000.0), Some(30.0))
        );
        assert!(a.runs_here());
        let t = k.tokenizer().unwrap().unwrap();
        assert_eq!(t.scores, [0.0, -1.5, -2.0]);
        assert_eq!(t.add_space_prefix, Some(false));

        // A model without these keys serializes none of them (model hashes of files imported
        // before they existed stay the same).
        let (_dir, k) = import(&qwen_like()).unwrap();
        let json = serde_json::to_string(k.arch()).unwrap();
        assert!(
            !json.contains("sliding") && !json.contains("softcap"),
            "{json}"
        );
        let t = serde_json::to_string(&k.tokenizer().unwrap().unwrap()).unwrap();
        assert!(!t.contains("scores") && !t.contains("space_prefix"), "{t}");

        // Scores that do not match the vocabulary are refused by name.
        let e = import(&gemma_like(&[0.0])).unwrap_err().to_string();
        assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    }

    #[test]
    fn import_errors_name_the_problem() {
        let mut g = Builder::new();
        g.string("general.architecture", "qwen2")
            .u32("qwen2.block_count", 1);
        let e = import(&g).unwrap_err().to_string();
        assert!(
            e.contains("qwen2.embedding_length") && e.contains("required"),
            "{e}"
        );

        let mut g = Builder::new();
        g.string("general.architecture", "rwkv6");
        let e = import(&g).unwrap_err();
        assert!(matches!(e, KnotError::UnsupportedArch { .. }), "{e}");

        let mut g = qwen_like();
        g.string("qwen2.attention.head_count_kv", "two");
        let e = import(&g).unwrap_err().to_string();
        assert!(
            e.contains("head_count_kv") && e.contains("expected an integer"),
            "{e}"
        );

        // A tensor of an unsupported GGML type (16 = IQ2_XXS) is refused by name.
        let mut g = qwen_like();
        gstr(&mut g.infos, "blk.0.ffn_up.weight");
        g.infos.extend_from_slice(&1u32.to_le_bytes());
        g.infos.extend_from_slice(&256u64.to_le_bytes());
        g.infos.extend_from_slice(&16u32.to_le_bytes());
        g.infos.extend_from_slice(&0u64.to_le_bytes());
        g.n_t += 1;
        let e = import(&g).unwrap_err();
        assert_eq!(e.tensor(), Some("blk.0.ffn_up.weight"), "{e}");
        // ... with the type's name and the reason, on one line.
        let msg = e.to_string();
        assert!(
            msg.contains("GGML type 16") && msg.contains("IQ2_XXS") && msg.contains("requantize"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");

        let mut g = qwen_like();
        g.u32("tokenizer.ggml.bos_token_id", 99);
        let e = import(&g).unwrap_err().to_string();
        assert!(e.contains("outside the 4-token vocabulary"), "{e}");
    }

    /// A GGUF array of u32 as `raw_kv` takes it.
    fn u32_array(v: &[u32]) -> Vec<u8> {
        let mut b = 4u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        b
    }

    fn lfm2_like(kv: &[u32]) -> Builder {
        let mut g = Builder::new();
        g.string("general.architecture", "lfm2")
            .u32("lfm2.block_count", 4)
            .u32("lfm2.context_length", 64)
            .u32("lfm2.embedding_length", 32)
            .u32("lfm2.feed_forward_length", 64)
            .u32("lfm2.attention.head_count", 4)
            .u32("lfm2.vocab_size", 7)
            .f32("lfm2.attention.layer_norm_rms_epsilon", 1e-5)
            .u32("lfm2.shortconv.l_cache", 3)
            .raw_kv("lfm2.attention.head_count_kv", 9, &u32_array(kv));
        g
    }

    #[test]
    fn lfm2_per_layer_kv_heads_mark_its_convolution_layers() {
        let (_dir, k) = import(&lfm2_like(&[0, 0, 2, 0])).unwrap();
        let a = k.arch();
        assert_eq!(a.n_kv_heads, 2, "the attention layers' count");
        assert_eq!(a.rope_style, RopeStyle::Neox);
        let r = a.recurrent.as_ref().expect("recurrent layers");
        assert_eq!(
            (&r.layers[..], r.conv_kernel),
            (&[true, true, false, true][..], 3)
        );
        assert!(a.runs_here());
        // Attention layers that disagree, or a count per layer of the wrong length: refused
        // by key.
        for bad in [&[0, 2, 4, 0][..], &[0, 2, 2][..], &[0, 0, 0, 0][..]] {
            let e = import(&lfm2_like(bad)).unwrap_err().to_string();
            assert!(e.contains("head_count_kv"), "{bad:?}: {e}");
        }
    }

    fn mamba_like(arch: &str) -> Builder {
        let k = |s: &str| format!("{arch}.{s}");
        let mut g = Builder::new();
        g.string("general.architecture", arch)
            .u32(&k("block_count"), 3)
            .u32(&k("context_length"), 1 << 20)
            .u32(&k("embedding_length"), 32)
            // llama.cpp's converter writes 0 for both on a pure state-space model.
            .u32(&k("feed_forward_length"), 0)
            .u32(&k("attention.head_count"), 0)
            .u32(&k("vocab_size"), 7)
            .f32(&k("attention.layer_norm_rms_epsilon"), 1e-5)
            .u32(&k("ssm.conv_kernel"), 4)
            .u32(&k("ssm.inner_size"), 64)
            .u32(&k("ssm.state_size"), 16)
            .u32(&k("ssm.time_step_rank"), 2);
        g
    }

    #[test]
    fn mamba_imports_every_layer_recurrent_with_its_ssm_shape() {
        let (_dir, k) = import(&mamba_like("mamba")).unwrap();
        let a = k.arch();
        assert_eq!((a.n_heads, a.n_kv_heads, a.ffn), (0, 0, 0));
        let r = a.recurrent.as_ref().expect("recurrent layers");
        assert_eq!((&r.layers[..], r.conv_kernel), (&[true; 3][..], 4));
        let s = r.ssm.as_ref().expect("ssm shape");
        assert_eq!((s.inner, s.state, s.dt_rank, s.groups), (64, 16, 2, 0));
        assert!(!s.dt_b_c_rms && a.runs_here());
        // Absent fields stay out of the header (older headers, and their hashes, unchanged).
        let json = serde_json::to_string(a).unwrap();
        assert!(
            !json.contains("groups") && !json.contains("dt_b_c_rms"),
            "{json}"
        );

        // mamba2 carries its group count; a missing shape key is refused by name.
        let mut g = mamba_like("mamba2");
        g.u32("mamba2.ssm.group_count", 2);
        let (_dir, k) = import(&g).unwrap();
        assert_eq!(
            k.arch()
                .recurrent
                .as_ref()
                .unwrap()
                .ssm
                .as_ref()
                .unwrap()
                .groups,
            2
        );
        let mut g = Builder::new();
        g.string("general.architecture", "mamba")
            .u32("mamba.block_count", 1)
            .u32("mamba.context_length", 8)
            .u32("mamba.embedding_length", 32)
            .u32("mamba.vocab_size", 7)
            .u32("mamba.feed_forward_length", 0)
            .u32("mamba.attention.head_count", 0)
            .f32("mamba.attention.layer_norm_rms_epsilon", 1e-5)
            .u32("mamba.ssm.conv_kernel", 4);
        let e = import(&g).unwrap_err().to_string();
        assert!(e.contains("ssm.inner_size"), "{e}");
    }

    #[test]
    fn granitehybrid_marks_its_mamba_layers_by_zero_kv_heads() {
        let mut g = Builder::new();
        g.string("general.architecture", "granitehybrid")
            .u32("granitehybrid.block_count", 4)
            .u32("granitehybrid.context_length", 64)
            .u32("granitehybrid.embedding_length", 32)
            .u32("granitehybrid.feed_forward_length", 64)
            .u32("granitehybrid.attention.head_count", 4)
            .u32("granitehybrid.vocab_size", 7)
            .f32("granitehybrid.attention.layer_norm_rms_epsilon", 1e-5)
            .u32("granitehybrid.ssm.conv_kernel", 4)
            .u32("granitehybrid.ssm.inner_size", 64)
            .u32("granitehybrid.ssm.state_size", 16)
            .u32("granitehybrid.ssm.time_step_rank", 4)
            .u32("granitehybrid.ssm.group_count", 1)
            .raw_kv(
                "granitehybrid.attention.head_count_kv",
                9,
                &u32_array(&[0, 0, 2, 0]),
            );
        let (_dir, k) = import(&g).unwrap();
        let a = k.arch();
        assert_eq!((a.n_kv_heads, a.rope_style), (2, RopeStyle::Normal));
        let r = a.recurrent.as_ref().expect("recurrent layers");
        assert_eq!(&r.layers[..], &[true, true, false, true][..]);
        assert_eq!(r.ssm.as_ref().map(|s| (s.dt_rank, s.groups)), Some((4, 1)));
    }
}
