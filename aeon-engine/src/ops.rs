//! Small numeric building blocks of the forward pass. All are deterministic: each output
//! depends only on its own inputs, in a fixed summation order.
//!
//! And the same on every ISA: plain Rust f32/f64 arithmetic is IEEE (no FMA contraction, no
//! x87), sums run in one written order, and no transcendental function comes from the system
//! libm: glibc on x86 and musl on aarch64 round some results differently (glibc even picks an
//! FMA variant at run time; their `expf` disagree on 0.86% of inputs, mostly near 1.0), which
//! made an x86 station and an aarch64 station part in block 0's softmax. The hot ones ([`exp`],
//! [`tanh`]) are written here in plain f64 arithmetic (branch-free, so the SiLU loop
//! vectorizes); RoPE's `pow`, `sin` and `cos` (a table per model and per position) come from the
//! `libm` crate, musl's code in plain Rust.

use super::kernels::lanes::{lane_isa, vectorized};
use super::kernels::scores::{self, Scores16};
use super::team;
use knot_format::RopeStyle;
use std::cell::RefCell;

/// Index of the largest logit (the first on ties; 0 for an empty slice): greedy decoding.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// `e^x` for f32, the same bits on every target, within one ulp (the exact value rounded to
/// f32 except within ~3e-13 relative of a rounding midpoint).
///
/// In f64: `k = round(x / ln 2)` (the 1.5 * 2^52 shift rounds to nearest even and leaves `k` in
/// the low bits), `r = x - k ln 2` (|r| <= 0.347), `e^r` by its Taylor polynomial to `r^10`
/// (truncation < 3e-13 relative), times `2^k` built in the exponent bits, rounded once to f32.
/// `x` is clamped to [-104, 89] first, where the f32 result is already 0 or infinity; NaN
/// stays NaN. No branch, no table, no libm call: LLVM vectorizes loops over it.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_f64(x.clamp(-104.0, 89.0) as f64) as f32
}

/// `tanh(x)` for f32 from [`exp`]'s arithmetic, the same bits on every target:
/// `(e^2|x| - 1) / (e^2|x| + 1)` in f64 with the sign of `x`, and `x (1 - x^2 / 3)` below 2^-12
/// (where the quotient would lose digits to the cancellation).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    // Both branches computed and one chosen, so that loops over it vectorize.
    let xd = x as f64;
    // x (1 - x^2 / 3), not x - x^3 / 3: keeps the sign of -0.0.
    let small = xd * (1.0 - xd * xd / 3.0);
    let e = exp_f64((x.abs().min(10.0) as f64) * 2.0);
    let t = (e - 1.0) / (e + 1.0);
    let large = if x < 0.0 { -t } else { t };
    let r = if (x.abs() as f64) < 1.0 / 4096.0 {
        small
    } else {
        large
    };
    if x.is_nan() {
        x
    } else {
        r as f32
    }
}

/// `e^y` in f64 for `y` in [-104, 89] ([`exp`]'s clamped range; [`tanh`] uses [0, 20]):
/// `2^k * e^r` with `k = round(y / ln 2)` and `e^r` from its Taylor series to degree 10.
#[inline(always)]
fn exp_f64(y: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    const LN2: f64 = std::f64::consts::LN_2;
    const SHIFT: f64 = 6755399441055744.0;
    let z = y * LOG2E + SHIFT;
    let k = z - SHIFT;
    let r = y - k * LN2;
    // 1/n! for n = 10 down to 1 (Horner).
    let mut p = 1.0 / 3_628_800.0;
    for c in [
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // The low 12 bits of z's pattern are k mod 4096; k + 1023 is in 872..=1152.
    p * f64::from_bits(z.to_bits().wrapping_add(1023) << 52)
}

/// `out = x / rms(x) * w`, one row. Sum of squares in f64: Qwen's early residuals reach ~1e3.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * scale * wi;
    }
}

/// LayerNorm of one row: `(x - mean) / sqrt(var + eps) * w + b` (starcoder2; llama.cpp's
/// `LLM_NORM`, the mean and variance over the row, the bias when the file has one).
pub fn layernorm(out: &mut [f32], x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let scale = 1.0 / (var + eps as f64).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = ((xi as f64 - mean) * scale) as f32 * wi;
    }
    if let Some(b) = b {
        add_inplace(out, b);
    }
}

/// `x = gelu(x)`, GELU's tanh approximation (starcoder2's ungated MLP; see [`geglu_tanh`]).
pub fn gelu_tanh(x: &mut [f32]) {
    vectorized!(gelu_tanh_lanes(x))
}

#[inline(always)]
fn gelu_tanh_lanes(x: &mut [f32]) {
    x.iter_mut().for_each(|g| *g = gelu(*g))
}

/// GELU's tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

/// In-place RMSNorm of one row.
/// `x /= sqrt(mean(x^2) + eps)`: RMSNorm without a weight (llama4's L2 norm of q and k,
/// llama.cpp's bare `ggml_rms_norm`).
pub fn rms_scale_inplace(x: &mut [f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    x.iter_mut().for_each(|v| *v *= scale);
}

pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = *xi * scale * wi;
    }
}

/// Rotates every head of `x` (`n_heads * head_dim`) by position `pos`.
///
/// NeoX pairs dimension `i` with `i + head_dim/2`; normal pairs `2i` with `2i+1`.
/// The forward pass uses [`rope_inv_freq`] + [`rope_angles`] + [`rope_rotate`] (the same
/// numbers, computed once per model and once per position instead of per head).
pub fn rope(x: &mut [f32], head_dim: usize, pos: usize, base: f32, style: RopeStyle) {
    let inv_freq = rope_inv_freq(head_dim, base);
    let mut cs = vec![0.0f32; head_dim];
    rope_angles(&mut cs, &inv_freq, pos);
    rope_rotate(x, &cs, style);
}

/// RoPE inverse frequencies `base^(-2i / head_dim)` for `i in 0..head_dim/2`, in f64 (the
/// angle `pos * freq` needs the precision at long positions).
pub fn rope_inv_freq(head_dim: usize, base: f32) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| libm::pow(base as f64, -2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// Applies context scaling to inverse frequencies from [`rope_inv_freq`] at `base`, as
/// llama.cpp's `rope_yarn` does: each `f` becomes `f * scale`, except that YaRN blends it back
/// towards `f` on the high-frequency dimensions by a ramp between its correction dimensions.
pub fn rope_scale_freqs(inv_freq: &mut [f64], base: f32, s: crate::RopeScale) {
    let n_dims = (2 * inv_freq.len()) as f64;
    let ramp = s.yarn.map(|y| {
        // The dimension whose wavelength turns `rot` times over the original context.
        let corr = |rot: f32| {
            n_dims * (y.original_context as f64 / (rot as f64 * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * (base as f64).ln())
        };
        let low = corr(y.beta_fast).floor().max(0.0);
        let high = corr(y.beta_slow).ceil().min(n_dims - 1.0);
        (low, high)
    });
    let scale = s.freq_scale as f64;
    for (i, f) in inv_freq.iter_mut().enumerate() {
        let interp = *f * scale;
        *f = match ramp {
            None => interp,
            Some((low, high)) => {
                let y = (i as f64 - low) / (high - low).max(0.001);
                let mix = 1.0 - y.clamp(0.0, 1.0);
                interp * (1.0 - mix) + *f * mix
            }
        };
    }
}

/// Cosines then sines of position `pos`: `cs[i] = cos(pos * f_i)`, `cs[half + i] = sin(..)`;
/// `cs.len() == 2 * inv_freq.len()`.
pub fn rope_angles(cs: &mut [f32], inv_freq: &[f64], pos: usize) {
    let half = inv_freq.len();
    let (cos, sin) = cs.split_at_mut(half);
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
        let (sv, cv) = libm::sincos(pos as f64 * f);
        *c = cv as f32;
        *s = sv as f32;
    }
}

/// Rotates every head of `x` by the angles `cs` from [`rope_angles`] (head_dim = cs.len()).
pub fn rope_rotate(x: &mut [f32], cs: &[f32], style: RopeStyle) {
    let head_dim = cs.len();
    let half = head_dim / 2;
    let (cos, sin) = cs.split_at(half);
    for head in x.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::Neox => {
                let (lo, hi) = head.split_at_mut(half);
                for i in 0..half {
                    let (x0, x1) = (lo[i], hi[i]);
                    lo[i] = x0 * cos[i] - x1 * sin[i];
                    hi[i] = x0 * sin[i] + x1 * cos[i];
                }
            }
            RopeStyle::Normal => {
                for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (x0, x1) = (pair[0], pair[1]);
                    pair[0] = x0 * cos[i] - x1 * sin[i];
                    pair[1] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    vectorized!(softmax_lanes(x))
}

#[inline(always)]
fn softmax_lanes(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Exponentials first (a loop LLVM vectorizes), then the sum in order.
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let mut sum = 0.0f32;
    for &v in x.iter() {
        sum += v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    vectorized!(swiglu_lanes(gate, up))
}

#[inline(always)]
fn swiglu_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

/// `gate = gelu(gate) * up`, the GeGLU activation with GELU's tanh approximation
/// `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))` (gemma; llama.cpp's `ggml_gelu`, which
/// on CPU reads the same curve from an f16 table).
pub fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    vectorized!(geglu_tanh_lanes(gate, up))
}

#[inline(always)]
fn geglu_tanh_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu(*g) * u;
    }
}

/// `x = cap * tanh(x / cap)` (gemma's final logit soft-capping, gemma2's attention scores).
pub fn softcap(x: &mut [f32], cap: f32) {
    vectorized!(softcap_lanes(x, cap))
}

#[inline(always)]
fn softcap_lanes(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * tanh(*v / cap))
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `sum(a[i] * b[i])` in a fixed order: 16 interleaved partial sums (so the compiler can
/// vectorize it) folded pairwise, then the tail. Same bits on every run and thread count.
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    // Kept apart from the fold below, or LLVM's SLP pass, seeded by the fold's pairs, turns
    // the loop above into 2-wide operations even where 16 lanes fit one register.
    let mut acc = std::hint::black_box(acc);
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + tail
}

/// Attention of the query heads in `q` (heads of `k_rows.width`, all reading the same cached
/// key and value rows: a GQA group, an MLA latent's every head, or one head) over the cached
/// positions `span` (`0..n` causal; a later start on a sliding-window layer).
///
/// Position `p`'s key is `k[k_rows.at(p)..][..k_rows.width]`, its value likewise in `v`.
/// Scores are `q·k * scale`, then `cap * tanh(score / cap)` with a `cap` (gemma2). `scores` is
/// scratch, grown to `heads * span.len()` where shorter. Writes each head's weighted sum of values into
/// its `v_rows.width` of `out`. A head's bits do not depend on the other heads of the call:
/// the heads go together so that each block of cached rows is read from memory once for all
/// of them.
///
/// Generic over how the cache stores its rows ([`KvElem`]): an f16 row is widened to f32
/// first, then goes through the very same arithmetic as an f32 row.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads<T: KvElem>(
    out: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    (k_rows, v_rows): (HeadRows, HeadRows),
    span: std::ops::Range<usize>,
    scale: f32,
    cap: Option<f32>,
    scores: &mut Vec<f32>,
) {
    let need = q.len() / k_rows.width * span.len();
    if scores.len() < need {
        scores.resize(need, 0.0);
    }
    let by16 = scores::for_lanes(lane_isa());
    vectorized!(attend_heads_lanes(
        out, q, k, v, k_rows, v_rows, span, scale, cap, scores, by16
    ))
}

/// Cached positions per block: a block's rows (16 x 256 B for a 64-element f32 head) stay in
/// L1 while every head of the group takes them.
const BLOCK: usize = 16;

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_heads_lanes<T: KvElem>(
    out: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    k_rows: HeadRows,
    v_rows: HeadRows,
    span: std::ops::Range<usize>,
    scale: f32,
    cap: Option<f32>,
    scores: &mut [f32],
    by16: Option<Scores16>,
) {
    let hd = k_rows.width;
    let n = span.len();
    let scores = &mut scores[..q.len() / hd * n];
    let mut done = 0;
    if let Some(by16) = by16 {
        done = scores_by_16(q, k, k_rows, span.clone(), scale, by16, scores);
    }
    let mut stack = [0.0f32; 256];
    let mut heap = Vec::new();
    let buf: &mut [f32] = if hd <= stack.len() {
        &mut stack[..hd]
    } else {
        heap.resize(hd, 0.0);
        &mut heap
    };
    for (qh, sh) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n.max(1))) {
        for (p, s) in (span.start + done..span.end).zip(&mut sh[done..]) {
            *s = dot_f32(qh, T::widen(k_rows.row(k, p), buf)) * scale;
        }
        if let Some(cap) = cap {
            softcap_lanes(sh, cap);
        }
        softmax_lanes(sh);
    }
    weighted_rows(out, v, v_rows, span, scores);
}

/// Where one head's rows sit in a cache: position `p`'s row is `width` elements at
/// `p * stride + off`.
#[derive(Clone, Copy, Debug)]
pub struct HeadRows {
    pub stride: usize,
    pub off: usize,
    pub width: usize,
}

impl HeadRows {
    #[inline(always)]
    fn at(self, p: usize) -> usize {
        p * self.stride + self.off
    }

    #[inline(always)]
    fn row<T>(self, c: &[T], p: usize) -> &[T] {
        &c[self.at(p)..self.at(p) + self.width]
    }

    /// Where [`HeadRows::block`] widens a block of [`BLOCK`] rows of cache `c`: empty for an
    /// f32 cache (read in place).
    fn block_scratch<T: KvElem>(self, c: &[T]) -> Vec<f32> {
        match T::as_f32(c) {
            Some(_) => Vec::new(),
            None => vec![0.0f32; BLOCK * self.width],
        }
    }

    /// Rows `p0..p0 + len` of cache `c` as f32 `(floats, first row's start, stride)`: the
    /// cache itself where it holds f32, else the rows widened into `wide` (`len * width`).
    #[inline(always)]
    fn block<'a, T: KvElem>(
        self,
        c: &'a [T],
        p0: usize,
        len: usize,
        wide: &'a mut [f32],
    ) -> (&'a [f32], usize, usize) {
        match T::as_f32(c) {
            Some(c) => (c, self.at(p0), self.stride),
            None => {
                for (j, buf) in wide.chunks_exact_mut(self.width).take(len).enumerate() {
                    T::widen(self.row(c, p0 + j), buf);
                }
                (wide, 0, self.width)
            }
        }
    }
}

/// Head h's `scores[h * n + i] = dot_f32(q_h, k_row(span.start + i)) * scale` with
/// [`dot_f32`]'s bits for the positions of the whole blocks of 16 (`by16` does their folds),
/// every head of `q` on a block before the next; returns how many positions it did.
#[inline(always)]
fn scores_by_16<T: KvElem>(
    q: &[f32],
    k: &[T],
    kv: HeadRows,
    span: std::ops::Range<usize>,
    scale: f32,
    by16: Scores16,
    scores: &mut [f32],
) -> usize {
    let (hd, n) = (kv.width, span.len());
    let cut = hd / 16 * 16;
    let mut wide = kv.block_scratch(k);
    let mut folds = [0.0f32; 16];
    for b in 0..n / 16 {
        let (rows, at, stride) = kv.block(k, span.start + 16 * b, 16, &mut wide);
        for (qh, sh) in q.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
            by16(qh, rows, at, stride, &mut folds);
            for (j, (s, f)) in sh[16 * b..16 * b + 16].iter_mut().zip(folds).enumerate() {
                // `dot_f32`'s tail, in its order.
                let r = &rows[at + j * stride..][..hd];
                let tail: f32 = qh[cut..].iter().zip(&r[cut..]).map(|(x, y)| x * y).sum();
                *s = (f + tail) * scale;
            }
        }
    }
    n / 16 * 16
}

/// Head h's `out_h = sum_i w[h * n + i] * v_row(span.start + i)`, each element summed from 0
/// in position order (the bits of adding the rows one by one into a zeroed `out_h`). Per
/// block of cached rows, every head in turn: its 64-element pieces loaded into registers, the
/// block's rows added, stored back.
#[inline(always)]
fn weighted_rows<T: KvElem>(
    out: &mut [f32],
    v: &[T],
    kv: HeadRows,
    span: std::ops::Range<usize>,
    w: &[f32],
) {
    const C: usize = 64;
    let (hd, n) = (kv.width, span.len());
    out.fill(0.0);
    let mut wide = kv.block_scratch(v);
    for b0 in (0..n).step_by(BLOCK) {
        let len = BLOCK.min(n - b0);
        let (rows, at, stride) = kv.block(v, span.start + b0, len, &mut wide);
        for (oh, wh) in out.chunks_exact_mut(hd).zip(w.chunks_exact(n)) {
            let wh = &wh[b0..b0 + len];
            for (c, oc) in oh.chunks_mut(C).enumerate() {
                let mut acc = [0.0f32; C];
                acc[..oc.len()].copy_from_slice(oc);
                // A whole piece apart: its fixed length keeps it in registers.
                if oc.len() == C {
                    for (j, &wp) in wh.iter().enumerate() {
                        let vr = &rows[at + j * stride + c * C..][..C];
                        for i in 0..C {
                            acc[i] += wp * vr[i];
                        }
                    }
                } else {
                    let acc = &mut acc[..oc.len()];
                    for (j, &wp) in wh.iter().enumerate() {
                        let vr = &rows[at + j * stride + c * C..][..acc.len()];
                        for (a, &x) in acc.iter_mut().zip(vr) {
                            *a += wp * x;
                        }
                    }
                }
                oc.copy_from_slice(&acc[..oc.len()]);
            }
        }
    }
}

/// An element type a KV cache stores its rows in.
pub trait KvElem: Copy + Send + Sync {
    /// The rows as f32 where that is what they are.
    fn as_f32(rows: &[Self]) -> Option<&[f32]>;
    /// `row` as f32: itself, or widened into `buf` (at least `row.len()` long).
    fn widen<'a>(row: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl KvElem for f32 {
    #[inline(always)]
    fn as_f32(rows: &[f32]) -> Option<&[f32]> {
        Some(rows)
    }
    #[inline(always)]
    fn widen<'a>(row: &'a [f32], _buf: &'a mut [f32]) -> &'a [f32] {
        row
    }
}

impl KvElem for half::f16 {
    #[inline(always)]
    fn as_f32(_rows: &[half::f16]) -> Option<&[f32]> {
        None
    }
    fn widen<'a>(row: &'a [half::f16], buf: &'a mut [f32]) -> &'a [f32] {
        use half::slice::HalfFloatSliceExt;
        let b = &mut buf[..row.len()];
        row.convert_to_f32_slice(b);
        b
    }
}

/// Below this many multiply-adds (rows x heads x positions x head_dim) [`attention`] runs on
/// the calling thread: 32k take ~5 µs, a few fork-joins on a spinning team.
pub const ATTN_PAR_MIN_MACS: usize = 1 << 15;

/// Shapes of one [`attention`] call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    /// Query rows in this call.
    pub seq: usize,
    /// Position of the first row (the cache already holds `pos` earlier positions).
    pub pos: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Score multiplier, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Attention logit soft-capping of the scaled scores (gemma2: 50), when set.
    pub softcap: Option<f32>,
    /// Sliding window: row at position `p` sees only `p0` with `p - p0 < window`
    /// (llama.cpp `LLAMA_SWA_TYPE_STANDARD`); `None`: every earlier position.
    pub window: Option<usize>,
    /// Chunked attention: row at position `p` sees only the positions of its own chunk of
    /// this many, `p0 >= p / chunk * chunk` (llama.cpp `LLAMA_SWA_TYPE_CHUNKED`, llama4).
    pub chunk: Option<usize>,
}

impl AttnShape {
    /// The cached positions the row at position `p` attends to.
    pub fn span(&self, p: usize) -> std::ops::Range<usize> {
        let end = p + 1;
        let start = match self.window {
            Some(w) => end.saturating_sub(w),
            None => 0,
        };
        match self.chunk {
            Some(c) if c > 0 => start.max(p / c * c)..end,
            _ => start..end,
        }
    }
}

/// Causal GQA for `seq` query rows: row t sees positions `0..=pos + t` (the last `window`
/// of them on a sliding-window layer); query head j reads
/// kv head `j / (n_heads / n_kv_heads)`. `q`, `out`: (seq, n_heads * head_dim); `k`, `v`:
/// (pos + seq, n_kv_heads * head_dim). `scores` is scratch (grown to fit) for the serial path.
///
/// Parallel over (row, head) when the work is above [`ATTN_PAR_MIN_MACS`] and the pool has
/// more than one thread. Every head's output depends only on its inputs, so both paths give
/// the same bits.
pub fn attention<T: KvElem>(
    out: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    a: AttnShape,
    scores: &mut Vec<f32>,
) {
    let parallel = a.seq * a.n_heads * (a.pos + a.seq) * a.head_dim >= ATTN_PAR_MIN_MACS;
    attention_with(
        out,
        q,
        k,
        v,
        a,
        scores,
        parallel && rayon::current_num_threads() > 1,
    )
}

/// Heads per call of [`attend_heads`]: a whole group of `group` heads that share their cached
/// rows (each block of rows is then read once for all of them), or one head where a parallel
/// pass over `groups` such calls would leave threads idle (a decode step with few kv heads).
pub fn heads_per_item(parallel: bool, groups: usize, group: usize) -> usize {
    if parallel && groups < rayon::current_num_threads() {
        1
    } else {
        group
    }
}

/// `item(i, piece i, scores)` over `out` cut into pieces of `len`: on the team when
/// `parallel`, else in order on this thread; `scores` is the caller's scratch where it passes
/// one to a serial pass, else a thread's own (borrowed for one item at a time: an item never
/// forks, so no thread re-enters it). Every attention form's outer loop (GQA here, MLA's two).
pub fn for_each_attention_item(
    out: &mut [f32],
    len: usize,
    parallel: bool,
    scores: Option<&mut Vec<f32>>,
    item: impl Fn(usize, &mut [f32], &mut Vec<f32>) + Sync + Send,
) {
    thread_local! {
        /// Scores scratch of attention items run without the caller's.
        static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    }
    let own = |i: usize, o: &mut [f32]| SCORES.with_borrow_mut(|s| item(i, o, s));
    match (parallel, scores) {
        (true, _) => team::for_each_chunk_mut(out, len, own),
        (false, Some(s)) => {
            for (i, o) in out.chunks_mut(len).enumerate() {
                item(i, o, s);
            }
        }
        (false, None) => {
            for (i, o) in out.chunks_mut(len).enumerate() {
                own(i, o);
            }
        }
    }
}

/// [`attention`] with the serial / parallel choice made by the caller (tests compare them).
pub fn attention_with<T: KvElem>(
    out: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    a: AttnShape,
    scores: &mut Vec<f32>,
    parallel: bool,
) {
    let (hd, q_dim, kv_dim) = (
        a.head_dim,
        a.n_heads * a.head_dim,
        a.n_kv_heads * a.head_dim,
    );
    let group = a.n_heads / a.n_kv_heads;
    let max_pos = a.pos + a.seq;
    assert!(
        q.len() >= a.seq * q_dim && k.len() >= max_pos * kv_dim && v.len() >= max_pos * kv_dim,
        "attention: short inputs"
    );
    let per = heads_per_item(parallel, a.seq * a.n_kv_heads, group);
    let items_per_row = a.n_heads / per;
    let item = |i: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (t, first) = (i / items_per_row, (i % items_per_row) * per);
        let qh = &q[t * q_dim + first * hd..t * q_dim + (first + per) * hd];
        let rows = HeadRows {
            stride: kv_dim,
            off: first / group * hd,
            width: hd,
        };
        let span = a.span(a.pos + t);
        attend_heads(o, qh, k, v, (rows, rows), span, a.scale, a.softcap, scores);
    };
    let out = &mut out[..a.seq * q_dim];
    for_each_attention_item(out, per * hd, parallel, Some(scores), item);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunked attention (llama4): a row sees only its own chunk's positions, and with a
    /// window too, the later of the two starts.
    #[test]
    fn chunked_span_starts_at_the_rows_chunk() {
        let a = AttnShape {
            seq: 1,
            pos: 0,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
            softcap: None,
            window: None,
            chunk: Some(4),
        };
        let spans: Vec<_> = (0..9).map(|p| a.span(p)).collect();
        assert_eq!(
            spans,
            [0..1, 0..2, 0..3, 0..4, 4..5, 4..6, 4..7, 4..8, 8..9]
        );
        let w = AttnShape {
            window: Some(2),
            ..a
        };
        assert_eq!((w.span(3), w.span(4), w.span(6)), (2..4, 4..5, 5..7));
    }

    #[test]
    fn rope_styles_pair_different_dimensions() {
        let mut a: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let mut b = a.clone();
        rope(&mut a, 8, 3, 10000.0, RopeStyle::Neox);
        rope(&mut b, 8, 3, 10000.0, RopeStyle::Normal);
        assert_ne!(a, b);
        // Rotation keeps each pair's norm.
        let n = |x: f32, y: f32| (x * x + y * y).sqrt();
        assert!((n(a[0], a[4]) - n(1.0, 5.0)).abs() < 1e-5);
        assert!((n(b[0], b[1]) - n(1.0, 2.0)).abs() < 1e-5);
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let mut a: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let orig = a.clone();
        rope(&mut a, 8, 0, 10000.0, RopeStyle::Neox);
        assert_eq!(a, orig);
    }

    #[test]
    fn rope_table_matches_the_direct_formula() {
        // The per-model / per-position tables must give the bits of the textbook formula.
        for style in [RopeStyle::Neox, RopeStyle::Normal] {
            let mut a: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin() * 50.0).collect();
            let mut b = a.clone();
            rope(&mut a, 64, 1234, 1_000_000.0, style);
            for head in b.chunks_exact_mut(64) {
                for i in 0..32 {
                    let f = libm::pow(1_000_000.0, -2.0 * i as f64 / 64.0);
                    let (s, c) = libm::sincos(1234.0 * f);
                    let (ia, ib) = if style == RopeStyle::Neox {
                        (i, i + 32)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (head[ia], head[ib]);
                    head[ia] = x0 * c as f32 - x1 * s as f32;
                    head[ib] = x0 * s as f32 + x1 * c as f32;
                }
            }
            assert_eq!(a, b, "{style:?}");
        }
    }

    #[test]
    fn dot_f32_is_close_to_f64_and_handles_tails() {
        for n in [0usize, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).sin() * 3.0).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert!((dot_f32(&a, &b) as f64 - exact).abs() < 1e-4, "n={n}");
        }
    }

    /// SplitMix64 for reproducible test data.
    fn rng(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn floats(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((rng(seed) >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale)
            .collect()
    }

    /// Random Q5_0 (22-byte) or Q8_0 (34-byte) blocks with small finite f16 scales.
    fn blocks(dtype: knot_format::DType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
        let bb = dtype.block_bytes();
        let mut v: Vec<u8> = (0..n_blocks * bb).map(|_| rng(seed) as u8).collect();
        for b in v.chunks_exact_mut(bb) {
            let d = half::f16::from_f32(0.001 + (rng(seed) % 1000) as f32 * 1e-5);
            b[..2].copy_from_slice(&d.to_le_bytes());
        }
        v
    }

    fn pool(n: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("pool")
    }

    #[test]
    fn fused_linears_equal_separate_ones_bit_for_bit() {
        use super::super::kernels::{linear, linears, Linear, QMatrix};
        use knot_format::DType;
        let mut seed = 7u64;
        let cols = 256;
        let shapes = [(DType::Q5_0, 96usize), (DType::Q5_0, 40), (DType::Q8_0, 16)];
        let data: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(d, r)| blocks(d, r * cols / 32, &mut seed))
            .collect();
        let mats: Vec<Linear<'_>> = shapes
            .iter()
            .zip(&data)
            .map(|(&(d, r), b)| Linear::new(QMatrix::new(d, r, cols, b).expect("matrix")))
            .collect();
        for n_tok in [1usize, 3, 8] {
            let x = floats(n_tok * cols, &mut seed, 40.0);
            let want: Vec<Vec<f32>> = mats
                .iter()
                .map(|w| {
                    let mut y = vec![0.0; n_tok * w.rows];
                    linear(w, &x, n_tok, &mut y);
                    y
                })
                .collect();
            for threads in [1, 2] {
                let mut ys: Vec<Vec<f32>> = mats
                    .iter()
                    .map(|w| vec![f32::NAN; n_tok * w.rows])
                    .collect();
                pool(threads).install(|| {
                    let [a, b, c] = &mut ys[..] else {
                        unreachable!()
                    };
                    linears(
                        &mut [
                            (&mats[0], &mut a[..]),
                            (&mats[1], &mut b[..]),
                            (&mats[2], &mut c[..]),
                        ],
                        &x,
                        n_tok,
                    );
                });
                for (y, w) in ys.iter().zip(&want) {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(y), bits(w), "n_tok {n_tok}, {threads} thread(s)");
                }
            }
        }
    }

    /// An f16 cache is the f32 arithmetic over the rounded rows (bit for bit, serial and
    /// parallel), and close to the unrounded f32 result.
    #[test]
    fn attention_over_an_f16_cache_is_f32_attention_of_the_rounded_rows() {
        let mut seed = 5u64;
        let a = AttnShape {
            seq: 3,
            pos: 20,
            n_heads: 14,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 1.0 / 8.0,
            softcap: None,
            window: None,
            chunk: None,
        };
        let (q_dim, kv_dim, n) = (14 * 64, 2 * 64, 23);
        let q = floats(a.seq * q_dim, &mut seed, 3.0);
        let k = floats(n * kv_dim, &mut seed, 3.0);
        let v = floats(n * kv_dim, &mut seed, 3.0);
        let half = |x: &[f32]| {
            x.iter()
                .map(|&f| half::f16::from_f32(f))
                .collect::<Vec<_>>()
        };
        let (k16, v16) = (half(&k), half(&v));
        let round = |x: &[half::f16]| x.iter().map(|h| h.to_f32()).collect::<Vec<_>>();
        let (kr, vr) = (round(&k16), round(&v16));
        let run = |k: &(dyn Fn(&mut [f32], bool) + Sync)| {
            let mut o = vec![0.0; a.seq * q_dim];
            k(&mut o, false);
            let mut p = vec![0.0; a.seq * q_dim];
            pool(2).install(|| k(&mut p, true));
            assert_eq!(bits(&o), bits(&p), "serial vs parallel");
            o
        };
        let f16_out = run(&|o, par| attention_with(o, &q, &k16, &v16, a, &mut Vec::new(), par));
        let rounded = run(&|o, par| attention_with(o, &q, &kr, &vr, a, &mut Vec::new(), par));
        let exact = run(&|o, par| attention_with(o, &q, &k, &v, a, &mut Vec::new(), par));
        assert_eq!(bits(&f16_out), bits(&rounded));
        let max = f16_out
            .iter()
            .zip(&exact)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max > 0.0 && max < 0.05,
            "f16 cache moved attention by {max}"
        );
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Causal GQA written out the plain way in f64: softmax over `q·k * scale` of the
    /// positions each row sees, then the weighted sum of the values.
    fn reference_attention(q: &[f32], k: &[f32], v: &[f32], a: AttnShape) -> Vec<f64> {
        let (hd, kv_dim) = (a.head_dim, a.n_kv_heads * a.head_dim);
        let mut out = vec![0.0f64; a.seq * a.n_heads * hd];
        for t in 0..a.seq {
            for h in 0..a.n_heads {
                let kvh = h * a.n_kv_heads / a.n_heads;
                let qh = &q[(t * a.n_heads + h) * hd..][..hd];
                let span = a.span(a.pos + t);
                let scores: Vec<f64> = span
                    .clone()
                    .map(|p| {
                        let kr = &k[p * kv_dim + kvh * hd..][..hd];
                        qh.iter()
                            .zip(kr)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>()
                            * a.scale as f64
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let z: f64 = e.iter().sum();
                let o = &mut out[(t * a.n_heads + h) * hd..][..hd];
                for (p, w) in span.zip(&e) {
                    let vr = &v[p * kv_dim + kvh * hd..][..hd];
                    for (o, &y) in o.iter_mut().zip(vr) {
                        *o += w / z * y as f64;
                    }
                }
            }
        }
        out
    }

    /// The f16 cache's kernel against the plain f64 reference over the rounded rows, with and
    /// without a window, serial and parallel: within f32 rounding of it (relative 1e-5 of the
    /// values' scale), far closer than the f16 rounding itself moves the result.
    #[test]
    fn f16_attention_matches_a_scalar_reference() {
        let mut seed = 21u64;
        for window in [None, Some(6)] {
            let a = AttnShape {
                seq: 4,
                pos: 17,
                n_heads: 14,
                n_kv_heads: 2,
                head_dim: 64,
                scale: 1.0 / 8.0,
                softcap: None,
                window,
                chunk: None,
            };
            let (q_dim, kv_dim, n) = (14 * 64, 2 * 64, 21);
            let q = floats(a.seq * q_dim, &mut seed, 3.0);
            let k = floats(n * kv_dim, &mut seed, 3.0);
            let v = floats(n * kv_dim, &mut seed, 3.0);
            let k16: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
            let v16: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            let kr: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
            let vr: Vec<f32> = v16.iter().map(|h| h.to_f32()).collect();
            let want = reference_attention(&q, &kr, &vr, a);
            let unrounded = reference_attention(&q, &k, &v, a);
            for parallel in [false, true] {
                let mut got = vec![0.0f32; a.seq * q_dim];
                pool(2).install(|| {
                    attention_with(&mut got, &q, &k16, &v16, a, &mut Vec::new(), parallel)
                });
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(&g, &w)| (g as f64 - w).abs())
                    .fold(0.0, f64::max);
                let rounding = unrounded
                    .iter()
                    .zip(&want)
                    .map(|(&u, &w)| (u - w).abs())
                    .fold(0.0, f64::max);
                assert!(
                    err < 3e-5,
                    "window {window:?} parallel {parallel}: off the reference by {err}"
                );
                assert!(
                    rounding > 100.0 * err,
                    "f16 rounding moved the result by only {rounding} (kernel error {err})"
                );
            }
        }
    }

    #[test]
    fn attention_serial_and_parallel_give_the_same_bits() {
        let mut seed = 11u64;
        // Qwen2.5-0.5B's head layout: 14 query heads over 2 kv heads of 64.
        let a = AttnShape {
            seq: 5,
            pos: 9,
            n_heads: 14,
            n_kv_heads: 2,
            head_dim: 64,
            scale: 1.0 / 8.0,
            softcap: None,
            window: None,
            chunk: None,
        };
        let (q_dim, kv_dim, n) = (14 * 64, 2 * 64, 14);
        let q = floats(a.seq * q_dim, &mut seed, 3.0);
        let k = floats(n * kv_dim, &mut seed, 3.0);
        let v = floats(n * kv_dim, &mut seed, 3.0);
        let mut serial = vec![0.0; a.seq * q_dim];
        let mut par = vec![0.0; a.seq * q_dim];
        let mut scores = Vec::new();
        attention_with(&mut serial, &q, &k, &v, a, &mut scores, false);
        pool(2).install(|| attention_with(&mut par, &q, &k, &v, a, &mut Vec::new(), true));
        assert_eq!(
            serial.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            par.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
        );
        // Row 0 sees positions 0..=9 only: changing a later key must not move it.
        let mut k2 = k.clone();
        k2[12 * kv_dim] += 100.0;
        let mut moved = vec![0.0; a.seq * q_dim];
        attention_with(&mut moved, &q, &k2, &v, a, &mut scores, false);
        assert_eq!(
            moved[..q_dim],
            serial[..q_dim],
            "causal mask leaked a future position"
        );
        assert_ne!(moved[4 * q_dim..], serial[4 * q_dim..]);
    }

    #[test]
    fn sliding_window_sees_only_the_last_window_positions() {
        let mut seed = 5u64;
        let a = AttnShape {
            seq: 3,
            pos: 7,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 16,
            scale: 0.25,
            softcap: None,
            window: Some(4),
            chunk: None,
        };
        let (q_dim, kv_dim, n) = (4 * 16, 16, 10);
        let q = floats(a.seq * q_dim, &mut seed, 2.0);
        let k = floats(n * kv_dim, &mut seed, 2.0);
        let v = floats(n * kv_dim, &mut seed, 2.0);
        let mut out = vec![0.0; a.seq * q_dim];
        let mut scores = Vec::new();
        attention_with(&mut out, &q, &k, &v, a, &mut scores, false);
        // Row 0 (position 7) sees 4..=7: changing position 3 must not move it, and it must
        // equal a head attending over exactly those positions.
        let mut k2 = k.clone();
        k2[3 * kv_dim..4 * kv_dim]
            .iter_mut()
            .for_each(|x| *x += 50.0);
        let mut moved = vec![0.0; a.seq * q_dim];
        attention_with(&mut moved, &q, &k2, &v, a, &mut scores, false);
        assert_eq!(moved, out, "a position outside the window leaked in");
        let mut one = vec![0.0; 16];
        let rows = HeadRows {
            stride: kv_dim,
            off: 0,
            width: 16,
        };
        attend_heads(
            &mut one,
            &q[..16],
            &k,
            &v,
            (rows, rows),
            4..8,
            0.25,
            None,
            &mut Vec::new(),
        );
        assert_eq!(one, out[..16]);
        // Without the window, position 3 matters.
        let full = AttnShape { window: None, ..a };
        attention_with(&mut moved, &q, &k2, &v, full, &mut scores, false);
        assert_ne!(moved[..16], out[..16]);
        // Serial and parallel agree with a window too.
        let mut par = vec![0.0; a.seq * q_dim];
        pool(2).install(|| attention_with(&mut par, &q, &k, &v, a, &mut Vec::new(), true));
        assert_eq!(par, out);
    }

    #[test]
    fn geglu_uses_the_tanh_gelu() {
        // GELU-tanh(1) = 0.8411920, GELU-tanh(-1) = -0.1588080, GELU(0) = 0.
        let mut g = vec![1.0f32, -1.0, 0.0, 3.0];
        geglu_tanh(&mut g, &[2.0, 1.0, 5.0, 1.0]);
        assert!((g[0] - 2.0 * 0.841_192).abs() < 1e-5, "{g:?}");
        assert!((g[1] + 0.158_808).abs() < 1e-5, "{g:?}");
        assert_eq!(g[2], 0.0);
        assert!((g[3] - 2.996_363).abs() < 1e-5, "{g:?}");
        let mut l = vec![0.0f32, 10.0, -1000.0];
        softcap(&mut l, 30.0);
        assert_eq!(l[0], 0.0);
        assert!((l[1] - 30.0 * (1.0f32 / 3.0).tanh()).abs() < 1e-5);
        assert!((l[2] + 30.0).abs() < 1e-4);
    }

    /// [`exp`] against f64's exp rounded to f32: within one ulp on a sweep of every 97th f32
    /// in [-104, 89] (and exact on most), the special values right.
    #[test]
    fn portable_exp_is_within_an_ulp() {
        let (mut n, mut exact) = (0u64, 0u64);
        let mut b = 0u32;
        while b < 0x8000_0000 {
            for x in [f32::from_bits(b), -f32::from_bits(b)] {
                if !(-104.0..89.0).contains(&x) {
                    continue;
                }
                let (got, want) = (exp(x), (x as f64).exp() as f32);
                let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 1, "exp({x:e}) = {got:e}, f64 gives {want:e}");
                n += 1;
                exact += (ulps == 0) as u64;
            }
            b += 97;
        }
        assert!(exact as f64 > 0.9999 * n as f64, "{exact} of {n} exact");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        // The smallest subnormal's neighbourhood rounds as f64 says.
        assert_eq!(exp(-103.5).to_bits(), ((-103.5f64).exp() as f32).to_bits());
    }

    #[test]
    fn portable_tanh_is_within_two_ulps() {
        let mut b = 0u32;
        while b < 0x4200_0000 {
            let x = f32::from_bits(b);
            for x in [x, -x] {
                let (got, want) = (tanh(x), (x as f64).tanh() as f32);
                let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 2, "tanh({x:e}) = {got:e}, f64 gives {want:e}");
            }
            b += 4099;
        }
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    /// The element-wise loops and an attention head give the plain loop's bits compiled for
    /// every lane ISA this CPU has (`kernels::lanes`), on lengths no vector width divides and
    /// values across tanh's and exp's branches (tiny, signed zeros, saturated, infinite).
    #[test]
    fn every_lane_isa_gives_the_plain_bits() {
        use crate::kernels::lanes::lane_isas;
        let n = 1000 + 13;
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i as f32 * 0.618_034).fract() - 0.5) * 24.0)
            .collect();
        x[..8].copy_from_slice(&[0.0, -0.0, 1e-5, -3e-4, 9.5, -11.0, 1e-30, -1e-38]);
        x[8] = f32::INFINITY;
        let up: Vec<f32> = x.iter().map(|v| 1.0 - v / 7.0).collect();
        let (hd, kv_dim, pos) = (72, 144, 37);
        let k: Vec<f32> = (0..pos * kv_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let v: Vec<f32> = (0..pos * kv_dim).map(|i| (i as f32 * 0.11).cos()).collect();
        let kh: Vec<half::f16> = k.iter().map(|&a| half::f16::from_f32(a)).collect();
        let vh: Vec<half::f16> = v.iter().map(|&a| half::f16::from_f32(a)).collect();
        let q = &x[9..9 + hd];
        let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
        let run = |isa| {
            vectorized!(isa => {
                let mut out = Vec::new();
                let mut a = x.clone();
                gelu_tanh_lanes(&mut a);
                out.extend(bits(&a));
                let mut a = x.clone();
                geglu_tanh_lanes(&mut a, &up);
                out.extend(bits(&a));
                let mut a = x[9..].to_vec();
                swiglu_lanes(&mut a, &up[9..]);
                out.extend(bits(&a));
                let mut a = x.clone();
                softcap_lanes(&mut a, 30.0);
                out.extend(bits(&a));
                let mut a = x[9..].to_vec();
                softmax_lanes(&mut a);
                out.extend(bits(&a));
                let (mut o, mut sc) = (vec![0.0; hd], vec![0.0; pos]);
                let r1 = HeadRows { stride: kv_dim, off: hd, width: hd };
                attend_heads_lanes(&mut o, q, &k, &v, r1, r1, 3..pos, 0.12, Some(5.0), &mut sc, scores::for_lanes(isa));
                out.extend(bits(&o));
                let r0 = HeadRows { stride: kv_dim, off: 0, width: hd };
                attend_heads_lanes(&mut o, q, &kh, &vh, r0, r0, 0..pos, 0.12, None, &mut sc, scores::for_lanes(isa));
                out.extend(bits(&o));
                out
            })
        };
        let want = run(lane_isas()[0]);
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        for isa in lane_isas() {
            assert!(run(isa) == want, "{isa:?} differs from the plain loops");
        }
    }

    /// The attention head one position at a time, as it was: the blocked loops' bit reference.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn attend_head_per_position<T: KvElem>(
        out: &mut [f32],
        q: &[f32],
        k: &[T],
        v: &[T],
        span: std::ops::Range<usize>,
        kv_dim: usize,
        kv_head: usize,
        scale: f32,
        cap: Option<f32>,
        scores: &mut [f32],
    ) {
        let hd = q.len();
        let off = kv_head * hd;
        let n = span.len();
        let mut buf = vec![0.0f32; hd];
        for (p, s) in span.clone().zip(scores[..n].iter_mut()) {
            let kr = T::widen(&k[p * kv_dim + off..p * kv_dim + off + hd], &mut buf);
            *s = dot_f32(q, kr) * scale;
        }
        if let Some(cap) = cap {
            softcap_lanes(&mut scores[..n], cap);
        }
        softmax_lanes(&mut scores[..n]);
        out.fill(0.0);
        for (p, &w) in span.zip(scores[..n].iter()) {
            let vr = T::widen(&v[p * kv_dim + off..p * kv_dim + off + hd], &mut buf);
            for (o, &vv) in out.iter_mut().zip(vr) {
                *o += w * vv;
            }
        }
    }

    /// The blocked score and value loops give the bits of one head and one position at a
    /// time, with and without the 16-position kernel, for one head and for groups of heads, on
    /// heads with and without a tail past the last 16 elements, spans with and without a
    /// partial block, f32 and f16 rows, with a cap.
    #[test]
    fn attention_head_blocks_give_the_per_position_bits() {
        let mut seed = 77u64;
        for (hd, n) in [
            (64usize, 53usize),
            (72, 37),
            (16, 16),
            (128, 33),
            (24, 5),
            (300, 20),
        ] {
            let kv_dim = 2 * hd;
            let k = floats(n * kv_dim, &mut seed, 2.0);
            let v = floats(n * kv_dim, &mut seed, 2.0);
            let kh: Vec<half::f16> = k.iter().map(|&a| half::f16::from_f32(a)).collect();
            let vh: Vec<half::f16> = v.iter().map(|&a| half::f16::from_f32(a)).collect();
            let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            for heads in [1usize, 3] {
                let q = floats(heads * hd, &mut seed, 2.0);
                for cap in [None, Some(4.0)] {
                    let (mut want, mut want16) = (vec![0.0; heads * hd], vec![0.0; heads * hd]);
                    let mut sc = vec![0.0; heads * n];
                    for ((w, w16), qh) in want
                        .chunks_mut(hd)
                        .zip(want16.chunks_mut(hd))
                        .zip(q.chunks(hd))
                    {
                        attend_head_per_position(w, qh, &k, &v, 1..n, kv_dim, 1, 0.1, cap, &mut sc);
                        attend_head_per_position(
                            w16,
                            qh,
                            &kh,
                            &vh,
                            0..n,
                            kv_dim,
                            0,
                            0.1,
                            cap,
                            &mut sc,
                        );
                    }
                    for by16 in [None, scores::for_lanes(lane_isa())] {
                        let mut got = vec![0.0; heads * hd];
                        let on = by16.is_some();
                        let r1 = HeadRows {
                            stride: kv_dim,
                            off: hd,
                            width: hd,
                        };
                        attend_heads_lanes(
                            &mut got,
                            &q,
                            &k,
                            &v,
                            r1,
                            r1,
                            1..n,
                            0.1,
                            cap,
                            &mut sc,
                            by16,
                        );
                        assert_eq!(bits(&got), bits(&want), "f32 hd {hd} n {n} x{heads} {on}");
                        let r0 = HeadRows {
                            stride: kv_dim,
                            off: 0,
                            width: hd,
                        };
                        attend_heads_lanes(
                            &mut got,
                            &q,
                            &kh,
                            &vh,
                            r0,
                            r0,
                            0..n,
                            0.1,
                            cap,
                            &mut sc,
                            by16,
                        );
                        assert_eq!(bits(&got), bits(&want16), "f16 hd {hd} n {n} x{heads} {on}");
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1000.0, 999.0, -5.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[0] > x[1] && x[1] > x[2]);
    }

    #[test]
    fn rmsnorm_unit_weights_gives_unit_rms() {
        let x = vec![3.0f32, -4.0, 5.0, 0.0];
        let mut o = vec![0.0; 4];
        rmsnorm(&mut o, &x, &[1.0; 4], 0.0);
        let rms = (o.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }
}
