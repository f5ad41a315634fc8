//! NEON kernels (aarch64), same names and results as [`super::reference`]; the device path.
//!
//! Two flavours of every quantized kernel, one body each (a `const SDOT: bool` parameter):
//!
//! - plain NEON (ARMv8.0, e.g. the Cortex-A53): per 16 weight/activation byte pairs
//!   `smull` (low 8) + `smlal2` (high 8) into i16 lanes, then `sadalp` into i32 lanes:
//!   3 instructions per 16 products. An i16 lane holds two products, at most
//!   `2 * 128 * 127 = 32512 < 32767` in magnitude, so it cannot overflow (Q8_0 weights reach
//!   -128, activations are clamped to +-127);
//! - `dotprod` (ARMv8.2+, chosen at runtime): one `sdot` per 16 products.
//!
//! Weights are unpacked to *signed* i8 with their offset already removed (`q - 8`, `q - 16`,
//! `q - 32`), so each block's integer sum is exactly the reference's `isum`; the i32 lanes
//! are reduced to one i32 (`addv`) and scaled in f32 with the reference's own expression in
//! the reference's order. Integer sums are exact and f32 steps are the same operations in the
//! same order, so every quantized kernel here is bit-identical to the scalar reference, and
//! the plain and dotprod flavours are bit-identical to each other (a device with or without
//! dotprod computes the same logits). The tests assert exactly that.
//!
//! Float weights (F32, F16, BF16) use four f32x4 FMA accumulators (fixed order, so
//! deterministic, but not the reference's serial order: those match within 1e-5 of the
//! magnitude). Half to single uses `fcvt`/`fcvtl`, which are ARMv8.0 baseline (only half
//! *arithmetic* needs the fp16 extension).
//!
//! Only [`install`] / [`kernels`] hand these out; the dotprod ones only when the caller
//! checked `is_aarch64_feature_detected!("dotprod")`.

use super::blocks::*;
use super::{Dot, DotF, DotQ};
use knot_format::dtype::DType;
use std::arch::aarch64::*;
use std::arch::asm;

/// Whether this CPU has the ARMv8.2 dot-product instructions (`sdot`).
pub(super) fn dotprod_available() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// Replace the reference entries of `table` with NEON kernels (`dotprod`: the `sdot` flavour).
///
/// With `dotprod` the caller must have checked [`dotprod_available`].
pub(super) fn install(table: &mut [Dot; 13], dotprod: bool) {
    for (dtype, dot) in kernels(dotprod) {
        table[super::dtype_index(dtype)] = dot;
    }
}

/// The NEON kernels by type (types not listed, Q2_K and Q3_K, keep the scalar reference).
///
/// With `dotprod` the caller must have checked [`dotprod_available`].
pub(super) fn kernels(dotprod: bool) -> Vec<(DType, Dot)> {
    let q: [(DType, DotQ, DotQ); 8] = [
        (DType::Q4_0, q4_0_plain, q4_0_sdot),
        (DType::Q4_1, q4_1_plain, q4_1_sdot),
        (DType::Q5_0, q5_0_plain, q5_0_sdot),
        (DType::Q5_1, q5_1_plain, q5_1_sdot),
        (DType::Q8_0, q8_0_plain, q8_0_sdot),
        (DType::Q4_K, q4_k_plain, q4_k_sdot),
        (DType::Q5_K, q5_k_plain, q5_k_sdot),
        (DType::Q6_K, q6_k_plain, q6_k_sdot),
    ];
    let mut v = vec![
        (DType::F32, Dot::Float(vec_dot_f32 as DotF)),
        (DType::F16, Dot::Float(vec_dot_f16 as DotF)),
        (DType::BF16, Dot::Float(vec_dot_bf16 as DotF)),
    ];
    v.extend(
        q.iter()
            .map(|&(t, plain, sdot)| (t, Dot::Quant(if dotprod { sdot } else { plain }))),
    );
    v
}

/// Safe entry points: `$plain` runs the body with plain NEON (baseline on aarch64), `$sdot`
/// through a `dotprod` target-feature wrapper.
macro_rules! entries {
    ($body:ident, $plain:ident, $sdot:ident, $tf:ident) => {
        fn $plain(w: &[u8], x: &[BlockQ8A]) -> f32 {
            // SAFETY: NEON is part of the aarch64 baseline; the body only loads inside the
            // blocks of `w` and `x` it iterates over.
            unsafe { $body::<false>(w, x) }
        }
        #[target_feature(enable = "dotprod")]
        unsafe fn $tf(w: &[u8], x: &[BlockQ8A]) -> f32 {
            $body::<true>(w, x)
        }
        fn $sdot(w: &[u8], x: &[BlockQ8A]) -> f32 {
            // SAFETY: only handed out by `kernels(true)` / `install(_, true)`, whose callers
            // checked `dotprod_available()` on this CPU.
            unsafe { $tf(w, x) }
        }
    };
}

entries!(dot_q4_0, q4_0_plain, q4_0_sdot, q4_0_tf);
entries!(dot_q4_1, q4_1_plain, q4_1_sdot, q4_1_tf);
entries!(dot_q5_0, q5_0_plain, q5_0_sdot, q5_0_tf);
entries!(dot_q5_1, q5_1_plain, q5_1_sdot, q5_1_tf);
entries!(dot_q8_0, q8_0_plain, q8_0_sdot, q8_0_tf);
entries!(dot_q4_k, q4_k_plain, q4_k_sdot, q4_k_tf);
entries!(dot_q5_k, q5_k_plain, q5_k_sdot, q5_k_tf);
entries!(dot_q6_k, q6_k_plain, q6_k_sdot, q6_k_tf);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `acc + ` the 16 products `a[i] * b[i]`, grouped into 4 i32 lanes.
///
/// `SDOT = true` emits `sdot` and may only run inside a `dotprod` target-feature function on a
/// CPU that has it. Lane grouping differs between the two flavours; the lane *total* is the
/// same exact integer.
#[inline(always)]
unsafe fn idot<const SDOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if SDOT {
        let mut acc = acc;
        // SAFETY: register-only instruction; reached only from `dotprod` functions (see above).
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    } else {
        // Two products per i16 lane: |sum| <= 2 * 128 * 127 (see the module docs).
        let p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let p = vmlal_high_s8(p, a, b);
        vpadalq_s16(acc, p)
    }
}

/// The exact integer dot of 32 signed weights (`w0` = elements 0..16, `w1` = 16..32) with an
/// activation block's quants.
#[inline(always)]
unsafe fn isum32<const SDOT: bool>(w0: int8x16_t, w1: int8x16_t, a: &BlockQ8A) -> i32 {
    // SAFETY: `a.qs` is 32 bytes; the loads read 0..16 and 16..32.
    let (x0, x1) = unsafe { (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16))) };
    let acc = idot::<SDOT>(vdupq_n_s32(0), w0, x0);
    vaddvq_s32(idot::<SDOT>(acc, w1, x1))
}

/// Little-endian IEEE half to f32 with the ARMv8.0 `fcvt` (exact, as [`f16_le`]).
#[inline(always)]
fn f16(b: [u8; 2]) -> f32 {
    let h = u16::from_le_bytes(b) as u32;
    let out: f32;
    // SAFETY: register-only, baseline ARMv8 FP instructions.
    unsafe {
        asm!(
            "fmov {o:s}, {h:w}",
            "fcvt {o:s}, {o:h}",
            h = in(reg) h,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// 16 bytes of nibbles: (low nibbles, high nibbles) as u8 lanes.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: callers pass a pointer to 16 readable bytes.
    let q = unsafe { vld1q_u8(p) };
    (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8(q, 4))
}

/// The 32 bits of a Q5_0 / Q5_1 `qh` as `0x10` bytes: (elements 0..16, elements 16..32).
#[inline(always)]
unsafe fn q5_high(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const IDX0: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const IDX1: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
    // SAFETY: the constants are 16-byte arrays.
    let (i0, i1, bit) = unsafe {
        (
            vld1q_u8(IDX0.as_ptr()),
            vld1q_u8(IDX1.as_ptr()),
            vld1q_u8(BIT.as_ptr()),
        )
    };
    let sixteen = vdupq_n_u8(0x10);
    (
        vandq_u8(vtstq_u8(vqtbl1q_u8(v, i0), bit), sixteen),
        vandq_u8(vtstq_u8(vqtbl1q_u8(v, i1), bit), sixteen),
    )
}

/// `q - off` as signed bytes (`q` <= 63, so no wrap).
#[inline(always)]
fn signed(q: uint8x16_t, off: u8) -> int8x16_t {
    // SAFETY: register-only NEON (baseline).
    unsafe { vreinterpretq_s8_u8(vsubq_u8(q, vdupq_n_u8(off))) }
}

#[inline(always)]
fn q8a_sum(a: &BlockQ8A) -> i32 {
    a.sums[0] as i32 + a.sums[1] as i32
}

// ---------------------------------------------------------------------------------------------
// Legacy quants: one block of 32 against one Q8A block (f32 steps as in the reference)
// ---------------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn dot_q4_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4_0] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 16 bytes.
        let (lo, hi) = unsafe { nibbles(b.qs.as_ptr()) };
        let isum = unsafe { isum32::<SDOT>(signed(lo, 8), signed(hi, 8), a) };
        sum += f16(b.d) * a.d * isum as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q4_1<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4_1] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 16 bytes.
        let (lo, hi) = unsafe { nibbles(b.qs.as_ptr()) };
        let isum = unsafe { isum32::<SDOT>(signed(lo, 0), signed(hi, 0), a) };
        sum += f16(b.d) * a.d * isum as f32 + f16(b.m) * a.d * q8a_sum(a) as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q5_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5_0] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 16 bytes; `q5_high` reads its own constants.
        let isum = unsafe {
            let (lo, hi) = nibbles(b.qs.as_ptr());
            let (h0, h1) = q5_high(b.qh);
            isum32::<SDOT>(
                signed(vorrq_u8(lo, h0), 16),
                signed(vorrq_u8(hi, h1), 16),
                a,
            )
        };
        sum += f16(b.d) * a.d * isum as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q5_1<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5_1] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 16 bytes; `q5_high` reads its own constants.
        let isum = unsafe {
            let (lo, hi) = nibbles(b.qs.as_ptr());
            let (h0, h1) = q5_high(b.qh);
            isum32::<SDOT>(signed(vorrq_u8(lo, h0), 0), signed(vorrq_u8(hi, h1), 0), a)
        };
        sum += f16(b.d) * a.d * isum as f32 + f16(b.m) * a.d * q8a_sum(a) as f32;
    }
    sum
}

#[inline(always)]
unsafe fn dot_q8_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ8_0] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 32 bytes; the loads read 0..16 and 16..32.
        let isum = unsafe {
            let (w0, w1) = (vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16)));
            isum32::<SDOT>(w0, w1, a)
        };
        sum += f16(b.d) * a.d * isum as f32;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// k-quants: one super-block of 256 against eight Q8A blocks
// ---------------------------------------------------------------------------------------------

/// Shared Q4_K / Q5_K body (the reference's `sd`/`sm` sums in its order). `high(b, j)` gives
/// the fifth-bit bytes (0 or 16) of 64-chunk `j` for (elements 0..16, 16..32) of the low
/// nibbles and the same of the high nibbles.
#[inline(always)]
unsafe fn dot_k4<const SDOT: bool, B: bytemuck::Pod>(
    w: &[u8],
    x: &[BlockQ8A],
    parts: impl Fn(&B) -> ([u8; 2], [u8; 2], &[u8; 12], &[u8; 128]),
    high: impl Fn(&B, usize) -> [uint8x16_t; 4],
) -> f32 {
    let w: &[B] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let (d, dmin, scales, qs) = parts(b);
        let (mut sd, mut sm) = (0f32, 0f32);
        for j in 0..4 {
            // SAFETY: `qs` is 128 bytes; 32j + 16 + 16 <= 128.
            let (l0, h0) = unsafe { nibbles(qs.as_ptr().add(32 * j)) };
            let (l1, h1) = unsafe { nibbles(qs.as_ptr().add(32 * j + 16)) };
            let hb = high(b, j);
            let (a1, a2) = (&xa[2 * j], &xa[2 * j + 1]);
            let (lo0, lo1) = (vorrq_u8_(l0, hb[0]), vorrq_u8_(l1, hb[1]));
            let (hi0, hi1) = (vorrq_u8_(h0, hb[2]), vorrq_u8_(h1, hb[3]));
            // SAFETY: register-only NEON plus the 32-byte activation loads of `isum32`.
            let i1 = unsafe { isum32::<SDOT>(signed(lo0, 0), signed(lo1, 0), a1) };
            let i2 = unsafe { isum32::<SDOT>(signed(hi0, 0), signed(hi1, 0), a2) };
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            sd += a1.d * (sc1 as i32 * i1) as f32 + a2.d * (sc2 as i32 * i2) as f32;
            sm += a1.d * (m1 as i32 * q8a_sum(a1)) as f32 + a2.d * (m2 as i32 * q8a_sum(a2)) as f32;
        }
        sum += f16(d) * sd - f16(dmin) * sm;
    }
    sum
}

/// `a | b` on u8 lanes.
#[inline(always)]
fn vorrq_u8_(a: uint8x16_t, b: uint8x16_t) -> uint8x16_t {
    // SAFETY: register-only NEON (baseline).
    unsafe { vorrq_u8(a, b) }
}

#[inline(always)]
unsafe fn dot_q4_k<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: register-only NEON (baseline).
    let z = unsafe { vdupq_n_u8(0) };
    unsafe { dot_k4::<SDOT, BlockQ4K>(w, x, |b| (b.d, b.dmin, &b.scales, &b.qs), |_, _| [z; 4]) }
}

#[inline(always)]
unsafe fn dot_q5_k<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: `qh` is 32 bytes (loads at 0 and 16); the rest is register-only NEON.
    unsafe {
        dot_k4::<SDOT, BlockQ5K>(
            w,
            x,
            |b| (b.d, b.dmin, &b.scales, &b.qs),
            |b, j| {
                let (q0, q1) = (vld1q_u8(b.qh.as_ptr()), vld1q_u8(b.qh.as_ptr().add(16)));
                let (u1, u2) = (vdupq_n_u8(1 << (2 * j)), vdupq_n_u8(1 << (2 * j + 1)));
                let s = vdupq_n_u8(16);
                [
                    vandq_u8(vtstq_u8(q0, u1), s),
                    vandq_u8(vtstq_u8(q1, u1), s),
                    vandq_u8(vtstq_u8(q0, u2), s),
                    vandq_u8(vtstq_u8(q1, u2), s),
                ]
            },
        )
    }
}

#[inline(always)]
unsafe fn dot_q6_k<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ6K] = bytemuck::cast_slice(w);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let mut sd = 0f32;
        for n in 0..2 {
            let sc = &b.scales[8 * n..8 * n + 8];
            // isum[k]: group 4n + k (elements 128n + 32k ..), scale sc[2k + h] on half h.
            let mut isum = [0i32; 4];
            for h in 0..2 {
                // SAFETY: ql is 128 bytes (64n + 32 + 16h + 16 <= 128), qh 64 bytes
                // (32n + 16h + 16 <= 64), each activation block 32 bytes (16h + 16 <= 32);
                // the rest is register-only NEON.
                unsafe {
                    let ql = b.ql.as_ptr().add(64 * n + 16 * h);
                    let (ql0, ql1) = (vld1q_u8(ql), vld1q_u8(ql.add(32)));
                    let qh = vld1q_u8(b.qh.as_ptr().add(32 * n + 16 * h));
                    let (m4, m30) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30));
                    let q = [
                        vorrq_u8(vandq_u8(ql0, m4), vandq_u8(vshlq_n_u8(qh, 4), m30)),
                        vorrq_u8(vandq_u8(ql1, m4), vandq_u8(vshlq_n_u8(qh, 2), m30)),
                        vorrq_u8(vshrq_n_u8(ql0, 4), vandq_u8(qh, m30)),
                        vorrq_u8(vshrq_n_u8(ql1, 4), vandq_u8(vshrq_n_u8(qh, 2), m30)),
                    ];
                    for k in 0..4 {
                        let xq = vld1q_s8(xa[4 * n + k].qs.as_ptr().add(16 * h));
                        let p = idot::<SDOT>(vdupq_n_s32(0), signed(q[k], 32), xq);
                        isum[k] += sc[2 * k + h] as i32 * vaddvq_s32(p);
                    }
                }
            }
            for k in 0..4 {
                sd += xa[4 * n + k].d * isum[k] as f32;
            }
        }
        sum += f16(b.d) * sd;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Float weights against f32 activations
// ---------------------------------------------------------------------------------------------

/// Shared body: `load(i)` gives weights i..i+4 as f32; four accumulators over 16 at a time,
/// then 4 at a time, then a scalar tail with `one(i)`.
#[inline(always)]
unsafe fn dot_float(
    n: usize,
    x: &[f32],
    load: impl Fn(usize) -> float32x4_t,
    one: impl Fn(usize) -> f32,
) -> f32 {
    assert!(x.len() >= n);
    let xp = x.as_ptr();
    // SAFETY: every x load reads i..i+4 with i + 4 <= n <= x.len(); `load` is the caller's
    // contract for the same range of weights.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, load(i + 4 * k), vld1q_f32(xp.add(i + 4 * k)));
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], load(i), vld1q_f32(xp.add(i)));
            i += 4;
        }
        let mut s = vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ));
        while i < n {
            s += one(i) * x[i];
            i += 1;
        }
        s
    }
}

/// dot(f32 row, x).
fn vec_dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 4);
    let wp = w.as_ptr();
    let one = |i: usize| f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]);
    // SAFETY: `load(i)` is only called with i + 4 <= n, so it reads bytes 4i..4i+16 <= w.len();
    // ld1 has no alignment requirement (aarch64 is little-endian, as the row bytes).
    unsafe { dot_float(n, x, |i| vld1q_f32(wp.add(4 * i) as *const f32), one) }
}

/// Four halves (8 bytes at `p`) to f32 with the ARMv8.0 `fcvtl`.
#[inline(always)]
unsafe fn f16x4(p: *const u8) -> float32x4_t {
    // SAFETY: callers pass a pointer to 8 readable bytes.
    let h = unsafe { vld1_u16(p as *const u16) };
    let out: float32x4_t;
    // SAFETY: register-only, baseline AdvSIMD instruction.
    unsafe {
        asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            h = in(vreg) h,
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// dot(f16 row, x).
fn vec_dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 2);
    let wp = w.as_ptr();
    // SAFETY: `load(i)` is only called with i + 4 <= n, so it reads bytes 2i..2i+8 <= w.len().
    unsafe {
        dot_float(
            n,
            x,
            |i| f16x4(wp.add(2 * i)),
            |i| f16([w[2 * i], w[2 * i + 1]]),
        )
    }
}

/// dot(bf16 row, x).
fn vec_dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 2);
    let wp = w.as_ptr();
    // SAFETY: `load(i)` is only called with i + 4 <= n, so it reads bytes 2i..2i+8 <= w.len();
    // a bf16 is the high half of an f32, so widening with a 16-bit shift is exact.
    unsafe {
        dot_float(
            n,
            x,
            |i| vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(wp.add(2 * i) as *const u16), 16)),
            |i| bf16_le([w[2 * i], w[2 * i + 1]]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_row, random_x, Rng};
    use super::super::*;
    use super::BlockQ8A;

    /// Both flavours this CPU can run: plain always, dotprod where detected.
    fn flavours() -> Vec<bool> {
        if super::dotprod_available() {
            vec![false, true]
        } else {
            eprintln!("dotprod not available on this CPU: only the plain NEON flavour runs");
            vec![false]
        }
    }

    /// Every NEON kernel (both flavours) against the scalar reference on random rows (lengths
    /// with tails, Qwen's outlier activations): quantized kernels bit for bit, float kernels
    /// within the avx2 tests' 1e-5 of the magnitude.
    #[test]
    fn neon_matches_reference() {
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        let mut rng = Rng::new(11);
        for sdot in flavours() {
            for (dtype, dot) in super::kernels(sdot) {
                for cols in [256usize, 512, 768, 4864, 96, 32, 36, 7] {
                    if cols % dtype.block_elems() != 0 {
                        continue;
                    }
                    for _ in 0..10 {
                        let w = random_row(dtype, cols, &mut rng);
                        let x = random_x(cols, &mut rng);
                        let mut wd = vec![0f32; cols];
                        dequantize_row(dtype, &w, &mut wd);
                        let mag: f32 = wd.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                        let (got, want, exact) = match (dot, reference.dot(dtype)) {
                            (Dot::Float(f), Dot::Float(r)) => (f(&w, &x), r(&w, &x), false),
                            (Dot::Quant(f), Dot::Quant(r)) => {
                                let mut xq = Vec::new();
                                quantize_q8a(&x, &mut xq);
                                (f(&w, &xq), r(&w, &xq), true)
                            }
                            _ => panic!("{dtype}: kernel kinds differ"),
                        };
                        assert!(
                            (got - want).abs() <= 1e-5 * mag,
                            "{dtype} cols {cols} sdot {sdot}: neon {got} vs reference {want} (mag {mag})"
                        );
                        if exact {
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{dtype} cols {cols} sdot {sdot}: neon {got} vs reference {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The worst case for the plain flavour's i16 pair sums: Q8_0 weights all -128 against
    /// activations all -127 (each pair 2 * 16256), and the mirror +127 / +127. A wrapped i16
    /// would flip the sign of the result.
    #[test]
    fn plain_neon_i16_pairs_do_not_overflow() {
        let cols = 64;
        let mut w = Vec::new();
        for q in [-128i8, 127] {
            w.extend_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
            w.extend(std::iter::repeat_n(q as u8, 32));
        }
        let x: Vec<f32> = (0..cols).map(|i| if i < 32 { -1.0 } else { 1.0 }).collect();
        let mut xq: Vec<BlockQ8A> = Vec::new();
        quantize_q8a(&x, &mut xq);
        assert!(xq[0].qs.iter().all(|&q| q == -127));
        let want = (32 * 128 * 127 + 32 * 127 * 127) as f32 / 127.0;
        let Dot::Quant(r) = Kernels::for_isa(Isa::Scalar).unwrap().dot(DType::Q8_0) else {
            panic!("Q8_0 is quantized")
        };
        assert_eq!(r(&w, &xq), want);
        for sdot in flavours() {
            for (dtype, dot) in super::kernels(sdot) {
                if let (DType::Q8_0, Dot::Quant(f)) = (dtype, dot) {
                    assert_eq!(f(&w, &xq), want, "sdot {sdot}");
                }
            }
        }
    }

    /// The `fcvt` half conversion equals the `half` crate's on all 65536 inputs (NaN to NaN).
    #[test]
    fn fcvt_half_matches_half_crate() {
        for h in 0..=u16::MAX {
            let b = h.to_le_bytes();
            let (got, want) = (super::f16(b), half::f16::from_bits(h).to_f32());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: fcvt {got} vs half {want}"
            );
        }
    }

    /// Timing table (run with `--ignored --nocapture`): ns per 256 weights of the reference,
    /// plain NEON and (where present) dotprod kernels on a Qwen-sized row (4864 columns),
    /// cache-resident, one thread. Under qemu this measures emulation, not a device; it still
    /// asserts the three give the same bits.
    #[test]
    #[ignore = "timing table; run explicitly"]
    fn neon_timing_table() {
        use std::time::Instant;
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        let (cols, rows) = (4864usize, 32usize);
        let mut rng = Rng::new(5);
        let x = random_x(cols, &mut rng);
        let mut xq = Vec::new();
        quantize_q8a(&x, &mut xq);
        let fl = flavours();
        println!("dtype   ns/256 ref   plain   sdot   (ref/plain, ref/sdot)");
        for (dtype, plain) in super::kernels(false) {
            let w: Vec<Vec<u8>> = (0..rows)
                .map(|_| random_row(dtype, cols, &mut rng))
                .collect();
            let time = |d: Dot| -> (f64, Vec<u32>) {
                let run = || -> Vec<u32> {
                    w.iter()
                        .map(|r| match d {
                            Dot::Float(f) => f(r, &x),
                            Dot::Quant(f) => f(r, &xq),
                        })
                        .map(f32::to_bits)
                        .collect()
                };
                let bits = run();
                let (mut n, t0) = (0usize, Instant::now());
                while t0.elapsed().as_secs_f64() < 0.3 {
                    std::hint::black_box(run());
                    n += 1;
                }
                let ns = t0.elapsed().as_secs_f64() * 1e9 / (n * rows * cols / 256) as f64;
                (ns, bits)
            };
            let (t_ref, b_ref) = time(reference.dot(dtype));
            let (t_plain, b_plain) = time(plain);
            let t_sdot = if fl.contains(&true) {
                let sdot = super::kernels(true)
                    .into_iter()
                    .find(|(t, _)| *t == dtype)
                    .map(|(_, d)| d)
                    .unwrap();
                let (t, b) = time(sdot);
                assert_eq!(b, b_plain, "{dtype}: plain vs dotprod bits");
                t
            } else {
                f64::NAN
            };
            if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
                assert_eq!(b_ref.len(), b_plain.len());
            } else {
                assert_eq!(b_ref, b_plain, "{dtype}: reference vs plain bits");
            }
            println!(
                "{:<6} {t_ref:>10.0} {t_plain:>7.0} {t_sdot:>6.0}   ({:.1}x, {:.1}x)",
                dtype.to_string(),
                t_ref / t_plain,
                t_ref / t_sdot
            );
        }
    }

    /// On aarch64 the process-wide table is NEON (dotprod where present), and
    /// `FAT_KERNELS=scalar` style caps still build the other tables.
    #[test]
    fn aarch64_dispatch_picks_neon() {
        let want = if super::dotprod_available() {
            Isa::NeonDotprod
        } else {
            Isa::Neon
        };
        if std::env::var("FAT_KERNELS").is_err() {
            assert_eq!(kernels().isa, want);
        }
        assert_eq!(Kernels::for_isa(Isa::Neon).unwrap().isa, Isa::Neon);
        assert_eq!(
            Kernels::for_isa(Isa::NeonDotprod).map(|k| k.isa),
            super::dotprod_available().then_some(Isa::NeonDotprod)
        );
        assert_eq!(Kernels::for_isa(Isa::Scalar).unwrap().isa, Isa::Scalar);
    }
}
