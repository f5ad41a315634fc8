//! Scalar reference kernels: the specification every SIMD variant is tested against.
//!
//! `dequantize_row_*` follow ggml's `dequantize_row_*` line by line. `vec_dot_*_q8a_ref`
//! compute the dot product of one weight row with an activation row quantized by
//! [`quantize_row_q8a`]: integer sums per 32-element group (exact), scaled in f32.
//!
//! All functions take whole rows: `w.len()` is a multiple of the block size and the
//! activation slice has `elements / 32` blocks. Lengths are the caller's contract
//! (checked by `QMatrix::new` and `matmul`), so mismatches panic via slice indexing.

// Index loops mirror ggml's C line by line, which is the point of a reference.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::{Dequant, Dot, KernelRow};
use bytemuck::cast_slice;
use knot_format::dtype::{DType, QK};

/// The reference kernels of `dtype`: the one place that lists every type's kernels (SIMD
/// flavours replace entries of this row, see [`super::Kernels`]).
pub fn row(dtype: DType) -> KernelRow {
    let (dequant, dot): (Dequant, Dot) = match dtype {
        DType::F32 => (dequantize_row_f32, Dot::Float(vec_dot_f32_ref)),
        DType::F16 => (dequantize_row_f16, Dot::Float(vec_dot_f16_ref)),
        DType::BF16 => (dequantize_row_bf16, Dot::Float(vec_dot_bf16_ref)),
        DType::Q4_0 => (dequantize_row_q4_0, Dot::Quant(vec_dot_q4_0_q8a_ref)),
        DType::Q4_1 => (dequantize_row_q4_1, Dot::Quant(vec_dot_q4_1_q8a_ref)),
        DType::Q5_0 => (dequantize_row_q5_0, Dot::Quant(vec_dot_q5_0_q8a_ref)),
        DType::Q5_1 => (dequantize_row_q5_1, Dot::Quant(vec_dot_q5_1_q8a_ref)),
        DType::Q8_0 => (dequantize_row_q8_0, Dot::Quant(vec_dot_q8_0_q8a_ref)),
        DType::Q2_K => (dequantize_row_q2_k, Dot::Quant(vec_dot_q2_k_q8a_ref)),
        DType::Q3_K => (dequantize_row_q3_k, Dot::Quant(vec_dot_q3_k_q8a_ref)),
        DType::Q4_K => (dequantize_row_q4_k, Dot::Quant(vec_dot_q4_k_q8a_ref)),
        DType::Q5_K => (dequantize_row_q5_k, Dot::Quant(vec_dot_q5_k_q8a_ref)),
        DType::Q6_K => (dequantize_row_q6_k, Dot::Quant(vec_dot_q6_k_q8a_ref)),
        DType::IQ4_NL => (dequantize_row_iq4_nl, Dot::Quant(vec_dot_iq4_nl_q8a_ref)),
        DType::IQ4_XS => (dequantize_row_iq4_xs, Dot::Quant(vec_dot_iq4_xs_q8a_ref)),
        DType::MXFP4 => (dequantize_row_mxfp4, Dot::Quant(vec_dot_mxfp4_q8a_ref)),
    };
    KernelRow {
        dequant,
        dot,
        rows16: None,
        rows16_float: None,
        float4: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantization
// ---------------------------------------------------------------------------------------------

/// f32 row (little-endian bytes) to f32.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// f16 row to f32.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_le([b[0], b[1]]);
    }
}

/// bf16 row to f32.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_le([b[0], b[1]]);
    }
}

/// Q4_0 row to f32.
pub fn dequantize_row_q4_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_0] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(b.d);
        for j in 0..QK / 2 {
            y[j] = ((b.qs[j] & 0xF) as i32 - 8) as f32 * d;
            y[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Q4_1 row to f32.
pub fn dequantize_row_q4_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_1] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for j in 0..QK / 2 {
            y[j] = (b.qs[j] & 0xF) as f32 * d + m;
            y[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit quants of a Q5_0 / Q5_1 block, element order.
#[inline(always)]
fn q5_values(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        q[j] = (qs[j] & 0xF) | h0;
        q[j + 16] = (qs[j] >> 4) | h1;
    }
    q
}

/// Q5_0 row to f32.
pub fn dequantize_row_q5_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_0] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(b.d);
        let q = q5_values(&b.qs, b.qh);
        for j in 0..QK {
            y[j] = (q[j] as i32 - 16) as f32 * d;
        }
    }
}

/// Q5_1 row to f32.
pub fn dequantize_row_q5_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_1] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let q = q5_values(&b.qs, b.qh);
        for j in 0..QK {
            y[j] = q[j] as f32 * d + m;
        }
    }
}

/// Q8_0 row to f32.
pub fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_0] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(b.d);
        for j in 0..QK {
            y[j] = b.qs[j] as f32 * d;
        }
    }
}

/// Q2_K row to f32.
pub fn dequantize_row_q2_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ2K] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        let mut o = 0;
        let mut is = 0;
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                    for l in 0..16 {
                        y[o] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                        o += 1;
                    }
                }
            }
        }
    }
}

/// Q3_K row to f32.
pub fn dequantize_row_q3_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ3K] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(b.d);
        let scales = scales_q3k(&b.scales);
        let mut o = 0;
        let mut is = 0;
        let mut m = 1u8;
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d * scales[is] as f32;
                    is += 1;
                    for l in 0..16 {
                        let i = l + 16 * half;
                        let v =
                            ((q[i] >> shift) & 3) as i32 - if b.hmask[i] & m != 0 { 0 } else { 4 };
                        y[o] = dl * v as f32;
                        o += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Q4_K row to f32.
pub fn dequantize_row_q4_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4K] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        for j in 0..4 {
            let q = &b.qs[32 * j..32 * j + 32];
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, mm1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[64 * j + l] = d1 * (q[l] & 0xF) as f32 - mm1;
                y[64 * j + 32 + l] = d2 * (q[l] >> 4) as f32 - mm2;
            }
        }
    }
}

/// Q5_K row to f32.
pub fn dequantize_row_q5_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5K] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let (d, min) = (f16_le(b.d), f16_le(b.dmin));
        for j in 0..4 {
            let q = &b.qs[32 * j..32 * j + 32];
            let (u1, u2) = (1u8 << (2 * j), 1u8 << (2 * j + 1));
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, mm1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                y[64 * j + l] = d1 * ((q[l] & 0xF) + h1) as f32 - mm1;
                y[64 * j + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - mm2;
            }
        }
    }
}

/// The four 6-bit quants (minus 32) at position `l` (0..32) of 128-element half `n` of a
/// Q6_K block, for elements `128n + l + 32k`, k = 0..4.
#[inline(always)]
fn q6k_quad(b: &BlockQ6K, n: usize, l: usize) -> [i32; 4] {
    let ql = &b.ql[64 * n..];
    let qh = b.qh[32 * n + l];
    [
        ((ql[l] & 0xF) | ((qh & 3) << 4)) as i32 - 32,
        ((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4)) as i32 - 32,
        ((ql[l] >> 4) | (((qh >> 4) & 3) << 4)) as i32 - 32,
        ((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4)) as i32 - 32,
    ]
}

/// Q6_K row to f32.
pub fn dequantize_row_q6_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ6K] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(b.d);
        for n in 0..2 {
            let sc = &b.scales[8 * n..];
            for l in 0..32 {
                let is = l / 16;
                let q = q6k_quad(b, n, l);
                for k in 0..4 {
                    y[128 * n + l + 32 * k] = d * sc[is + 2 * k] as f32 * q[k] as f32;
                }
            }
        }
    }
}

/// The 32 table values of one IQ4_NL / IQ4_XS index run (16 bytes), element order.
#[inline(always)]
fn iq4_values(qs: &[u8]) -> [i32; 32] {
    let mut v = [0i32; 32];
    for j in 0..16 {
        v[j] = KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32;
        v[j + 16] = KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
    }
    v
}

/// IQ4_NL row to f32.
pub fn dequantize_row_iq4_nl(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ4NL] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = f16_le(b.d);
        for (o, v) in y.iter_mut().zip(iq4_values(&b.qs)) {
            *o = d * v as f32;
        }
    }
}

/// The 32 doubled e2m1 values of one MXFP4 block's codes (16 bytes), element order.
#[inline(always)]
fn mxfp4_values(qs: &[u8]) -> [i32; 32] {
    let mut v = [0i32; 32];
    for j in 0..16 {
        v[j] = KVALUES_MXFP4[(qs[j] & 0xF) as usize] as i32;
        v[j + 16] = KVALUES_MXFP4[(qs[j] >> 4) as usize] as i32;
    }
    v
}

/// MXFP4 row to f32: `e8m0_half(e) * value` (ggml's `dequantize_row_mxfp4`).
pub fn dequantize_row_mxfp4(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockMXFP4] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = e8m0_half(b.e);
        for (o, v) in y.iter_mut().zip(mxfp4_values(&b.qs)) {
            *o = v as f32 * d;
        }
    }
}

/// IQ4_XS row to f32: `dl = d * (ls - 32)`, then `dl * value`.
pub fn dequantize_row_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ4XS] = cast_slice(src);
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(b.d);
        for (ib, y) in y.chunks_exact_mut(QK).enumerate() {
            let dl = d * (b.scale(ib) - 32) as f32;
            for (o, v) in y.iter_mut().zip(iq4_values(&b.qs[16 * ib..16 * ib + 16])) {
                *o = dl * v as f32;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization
// ---------------------------------------------------------------------------------------------

/// Quantize `x` (a multiple of 32 long) into `out` (`x.len() / 32` blocks):
/// `d = max|x| / 127`, `q = round(x / d)`, `s = d * sum(q)`.
///
/// The specification, bit for bit, of the SIMD versions: `max` skips NaN, `x / d` is
/// `x * (1 / d)` in f32, `round` is half away from zero (`roundf`, not the hardware's
/// half-to-even), clamped to +-127, and NaN quantizes to 0 (`as i8`).
pub fn quantize_row_q8a(x: &[f32], out: &mut [BlockQ8A]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_row_q8a: length mismatch");
    for (xb, o) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sums = [0i16; 2];
        for (j, v) in xb.iter().enumerate() {
            let q = (v * id).round().clamp(-127.0, 127.0) as i8;
            o.qs[j] = q;
            sums[j / 16] += q as i16;
        }
        o.d = d;
        o.s = d * (sums[0] as i32 + sums[1] as i32) as f32;
        o.sums = sums;
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products: float weights against f32 activations
// ---------------------------------------------------------------------------------------------

/// Partial sums of the canonical float-dot order ([`float_dot`]).
pub const FLOAT_LANES: usize = 32;

/// The canonical order of the float-weight dots (F32, F16, BF16), which every flavour follows
/// bit for bit: [`FLOAT_LANES`] partial sums, element `i` (in increasing order) into lane
/// `i % 32` with one rounding, `acc[i % 32] = fma(w_i, x_i, acc[i % 32])`, then the fixed
/// pairwise tree of [`float_lanes_sum`]. Widening f16 and bf16 to f32 is exact, so the weight
/// type only changes the load.
///
/// Why 32 lanes: four 8-lane AVX2 registers or eight 4-lane NEON registers, independent FMA
/// chains enough to hide the FMA latency on both (x86's earlier kernel already had these 32;
/// NEON's had 16); the tree is what their horizontal adds do in a few instructions.
#[inline(always)]
pub(super) fn float_dot(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    let mut acc = [0f32; FLOAT_LANES];
    for i in 0..n {
        acc[i % FLOAT_LANES] = w(i).mul_add(x[i], acc[i % FLOAT_LANES]);
    }
    float_lanes_sum(acc)
}

/// The canonical float dot's reduction of its 32 lanes: fold the upper half onto the lower,
/// `a[l] += a[l + h]` for `l < h`, with h = 16, 8, 4, 2, 1 (AVX2: register pairs (0, 2) and
/// (1, 3), then the two sums, then its 128-bit halves, `movehl`, `movehdup`; NEON: (k, k + 4),
/// (k, k + 2), the pair, low + high halves, `faddp`).
#[inline(always)]
pub(super) fn float_lanes_sum(mut a: [f32; FLOAT_LANES]) -> f32 {
    let mut h = FLOAT_LANES / 2;
    while h >= 1 {
        for l in 0..h {
            a[l] += a[l + h];
        }
        h /= 2;
    }
    a[0]
}

/// dot(f32 row, x), in the canonical order of [`float_dot`].
pub fn vec_dot_f32_ref(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 4);
    float_dot(
        n,
        |i| f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
        x,
    )
}

/// dot(f16 row, x), in the canonical order of [`float_dot`].
pub fn vec_dot_f16_ref(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 2);
    float_dot(n, |i| f16_le([w[2 * i], w[2 * i + 1]]), x)
}

/// dot(bf16 row, x), in the canonical order of [`float_dot`].
pub fn vec_dot_bf16_ref(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 2);
    float_dot(n, |i| bf16_le([w[2 * i], w[2 * i + 1]]), x)
}

// ---------------------------------------------------------------------------------------------
// Dot products: quantized weights against Q8A activations
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn q8a_sum(a: &BlockQ8A) -> i32 {
    a.sums[0] as i32 + a.sums[1] as i32
}

/// One block's step of the canonical order: `fma(d_w, f32(isum) * d_x, acc)` (one rounding for
/// the multiply-add: `f32::mul_add` is IEEE fusedMultiplyAdd on every target, an instruction
/// on aarch64 and on x86 with FMA, libm's exact `fmaf` elsewhere).
#[inline(always)]
pub(super) fn block_step(acc: f32, d_w: f32, isum: i32, d_x: f32) -> f32 {
    d_w.mul_add(isum as f32 * d_x, acc)
}

/// Q4_0 . Q8A: `sum d_w d_x sum (q - 8) q_x`, blocks in order with [`block_step`].
pub fn vec_dot_q4_0_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4_0] = cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += ((b.qs[j] & 0xF) as i32 - 8) * a.qs[j] as i32;
            isum += ((b.qs[j] >> 4) as i32 - 8) * a.qs[j + 16] as i32;
        }
        sum = block_step(sum, f16_le(b.d), isum, a.d);
    }
    sum
}

/// Q4_1 . Q8A: `sum d_w d_x sum q q_x + m_w d_x sum q_x`.
pub fn vec_dot_q4_1_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4_1] = cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (b.qs[j] & 0xF) as i32 * a.qs[j] as i32;
            isum += (b.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
        }
        sum += f16_le(b.d) * a.d * isum as f32 + f16_le(b.m) * a.d * q8a_sum(a) as f32;
    }
    sum
}

/// Q5_0 . Q8A, blocks in order with [`block_step`].
pub fn vec_dot_q5_0_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5_0] = cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let q = q5_values(&b.qs, b.qh);
        let isum: i32 = (0..QK).map(|j| (q[j] as i32 - 16) * a.qs[j] as i32).sum();
        sum = block_step(sum, f16_le(b.d), isum, a.d);
    }
    sum
}

/// Q5_1 . Q8A.
pub fn vec_dot_q5_1_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5_1] = cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let q = q5_values(&b.qs, b.qh);
        let isum: i32 = (0..QK).map(|j| q[j] as i32 * a.qs[j] as i32).sum();
        sum += f16_le(b.d) * a.d * isum as f32 + f16_le(b.m) * a.d * q8a_sum(a) as f32;
    }
    sum
}

/// Q8_0 . Q8A, blocks in order with [`block_step`].
pub fn vec_dot_q8_0_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ8_0] = cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let isum: i32 = (0..QK).map(|j| b.qs[j] as i32 * a.qs[j] as i32).sum();
        sum = block_step(sum, f16_le(b.d), isum, a.d);
    }
    sum
}

/// Q2_K . Q8A: per 32-group g, `d * d_x (sum_h sc_h sum q q_x) - dmin * d_x sum_h m_h sum q_x`.
pub fn vec_dot_q2_k_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ2K] = cast_slice(w);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let (mut sd, mut sm) = (0f32, 0f32);
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                let g = 4 * n + j;
                let a = &xa[g];
                let shift = 2 * j;
                let (s0, s1) = (b.scales[2 * g], b.scales[2 * g + 1]);
                let mut i0 = 0i32;
                let mut i1 = 0i32;
                for l in 0..16 {
                    i0 += ((q[l] >> shift) & 3) as i32 * a.qs[l] as i32;
                    i1 += ((q[l + 16] >> shift) & 3) as i32 * a.qs[l + 16] as i32;
                }
                let isum = (s0 & 0xF) as i32 * i0 + (s1 & 0xF) as i32 * i1;
                let msum =
                    (s0 >> 4) as i32 * a.sums[0] as i32 + (s1 >> 4) as i32 * a.sums[1] as i32;
                sd += a.d * isum as f32;
                sm += a.d * msum as f32;
            }
        }
        sum += f16_le(b.d) * sd - f16_le(b.dmin) * sm;
    }
    sum
}

/// Q3_K . Q8A.
pub fn vec_dot_q3_k_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ3K] = cast_slice(w);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let scales = scales_q3k(&b.scales);
        let mut sd = 0f32;
        for n in 0..2 {
            let q = &b.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                let g = 4 * n + j;
                let a = &xa[g];
                let (shift, m) = (2 * j, 1u8 << g);
                let mut ih = [0i32; 2];
                for l in 0..32 {
                    let v = ((q[l] >> shift) & 3) as i32 - if b.hmask[l] & m != 0 { 0 } else { 4 };
                    ih[l / 16] += v * a.qs[l] as i32;
                }
                let isum = scales[2 * g] as i32 * ih[0] + scales[2 * g + 1] as i32 * ih[1];
                sd += a.d * isum as f32;
            }
        }
        sum += f16_le(b.d) * sd;
    }
    sum
}

/// Q4_K . Q8A: per 32-element sub-block s in order (`a` its Q8A block),
/// `acc = fma(d * sc_s, f32(isum_s) * a.d, acc)`, then `acc = fma(-(dmin * m_s), a.s, acc)`
/// (`d * sc_s` and `dmin * m_s` are exact: 11-bit by 6-bit products).
pub fn vec_dot_q4_k_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4K] = cast_slice(w);
    let mut acc = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (s, a) in xa.iter().enumerate() {
            let q = &b.qs[32 * (s / 2)..32 * (s / 2) + 32];
            let shift = 4 * (s % 2);
            let (sc, m) = scale_min_k4(s, &b.scales);
            let isum: i32 = (0..32)
                .map(|l| ((q[l] >> shift) & 0xF) as i32 * a.qs[l] as i32)
                .sum();
            acc = (d * sc as f32).mul_add(isum as f32 * a.d, acc);
            acc = (-(dmin * m as f32)).mul_add(a.s, acc);
        }
    }
    acc
}

/// Q5_K . Q8A.
pub fn vec_dot_q5_k_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5K] = cast_slice(w);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let (mut sd, mut sm) = (0f32, 0f32);
        for j in 0..4 {
            let q = &b.qs[32 * j..32 * j + 32];
            let (u1, u2) = (1u8 << (2 * j), 1u8 << (2 * j + 1));
            let (a1, a2) = (&xa[2 * j], &xa[2 * j + 1]);
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (mut i1, mut i2) = (0i32, 0i32);
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                i1 += ((q[l] & 0xF) as i32 + h1) * a1.qs[l] as i32;
                i2 += ((q[l] >> 4) as i32 + h2) * a2.qs[l] as i32;
            }
            sd += a1.d * (sc1 as i32 * i1) as f32 + a2.d * (sc2 as i32 * i2) as f32;
            sm += a1.d * (m1 as i32 * q8a_sum(a1)) as f32 + a2.d * (m2 as i32 * q8a_sum(a2)) as f32;
        }
        sum += f16_le(b.d) * sd - f16_le(b.dmin) * sm;
    }
    sum
}

/// Q6_K . Q8A: per 32-element group g in order (`a` its Q8A block) and per half h of it
/// (16 weights, scale `sc = scales[2g + h]`): `acc = fma(d * sc, f32(isum) * a.d, acc)`,
/// `isum` the exact dot of the signed 6-bit weights (`q - 32`) with the half's activations
/// (`d * sc` is exact: 11-bit by 8-bit).
pub fn vec_dot_q6_k_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ6K] = cast_slice(w);
    let mut acc = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let d = f16_le(b.d);
        for (g, a) in xa.iter().enumerate() {
            let (n, k) = (g / 4, g % 4);
            for h in 0..2 {
                let isum: i32 = (16 * h..16 * h + 16)
                    .map(|l| q6k_quad(b, n, l)[k] * a.qs[l] as i32)
                    .sum();
                let sc = b.scales[8 * n + 2 * k + h];
                acc = (d * sc as f32).mul_add(isum as f32 * a.d, acc);
            }
        }
    }
    acc
}

/// IQ4_NL . Q8A: `isum = sum(value * q_x)` (exact), blocks in order with [`block_step`].
pub fn vec_dot_iq4_nl_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockIQ4NL] = cast_slice(w);
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let v = iq4_values(&b.qs);
        let isum: i32 = (0..QK).map(|j| v[j] * a.qs[j] as i32).sum();
        acc = block_step(acc, f16_le(b.d), isum, a.d);
    }
    acc
}

/// MXFP4 . Q8A: `isum = sum(value * q_x)` (exact), blocks in order with [`block_step`], the
/// weight scale `e8m0_half(e)` in place of an f16 `d` (IQ4_NL's canonical order).
pub fn vec_dot_mxfp4_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockMXFP4] = cast_slice(w);
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let v = mxfp4_values(&b.qs);
        let isum: i32 = (0..QK).map(|j| v[j] * a.qs[j] as i32).sum();
        acc = block_step(acc, e8m0_half(b.e), isum, a.d);
    }
    acc
}

/// IQ4_XS . Q8A: per 32-element sub-block ib in order (`a` its Q8A block),
/// `acc = fma(d * (ls_ib - 32), f32(isum) * a.d, acc)` (`d * (ls - 32)` is exact: 11-bit by
/// 6-bit).
pub fn vec_dot_iq4_xs_q8a_ref(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockIQ4XS] = cast_slice(w);
    let mut acc = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let d = f16_le(b.d);
        for (ib, a) in xa.iter().enumerate() {
            let v = iq4_values(&b.qs[16 * ib..16 * ib + 16]);
            let isum: i32 = (0..QK).map(|j| v[j] * a.qs[j] as i32).sum();
            acc = (d * (b.scale(ib) - 32) as f32).mul_add(isum as f32 * a.d, acc);
        }
    }
    acc
}
