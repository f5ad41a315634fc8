//! Validated hyper-parameters of the forward pass, derived from the KNOT header.

use knot_format::{ArchConfig, RopeStyle};

use super::EngineError;

/// Architectures the forward pass implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: q, k, v biases, NeoX RoPE.
    Qwen2,
    /// Llama family (SmolLM2): no biases, normal RoPE (GGUF permutes q/k for it).
    Llama,
    /// Qwen3: per-head RMSNorm on q and k, `n_heads * head_dim` may differ from `hidden`.
    Qwen3,
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
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// The output head is the token embedding.
    pub tied_embeddings: bool,
}

impl Config {
    /// Width of all query heads together (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

impl TryFrom<&ArchConfig> for Config {
    type Error = EngineError;

    fn try_from(a: &ArchConfig) -> Result<Self, EngineError> {
        let arch = match a.arch.as_str() {
            "qwen2" => Arch::Qwen2,
            "llama" => Arch::Llama,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "architecture {other:?} (supported: qwen2, llama, qwen3)"
                )))
            }
        };
        // Counts and caps: knot-format's one check (the reader already ran it; an ArchConfig
        // built in memory goes through it here).
        a.check().map_err(EngineError::BadConfig)?;
        if !a.n_heads.is_multiple_of(a.n_kv_heads) {
            return Err(EngineError::BadConfig(format!(
                "n_heads {} is not a multiple of n_kv_heads {}",
                a.n_heads, a.n_kv_heads
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
        Ok(Config {
            arch,
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
