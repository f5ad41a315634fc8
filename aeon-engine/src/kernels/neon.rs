//! NEON kernels (aarch64), same names and results as [`super::reference`]; the device path.
//! For Q4_0, Q5_0 and Q8_0, [`super::Linear`]s take the 16-row kernels over interleaved
//! tiles instead (`interleaved/neon.rs`); these block kernels still serve the rows past a
//! matrix's last full group of 16 and plain [`super::matmul`].
//!
//! Two flavours of every quantized kernel, one body each (a `const SDOT: bool` parameter):
//!
//! - plain NEON (ARMv8.0, e.g. the Cortex-A53): per 16 weight/activation byte pairs
//!   `smull` (low 8) + `smlal2` (high 8) into i16 lanes, then pairwise adds into i32 lanes.
//!   An i16 lane holds at most `32512 < 32767` in magnitude: two products of Q8_0 weights
//!   (down to -128) with activations (clamped to +-127), more of smaller weights (each place
//!   that adds more says how many);
//! - `dotprod` (ARMv8.2+, chosen at runtime): one `sdot` per 16 products.
//!
//! Weights are unpacked to *signed* i8 with their offset already removed (`q - 8`, `q - 16`,
//! `q - 32`), so each block's integer sum is exactly the reference's `isum`, and scaled in f32
//! with the reference's own expression in the reference's order (for Q4_0, Q5_0, Q8_0, Q4_K
//! and Q6_K the canonical `fma(d_w, f32(isum) * d_x, acc)` chain that the x86 16-row kernels
//! also follow, so an aarch64 node and an x86 node compute the same bits). Integer sums are exact and f32
//! steps are the same operations in the same order, so every quantized kernel here is
//! bit-identical to the scalar reference, and the plain and dotprod flavours are bit-identical
//! to each other (a device with or without dotprod computes the same logits). The tests assert
//! exactly that (`scripts/cross/qemu-kernels.sh` runs them under qemu-aarch64 for both).
//!
//! Shaped for in-order cores (the A53 issues in program order, so a dependent instruction
//! stalls everything behind it). The hot types (Q4_0, Q5_0, Q8_0: four blocks per step; Q4_K,
//! Q6_K: a super-block per step) reduce several blocks' integer sums together (pairwise i16
//! adds while the lanes cannot overflow, then one widening add: fewer instructions than a
//! horizontal add per block), do the f32 products on four lanes, and leave only the
//! reference's serial adds scalar, issued next to the following step's arithmetic (a software
//! pipeline, `pipelined!`). `scripts/arm-proxy.sh` models each hot loop with llvm-mca's
//! Cortex-A53 / A55 models next to llama.cpp's and prints the table. Q4_1, Q5_1 and Q5_K keep
//! the simpler one-block-at-a-time bodies.
//!
//! Float weights (F32, F16, BF16) follow the reference's canonical order
//! ([`super::reference::float_dot`]: 32 lanes as eight f32x4 FMA accumulators, then its
//! pairwise tree), so they give its bits as the quantized kernels do. Half to single uses `fcvt`/`fcvtl`, which are ARMv8.0 baseline (only half
//! *arithmetic* needs the fp16 extension).
//!
//! Only [`kernels`] hands these out; the dotprod ones only when the caller
//! checked `is_aarch64_feature_detected!("dotprod")`.

use super::blocks::*;
use super::reference::{block_step, float_lanes_sum, FLOAT_LANES};
use super::{Dot, DotF, DotQ};
use knot_format::dtype::DType;
use std::arch::aarch64::*;
use std::arch::asm;

/// Whether this CPU has the ARMv8.2 dot-product instructions (`sdot`).
pub(super) fn dotprod_available() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
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
        fn $tf(w: &[u8], x: &[BlockQ8A]) -> f32 {
            // SAFETY: as `$plain`, with `sdot` enabled here.
            unsafe { $body::<true>(w, x) }
        }
        fn $sdot(w: &[u8], x: &[BlockQ8A]) -> f32 {
            // SAFETY: only handed out by `kernels(true)`, whose callers
            // checked `dotprod_available()` on this CPU.
            unsafe { $tf(w, x) }
        }
    };
}

entries!(dot4_q4_0, q4_0_plain, q4_0_sdot, q4_0_tf);
entries!(dot_q4_1, q4_1_plain, q4_1_sdot, q4_1_tf);
entries!(dot4_q5_0, q5_0_plain, q5_0_sdot, q5_0_tf);
entries!(dot_q5_1, q5_1_plain, q5_1_sdot, q5_1_tf);
entries!(dot4_q8_0, q8_0_plain, q8_0_sdot, q8_0_tf);
entries!(dot2_q4_k, q4_k_plain, q4_k_sdot, q4_k_tf);
entries!(dot_q5_k, q5_k_plain, q5_k_sdot, q5_k_tf);
entries!(dot2_q6_k, q6_k_plain, q6_k_sdot, q6_k_tf);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `[e(0), e(1), e(2), e(3)]` written out (`std::array::from_fn` is not always inlined, and a
/// call inside a kernel's loop costs more than the loop).
macro_rules! arr4 {
    (|$k:ident| $e:expr) => {
        [
            {
                let $k = 0usize;
                $e
            },
            {
                let $k = 1usize;
                $e
            },
            {
                let $k = 2usize;
                $e
            },
            {
                let $k = 3usize;
                $e
            },
        ]
    };
}

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
        // The directive lets the assembler take `sdot` even where LLVM did not inline this
        // into the `dotprod` function (a closure body is its own function).
        unsafe {
            asm!(
                ".arch_extension dotprod",
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
        // SAFETY: register-only NEON, part of the aarch64 baseline.
        unsafe {
            let p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let p = vmlal_high_s8(p, a, b);
            vpadalq_s16(acc, p)
        }
    }
}

/// The exact integer dot of 32 signed weights (`w0` = elements 0..16, `w1` = 16..32) with an
/// activation block's quants.
#[inline(always)]
unsafe fn isum32<const SDOT: bool>(w0: int8x16_t, w1: int8x16_t, a: &BlockQ8A) -> i32 {
    // SAFETY: `a.qs` is 32 bytes; the loads read 0..16 and 16..32. `idot::<SDOT>` runs
    // where this does: the caller's flavour.
    unsafe {
        let (x0, x1) = (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16)));
        let acc = idot::<SDOT>(vdupq_n_s32(0), w0, x0);
        vaddvq_s32(idot::<SDOT>(acc, w1, x1))
    }
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
    // SAFETY: callers pass a pointer to 16 readable bytes; NEON is the aarch64 baseline.
    unsafe {
        let q = vld1q_u8(p);
        (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8(q, 4))
    }
}

/// The 32 bits of a Q5_0 / Q5_1 `qh` as `0x10` bytes: (elements 0..16, elements 16..32).
#[inline(always)]
unsafe fn q5_high(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const IDX0: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const IDX1: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: the constants are 16-byte arrays; NEON is the aarch64 baseline.
    unsafe {
        let v = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
        let (i0, i1, bit) = (
            vld1q_u8(IDX0.as_ptr()),
            vld1q_u8(IDX1.as_ptr()),
            vld1q_u8(BIT.as_ptr()),
        );
        let sixteen = vdupq_n_u8(0x10);
        (
            vandq_u8(vtstq_u8(vqtbl1q_u8(v, i0), bit), sixteen),
            vandq_u8(vtstq_u8(vqtbl1q_u8(v, i1), bit), sixteen),
        )
    }
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

/// The canonical steps ([`block_step`]) of the blocks of `w` onto `sum` (the tail of
/// [`dot4_q4_0`]).
#[inline(always)]
unsafe fn dot_q4_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A], mut sum: f32) -> f32 {
    let w: &[BlockQ4_0] = bytemuck::cast_slice(w);
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 16 bytes.
        let (lo, hi) = unsafe { nibbles(b.qs.as_ptr()) };
        // SAFETY: `a` is a whole block; `SDOT` as the caller's.
        let isum = unsafe { isum32::<SDOT>(signed(lo, 8), signed(hi, 8), a) };
        sum = block_step(sum, f16(b.d), isum, a.d);
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
        // SAFETY: `a` is a whole block; `SDOT` as the caller's.
        let isum = unsafe { isum32::<SDOT>(signed(lo, 0), signed(hi, 0), a) };
        sum += f16(b.d) * a.d * isum as f32 + f16(b.m) * a.d * q8a_sum(a) as f32;
    }
    sum
}

/// The canonical steps of the blocks of `w` onto `sum` (the tail of [`dot4_q5_0`]).
#[inline(always)]
unsafe fn dot_q5_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A], mut sum: f32) -> f32 {
    let w: &[BlockQ5_0] = bytemuck::cast_slice(w);
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
        sum = block_step(sum, f16(b.d), isum, a.d);
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

/// The canonical steps of the blocks of `w` onto `sum` (the tail of [`dot4_q8_0`]).
#[inline(always)]
unsafe fn dot_q8_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A], mut sum: f32) -> f32 {
    let w: &[BlockQ8_0] = bytemuck::cast_slice(w);
    for (b, a) in w.iter().zip(x) {
        // SAFETY: `b.qs` is 32 bytes; the loads read 0..16 and 16..32.
        let isum = unsafe {
            let (w0, w1) = (vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16)));
            isum32::<SDOT>(w0, w1, a)
        };
        sum = block_step(sum, f16(b.d), isum, a.d);
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Legacy quants, four blocks per step (Q4_0, Q5_0, Q8_0)
// ---------------------------------------------------------------------------------------------
//
// The reference takes one canonical step per block, `sum = fma(d_w, f32(isum) * d_x, sum)`, in
// block order. Here a step computes four blocks' `d_w` and `f32(isum) * d_x` as two f32x4 (their
// integer sums reduced together, the product on four lanes at once: the same rounding as the
// scalar expression) and the serial multiply-adds of the *previous* step's four blocks are
// interleaved with it (a software pipeline: the in-order core has independent work while each
// one waits for the one before). Blocks past the last group of four take the one-block kernel.
// Same operations in the same order as the reference, so the same bits.

/// `sum = fma(dw[k], t[k], sum)` for k = 0, 1, 2, 3 (the reference's order).
#[inline(always)]
fn fma4(sum: f32, (dw, t): (float32x4_t, float32x4_t)) -> f32 {
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let s = vgetq_lane_f32::<0>(dw).mul_add(vgetq_lane_f32::<0>(t), sum);
        let s = vgetq_lane_f32::<1>(dw).mul_add(vgetq_lane_f32::<1>(t), s);
        let s = vgetq_lane_f32::<2>(dw).mul_add(vgetq_lane_f32::<2>(t), s);
        vgetq_lane_f32::<3>(dw).mul_add(vgetq_lane_f32::<3>(t), s)
    }
}

/// The f16 scales at `p`, `p + stride`, `p + 2 stride`, `p + 3 stride` as f32 lanes (`fcvtl`).
#[inline(always)]
unsafe fn f16_gather4(p: *const u8, stride: usize) -> float32x4_t {
    // SAFETY: callers pass four readable, possibly unaligned 2-byte fields.
    let h = unsafe {
        let h = vdup_n_u16(std::ptr::read_unaligned(p as *const u16));
        let h = vset_lane_u16::<1>(std::ptr::read_unaligned(p.add(stride) as *const u16), h);
        let h = vset_lane_u16::<2>(std::ptr::read_unaligned(p.add(2 * stride) as *const u16), h);
        vset_lane_u16::<3>(std::ptr::read_unaligned(p.add(3 * stride) as *const u16), h)
    };
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

/// Two f16 fields as the f32 lanes of a pair (`fcvtl`).
#[inline(always)]
fn f16x4_low2(a: [u8; 2], b: [u8; 2]) -> float32x2_t {
    let packed = u16::from_le_bytes(a) as u64 | (u16::from_le_bytes(b) as u64) << 16;
    let out: float32x4_t;
    // SAFETY: register-only, baseline AdvSIMD instructions.
    unsafe {
        asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            h = in(vreg) vcreate_u16(packed),
            o = out(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
        vget_low_f32(out)
    }
}

/// Of the four activation blocks from `a`: `d` as f32 lanes and `sums[0] + sums[1]` as i32
/// lanes, from one 16-byte load of each block's head (`d`, `s`, `sums`, `qs[0..4]`) and four
/// permutes (cheaper on an in-order core than eight lane inserts and their address arithmetic).
#[inline(always)]
unsafe fn act_head4(a: *const BlockQ8A) -> (float32x4_t, int32x4_t) {
    // SAFETY: the caller passes four readable blocks of 44 bytes; each load reads 0..16 of one.
    let h: [uint32x4_t; 4] =
        // SAFETY: as above.
        arr4!(|k| unsafe { vreinterpretq_u32_u8(vld1q_u8(a.add(k) as *const u8)) });
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let (ab, cd) = (vtrn1q_u32(h[0], h[1]), vtrn1q_u32(h[2], h[3]));
        let d = vreinterpretq_f32_u64(vzip1q_u64(
            vreinterpretq_u64_u32(ab),
            vreinterpretq_u64_u32(cd),
        ));
        let sums = vreinterpretq_s16_u64(vzip2q_u64(
            vreinterpretq_u64_u32(ab),
            vreinterpretq_u64_u32(cd),
        ));
        (d, vpaddlq_s16(sums))
    }
}

/// `d` of four activation blocks as f32 lanes.
#[inline(always)]
fn act_d4(a: &[BlockQ8A; 4]) -> float32x4_t {
    // SAFETY: four blocks.
    unsafe { act_head4(a.as_ptr()).0 }
}

/// `p`, hidden from the optimiser by an empty `asm!`: loads at small offsets from it stay one
/// instruction each (LLVM would otherwise fold them back onto the row's base pointer, with
/// offsets too large for `ldur`, and spend an `add` per load).
#[inline(always)]
fn opaque<T>(p: *const T) -> *const T {
    // Through an integer (exposed provenance): a `nomem` block may not be handed pointers.
    let mut a = p as usize;
    // SAFETY: an empty instruction template; the value is passed through unchanged.
    unsafe { asm!("/* {a} */", a = inout(reg) a, options(pure, nomem, nostack, preserves_flags)) };
    a as *const T
}

/// An activation block's 32 quants as two vectors.
#[inline(always)]
fn act_qs(a: &BlockQ8A) -> (int8x16_t, int8x16_t) {
    // SAFETY: `qs` is 32 bytes: the loads read 0..16 and 16..32.
    unsafe { (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16))) }
}

/// The 32 products of (w0, w1) with (x0, x1), four per i16 lane: only for weights of magnitude
/// at most 16 (then a lane is at most `4 * 16 * 127 = 8128`; [`isum4_small`] adds four such
/// vectors per lane pair, `32512 < 32767`).
#[inline(always)]
fn i16_products(w0: int8x16_t, w1: int8x16_t, x0: int8x16_t, x1: int8x16_t) -> int16x8_t {
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
        let p = vmlal_high_s8(p, w0, x0);
        let p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(x1));
        vmlal_high_s8(p, w1, x1)
    }
}

/// The exact integer dots of four blocks of 32 small weights (|w| <= 16: Q4_0, Q5_0) with their
/// activation blocks, as i32 lanes. Plain: [`i16_products`], two pairwise i16 adds (a lane then
/// holds 16 products, at most 32512) and one widening pairwise add; dotprod: two `sdot` per block.
#[inline(always)]
unsafe fn isum4_small<const SDOT: bool>(
    w: [(int8x16_t, int8x16_t); 4],
    a: &[BlockQ8A; 4],
) -> int32x4_t {
    let x = [act_qs(&a[0]), act_qs(&a[1]), act_qs(&a[2]), act_qs(&a[3])];
    if SDOT {
        // SAFETY: reached only from `dotprod` functions (see `idot`).
        unsafe { isum4_sdot(w, x) }
    } else {
        let p: [int16x8_t; 4] = arr4!(|k| i16_products(w[k].0, w[k].1, x[k].0, x[k].1));
        // SAFETY: register-only NEON (baseline).
        unsafe { vpaddlq_s16(vpaddq_s16(vpaddq_s16(p[0], p[1]), vpaddq_s16(p[2], p[3]))) }
    }
}

/// Four blocks' dots with `sdot` (any weights), reduced to one i32 lane per block.
#[inline(always)]
unsafe fn isum4_sdot(w: [(int8x16_t, int8x16_t); 4], x: [(int8x16_t, int8x16_t); 4]) -> int32x4_t {
    // SAFETY: the caller is a `dotprod` function (see `idot`).
    let s: [int32x4_t; 4] = arr4!(|k| unsafe {
        idot::<true>(idot::<true>(vdupq_n_s32(0), w[k].0, x[k].0), w[k].1, x[k].1)
    });
    // SAFETY: register-only NEON (baseline).
    unsafe { vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3])) }
}

/// The exact integer dots of four Q8_0 blocks (weights down to -128: two products per i16 lane,
/// then widened per block) with their activation blocks, as i32 lanes.
#[inline(always)]
unsafe fn isum4_q8<const SDOT: bool>(
    w: [(int8x16_t, int8x16_t); 4],
    a: &[BlockQ8A; 4],
) -> int32x4_t {
    let x = [act_qs(&a[0]), act_qs(&a[1]), act_qs(&a[2]), act_qs(&a[3])];
    if SDOT {
        // SAFETY: reached only from `dotprod` functions (see `idot`).
        unsafe { isum4_sdot(w, x) }
    } else {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let s: [int32x4_t; 4] = arr4!(|k| {
                let (w0, w1, x0, x1) = (w[k].0, w[k].1, x[k].0, x[k].1);
                let p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
                let p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
                vpadalq_s16(vpaddlq_s16(p0), p1)
            });
            vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]))
        }
    }
}

/// The software pipeline every kernel here runs: `$step` (with `$i` the step index) computes a
/// step's terms, the bulk of the work, independent between steps; `$finish(sum, terms)` adds
/// them to `sum` in the reference's order, the serial part. Step i's adds are issued next to
/// step i + 1's arithmetic, so an in-order core has independent work while each add waits for
/// the one before; two steps per iteration, so the pending terms need no register copy.
/// A macro, not a function taking closures: `$step` is written out at each use, so a step
/// made of `#[inline(always)]` functions is always inlined (LLVM declines to inline a large
/// closure called twice per iteration, and a call in the loop costs more than the loop).
macro_rules! pipelined {
    ($steps:expr, |$i:ident| $step:expr, $finish:expr) => {{
        let steps: usize = $steps;
        let mut sum = 0f32;
        if steps > 0 {
            let mut pending = {
                let $i = 0usize;
                $step
            };
            let mut next = 1usize;
            while next + 2 <= steps {
                let a = {
                    let $i = next;
                    $step
                };
                sum = $finish(sum, pending);
                pending = {
                    let $i = next + 1;
                    $step
                };
                sum = $finish(sum, a);
                next += 2;
            }
            if next < steps {
                let a = {
                    let $i = next;
                    $step
                };
                sum = $finish(sum, pending);
                pending = a;
            }
            sum = $finish(sum, pending);
        }
        sum
    }};
}

/// The legacy driver: `terms(g)` gives `(d_w, f32(isum) * d_x)` of blocks 4g..4g + 4,
/// `tail(i, sum)` continues `sum` over blocks i..nb with the one-block kernel; the canonical
/// steps in block order.
#[inline(always)]
fn sum_terms4(
    nb: usize,
    terms: impl Fn(usize) -> (float32x4_t, float32x4_t),
    tail: impl Fn(usize, f32) -> f32,
) -> f32 {
    let groups = nb / 4;
    let sum = pipelined!(groups, |g| terms(g), fma4);
    if groups * 4 < nb {
        tail(groups * 4, sum)
    } else {
        sum
    }
}

/// `(d_w, f32(isum) * d_x)` on four lanes (the reference's product).
#[inline(always)]
fn scale4(dw: float32x4_t, a: &[BlockQ8A; 4], isum: int32x4_t) -> (float32x4_t, float32x4_t) {
    // SAFETY: register-only NEON (baseline).
    (dw, unsafe { vmulq_f32(vcvtq_f32_s32(isum), act_d4(a)) })
}

#[inline(always)]
unsafe fn dot4_q4_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4_0] = bytemuck::cast_slice(w);
    let nb = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let terms = |g: usize| {
        // SAFETY: g < nb / 4, so blocks 4g..4g + 4 are inside `w` (and `x`, below).
        let b: &[BlockQ4_0; 4] = unsafe { &*(wp.add(4 * g) as *const [BlockQ4_0; 4]) };
        let ws = b.each_ref().map(|b| {
            // SAFETY: `b.qs` is 16 bytes.
            let (lo, hi) = unsafe { nibbles(b.qs.as_ptr()) };
            (signed(lo, 8), signed(hi, 8))
        });
        // SAFETY: g < nb / 4: blocks 4g..4g + 4 of `x` are inside it.
        let a: &[BlockQ8A; 4] = unsafe { &*(xp.add(4 * g) as *const [BlockQ8A; 4]) };
        // SAFETY: blocks of 18 bytes: the four `d` fields lie at 0, 18, 36, 54 of `b`.
        let dw = unsafe { f16_gather4(b.as_ptr() as *const u8, 18) };
        // SAFETY: weights of magnitude <= 8 (see `isum4_small`); `SDOT` as the caller's.
        scale4(dw, a, unsafe { isum4_small::<SDOT>(ws, a) })
    };
    // SAFETY: the one-block kernel of the same flavour, over blocks i..nb.
    sum_terms4(nb, terms, |i, sum| unsafe {
        dot_q4_0::<SDOT>(bytemuck::cast_slice(&w[i..nb]), &x[i..nb], sum)
    })
}

#[inline(always)]
unsafe fn dot4_q5_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5_0] = bytemuck::cast_slice(w);
    let nb = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let terms = |g: usize| {
        // SAFETY: g < nb / 4, so blocks 4g..4g + 4 are inside `w` (and `x`, below).
        let b: &[BlockQ5_0; 4] = unsafe { &*(wp.add(4 * g) as *const [BlockQ5_0; 4]) };
        let ws = b.each_ref().map(|b| {
            // SAFETY: `b.qs` is 16 bytes; the rest is register-only NEON.
            unsafe {
                let (lo, hi) = nibbles(b.qs.as_ptr());
                let (m0, m1) = q5_high_mask(b.qh);
                // q | h << 4 - 16 = q - 16 where the bit is clear, q where it is set.
                let sixteen = vdupq_n_u8(16);
                (
                    vreinterpretq_s8_u8(vsubq_u8(lo, vbicq_u8(sixteen, m0))),
                    vreinterpretq_s8_u8(vsubq_u8(hi, vbicq_u8(sixteen, m1))),
                )
            }
        });
        // SAFETY: g < nb / 4: blocks 4g..4g + 4 of `x` are inside it.
        let a: &[BlockQ8A; 4] = unsafe { &*(xp.add(4 * g) as *const [BlockQ8A; 4]) };
        // SAFETY: blocks of 22 bytes: the four `d` fields lie at 0, 22, 44, 66 of `b`.
        let dw = unsafe { f16_gather4(b.as_ptr() as *const u8, 22) };
        // SAFETY: weights of magnitude <= 16 (see `isum4_small`); `SDOT` as the caller's.
        scale4(dw, a, unsafe { isum4_small::<SDOT>(ws, a) })
    };
    // SAFETY: the one-block kernel of the same flavour, over blocks i..nb.
    sum_terms4(nb, terms, |i, sum| unsafe {
        dot_q5_0::<SDOT>(bytemuck::cast_slice(&w[i..nb]), &x[i..nb], sum)
    })
}

#[inline(always)]
unsafe fn dot4_q8_0<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ8_0] = bytemuck::cast_slice(w);
    let nb = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let terms = |g: usize| {
        // SAFETY: g < nb / 4, so blocks 4g..4g + 4 are inside `w` (and `x`, below).
        let b: &[BlockQ8_0; 4] = unsafe { &*(wp.add(4 * g) as *const [BlockQ8_0; 4]) };
        // SAFETY: `qs` is 32 bytes: the loads read 0..16 and 16..32.
        let ws = b
            .each_ref()
            .map(|b| unsafe { (vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16))) });
        // SAFETY: g < nb / 4: blocks 4g..4g + 4 of `x` are inside it.
        let a: &[BlockQ8A; 4] = unsafe { &*(xp.add(4 * g) as *const [BlockQ8A; 4]) };
        // SAFETY: blocks of 34 bytes: the four `d` fields lie at 0, 34, 68, 102 of `b`.
        let dw = unsafe { f16_gather4(b.as_ptr() as *const u8, 34) };
        // SAFETY: `SDOT` as the caller's.
        scale4(dw, a, unsafe { isum4_q8::<SDOT>(ws, a) })
    };
    // SAFETY: the one-block kernel of the same flavour, over blocks i..nb.
    sum_terms4(nb, terms, |i, sum| unsafe {
        dot_q8_0::<SDOT>(bytemuck::cast_slice(&w[i..nb]), &x[i..nb], sum)
    })
}

/// The 32 bits of a Q5_0 / Q5_1 `qh` as byte masks (0xFF where set): (elements 0..16, 16..32).
#[inline(always)]
unsafe fn q5_high_mask(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const IDX0: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const IDX1: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: the constants are 16-byte arrays; NEON is the aarch64 baseline.
    unsafe {
        let v = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
        let (i0, i1, bit) = (
            vld1q_u8(IDX0.as_ptr()),
            vld1q_u8(IDX1.as_ptr()),
            vld1q_u8(BIT.as_ptr()),
        );
        (
            vtstq_u8(vqtbl1q_u8(v, i0), bit),
            vtstq_u8(vqtbl1q_u8(v, i1), bit),
        )
    }
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
            // SAFETY: as above.
            let (l1, h1) = unsafe { nibbles(qs.as_ptr().add(32 * j + 16)) };
            let hb = high(b, j);
            let (a1, a2) = (&xa[2 * j], &xa[2 * j + 1]);
            let (lo0, lo1) = (vorrq_u8_(l0, hb[0]), vorrq_u8_(l1, hb[1]));
            let (hi0, hi1) = (vorrq_u8_(h0, hb[2]), vorrq_u8_(h1, hb[3]));
            // SAFETY: register-only NEON plus the 32-byte activation loads of `isum32`.
            let i1 = unsafe { isum32::<SDOT>(signed(lo0, 0), signed(lo1, 0), a1) };
            // SAFETY: as above.
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

// ---------------------------------------------------------------------------------------------
// k-quants, whole super-blocks on vectors (Q4_K, Q6_K)
// ---------------------------------------------------------------------------------------------
//
// The integer sums of a super-block's eight 32-groups come out as two i32x4 (pairwise adds of
// the products, then one widening step), the scales are multiplied in on four lanes, the
// per-group f32 products `d_x * (sc * isum) as f32` are four-lane multiplies, and only the
// reference's serial adds (`sd += ...`, group order) stay scalar: they are those of the previous
// super-block, interleaved with this one's arithmetic. Same operations, same order, same bits.

/// The eight 6-bit scales and mins of a Q4_K / Q5_K block, as bytes 0..8 of two u64
/// (the same values as [`scale_min_k4`] for j = 0..8).
#[inline(always)]
fn scales_mins_k4(q: &[u8; 12]) -> (u64, u64) {
    let w = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a0, a1, a2) = (w(0), w(4), w(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let sc = (a0 & LOW6) as u64 | (((a2 & LOW4) | (((a0 >> 6) & TOP2) << 4)) as u64) << 32;
    let m = (a1 & LOW6) as u64 | ((((a2 >> 4) & LOW4) | (((a1 >> 6) & TOP2) << 4)) as u64) << 32;
    (sc, m)
}

/// Eight u8 values (bytes of `v`) as two i32x4.
#[inline(always)]
fn widen8(v: u64) -> (int32x4_t, int32x4_t) {
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let h = vmovl_u8(vcreate_u8(v));
        (
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
            vreinterpretq_s32_u32(vmovl_high_u16(h)),
        )
    }
}

/// Per-group integer dots of four 32-groups of small unsigned weights (<= 15: Q4_K) as i32
/// lanes. Plain: four products per i16 lane per group, two pairwise adds (16 products, at most
/// `16 * 15 * 127 = 30480`), one widening add.
#[inline(always)]
unsafe fn isum4_groups<const SDOT: bool>(
    w: [(int8x16_t, int8x16_t); 4],
    x: [(int8x16_t, int8x16_t); 4],
) -> int32x4_t {
    if SDOT {
        // SAFETY: reached only from `dotprod` functions (see `idot`).
        unsafe { isum4_sdot(w, x) }
    } else {
        let p: [int16x8_t; 4] = arr4!(|k| i16_products(w[k].0, w[k].1, x[k].0, x[k].1));
        // SAFETY: register-only NEON (baseline).
        unsafe { vpaddlq_s16(vpaddq_s16(vpaddq_s16(p[0], p[1]), vpaddq_s16(p[2], p[3]))) }
    }
}

/// What one Q4_K super-block leaves for the serial part, per sub-block s (lane s % 4 of the
/// `lo` (s < 4) or `hi` vector): `d * sc_s`, `f32(isum_s) * d_x`, `-(dmin * m_s)` and the
/// activation block's `s`.
#[derive(Clone, Copy)]
struct KTerms {
    dsc: [float32x4_t; 2],
    t: [float32x4_t; 2],
    dm: [float32x4_t; 2],
    xs: [float32x4_t; 2],
}

/// The reference's serial part of a Q4_K super-block: per sub-block in order,
/// `sum = fma(d * sc, f32(isum) * d_x, sum)` then `sum = fma(-(dmin * m), a.s, sum)`.
#[inline(always)]
fn k4_finish(sum: f32, t: KTerms) -> f32 {
    let mut sum = sum;
    for h in 0..2 {
        // SAFETY: register-only NEON (baseline).
        unsafe {
            let (a, b, c, e) = (t.dsc[h], t.t[h], t.dm[h], t.xs[h]);
            sum = vgetq_lane_f32::<0>(a).mul_add(vgetq_lane_f32::<0>(b), sum);
            sum = vgetq_lane_f32::<0>(c).mul_add(vgetq_lane_f32::<0>(e), sum);
            sum = vgetq_lane_f32::<1>(a).mul_add(vgetq_lane_f32::<1>(b), sum);
            sum = vgetq_lane_f32::<1>(c).mul_add(vgetq_lane_f32::<1>(e), sum);
            sum = vgetq_lane_f32::<2>(a).mul_add(vgetq_lane_f32::<2>(b), sum);
            sum = vgetq_lane_f32::<2>(c).mul_add(vgetq_lane_f32::<2>(e), sum);
            sum = vgetq_lane_f32::<3>(a).mul_add(vgetq_lane_f32::<3>(b), sum);
            sum = vgetq_lane_f32::<3>(c).mul_add(vgetq_lane_f32::<3>(e), sum);
        }
    }
    sum
}

/// Of the four activation blocks from `a`: `s` (`d * sum(q)`) as f32 lanes.
#[inline(always)]
unsafe fn act_s4(a: *const BlockQ8A) -> float32x4_t {
    // SAFETY: the caller passes four readable blocks of 44 bytes; each load reads 0..16 of one.
    let h: [uint32x4_t; 4] =
        // SAFETY: as above.
        arr4!(|k| unsafe { vreinterpretq_u32_u8(vld1q_u8(a.add(k) as *const u8)) });
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let (ab, cd) = (vtrn2q_u32(h[0], h[1]), vtrn2q_u32(h[2], h[3]));
        vreinterpretq_f32_u64(vzip1q_u64(
            vreinterpretq_u64_u32(ab),
            vreinterpretq_u64_u32(cd),
        ))
    }
}

#[inline(always)]
unsafe fn q4_k_terms<const SDOT: bool>(b: &BlockQ4K, xa: *const BlockQ8A) -> KTerms {
    // Blocks addressed from the fourth: every load is one `ldur` (offsets within +-256).
    // SAFETY: the caller passes eight readable blocks.
    let mid = opaque(unsafe { xa.add(4) });
    // SAFETY: as above.
    let blk = |g: usize| unsafe { &*mid.offset(g as isize - 4) };
    let x: [(int8x16_t, int8x16_t); 8] = [
        act_qs(blk(0)),
        act_qs(blk(1)),
        act_qs(blk(2)),
        act_qs(blk(3)),
        act_qs(blk(4)),
        act_qs(blk(5)),
        act_qs(blk(6)),
        act_qs(blk(7)),
    ];
    // Groups 2j (low nibbles of bytes 32j..32j+32) and 2j + 1 (high nibbles).
    // SAFETY: register-only NEON (the aarch64 baseline).
    let mut w = [unsafe { (vdupq_n_s8(0), vdupq_n_s8(0)) }; 8];
    for j in 0..4 {
        // SAFETY: `qs` is 128 bytes; 32j + 32 <= 128.
        let (l0, h0) = unsafe { nibbles(b.qs.as_ptr().add(32 * j)) };
        // SAFETY: as above.
        let (l1, h1) = unsafe { nibbles(b.qs.as_ptr().add(32 * j + 16)) };
        w[2 * j] = (signed(l0, 0), signed(l1, 0));
        w[2 * j + 1] = (signed(h0, 0), signed(h1, 0));
    }
    // SAFETY: weights <= 15 (see `isum4_groups`); `SDOT` as the caller's.
    let (i_lo, i_hi) = unsafe {
        (
            isum4_groups::<SDOT>([w[0], w[1], w[2], w[3]], [x[0], x[1], x[2], x[3]]),
            isum4_groups::<SDOT>([w[4], w[5], w[6], w[7]], [x[4], x[5], x[6], x[7]]),
        )
    };
    let (sc, m) = scales_mins_k4(&b.scales);
    let ((sc_lo, sc_hi), (m_lo, m_hi)) = (widen8(sc), widen8(m));
    // SAFETY: blocks 0..4 and 4..8 of the eight.
    let (d_lo, d_hi) = unsafe { (act_head4(mid.sub(4)).0, act_head4(mid).0) };
    // SAFETY: as above.
    let (s_lo, s_hi) = unsafe { (act_s4(mid.sub(4)), act_s4(mid)) };
    // SAFETY: register-only NEON (baseline).
    unsafe {
        // `d` and `dmin` are the block's first four bytes: one load, one widening.
        let dd = f16x4_low2(b.d, b.dmin);
        let (d, ndmin) = (vget_lane_f32::<0>(dd), -vget_lane_f32::<1>(dd));
        // d * sc and -(dmin * m) = (-dmin) * m are exact (11-bit by 6-bit products).
        KTerms {
            dsc: [
                vmulq_n_f32(vcvtq_f32_s32(sc_lo), d),
                vmulq_n_f32(vcvtq_f32_s32(sc_hi), d),
            ],
            t: [
                vmulq_f32(vcvtq_f32_s32(i_lo), d_lo),
                vmulq_f32(vcvtq_f32_s32(i_hi), d_hi),
            ],
            dm: [
                vmulq_n_f32(vcvtq_f32_s32(m_lo), ndmin),
                vmulq_n_f32(vcvtq_f32_s32(m_hi), ndmin),
            ],
            xs: [s_lo, s_hi],
        }
    }
}

#[inline(always)]
unsafe fn dot2_q4_k<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4K] = bytemuck::cast_slice(w);
    let nb = w.len().min(x.len() / 8);
    let xp = x.as_ptr();
    // One super-block per iteration (two would not fit the registers): the pipeline of
    // `pipelined!` with a register copy of the pending terms.
    let mut sum = 0f32;
    if nb == 0 {
        return sum;
    }
    // SAFETY: `SDOT` as the caller's; super-block i < nb has activation blocks 8i..8i + 8.
    let mut pending = unsafe { q4_k_terms::<SDOT>(&w[0], xp) };
    // `i` also places the activation blocks (8i..8i + 8).
    #[allow(clippy::needless_range_loop)]
    for i in 1..nb {
        // SAFETY: as above, for super-block i < nb.
        let next = unsafe { q4_k_terms::<SDOT>(&w[i], xp.add(8 * i)) };
        sum = k4_finish(sum, pending);
        pending = next;
    }
    k4_finish(sum, pending)
}

/// What one Q6_K super-block leaves for the serial part, per 16-weight half i = 2g + h in
/// scale order (lane i % 4 of vector i / 4): `d * sc_i` and `f32(isum_i) * d_x` of group g.
#[derive(Clone, Copy)]
struct K6Terms {
    dsc: [float32x4_t; 4],
    t: [float32x4_t; 4],
}

/// The reference's serial part of a Q6_K super-block: `sum = fma(d * sc_i, t_i, sum)`, i in order.
#[inline(always)]
fn k6_finish(sum: f32, t: K6Terms) -> f32 {
    let mut sum = sum;
    for v in 0..4 {
        sum = fma4(sum, (t.dsc[v], t.t[v]));
    }
    sum
}

/// The 16-weight dots of one Q6_K super-block, in scale order (`scales[i]` belongs to lane i),
/// as four i32x4. Lane i covers half h = i % 2 of group 4n + k, n = i / 8, k = (i % 8) / 2.
#[inline(always)]
unsafe fn q6_k_dots16<const SDOT: bool>(b: &BlockQ6K, mid: *const BlockQ8A) -> [int32x4_t; 4] {
    // d[n][h][k]: the 16 six-bit weights (minus 32) of half h of group 4n + k.
    // SAFETY: register-only NEON (the aarch64 baseline).
    let mut w = [[[unsafe { vdupq_n_s8(0) }; 4]; 2]; 2];
    for (n, wn) in w.iter_mut().enumerate() {
        for (h, wh) in wn.iter_mut().enumerate() {
            // SAFETY: ql is 128 bytes (64n + 32 + 16h + 16 <= 128), qh 64 bytes
            // (32n + 16h + 16 <= 64); the rest is register-only NEON.
            unsafe {
                let ql = b.ql.as_ptr().add(64 * n + 16 * h);
                let (ql0, ql1) = (vld1q_u8(ql), vld1q_u8(ql.add(32)));
                let qh = vld1q_u8(b.qh.as_ptr().add(32 * n + 16 * h));
                let m6 = vdupq_n_u8(0x3F);
                let qh2 = vshrq_n_u8(qh, 2);
                // Shift-and-insert: the nibble and the two high bits in one op, then 6 bits kept.
                let q = [
                    vandq_u8(vsliq_n_u8(ql0, qh, 4), m6),
                    vandq_u8(vsliq_n_u8(ql1, qh2, 4), m6),
                    vandq_u8(vsriq_n_u8(qh, ql0, 4), m6),
                    vandq_u8(vsriq_n_u8(qh2, ql1, 4), m6),
                ];
                *wh = q.map(|q| signed(q, 32));
            }
        }
    }
    // x[n][h][k]: the matching 16 activations.
    let xs = |n: usize, h: usize, k: usize| -> int8x16_t {
        // SAFETY: `mid` is block 4 of eight; `qs` is 32 bytes, 16h + 16 <= 32.
        unsafe {
            vld1q_s8(
                (*mid.offset((4 * n + k) as isize - 4))
                    .qs
                    .as_ptr()
                    .add(16 * h),
            )
        }
    };
    // Scale order i = 8n + 2k + h, four per output vector.
    let at = |i: usize| (i / 8, i % 2, (i % 8) / 2);
    if SDOT {
        arr4!(|v| {
            let s: [int32x4_t; 4] = arr4!(|j| {
                let (n, h, k) = at(4 * v + j);
                // SAFETY: reached only from `dotprod` functions (see `idot`).
                unsafe { idot::<true>(vdupq_n_s32(0), w[n][h][k], xs(n, h, k)) }
            });
            // SAFETY: register-only NEON (baseline).
            unsafe { vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3])) }
        })
    } else {
        arr4!(|v| {
            // Two products per i16 lane (|w| <= 32: at most 8128), then two pairwise adds
            // (8 products, at most 32512), then widened.
            let p: [int16x8_t; 4] = arr4!(|j| {
                let (n, h, k) = at(4 * v + j);
                let (a, x) = (w[n][h][k], xs(n, h, k));
                // SAFETY: register-only NEON (baseline).
                unsafe { vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(x)), a, x) }
            });
            // SAFETY: register-only NEON (baseline).
            unsafe { vpaddlq_s16(vpaddq_s16(vpaddq_s16(p[0], p[1]), vpaddq_s16(p[2], p[3]))) }
        })
    }
}

#[inline(always)]
unsafe fn q6_k_terms<const SDOT: bool>(b: &BlockQ6K, xa: *const BlockQ8A) -> K6Terms {
    // Blocks addressed from the fourth: every load is one `ldur` (offsets within +-256).
    // SAFETY: the caller passes eight readable blocks; `SDOT` as the caller's.
    let mid = opaque(unsafe { xa.add(4) });
    // SAFETY: as above.
    let dots = unsafe { q6_k_dots16::<SDOT>(b, mid) };
    // SAFETY: `scales` is 16 bytes; the rest is register-only NEON.
    unsafe {
        let sc = vld1q_s8(b.scales.as_ptr());
        let (s0, s1) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
        let sc32 = [
            vmovl_s16(vget_low_s16(s0)),
            vmovl_high_s16(s0),
            vmovl_s16(vget_low_s16(s1)),
            vmovl_high_s16(s1),
        ];
        let ((d_lo, _), (d_hi, _)) = (act_head4(mid.sub(4)), act_head4(mid));
        // d_x of group i / 2 for half i: each block's scale on two adjacent lanes.
        let dx = [
            vzip1q_f32(d_lo, d_lo),
            vzip2q_f32(d_lo, d_lo),
            vzip1q_f32(d_hi, d_hi),
            vzip2q_f32(d_hi, d_hi),
        ];
        let d = f16(b.d);
        // d * sc is exact (11-bit by 8-bit).
        K6Terms {
            dsc: arr4!(|v| vmulq_n_f32(vcvtq_f32_s32(sc32[v]), d)),
            t: arr4!(|v| vmulq_f32(vcvtq_f32_s32(dots[v]), dx[v])),
        }
    }
}

#[inline(always)]
unsafe fn dot2_q6_k<const SDOT: bool>(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ6K] = bytemuck::cast_slice(w);
    let nb = w.len().min(x.len() / 8);
    let xp = x.as_ptr();
    // One super-block per iteration (two would not fit the registers): the pipeline of
    // `pipelined!` with a register copy of the pending terms.
    let mut sum = 0f32;
    if nb == 0 {
        return sum;
    }
    // SAFETY: `SDOT` as the caller's; super-block i < nb has activation blocks 8i..8i + 8.
    let mut pending = unsafe { q6_k_terms::<SDOT>(&w[0], xp) };
    // `i` also places the activation blocks (8i..8i + 8).
    #[allow(clippy::needless_range_loop)]
    for i in 1..nb {
        // SAFETY: as above, for super-block i < nb.
        let next = unsafe { q6_k_terms::<SDOT>(&w[i], xp.add(8 * i)) };
        sum = k6_finish(sum, pending);
        pending = next;
    }
    k6_finish(sum, pending)
}

// ---------------------------------------------------------------------------------------------
// Float weights against f32 activations
// ---------------------------------------------------------------------------------------------

/// Shared body, in the canonical order of [`super::reference::float_dot`]: `load(i)` gives
/// weights i..i+4 as f32, `one(i)` weight i; eight accumulators are the 32 lanes. Rows of a
/// multiple of 32 reduce in registers; a ragged tail goes through the lanes in memory (same
/// steps, scalar).
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
    // contract for the same range of weights; the lane stores write inside `lanes`.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 8];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, load(i + 4 * k), vld1q_f32(xp.add(i + 4 * k)));
            }
            i += 32;
        }
        if i == n {
            // The tree: lanes l + 16 (registers k, k + 4), l + 8 (k, k + 2), l + 4 (the pair),
            // l + 2 (low + high halves), l + 1 (faddp).
            let r: [float32x4_t; 4] = std::array::from_fn(|k| vaddq_f32(acc[k], acc[k + 4]));
            let s = vaddq_f32(vaddq_f32(r[0], r[2]), vaddq_f32(r[1], r[3]));
            return vpadds_f32(vadd_f32(vget_low_f32(s), vget_high_f32(s)));
        }
        let mut lanes = [0f32; FLOAT_LANES];
        for (k, a) in acc.iter().enumerate() {
            vst1q_f32(lanes.as_mut_ptr().add(4 * k), *a);
        }
        while i < n {
            lanes[i % FLOAT_LANES] = one(i).mul_add(x[i], lanes[i % FLOAT_LANES]);
            i += 1;
        }
        float_lanes_sum(lanes)
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

/// Four halves (8 bytes at `p`) to f32 with the ARMv8.0 `fcvtl` (also the 16-row kernels'
/// scale loads).
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8) -> float32x4_t {
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

    /// Every NEON kernel (both flavours) against the scalar reference on random rows (1 to 3
    /// super-blocks; legacy rows of 1 to 7 blocks, so groups of four with and without a tail;
    /// Qwen's outlier activations; float rows also of ragged lengths): every kernel bit for bit.
    #[test]
    fn neon_matches_reference() {
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        let mut rng = Rng::new(11);
        for sdot in flavours() {
            for (dtype, dot) in super::kernels(sdot) {
                for cols in [256usize, 512, 768, 4864, 96, 160, 224, 32, 36, 7] {
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
                            (Dot::Float(f), Dot::Float(r)) => (f(&w, &x), r(&w, &x), true),
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

    /// The i16 lanes at their limits: every weight at its most negative or largest value
    /// (Q4_0 -8, Q5_0 -16, Q8_0 -128, Q4_K 15, Q6_K -32) against activations all -127 or +127,
    /// where the pairwise i16 adds hold 16 (Q4_0, Q5_0, Q4_K) or 8 (Q6_K) products: 32512 at
    /// most. A wrapped lane would move the result by 65536 units; the reference is exact.
    #[test]
    fn integer_lanes_hold_the_extremes() {
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        for sdot in flavours() {
            for (dtype, dot) in super::kernels(sdot) {
                let Dot::Quant(f) = dot else { continue };
                let Dot::Quant(r) = reference.dot(dtype) else {
                    panic!("{dtype}: kernel kinds differ")
                };
                let cols = 4 * 256;
                let bb = dtype.block_bytes();
                for fill in [0x00u8, 0xFF, 0x80, 0x88] {
                    let mut w = vec![fill; cols / dtype.block_elems() * bb];
                    for blk in w.chunks_exact_mut(bb) {
                        match dtype {
                            DType::Q6_K => blk[192..208].fill(0x7F),
                            DType::Q4_K | DType::Q5_K => blk[4..16].fill(0xFF),
                            _ => {}
                        }
                        for &off in super::super::blocks::f16_fields(dtype) {
                            blk[off..off + 2]
                                .copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
                        }
                    }
                    for xv in [-1.0f32, 1.0] {
                        let mut xq = Vec::new();
                        quantize_q8a(&vec![xv; cols], &mut xq);
                        let (got, want) = (f(&w, &xq), r(&w, &xq));
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{dtype} fill {fill:#04x} x {xv} sdot {sdot}: neon {got} vs reference {want}"
                        );
                    }
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
