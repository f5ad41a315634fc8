//! Typed views into the mmapped KNOT: nothing here copies a weight.

use knot_format::{DType, Knot};

use super::kernels::{Linear, QMatrix};
use super::mla::{MlaQ, MlaWeights};
use super::moe::{Expert, Gating, MoeFfn};
use super::{Config, EngineError};

// Defined beside the shard roles it follows from; the engine loads what it names.
pub use knot_format::Holdings;

/// One block's tensors: a token mixer (attention, or a recurrent layer in a hybrid), then
/// the gated FFN.
pub struct LayerWeights<'a> {
    /// (hidden) the norm before the mixer
    pub attn_norm: &'a [f32],
    pub mixer: Mixer<'a>,
    /// (hidden) RMSNorm of the attention output before the residual add (gemma3).
    pub post_attn_norm: Option<&'a [f32]>,
    /// (hidden)
    pub ffn_norm: &'a [f32],
    pub ffn: Ffn<'a>,
    /// (hidden) RMSNorm of the FFN output before the residual add (gemma3).
    pub post_ffn_norm: Option<&'a [f32]>,
}

/// What mixes information across positions in one block. (The variants differ in size, but
/// there is one per held block, built once: boxing would only add an indirection per token.)
#[allow(clippy::large_enum_variant)]
pub enum Mixer<'a> {
    Attention(AttnWeights<'a>),
    /// LFM2's gated short convolution (`shortconv.rs`).
    ShortConv(ShortConvWeights<'a>),
    /// DeepSeek's Multi-head Latent Attention (`mla.rs`).
    Mla(MlaWeights<'a>),
}

/// Self-attention's tensors.
pub struct AttnWeights<'a> {
    /// (q_dim rows, hidden cols)
    pub wq: Linear<'a>,
    /// (kv_dim rows, hidden cols)
    pub wk: Linear<'a>,
    /// (kv_dim rows, hidden cols)
    pub wv: Linear<'a>,
    /// (q_dim), (kv_dim), (kv_dim) when the architecture has q/k/v biases.
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    /// (head_dim) per-head RMSNorm weights for q and k (qwen3).
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    /// (hidden rows, q_dim cols)
    pub wo: Linear<'a>,
}

/// A gated short convolution's tensors (llama.cpp `shortconv.*`).
pub struct ShortConvWeights<'a> {
    /// (3 * hidden rows, hidden cols): the gate `b`, the output gate `c` and the input `x`.
    pub in_proj: Linear<'a>,
    /// (hidden, conv_kernel) one causal filter per channel, oldest tap first.
    pub conv: &'a [f32],
    /// (hidden rows, hidden cols)
    pub out_proj: Linear<'a>,
}

impl<'a> LayerWeights<'a> {
    /// The block's matrices, in forward order.
    pub fn matrices(&self) -> Vec<&Linear<'a>> {
        let mut m = match &self.mixer {
            Mixer::Attention(a) => vec![&a.wq, &a.wk, &a.wv, &a.wo],
            Mixer::ShortConv(c) => vec![&c.in_proj, &c.out_proj],
            Mixer::Mla(m) => m.matrices(),
        };
        m.extend(self.ffn.matrices());
        m
    }
}

/// The FFN of a block.
pub enum Ffn<'a> {
    /// One gated FFN.
    Dense {
        /// (ffn rows, hidden cols)
        gate: Linear<'a>,
        /// (ffn rows, hidden cols)
        up: Linear<'a>,
        /// (hidden rows, ffn cols)
        down: Linear<'a>,
    },
    /// Routed experts (qwen3moe).
    Moe(MoeFfn<'a>),
}

impl<'a> Ffn<'a> {
    /// Every matrix of the FFN.
    pub fn matrices(&self) -> Box<dyn Iterator<Item = &Linear<'a>> + '_> {
        match self {
            Ffn::Dense { gate, up, down } => Box::new([gate, up, down].into_iter()),
            Ffn::Moe(m) => Box::new(
                std::iter::once(&m.router).chain(
                    m.experts
                        .iter()
                        .chain(m.shared.as_ref())
                        .flat_map(|e| [&e.gate, &e.up, &e.down]),
                ),
            ),
        }
    }
}

/// The tensors a station holds, at their original layer indices.
pub struct Weights<'a> {
    /// (vocab rows, hidden cols)
    pub embed: Option<QMatrix<'a>>,
    /// Blocks `holdings.layers.start..end`, in order.
    pub layers: Vec<LayerWeights<'a>>,
    /// (hidden)
    pub output_norm: Option<&'a [f32]>,
    /// (vocab rows, hidden cols): `output.weight`, or the embedding when tied.
    pub output: Option<Linear<'a>>,
    pub holdings: Holdings,
}

impl<'a> Weights<'a> {
    /// Resolves every tensor the holdings need and checks its type and shape against `cfg`.
    pub fn load(knot: &'a Knot, cfg: &Config, holdings: Holdings) -> Result<Self, EngineError> {
        let h = cfg.hidden;
        let mut layers = Vec::with_capacity(holdings.layers.len() as usize);
        for l in holdings.layers.start..holdings.layers.end {
            let name = |t: &str| format!("blk.{l}.{t}");
            let opt_vec = |t: &str, n: usize| -> Result<Option<&'a [f32]>, EngineError> {
                match knot.tensor(&name(t)) {
                    Some(_) => vector(knot, &name(t), n).map(Some),
                    None => Ok(None),
                }
            };
            let attn = !cfg.is_recurrent(l as usize);
            let (bq, bk, bv) = if cfg.qkv_bias && attn {
                (
                    Some(vector(knot, &name("attn_q.bias"), cfg.q_dim())?),
                    Some(vector(knot, &name("attn_k.bias"), cfg.kv_dim())?),
                    Some(vector(knot, &name("attn_v.bias"), cfg.kv_dim())?),
                )
            } else {
                (None, None, None)
            };
            let (q_norm, k_norm) = if cfg.qk_norm && attn {
                (
                    Some(vector(knot, &name("attn_q_norm.weight"), cfg.head_dim)?),
                    Some(vector(knot, &name("attn_k_norm.weight"), cfg.head_dim)?),
                )
            } else {
                (
                    opt_vec("attn_q_norm.weight", cfg.head_dim)?,
                    opt_vec("attn_k_norm.weight", cfg.head_dim)?,
                )
            };
            let (post_attn_norm, post_ffn_norm) = if cfg.recipe.post_norms {
                (
                    Some(vector(knot, &name("post_attention_norm.weight"), h)?),
                    Some(vector(knot, &name("post_ffw_norm.weight"), h)?),
                )
            } else {
                (None, None)
            };
            let mixer = if let Some(m) = &cfg.mla {
                let qd = m.n_heads * m.k_head();
                let lin = |t: &str, rows: usize, cols: usize| -> Result<Linear<'a>, EngineError> {
                    Ok(Linear::mapped(matrix(knot, &name(t), rows, cols)?, knot))
                };
                if knot.tensor(&name("attn_k_b.weight")).is_some() {
                    return Err(EngineError::Unsupported(format!(
                        "{}: the split attn_k_b / attn_v_b tensors of newer deepseek2 \
                         converters (the engine reads attn_kv_b)",
                        name("attn_k_b.weight")
                    )));
                }
                Mixer::Mla(MlaWeights {
                    q: if m.q_lora_rank == 0 {
                        MlaQ::Direct(lin("attn_q.weight", qd, h)?)
                    } else {
                        MlaQ::LowRank {
                            a: lin("attn_q_a.weight", m.q_lora_rank, h)?,
                            norm: vector(knot, &name("attn_q_a_norm.weight"), m.q_lora_rank)?,
                            b: lin("attn_q_b.weight", qd, m.q_lora_rank)?,
                        }
                    },
                    kv_a: lin("attn_kv_a_mqa.weight", m.latent(), h)?,
                    kv_a_norm: vector(knot, &name("attn_kv_a_norm.weight"), m.kv_lora_rank)?,
                    kv_b: lin("attn_kv_b.weight", m.kv_b_rows(), m.kv_lora_rank)?,
                    wo: lin("attn_output.weight", h, m.n_heads * m.v_head)?,
                    // Head h's value rows of kv_b, in place (the latent cache's W_UV).
                    uv: {
                        let kvb = matrix(
                            knot,
                            &name("attn_kv_b.weight"),
                            m.kv_b_rows(),
                            m.kv_lora_rank,
                        )?;
                        let (per, rb) = (m.nope + m.v_head, kvb.row_bytes());
                        (0..m.n_heads)
                            .map(|hh| {
                                let at = (hh * per + m.nope) * rb;
                                Linear::new(QMatrix {
                                    dtype: kvb.dtype,
                                    rows: m.v_head,
                                    cols: m.kv_lora_rank,
                                    data: &kvb.data[at..at + m.v_head * rb],
                                })
                            })
                            .collect()
                    },
                    uk: std::sync::OnceLock::new(),
                })
            } else if cfg.is_recurrent(l as usize) {
                let k = cfg.conv_kernel;
                let conv = find(knot, &name("shortconv.conv.weight"))?;
                if conv.entry.shape != [k as u64, h as u64] {
                    return Err(EngineError::BadTensor {
                        name: name("shortconv.conv.weight"),
                        why: format!("shape {:?}, expected [{k}, {h}]", conv.entry.shape),
                    });
                }
                Mixer::ShortConv(ShortConvWeights {
                    in_proj: Linear::mapped(
                        matrix(knot, &name("shortconv.in_proj.weight"), 3 * h, h)?,
                        knot,
                    ),
                    conv: vector(knot, &name("shortconv.conv.weight"), k * h)?,
                    out_proj: Linear::mapped(
                        matrix(knot, &name("shortconv.out_proj.weight"), h, h)?,
                        knot,
                    ),
                })
            } else {
                let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
                // Fused q/k/v (phi3): three row ranges of one matrix, in place.
                let [wq, wk, wv] = match knot.tensor(&name("attn_qkv.weight")) {
                    Some(_) => split_rows(
                        matrix(knot, &name("attn_qkv.weight"), q + 2 * kv, h)?,
                        [q, kv, kv],
                    ),
                    None => [
                        matrix(knot, &name("attn_q.weight"), q, h)?,
                        matrix(knot, &name("attn_k.weight"), kv, h)?,
                        matrix(knot, &name("attn_v.weight"), kv, h)?,
                    ],
                };
                Mixer::Attention(AttnWeights {
                    wq: Linear::mapped(wq, knot),
                    wk: Linear::mapped(wk, knot),
                    wv: Linear::mapped(wv, knot),
                    bq,
                    bk,
                    bv,
                    q_norm,
                    k_norm,
                    wo: Linear::mapped(
                        matrix(knot, &name("attn_output.weight"), h, cfg.q_dim())?,
                        knot,
                    ),
                })
            };
            layers.push(LayerWeights {
                attn_norm: vector(knot, &name("attn_norm.weight"), h)?,
                mixer,
                post_attn_norm,
                ffn_norm: vector(knot, &name("ffn_norm.weight"), h)?,
                ffn: match cfg.moe.as_ref().filter(|_| cfg.is_moe(l as usize)) {
                    // Gate and up fused in `ffn_up`, gate rows first (phi3).
                    None if cfg.recipe.fused_gate_up => {
                        let [gate, up] = split_rows(
                            matrix(knot, &name("ffn_up.weight"), 2 * cfg.ffn, h)?,
                            [cfg.ffn, cfg.ffn],
                        );
                        Ffn::Dense {
                            gate: Linear::mapped(gate, knot),
                            up: Linear::mapped(up, knot),
                            down: Linear::mapped(
                                matrix(knot, &name("ffn_down.weight"), h, cfg.ffn)?,
                                knot,
                            ),
                        }
                    }
                    None => Ffn::Dense {
                        gate: Linear::mapped(
                            matrix(knot, &name("ffn_gate.weight"), cfg.ffn, h)?,
                            knot,
                        ),
                        up: Linear::mapped(matrix(knot, &name("ffn_up.weight"), cfg.ffn, h)?, knot),
                        down: Linear::mapped(
                            matrix(knot, &name("ffn_down.weight"), h, cfg.ffn)?,
                            knot,
                        ),
                    },
                    Some(m) => {
                        let (ne, f) = (m.n_experts as usize, m.expert_ffn as usize);
                        let gates = stacked(knot, &name("ffn_gate_exps.weight"), ne, f, h)?;
                        let ups = stacked(knot, &name("ffn_up_exps.weight"), ne, f, h)?;
                        let downs = stacked(knot, &name("ffn_down_exps.weight"), ne, h, f)?;
                        // deepseek2: shared experts as one FFN of n_shared * expert_ffn.
                        let shared = if m.n_shared > 0 {
                            let fs = f * m.n_shared as usize;
                            let lin =
                                |t: &str, r: usize, c: usize| -> Result<Linear<'a>, EngineError> {
                                    Ok(Linear::mapped(matrix(knot, &name(t), r, c)?, knot))
                                };
                            Some(Expert {
                                gate: lin("ffn_gate_shexp.weight", fs, h)?,
                                up: lin("ffn_up_shexp.weight", fs, h)?,
                                down: lin("ffn_down_shexp.weight", h, fs)?,
                            })
                        } else {
                            None
                        };
                        Ffn::Moe(MoeFfn {
                            shared,
                            gating: match m.gating.as_deref() {
                                Some("sigmoid") => Gating::Sigmoid,
                                // Config refused any other.
                                _ => Gating::Softmax,
                            },
                            select_bias: opt_vec("exp_probs_b.bias", ne)?,
                            groups: m
                                .groups
                                .as_ref()
                                .map(|g| (g.count as usize, g.used as usize)),
                            scale: m.weights_scale.unwrap_or(1.0),
                            router: Linear::mapped(
                                matrix(knot, &name("ffn_gate_inp.weight"), ne, h)?,
                                knot,
                            ),
                            experts: gates
                                .into_iter()
                                .zip(ups)
                                .zip(downs)
                                .map(|((g, u), d)| Expert {
                                    gate: Linear::mapped(g, knot),
                                    up: Linear::mapped(u, knot),
                                    down: Linear::mapped(d, knot),
                                })
                                .collect(),
                            n_used: m.n_experts_used as usize,
                            norm_topk: m.norm_topk,
                        })
                    }
                },
                post_ffn_norm,
            });
        }
        let embed = if holdings.embed {
            Some(matrix(knot, "token_embd.weight", cfg.vocab, h)?)
        } else {
            None
        };
        let (output_norm, output) = if holdings.head {
            let head = match knot.tensor("output.weight") {
                Some(_) => matrix(knot, "output.weight", cfg.vocab, h)?,
                // Tied models (SmolLM2, qwen3) reuse the embedding as the head.
                None => matrix(knot, "token_embd.weight", cfg.vocab, h)?,
            };
            (
                Some(vector(knot, cfg.recipe.output_norm, h)?),
                Some(Linear::mapped(head, knot)),
            )
        } else {
            (None, None)
        };
        Ok(Weights {
            embed,
            layers,
            output_norm,
            output,
            holdings,
        })
    }

    /// The block with original index `layer`, if held.
    pub fn layer(&self, layer: usize) -> Option<&LayerWeights<'a>> {
        let start = self.holdings.layers.start as usize;
        layer.checked_sub(start).and_then(|i| self.layers.get(i))
    }
}

/// Consecutive row ranges of `m`, `rows[i]` rows each (they sum to `m.rows`): views of its
/// bytes, nothing copied (a quantized row is whole blocks, so a row range is a byte range).
fn split_rows<'a, const N: usize>(m: QMatrix<'a>, rows: [usize; N]) -> [QMatrix<'a>; N] {
    debug_assert_eq!(rows.iter().sum::<usize>(), m.rows);
    let rb = m.row_bytes();
    let mut start = 0;
    rows.map(|r| {
        let data = &m.data[start * rb..(start + r) * rb];
        start += r;
        QMatrix {
            dtype: m.dtype,
            rows: r,
            cols: m.cols,
            data,
        }
    })
}

/// RoPE's per-frequency divisors, `head_dim / 2` of them, when the file has them:
/// llama3's `rope_freqs.weight`, or Phi-3 LongRoPE's `rope_factors_short.weight` (the
/// factors for contexts up to the original one; the long ones are not used).
pub fn rope_factors<'a>(knot: &'a Knot, cfg: &Config) -> Result<Option<&'a [f32]>, EngineError> {
    for name in ["rope_freqs.weight", "rope_factors_short.weight"] {
        if knot.tensor(name).is_some() {
            let f = vector(knot, name, cfg.head_dim / 2)?;
            if let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                return Err(EngineError::BadTensor {
                    name: name.to_string(),
                    why: format!("factor {bad} is not a positive number"),
                });
            }
            return Ok(Some(f));
        }
    }
    Ok(None)
}

fn find<'a>(knot: &'a Knot, name: &str) -> Result<knot_format::TensorView<'a>, EngineError> {
    knot.tensor(name)
        .ok_or_else(|| EngineError::MissingTensor(name.to_string()))
}

/// A 2-D quantized tensor as `rows x cols` (GGUF shape `[cols, rows]`).
fn matrix<'a>(
    knot: &'a Knot,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<QMatrix<'a>, EngineError> {
    let t = find(knot, name)?;
    let shape = &t.entry.shape;
    if shape.len() != 2 || shape[0] != cols as u64 || shape[1] != rows as u64 {
        return Err(EngineError::BadTensor {
            name: name.to_string(),
            why: format!("shape {shape:?}, expected [{cols}, {rows}]"),
        });
    }
    QMatrix::new(t.entry.dtype, rows, cols, t.bytes).map_err(|e| EngineError::BadTensor {
        name: name.to_string(),
        why: e.to_string(),
    })
}

/// A 3-D tensor of `n` stacked `rows x cols` matrices (GGUF shape `[cols, rows, n]`, the
/// experts of a block), as `n` views: matrix `e` is the bytes at `e * rows * row_bytes`.
fn stacked<'a>(
    knot: &'a Knot,
    name: &str,
    n: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<QMatrix<'a>>, EngineError> {
    let t = find(knot, name)?;
    let shape = &t.entry.shape;
    let bad = |why: String| EngineError::BadTensor {
        name: name.to_string(),
        why,
    };
    if shape.len() != 3
        || shape[0] != cols as u64
        || shape[1] != rows as u64
        || shape[2] != n as u64
    {
        return Err(bad(format!(
            "shape {shape:?}, expected [{cols}, {rows}, {n}]"
        )));
    }
    if !t.bytes.len().is_multiple_of(n) {
        return Err(bad(format!("{} bytes for {n} matrices", t.bytes.len())));
    }
    t.bytes
        .chunks_exact(t.bytes.len() / n)
        .map(|b| QMatrix::new(t.entry.dtype, rows, cols, b).map_err(|e| bad(e.to_string())))
        .collect()
}

/// A 1-D F32 tensor of `n` elements, viewed in place (tensors are page-aligned).
fn vector<'a>(knot: &'a Knot, name: &str, n: usize) -> Result<&'a [f32], EngineError> {
    let t = find(knot, name)?;
    let bad = |why: String| EngineError::BadTensor {
        name: name.to_string(),
        why,
    };
    if t.entry.dtype != DType::F32 || t.entry.elems() != n as u64 {
        return Err(bad(format!(
            "{} {:?}, expected f32 [{n}]",
            t.entry.dtype, t.entry.shape
        )));
    }
    bytemuck::try_cast_slice(t.bytes).map_err(|e| bad(format!("not viewable as f32: {e}")))
}
