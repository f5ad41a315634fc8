//! Multi-head Latent Attention (deepseek2), as llama.cpp 0.3.36 runs a file with `attn_kv_b`:
//! keys and values decompressed per head, the cache holding them like any multi-head cache.
//!
//! One block: `q = Wq·x` (or `Wq_b·rmsnorm(Wq_a·x)`), each head `[q_nope | q_rope]`;
//! `Wkv_a·x = [c | k_rope]`, `c` (kv_lora_rank wide) RMSNormed, `k_rope` one rotated key
//! part shared by every head; `Wkv_b·c` gives each head's `[k_nope | v]`. A head's key is
//! `[k_nope | k_rope]`, so `q·k = q_nope·k_nope + q_rope·k_rope`. RoPE (normal pairing)
//! turns only the `rope_dim` tail of q and the shared `k_rope`.
//!
//! With [`MlaShape::latent_cache`] the cache holds instead each position's latent row `[c |
//! k_rope]` (kv_lora_rank + rope floats, for all heads together), and the "absorbed" form
//! runs: `q_nope·k_nope = (W_UK^T q_nope)·c`, so each head's query becomes `[W_UK^T q_nope |
//! q_rope]` against the latent rows (one shared key head), its output the attention-weighted
//! latent, and `W_UV` (the value rows of `attn_kv_b`) turns that into the head's value.
//! Fewer cache bytes per position (576 floats against 5120 in V2-Lite), more arithmetic per
//! decoded token; the same model up to rounding.
//!
//! Files from newer converters hold `attn_k_b` (each head's `W_UK^T`, kv_lora_rank x nope) and
//! `attn_v_b` (each head's `W_UV`) instead of `attn_kv_b`; llama.cpp runs those only in the
//! absorbed form, and so does this module (`MlaShape::split_kv_b` forces the latent cache):
//! `q_nope` goes through head h's `attn_k_b` as a projection.
//!
//! Determinism: every row's projections depend only on that row (the kernels' contract), and
//! a head's output only on its query and the cached rows: the same bits alone or in a batch.

use std::cell::RefCell;

use knot_format::RopeStyle;

use super::kernels::{linear, linears, Linear};
use super::ops::{
    attend_heads, for_each_attention_item, heads_per_item, rmsnorm_inplace, rope_rotate, HeadRows,
    KvElem,
};
use super::session::{LayerCache, Scratch};
use super::KvRows;

/// MLA's widths, from the header (see `knot_format::MlaConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    pub n_heads: usize,
    /// 0: q straight from `attn_q`.
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Non-rotated dimensions of a head's q and k.
    pub nope: usize,
    /// Rotated dimensions of a head's q and k (the shared key part).
    pub rope: usize,
    /// Width of a head's value.
    pub v_head: usize,
    /// The cache holds the latent rows (absorbed form) instead of per-head keys and values.
    pub latent_cache: bool,
    /// The file has `attn_k_b` / `attn_v_b` instead of `attn_kv_b`: only the latent cache
    /// runs (as in llama.cpp), so `latent_cache` is always set.
    pub split_kv_b: bool,
}

impl MlaShape {
    /// Width of one head's query and key.
    pub fn k_head(&self) -> usize {
        self.nope + self.rope
    }

    /// Width of the latent row `Wkv_a·x`: the compressed kv and the shared rope key.
    pub fn latent(&self) -> usize {
        self.kv_lora_rank + self.rope
    }

    /// Width of `Wkv_b·c`: every head's `[k_nope | v]`.
    pub fn kv_b_rows(&self) -> usize {
        self.n_heads * (self.nope + self.v_head)
    }
}

/// How q is made.
pub enum MlaQ<'a> {
    /// (n_heads * k_head rows, hidden cols): `attn_q` (DeepSeek-V2-Lite).
    Direct(Linear<'a>),
    /// `attn_q_a` (q_lora_rank rows, hidden cols), its RMSNorm `attn_q_a_norm`
    /// (q_lora_rank), `attn_q_b` (n_heads * k_head rows, q_lora_rank cols).
    LowRank {
        a: Linear<'a>,
        norm: &'a [f32],
        b: Linear<'a>,
    },
}

/// One block's MLA tensors.
pub struct MlaWeights<'a> {
    pub q: MlaQ<'a>,
    /// (kv_lora_rank + rope rows, hidden cols): `attn_kv_a_mqa`.
    pub kv_a: Linear<'a>,
    /// (kv_lora_rank): `attn_kv_a_norm`.
    pub kv_a_norm: &'a [f32],
    /// (n_heads * (nope + v_head) rows, kv_lora_rank cols): `attn_kv_b`; `None` in a file
    /// with split `attn_k_b` / `attn_v_b`.
    pub kv_b: Option<Linear<'a>>,
    /// (n_heads) head h's `attn_k_b` (kv_lora_rank rows, nope cols): `W_UK^T` as stored by
    /// newer converters; empty with `attn_kv_b`.
    pub k_b: Vec<Linear<'a>>,
    /// (hidden rows, n_heads * v_head cols): `attn_output`.
    pub wo: Linear<'a>,
    /// (n_heads) head h's value rows of `attn_kv_b` (v_head rows, kv_lora_rank cols), views;
    /// or its `attn_v_b`.
    pub uv: Vec<Linear<'a>>,
    /// (n_heads, nope, kv_lora_rank) head h's key rows of `attn_kv_b` in f32, made on the
    /// first latent-cache forward (the absorbed query needs `W_UK^T`).
    pub uk: std::sync::OnceLock<Vec<f32>>,
}

impl<'a> MlaWeights<'a> {
    /// The block's matrices, in forward order.
    pub fn matrices(&self) -> Vec<&Linear<'a>> {
        let mut m = match &self.q {
            MlaQ::Direct(q) => vec![q],
            MlaQ::LowRank { a, b, .. } => vec![a, b],
        };
        m.push(&self.kv_a);
        match &self.kv_b {
            Some(kv_b) => m.push(kv_b),
            // Split: the per-head matrices are the file's own tensors.
            None => m.extend(self.k_b.iter().chain(&self.uv)),
        }
        m.push(&self.wo);
        m
    }

    /// Attention of one block over the normed rows in `s.xb` (seq, hidden); output in
    /// `s.xb2`. `rope` holds each row's cosines then sines (seq, rope dims), already times
    /// the magnitude; `scale` multiplies q·k.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        m: &MlaShape,
        eps: f32,
        scale: f32,
        rope: &[f32],
        cache: &mut LayerCache,
        s: &mut Scratch,
        seq: usize,
        pos: usize,
    ) {
        let Some(kv_b) = self.kv_b.as_ref().filter(|_| !m.latent_cache) else {
            return self.forward_latent(m, eps, scale, rope, cache, s, seq, pos);
        };
        let (kh, lat, nh) = (m.k_head(), m.latent(), m.n_heads);
        let (q_dim, k_dim, v_dim) = (nh * kh, nh * kh, nh * m.v_head);
        let hidden = self.kv_a.cols;
        self.project(m, eps, rope, s, seq);
        let ckn = &s.mla_c[..seq * m.kv_lora_rank];
        // Decompress: every head's k_nope and v from the latent.
        let kvb = &mut s.mla_kvb[..seq * m.kv_b_rows()];
        linear(kv_b, ckn, seq, kvb);
        let per = m.nope + m.v_head;
        for t in 0..seq {
            let kr = &s.mla_latent[t * lat + m.kv_lora_rank..(t + 1) * lat];
            let src = &kvb[t * m.kv_b_rows()..(t + 1) * m.kv_b_rows()];
            let k = &mut s.k[t * k_dim..(t + 1) * k_dim];
            let v = &mut s.v[t * v_dim..(t + 1) * v_dim];
            for h in 0..nh {
                let hs = &src[h * per..(h + 1) * per];
                k[h * kh..h * kh + m.nope].copy_from_slice(&hs[..m.nope]);
                k[h * kh + m.nope..(h + 1) * kh].copy_from_slice(kr);
                v[h * m.v_head..(h + 1) * m.v_head].copy_from_slice(&hs[m.nope..]);
            }
        }
        // Stored first, then read back (a row sees its own key as stored, alone or batched).
        cache.k.extend(&s.k[..seq * k_dim]);
        cache.v.extend(&s.v[..seq * v_dim]);
        let shape = Heads {
            seq,
            pos,
            n_heads: nh,
            k_head: kh,
            v_head: m.v_head,
            scale,
        };
        let att = &mut s.att[..seq * v_dim];
        match (&cache.k, &cache.v) {
            (KvRows::F32(k), KvRows::F32(v)) => attend(att, &s.q[..seq * q_dim], k, v, shape),
            (KvRows::F16(k), KvRows::F16(v)) => attend(att, &s.q[..seq * q_dim], k, v, shape),
            _ => unreachable!("a session stores keys and values in one type"),
        }
        linear(&self.wo, att, seq, &mut s.xb2[..seq * hidden]);
    }

    /// x -> q (tails rotated) in `s.q`, the latent rows `[rmsnorm(c) | rope(k_rope)]` in
    /// `s.mla_latent`, and the normed `c` alone in `s.mla_c`.
    fn project(&self, m: &MlaShape, eps: f32, rope: &[f32], s: &mut Scratch, seq: usize) {
        let (kh, lat, nh) = (m.k_head(), m.latent(), m.n_heads);
        let q_dim = nh * kh;
        let hidden = self.kv_a.cols;
        let xb = &s.xb[..seq * hidden];
        let ckv = &mut s.mla_latent[..seq * lat];
        // x -> q (or q's low-rank input) and the latent, one shared quantization of x.
        match &self.q {
            MlaQ::Direct(wq) => linears(
                &mut [(wq, &mut s.q[..seq * q_dim]), (&self.kv_a, ckv)],
                xb,
                seq,
            ),
            MlaQ::LowRank { a, norm, b } => {
                let qa = &mut s.mla_qa[..seq * m.q_lora_rank];
                linears(&mut [(a, &mut *qa), (&self.kv_a, ckv)], xb, seq);
                qa.chunks_exact_mut(m.q_lora_rank)
                    .for_each(|r| rmsnorm_inplace(r, norm, eps));
                linear(b, qa, seq, &mut s.q[..seq * q_dim]);
            }
        }
        // The latent normed, the shared key part and each head's q tail rotated.
        let ckn = &mut s.mla_c[..seq * m.kv_lora_rank];
        for t in 0..seq {
            let cs = &rope[t * m.rope..(t + 1) * m.rope];
            let row = &mut s.mla_latent[t * lat..(t + 1) * lat];
            let (c, kr) = row.split_at_mut(m.kv_lora_rank);
            rmsnorm_inplace(c, self.kv_a_norm, eps);
            ckn[t * m.kv_lora_rank..(t + 1) * m.kv_lora_rank].copy_from_slice(c);
            rope_rotate(kr, cs, RopeStyle::Normal);
            for h in s.q[t * q_dim..(t + 1) * q_dim].chunks_exact_mut(kh) {
                rope_rotate(&mut h[m.nope..], cs, RopeStyle::Normal);
            }
        }
    }

    /// The absorbed form over a latent cache (see the module's doc).
    #[allow(clippy::too_many_arguments)]
    fn forward_latent(
        &self,
        m: &MlaShape,
        eps: f32,
        scale: f32,
        rope: &[f32],
        cache: &mut LayerCache,
        s: &mut Scratch,
        seq: usize,
        pos: usize,
    ) {
        let (kh, lat, nh, kl) = (m.k_head(), m.latent(), m.n_heads, m.kv_lora_rank);
        self.project(m, eps, rope, s, seq);
        cache.k.extend(&s.mla_latent[..seq * lat]);
        let Some(kv_b) = &self.kv_b else {
            return self.forward_latent_split(m, scale, cache, s, seq, pos);
        };
        let uk = self.uk.get_or_init(|| {
            let w = &kv_b.q;
            let (per, rb) = (m.nope + m.v_head, w.row_bytes());
            let mut out = vec![0f32; nh * m.nope * kl];
            for h in 0..nh {
                for c in 0..m.nope {
                    let r = h * per + c;
                    let dst = &mut out[(h * m.nope + c) * kl..(h * m.nope + c + 1) * kl];
                    super::kernels::dequantize_row(w.dtype, &w.data[r * rb..(r + 1) * rb], dst);
                }
            }
            out
        });
        LATENT.with_borrow_mut(|b| {
            // Each head's query against the latent rows: [W_UK^T q_nope | q_rope].
            b.q.resize(seq * nh * lat, 0.0);
            for t in 0..seq {
                for h in 0..nh {
                    let qh = &s.q[(t * nh + h) * kh..(t * nh + h + 1) * kh];
                    let qa = &mut b.q[(t * nh + h) * lat..(t * nh + h + 1) * lat];
                    let (abs, pe) = qa.split_at_mut(kl);
                    abs.fill(0.0);
                    for (c, &qc) in qh[..m.nope].iter().enumerate() {
                        let row = &uk[(h * m.nope + c) * kl..(h * m.nope + c + 1) * kl];
                        abs.iter_mut().zip(row).for_each(|(a, &w)| *a += qc * w);
                    }
                    pe.copy_from_slice(&qh[m.nope..]);
                }
            }
            self.attend_latent(m, scale, cache, s, b, seq, pos);
        });
    }

    /// With the absorbed queries in `b.q` (seq, n_heads, latent): attention over the cached
    /// latent rows, each head's weighted latent through its `W_UV`, then `attn_output` into
    /// `s.xb2`.
    #[allow(clippy::too_many_arguments)]
    fn attend_latent(
        &self,
        m: &MlaShape,
        scale: f32,
        cache: &LayerCache,
        s: &mut Scratch,
        b: &mut LatentScratch,
        seq: usize,
        pos: usize,
    ) {
        let (lat, nh, kl) = (m.latent(), m.n_heads, m.kv_lora_rank);
        let hidden = self.kv_a.cols;
        // One shared key head of width `lat`; the value is its first kl.
        b.o.resize(seq * nh * kl, 0.0);
        let shape = Heads {
            seq,
            pos,
            n_heads: nh,
            k_head: lat,
            v_head: kl,
            scale,
        };
        match &cache.k {
            KvRows::F32(k) => attend_shared(&mut b.o, &b.q, k, shape),
            KvRows::F16(k) => attend_shared(&mut b.o, &b.q, k, shape),
        }
        // Each head's weighted latent -> its value through W_UV (head h's rows of kv_b).
        b.g.resize(seq * kl, 0.0);
        b.y.resize(seq * m.v_head, 0.0);
        let v_dim = nh * m.v_head;
        for h in 0..nh {
            for t in 0..seq {
                b.g[t * kl..(t + 1) * kl]
                    .copy_from_slice(&b.o[(t * nh + h) * kl..(t * nh + h + 1) * kl]);
            }
            linear(&self.uv[h], &b.g, seq, &mut b.y);
            for t in 0..seq {
                s.att[t * v_dim + h * m.v_head..t * v_dim + (h + 1) * m.v_head]
                    .copy_from_slice(&b.y[t * m.v_head..(t + 1) * m.v_head]);
            }
        }
        linear(
            &self.wo,
            &s.att[..seq * nh * m.v_head],
            seq,
            &mut s.xb2[..seq * hidden],
        );
    }

    /// The absorbed queries of a file with split `attn_k_b` (each head's `W_UK^T` a matrix
    /// of its own, as llama.cpp multiplies it: `q_nope` through it like any projection).
    fn forward_latent_split(
        &self,
        m: &MlaShape,
        scale: f32,
        cache: &LayerCache,
        s: &mut Scratch,
        seq: usize,
        pos: usize,
    ) {
        let (kh, lat, nh, kl) = (m.k_head(), m.latent(), m.n_heads, m.kv_lora_rank);
        LATENT.with_borrow_mut(|b| {
            b.q.resize(seq * nh * lat, 0.0);
            b.g.resize(seq * m.nope, 0.0);
            b.y.resize(seq * kl, 0.0);
            for h in 0..nh {
                for t in 0..seq {
                    let qh = &s.q[(t * nh + h) * kh..(t * nh + h + 1) * kh];
                    b.g[t * m.nope..(t + 1) * m.nope].copy_from_slice(&qh[..m.nope]);
                }
                linear(&self.k_b[h], &b.g, seq, &mut b.y);
                for t in 0..seq {
                    let qh = &s.q[(t * nh + h) * kh..(t * nh + h + 1) * kh];
                    let qa = &mut b.q[(t * nh + h) * lat..(t * nh + h + 1) * lat];
                    qa[..kl].copy_from_slice(&b.y[t * kl..(t + 1) * kl]);
                    qa[kl..].copy_from_slice(&qh[m.nope..]);
                }
            }
            self.attend_latent(m, scale, cache, s, b, seq, pos);
        });
    }
}

/// Buffers of the latent-cache path: absorbed queries (seq, n_heads, latent), weighted latents
/// (seq, n_heads, kv_lora_rank), one head's gathered latents and values.
#[derive(Default)]
struct LatentScratch {
    q: Vec<f32>,
    o: Vec<f32>,
    g: Vec<f32>,
    y: Vec<f32>,
}

thread_local! {
    static LATENT: RefCell<LatentScratch> = RefCell::new(LatentScratch::default());
}

/// Multi-query attention over the latent rows: every head's query (`k_head` = latent wide)
/// against the one shared row per position, the output the weighted sum of each row's first
/// `v_head` (= kv_lora_rank) elements. `out`: (seq, n_heads * v_head).
fn attend_shared<T: KvElem>(out: &mut [f32], q: &[f32], k: &[T], a: Heads) {
    let (qd, lat) = (a.n_heads * a.k_head, a.k_head);
    let max_pos = a.pos + a.seq;
    assert!(
        q.len() >= a.seq * qd && k.len() >= max_pos * lat,
        "mla latent attention: short inputs"
    );
    // Every head of a row reads the same latent rows: one group of all of them.
    let per = heads_per_item(a.parallel(), a.seq, a.n_heads);
    let rows = (
        HeadRows {
            stride: lat,
            off: 0,
            width: lat,
        },
        HeadRows {
            stride: lat,
            off: 0,
            width: a.v_head,
        },
    );
    let item = |i: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (t, h) = (i * per / a.n_heads, i * per % a.n_heads);
        let qh = &q[t * qd + h * lat..t * qd + (h + per) * lat];
        attend_heads(o, qh, k, k, rows, 0..a.pos + t + 1, a.scale, None, scores);
    };
    let out = &mut out[..a.seq * a.n_heads * a.v_head];
    for_each_attention_item(out, per * a.v_head, a.parallel(), None, item);
}

/// Shapes of one [`attend`] call: causal multi-head attention whose key and value heads
/// differ in width.
#[derive(Clone, Copy, Debug)]
struct Heads {
    seq: usize,
    pos: usize,
    n_heads: usize,
    k_head: usize,
    v_head: usize,
    scale: f32,
}

impl Heads {
    /// Whether the heads go to the team: enough multiply-adds to pay for a fork-join.
    fn parallel(&self) -> bool {
        let macs = self.seq * self.n_heads * (self.pos + self.seq) * (self.k_head + self.v_head);
        macs >= super::ops::ATTN_PAR_MIN_MACS && rayon::current_num_threads() > 1
    }
}

/// Causal attention: row t (position `pos + t`) of head h over the cached positions
/// `0..=pos + t`. `q`: (seq, n_heads * k_head); `k`: (positions, n_heads * k_head); `v`:
/// (positions, n_heads * v_head); `out`: (seq, n_heads * v_head). Parallel over (row, head)
/// when the work is large enough; each head's output depends only on its inputs, so the bits
/// do not depend on the split.
fn attend<T: KvElem>(out: &mut [f32], q: &[f32], k: &[T], v: &[T], a: Heads) {
    let (kd, vd) = (a.n_heads * a.k_head, a.n_heads * a.v_head);
    let max_pos = a.pos + a.seq;
    assert!(
        q.len() >= a.seq * kd && k.len() >= max_pos * kd && v.len() >= max_pos * vd,
        "mla attention: short inputs"
    );
    let head = |i: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (t, h) = (i / a.n_heads, i % a.n_heads);
        let qh = &q[t * kd + h * a.k_head..t * kd + (h + 1) * a.k_head];
        let rows = (
            HeadRows {
                stride: kd,
                off: h * a.k_head,
                width: a.k_head,
            },
            HeadRows {
                stride: vd,
                off: h * a.v_head,
                width: a.v_head,
            },
        );
        attend_heads(o, qh, k, v, rows, 0..a.pos + t + 1, a.scale, None, scores);
    };
    let out = &mut out[..a.seq * vd];
    for_each_attention_item(out, a.v_head, a.parallel(), None, head);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct evaluation: softmax(q·k * scale) weighted values, key and value heads
    /// of different widths.
    #[test]
    fn attention_with_wider_keys_than_values_matches_a_direct_sum() {
        let a = Heads {
            seq: 3,
            pos: 2,
            n_heads: 2,
            k_head: 6,
            v_head: 4,
            scale: 0.5,
        };
        let (kd, vd, n) = (12, 8, 5);
        let f = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 7.0;
        let q: Vec<f32> = (0..a.seq * kd).map(|i| f(i + 3)).collect();
        let k: Vec<f32> = (0..n * kd).map(f).collect();
        let v: Vec<f32> = (0..n * vd).map(|i| f(i + 11)).collect();
        let mut out = vec![0f32; a.seq * vd];
        attend(&mut out, &q, &k, &v, a);
        for t in 0..a.seq {
            for h in 0..2 {
                let qh = &q[t * kd + h * 6..t * kd + h * 6 + 6];
                let s: Vec<f64> = (0..=a.pos + t)
                    .map(|p| {
                        let kr = &k[p * kd + h * 6..p * kd + h * 6 + 6];
                        qh.iter()
                            .zip(kr)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>()
                            * 0.5
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for d in 0..4 {
                    let want: f64 = s
                        .iter()
                        .enumerate()
                        .map(|(p, x)| (x - m).exp() / z * v[p * vd + h * 4 + d] as f64)
                        .sum();
                    let got = out[t * vd + h * 4 + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "t {t} h {h} d {d}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
