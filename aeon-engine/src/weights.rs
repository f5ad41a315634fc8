//! Typed views into the mmapped KNOT: nothing here copies a weight.

use knot_format::{DType, Knot};

use super::kernels::{Linear, QMatrix};
use super::mla::{MlaQ, MlaWeights};
use super::moe::{Expert, Gating, MoeFfn};
use super::ssm::{SsmConfig, SsmKind, SsmWeights};
use super::{Config, EngineError};

// Defined beside the shard roles it follows from; the engine loads what it names.
pub use knot_format::Holdings;

/// One block's tensors: a token mixer (attention, or a recurrent layer in a hybrid), then
/// the gated FFN.
pub struct LayerWeights<'a> {
    /// (hidden) the norm before the mixer
    pub attn_norm: &'a [f32],
    /// (hidden) its bias (starcoder2's LayerNorm).
    pub attn_norm_b: Option<&'a [f32]>,
    pub mixer: Mixer<'a>,
    /// (hidden) RMSNorm of the attention output before the residual add (gemma3).
    pub post_attn_norm: Option<&'a [f32]>,
    /// (hidden)
    pub ffn_norm: &'a [f32],
    /// (hidden) its bias (starcoder2's LayerNorm).
    pub ffn_norm_b: Option<&'a [f32]>,
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
    /// Mamba's selective state-space layer (`ssm.rs`).
    Ssm(SsmWeights<'a>),
    /// Qwen3.5's Gated DeltaNet (`deltanet.rs`).
    DeltaNet(DeltaNetWeights<'a>),
    /// DeepSeek's Multi-head Latent Attention (`mla.rs`).
    Mla(MlaWeights<'a>),
}

/// A Gated DeltaNet's tensors (llama.cpp `qwen35`: `attn_qkv`, `attn_gate`, `ssm_*`).
pub struct DeltaNetWeights<'a> {
    /// (2 * k_heads * head_dim + v_heads * head_dim rows, hidden cols): q, k, v before the
    /// convolution.
    pub qkv: Linear<'a>,
    /// (v_heads * head_dim rows, hidden cols): the output gate `z`.
    pub gate: Linear<'a>,
    /// (v_heads rows, hidden cols): `beta` before its sigmoid.
    pub beta: Linear<'a>,
    /// (v_heads rows, hidden cols): the decay's input `alpha`.
    pub alpha: Linear<'a>,
    /// (channels, conv_kernel) one causal filter per q/k/v channel, oldest tap first.
    pub conv: &'a [f32],
    /// (v_heads) added to `alpha` before the softplus.
    pub dt_bias: &'a [f32],
    /// (v_heads) `-exp(A_log)`: the decay is `exp(a * softplus(alpha + dt_bias))`.
    pub a: &'a [f32],
    /// (head_dim) the RMSNorm of each value head's output.
    pub norm: &'a [f32],
    /// (hidden rows, v_heads * head_dim cols)
    pub out: Linear<'a>,
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
    /// (hidden) the output projection's bias, when the file has one (starcoder2).
    pub bo: Option<&'a [f32]>,
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
            Mixer::Ssm(s) => s.matrices(),
            Mixer::DeltaNet(d) => vec![&d.qkv, &d.gate, &d.beta, &d.alpha, &d.out],
            Mixer::Mla(m) => m.matrices(),
        };
        m.extend(self.ffn.matrices());
        m
    }
}

/// The FFN of a block. (Its variants differ in size, but there is one per held block, built
/// once: boxing would only add an indirection per token.)
#[allow(clippy::large_enum_variant)]
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
    /// An ungated MLP `down(act(up x + up_b)) + down_b` (starcoder2).
    Ungated {
        /// (ffn rows, hidden cols)
        up: Linear<'a>,
        /// (ffn)
        up_b: Option<&'a [f32]>,
        /// (hidden rows, ffn cols)
        down: Linear<'a>,
        /// (hidden)
        down_b: Option<&'a [f32]>,
    },
    /// No FFN: the block is its mixer alone (mamba, mamba2).
    None,
}

impl<'a> Ffn<'a> {
    /// Every matrix of the FFN.
    pub fn matrices(&self) -> Box<dyn Iterator<Item = &Linear<'a>> + '_> {
        match self {
            Ffn::Dense { gate, up, down } => Box::new([gate, up, down].into_iter()),
            Ffn::Ungated { up, down, .. } => Box::new([up, down].into_iter()),
            Ffn::Moe(m) => Box::new(
                std::iter::once(&m.router).chain(
                    m.experts
                        .iter()
                        .chain(m.shared.as_ref())
                        .flat_map(|e| [&e.gate, &e.up, &e.down]),
                ),
            ),
            Ffn::None => Box::new(std::iter::empty()),
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
    /// (hidden) its bias (starcoder2's LayerNorm).
    pub output_norm_b: Option<&'a [f32]>,
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
            // A LayerNorm's bias is part of the architecture: required, not guessed absent.
            let norm_bias = |t: &str| -> Result<Option<&'a [f32]>, EngineError> {
                match cfg.recipe.layer_norm {
                    true => vector(knot, t, h).map(Some),
                    false => Ok(None),
                }
            };
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
                // Newer converters: each head's W_UK^T and W_UV as tensors of their own.
                let mut split = match m.split_kv_b {
                    true => {
                        let (kl, nh) = (m.kv_lora_rank, m.n_heads);
                        let map = |v: Vec<QMatrix<'a>>| -> Vec<Linear<'a>> {
                            v.into_iter().map(|q| Linear::mapped(q, knot)).collect()
                        };
                        Some((
                            map(stacked(knot, &name("attn_k_b.weight"), nh, kl, m.nope)?),
                            map(stacked(knot, &name("attn_v_b.weight"), nh, m.v_head, kl)?),
                        ))
                    }
                    false => None,
                };
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
                    kv_b: match split {
                        Some(_) => None,
                        None => Some(lin("attn_kv_b.weight", m.kv_b_rows(), m.kv_lora_rank)?),
                    },
                    wo: lin("attn_output.weight", h, m.n_heads * m.v_head)?,
                    k_b: split
                        .as_mut()
                        .map(|(k_b, _)| std::mem::take(k_b))
                        .unwrap_or_default(),
                    // Head h's value rows of kv_b, in place (the latent cache's W_UV).
                    uv: if let Some((_, v_b)) = split {
                        v_b
                    } else {
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
            } else if let (true, Some(sc)) = (cfg.is_recurrent(l as usize), &cfg.ssm) {
                Mixer::Ssm(ssm_weights(knot, sc, h, &name)?)
            } else if let (true, Some(d)) = (cfg.is_recurrent(l as usize), &cfg.delta_net) {
                let (hd, kh, vh) = (d.head_dim as usize, d.k_heads as usize, d.v_heads as usize);
                let (k, ch, vd) = (cfg.conv_kernel, (2 * kh + vh) * hd, vh * hd);
                let conv = find(knot, &name("ssm_conv1d.weight"))?;
                if conv.entry.shape != [k as u64, ch as u64] {
                    return Err(EngineError::BadTensor {
                        name: name("ssm_conv1d.weight"),
                        why: format!("shape {:?}, expected [{k}, {ch}]", conv.entry.shape),
                    });
                }
                let lin = |t: &str, rows: usize, cols: usize| -> Result<Linear<'a>, EngineError> {
                    Ok(Linear::mapped(matrix(knot, &name(t), rows, cols)?, knot))
                };
                Mixer::DeltaNet(DeltaNetWeights {
                    qkv: lin("attn_qkv.weight", ch, h)?,
                    gate: lin("attn_gate.weight", vd, h)?,
                    beta: lin("ssm_beta.weight", vh, h)?,
                    alpha: lin("ssm_alpha.weight", vh, h)?,
                    conv: vector(knot, &name("ssm_conv1d.weight"), k * ch)?,
                    dt_bias: vector(knot, &name("ssm_dt.bias"), vh)?,
                    a: vector(knot, &name("ssm_a"), vh)?,
                    norm: vector(knot, &name("ssm_norm.weight"), hd)?,
                    out: lin("ssm_out.weight", h, vd)?,
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
                        // Gated attention (qwen35): each head's query, then its gate.
                        matrix(
                            knot,
                            &name("attn_q.weight"),
                            if cfg.recipe.attn_output_gate {
                                2 * q
                            } else {
                                q
                            },
                            h,
                        )?,
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
                    bo: opt_vec("attn_output.bias", h)?,
                })
            };
            layers.push(LayerWeights {
                attn_norm: vector(knot, &name("attn_norm.weight"), h)?,
                attn_norm_b: norm_bias(&name("attn_norm.bias"))?,
                mixer,
                post_attn_norm,
                // No FFN (mamba): an empty norm the block never reads.
                ffn_norm: match cfg.ffn {
                    0 => &[],
                    _ => vector(knot, &name(cfg.recipe.ffn_norm), h)?,
                },
                ffn_norm_b: norm_bias(&name("ffn_norm.bias"))?,
                ffn: match cfg.moe.as_ref().filter(|_| cfg.is_moe(l as usize)) {
                    None if cfg.ffn == 0 => Ffn::None,
                    None if cfg.recipe.ungated_ffn => Ffn::Ungated {
                        up: Linear::mapped(matrix(knot, &name("ffn_up.weight"), cfg.ffn, h)?, knot),
                        up_b: opt_vec("ffn_up.bias", cfg.ffn)?,
                        down: Linear::mapped(
                            matrix(knot, &name("ffn_down.weight"), h, cfg.ffn)?,
                            knot,
                        ),
                        down_b: opt_vec("ffn_down.bias", h)?,
                    },
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
                        // deepseek2: shared experts as one FFN of n_shared * expert_ffn;
                        // qwen35moe: one of its own width, gated.
                        let shared_width = match m.shared_ffn {
                            Some(w) => w as usize,
                            None => f * m.n_shared as usize,
                        };
                        let shared = if shared_width > 0 {
                            let fs = shared_width;
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
                            shared_gate: match m.shared_ffn {
                                Some(_) => {
                                    Some(vector(knot, &name("ffn_gate_inp_shexp.weight"), h)?)
                                }
                                None => None,
                            },
                            gating: match m.gating.as_deref() {
                                _ if cfg.arch == super::Arch::Llama4 => Gating::SigmoidInput,
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
        let (output_norm, output_norm_b, output) = if holdings.head {
            let head = match knot.tensor("output.weight") {
                Some(_) => matrix(knot, "output.weight", cfg.vocab, h)?,
                // Tied models (SmolLM2, qwen3) reuse the embedding as the head.
                None => matrix(knot, "token_embd.weight", cfg.vocab, h)?,
            };
            let bias = match cfg.recipe.layer_norm {
                true => Some(vector(knot, "output_norm.bias", h)?),
                false => None,
            };
            (
                Some(vector(knot, cfg.recipe.output_norm, h)?),
                bias,
                Some(Linear::mapped(head, knot)),
            )
        } else {
            (None, None, None)
        };
        Ok(Weights {
            embed,
            layers,
            output_norm,
            output_norm_b,
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

/// A state-space layer's tensors (llama.cpp's `ssm_*` names), checked against `c`.
fn ssm_weights<'a>(
    knot: &'a Knot,
    c: &SsmConfig,
    h: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<SsmWeights<'a>, EngineError> {
    let (di, ds, cd, nh) = (c.inner, c.state, c.conv_dim(), c.heads());
    let conv_name = name("ssm_conv1d.weight");
    let conv = find(knot, &conv_name)?;
    if conv.entry.shape != [c.conv_kernel as u64, cd as u64] {
        return Err(EngineError::BadTensor {
            name: conv_name,
            why: format!(
                "shape {:?}, expected [{}, {cd}]",
                conv.entry.shape, c.conv_kernel
            ),
        });
    }
    let conv_bias = match knot.tensor(&name("ssm_conv1d.bias")) {
        Some(_) => Some(vector(knot, &name("ssm_conv1d.bias"), cd)?),
        None if c.kind == SsmKind::Mamba2 => None,
        None => return Err(EngineError::MissingTensor(name("ssm_conv1d.bias"))),
    };
    let a_name = name("ssm_a");
    let (x_proj, dt_proj, a, norm) = match c.kind {
        SsmKind::Mamba1 => {
            // GGUF (state, inner) with state fastest: A[i][s]; the scan wants A[s][i].
            let a = vector(knot, &a_name, di * ds)?;
            let mut t = vec![0.0f32; di * ds];
            for i in 0..di {
                for s in 0..ds {
                    t[s * di + i] = a[i * ds + s];
                }
            }
            (
                Some(Linear::mapped(
                    matrix(knot, &name("ssm_x.weight"), c.dt_rank + 2 * ds, di)?,
                    knot,
                )),
                Some(Linear::mapped(
                    matrix(knot, &name("ssm_dt.weight"), di, c.dt_rank)?,
                    knot,
                )),
                t,
                None,
            )
        }
        SsmKind::Mamba2 => (
            None,
            None,
            vector(knot, &a_name, nh)?.to_vec(),
            Some(vector(knot, &name("ssm_norm.weight"), di)?),
        ),
    };
    Ok(SsmWeights {
        in_proj: Linear::mapped(
            matrix(knot, &name("ssm_in.weight"), c.in_proj_rows(), h)?,
            knot,
        ),
        conv: vector(knot, &conv_name, cd * c.conv_kernel)?,
        conv_bias,
        x_proj,
        dt_proj,
        dt_bias: vector(knot, &name("ssm_dt.bias"), nh)?,
        a,
        d: vector(knot, &name("ssm_d"), nh)?,
        norm,
        out_proj: Linear::mapped(matrix(knot, &name("ssm_out.weight"), h, di)?, knot),
    })
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
/// llama3's `rope_freqs.weight`, or Phi-3 LongRoPE's `rope_factors_short.weight` for a
/// context up to the original one and `rope_factors_long.weight` beyond it (llama.cpp's
/// `get_rope_factors`: long when the context exceeds `rope.scaling.original_context_length`,
/// else the trained context). `context`: the positions a session may hold (llama.cpp's
/// `n_ctx_seq`); `None` (unknown) takes the short ones.
pub fn rope_factors<'a>(
    knot: &'a Knot,
    cfg: &Config,
    context: Option<usize>,
) -> Result<Option<&'a [f32]>, EngineError> {
    let long = context.is_some_and(|n| n > original_context(knot.arch()));
    let names = [
        "rope_freqs.weight",
        if long {
            "rope_factors_long.weight"
        } else {
            "rope_factors_short.weight"
        },
    ];
    for name in names {
        if knot.tensor(name).is_some() {
            let f = vector(knot, name, cfg.rope_dim / 2)?;
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

/// The context RoPE was trained for before any scaling: `rope.scaling.original_context_length`,
/// else the trained context (llama.cpp's `n_ctx_orig_yarn`).
fn original_context(a: &knot_format::ArchConfig) -> usize {
    match a.rope_scaling.as_ref().map(|s| s.original_context) {
        Some(n) if n > 0 => n as usize,
        _ => a.context_len as usize,
    }
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
