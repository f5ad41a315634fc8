//! NEON kernels (aarch64) over the k-quant 16-row tiles of [`super::kquants`] (Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, IQ4_XS).
//!
//! A 64-byte granule of a tile is 16 rows x 4 consecutive quant bytes; NEON register `j` of it
//! (16 bytes) holds rows `4j..4j + 4`. So the kernels work one *row quad* `j` at a time: per
//! sub-block (Q4_K) or Q8A block (Q6_K) 8 registers of unsigned weights, unpacked once for all
//! tokens of the call, then per token an exact i32 sum per row (the 4 lanes of one register)
//! and the f32 steps of the kquants specification on 4 rows at once, in its order. Rows are
//! independent, so the quad order changes no bit; each token gets the same exact sums and the
//! same f32 steps whatever the token count, so a multi-token call gives one-token bits. With
//! several tokens they are written out, on plain NEON two at a time ([`isum_quad2`]: more
//! independent chains for an in-order core), in groups of [`GROUP`].
//!
//! Two flavours of one body (`const SDOT: bool`):
//!
//! - dotprod: `sdot acc.4s, w.16b, x.4b[i]` (the indexed form): one 4-byte activation group
//!   feeds 4 rows per instruction;
//! - plain NEON (ARMv8.0, Cortex-A53): the group broadcast (`dup` from a lane of one 16-byte
//!   activation load), `smull`/`smlal` (low 8 bytes: rows 4j, 4j+1) and the high halves (rows
//!   4j+2, 4j+3) into i16 lanes, one lane per (row, position in the group), then `saddlp` to
//!   i32 and one `addp` to a lane per row. The i16 bounds are written where the products are
//!   added.
//!
//! Q5_K, Q3_K and Q2_K keep the per-row reference's f32 expressions (`q5k_ref`, `k16_ref`
//! in [`super::kquants`]): per-token partial sums `sd` (and `sm`) over the tile, added to the
//! accumulator once per tile, every product rounded on its own. IQ4_XS's weights are its
//! table values (`tbl`), signed, so the plain flavour adds two products per i16 lane only.
//!
//! The one-token plain kernels of all six types (and the one-token `sdot` ones of all but
//! Q6_K) are tile-major instead ([`q4k_pair_tile`], [`q5k_pair_tile`], [`q6k_block_tile`],
//! [`k16_block_tile`], [`iq4xs_sub_tile`]): one activation broadcast and scale plane serves
//! all four quads.
//!
//! `scripts/arm-proxy.sh` models the one-token loops (`q4k_one_plain` on the Cortex-A53,
//! `q4k_one_tf` on the A55, Q6_K alike) next to llama.cpp's per-block dots, and the 8-token
//! ones (`q4k_eight_plain`, `q4k_eight_tf`, ...) against them.
//!
//! Only [`kernels`] hands these out; the dotprod ones only when the caller checked that the
//! CPU has dotprod ([`super::super::Isa::NeonDotprod`]).

use super::super::blocks::BlockQ8A;
use super::super::blocks::KVALUES_IQ4NL;
use super::super::neon::f16x4;
use super::kquants::{
    k6_qh, k6_ql, K2_BYTES, K2_D, K2_DMIN, K2_QS, K2_SC, K3_BYTES, K3_D, K3_HM, K3_QS, K3_SC,
    K4_BYTES, K4_D, K4_DMIN, K4_QS, K4_SC, K5_BYTES, K5_D, K5_DMIN, K5_QH, K5_QS, K6_BYTES, K6_D,
    K6_SC, KX_BYTES, KX_D, KX_QS, KX_SH, KX_SL,
};
use super::neon::{each_token, opaque_ptr, settled};
use super::{Rows16Dot, ROWS};
use knot_format::dtype::DType;
use std::arch::aarch64::*;
use std::arch::asm;

/// The 16-row k-quant kernels (`dotprod`: the `sdot` flavour, only where the CPU has it).
pub(in super::super) fn kernels(dotprod: bool) -> Vec<(DType, Rows16Dot)> {
    if dotprod {
        vec![
            (DType::Q4_K, rows16_q4_k_sdot as Rows16Dot),
            (DType::Q6_K, rows16_q6_k_sdot as Rows16Dot),
            (DType::Q5_K, rows16_q5_k_sdot as Rows16Dot),
            (DType::Q3_K, rows16_q3_k_sdot as Rows16Dot),
            (DType::Q2_K, rows16_q2_k_sdot as Rows16Dot),
            (DType::IQ4_XS, rows16_iq4_xs_sdot as Rows16Dot),
        ]
    } else {
        vec![
            (DType::Q4_K, rows16_q4_k_plain as Rows16Dot),
            (DType::Q6_K, rows16_q6_k_plain as Rows16Dot),
            (DType::Q5_K, rows16_q5_k_plain as Rows16Dot),
            (DType::Q3_K, rows16_q3_k_plain as Rows16Dot),
            (DType::Q2_K, rows16_q2_k_plain as Rows16Dot),
            (DType::IQ4_XS, rows16_iq4_xs_plain as Rows16Dot),
        ]
    }
}

/// `if t < T { body }` for t = 0, 2, 4, 6 written out (token pairs of an 8-token call): LLVM
/// keeps a loop over the tokens rolled, one token's chains at a time.
macro_rules! each_pair {
    ($T:expr, |$t:ident| $body:block) => {
        each_token!(@ $T, $t, $body, 0 2 4 6)
    };
}

/// Tokens per group in the multi-token loops (a multiple of 2): a group's activation loads
/// wait for the previous group's results ([`group_ptr`], [`group_end`]). Left alone, LLVM
/// interleaves all 8 tokens and spills; llvm-mca, the 8-token loops per row-block: A53 plain
/// Q4_K 899.8 -> 763.8 (groups of 2: 1011.3, of 8: 779.3), Q6_K 1197.0 -> 885.5; A55 `sdot`
/// Q6_K 571.5 -> 510.0, Q3_K 618.8 -> 567.8 (Q5_K's `sdot` path is not grouped).
const GROUP: usize = 4;

/// Token `t`'s activation blocks `a`, through [`opaque_ptr`] where `t` starts a [`GROUP`] (so
/// their loads come after the previous group's [`settled`]).
#[inline(always)]
fn group_ptr(t: usize, a: *const BlockQ8A) -> *const BlockQ8A {
    if t.is_multiple_of(GROUP) {
        opaque_ptr(a)
    } else {
        a
    }
}

/// `v[n - GROUP..n]` [`settled`] where the first `n` tokens end a [`GROUP`].
#[inline(always)]
fn group_end<const T: usize>(n: usize, v: &mut [float32x4_t; T]) {
    if n.is_multiple_of(GROUP) {
        for v in &mut v[n - GROUP..n] {
            *v = settled(*v);
        }
    }
}

/// One k-quant type's tile, a row quad at a time.
trait KTile {
    const BYTES: usize;
    /// Row quad `j` of the tile at `p` for `T` tokens (`xb`: each token's 8 Q8A blocks of
    /// this super-block) onto `acc[t]` (the quad's four rows of token t).
    ///
    /// SAFETY (callers): `p` points at `BYTES` readable bytes, each `xb[t]` at 8 readable
    /// blocks, and with `SDOT` the CPU has dotprod.
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        acc: &mut [float32x4_t; T],
    );
}

/// `acc + ` lane-wise 4-byte dots of `w` with group `LANE` of `x` (`sdot` by element).
///
/// Reached only from `SDOT` bodies, which only run on a CPU with dotprod.
#[inline(always)]
unsafe fn sdot_lane(acc: int32x4_t, w: int8x16_t, x: int8x16_t, lane: usize) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction, reached only on CPUs with dotprod (see above). The
    // directive lets the assembler take `sdot` outside a `dotprod` function too. `lane` is
    // a constant after unrolling, so the match folds to one instruction.
    unsafe {
        macro_rules! sdot {
            ($i:literal) => {
                asm!(
                    ".arch_extension dotprod",
                    concat!("sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[", $i, "]"),
                    acc = inout(vreg) acc,
                    w = in(vreg) w,
                    x = in(vreg) x,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
        }
        match lane & 3 {
            0 => sdot!(0),
            1 => sdot!(1),
            2 => sdot!(2),
            _ => sdot!(3),
        }
    }
    acc
}

/// `init + ` the exact i32 sums of rows `4j..4j + 4` (lanes) over `4H` granules: register `g`
/// of `w` (flattened) holds elements `4g..4g + 4` of each row, matched by the 4 activation
/// bytes at `x + 4g`.
///
/// SAFETY (callers): `x` points at `16H` readable bytes; with `SDOT` the CPU has dotprod.
#[inline(always)]
unsafe fn isum_quad<const SDOT: bool, const H: usize>(
    w: &[[int8x16_t; 4]; H],
    x: *const i8,
    init: int32x4_t,
) -> int32x4_t {
    // SAFETY: the loads read `x[0..16H]` (see above); everything else is register-only.
    unsafe {
        if SDOT {
            // Two chains (an in-order core waits for each `sdot`'s result otherwise); integer
            // sums are exact, so the split changes no bit.
            let mut acc = [init, vdupq_n_s32(0)];
            for (h, wh) in w.iter().enumerate() {
                let xr = vld1q_s8(x.add(16 * h));
                for (i, &wg) in wh.iter().enumerate() {
                    acc[i % 2] = sdot_lane(acc[i % 2], wg, xr, i);
                }
            }
            vaddq_s32(acc[0], acc[1])
        } else {
            // i16 lane (row, i) adds one product per granule: 4H products of |u * x| <=
            // 63 * 127 (Q6_K, H = 1: 4 * 8001 = 32004 <= 32767) or 15 * 127 (Q4_K, H = 2:
            // 8 * 1905 = 15240); activations are in [-127, 127] (BlockQ8A).
            let mut lo = vdupq_n_s16(0);
            let mut hi = vdupq_n_s16(0);
            for (h, wh) in w.iter().enumerate() {
                // One load per 16 activations, then a lane broadcast per group (an `ld1r` per
                // group needs an address `add` each).
                let xr = vreinterpretq_s32_s8(vld1q_s8(x.add(16 * h)));
                for (i, &wg) in wh.iter().enumerate() {
                    let g = 4 * h + i;
                    let xb = lane_bytes(xr, i);
                    if g == 0 {
                        lo = vmull_s8(vget_low_s8(wg), vget_low_s8(xb));
                        hi = vmull_high_s8(wg, xb);
                    } else {
                        lo = vmlal_s8(lo, vget_low_s8(wg), vget_low_s8(xb));
                        hi = vmlal_high_s8(hi, wg, xb);
                    }
                }
            }
            vaddq_s32(init, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
        }
    }
}

/// [`isum_quad`]'s plain flavour (from 0) for two tokens at once (activations at `x[0]`,
/// `x[1]`), their products interleaved: four independent i16 chains instead of two, so an
/// in-order core does not wait on each `smlal` (the same lanes take the same products: the
/// same bounds, the same exact sums).
///
/// SAFETY (callers): each `x[k]` points at `16H` readable bytes.
#[inline(always)]
unsafe fn isum_quad2<const H: usize>(w: &[[int8x16_t; 4]; H], x: [*const i8; 2]) -> [int32x4_t; 2] {
    // SAFETY: the loads read `x[k][0..16H]` (see above); everything else is register-only.
    unsafe {
        // i16 lane (row, i) of each token adds one product per granule, as in `isum_quad`:
        // 4H products of |u * x| <= 63 * 127 (H = 1) or 31 * 127 (H = 2: 8 * 3937 = 31496).
        let mut lo = [vdupq_n_s16(0); 2];
        let mut hi = [vdupq_n_s16(0); 2];
        for (h, wh) in w.iter().enumerate() {
            let xr = x.map(|x| vreinterpretq_s32_s8(vld1q_s8(x.add(16 * h))));
            for (i, &wg) in wh.iter().enumerate() {
                let first = h == 0 && i == 0;
                for k in 0..2 {
                    let xb = lane_bytes(xr[k], i);
                    if first {
                        lo[k] = vmull_s8(vget_low_s8(wg), vget_low_s8(xb));
                        hi[k] = vmull_high_s8(wg, xb);
                    } else {
                        lo[k] = vmlal_s8(lo[k], vget_low_s8(wg), vget_low_s8(xb));
                        hi[k] = vmlal_high_s8(hi[k], wg, xb);
                    }
                }
            }
        }
        [0, 1].map(|k| vpaddq_s32(vpaddlq_s16(lo[k]), vpaddlq_s16(hi[k])))
    }
}

/// Bytes `4j..4j + 4` of the planes at `a` and `b` as the two halves of one vector.
#[inline(always)]
unsafe fn two_planes(a: *const u8, b: *const u8) -> uint8x8_t {
    // SAFETY: callers pass planes of 16 readable bytes, already offset by 4j (j < 4).
    unsafe {
        let v = vld1_dup_u32(a as *const u32);
        vreinterpret_u8_u32(vld1_lane_u32::<1>(b as *const u32, v))
    }
}

/// Q4_K: per sub-block 8 registers of nibbles, `d * sc` and `dmin * m` for the quad, then per
/// token one sub-block dot, its scale FMA and its min FMA.
struct Q4K;

/// `(d * sc, dmin * m)` of sub-block `S` for the quad at plane offset `j` (get_scale_min_k4 on
/// 4 rows; both products are exact in f32).
#[inline(always)]
unsafe fn q4k_scales<const S: usize>(
    p: *const u8,
    j: usize,
    d: float32x4_t,
    dmin: float32x4_t,
) -> (float32x4_t, float32x4_t) {
    // SAFETY: the caller's contract, passed on; the rest is register-only.
    unsafe {
        let v = k4_scale_min::<S>(p, j);
        let sc = vcvtq_f32_u32(vmovl_u16(vget_low_u16(v)));
        let m = vcvtq_f32_u32(vmovl_high_u16(v));
        (vmulq_f32(d, sc), vmulq_f32(dmin, m))
    }
}

/// Sub-block `S`'s 6-bit scales (lanes 0..4) and mins (lanes 4..8) of the quad at plane
/// offset `j`, from the 12 scale planes of a Q4_K or Q5_K tile at `p` (same offsets).
#[inline(always)]
unsafe fn k4_scale_min<const S: usize>(p: *const u8, j: usize) -> uint16x8_t {
    // SAFETY: the planes lie inside the tile at `p` (the caller's contract); the rest is
    // register-only.
    unsafe {
        let plane = |i: usize| p.add(K4_SC + ROWS * i + 4 * j);
        // Lanes 0..4: the quad's scales, 4..8: its mins.
        let v = if S < 4 {
            vand_u8(two_planes(plane(S), plane(S + 4)), vdup_n_u8(63))
        } else {
            let lo = two_planes(plane(S + 4), plane(S + 4));
            let hi = two_planes(plane(S - 4), plane(S));
            // Low nibble for the scales, high nibble for the mins (a right shift by 4 in lanes
            // 4..8), then the top 2 bits of the other planes above them.
            let lo = vshl_u8(lo, vcreate_s8(0xFCFC_FCFC_0000_0000));
            let lo = vand_u8(lo, vdup_n_u8(0x0F));
            vsli_n_u8::<4>(lo, vshr_n_u8::<6>(hi))
        };
        vmovl_u8(v)
    }
}

/// Sub-block `S` of row quad `j` of a Q4_K tile at `p` for `T` tokens.
#[inline(always)]
unsafe fn q4k_sub<const SDOT: bool, const T: usize, const S: usize>(
    p: *const u8,
    j: usize,
    (d, dmin): (float32x4_t, float32x4_t),
    xb: &[*const BlockQ8A; T],
    acc: &mut [float32x4_t; T],
) {
    // SAFETY: every load lies inside the tile at `p` or the activation blocks (the caller's
    // contract); the rest is register-only.
    unsafe {
        let (dsc, dm) = q4k_scales::<S>(p, j, d, dmin);
        let qs = p.add(K4_QS + 512 * (S / 2) + 16 * j);
        let mut w = [[vdupq_n_s8(0); 4]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (i, wg) in wh.iter_mut().enumerate() {
                let v = vld1q_u8(qs.add(64 * (4 * h + i)));
                let v = if S % 2 == 1 {
                    vshrq_n_u8::<4>(v)
                } else {
                    vandq_u8(v, vdupq_n_u8(0x0F))
                };
                *wg = vreinterpretq_s8_u8(v);
            }
        }
        let step = |acc: float32x4_t, a: *const BlockQ8A, isum: int32x4_t| {
            // `d` and `s` are the block's first two fields.
            let ds = vld1_f32(a as *const f32);
            let tmp = vmulq_lane_f32::<0>(vcvtq_f32_s32(isum), ds);
            let acc = vfmaq_f32(acc, dsc, tmp);
            // fmls rounds acc - dm * s once: the spec's fma(-(dmin * m), s, acc).
            vfmsq_lane_f32::<1>(acc, dm, ds)
        };
        if SDOT || T % 2 == 1 {
            each_token!(T, |t| {
                let a = group_ptr(t, xb[t]).add(S);
                let isum = isum_quad::<SDOT, 2>(&w, (*a).qs.as_ptr(), vdupq_n_s32(0));
                acc[t] = step(acc[t], a, isum);
                group_end(t + 1, acc);
            });
        } else {
            // Plain, an even count: two tokens at a time (`isum_quad2`), written out.
            each_pair!(T, |t| {
                let a = [group_ptr(t, xb[t]).add(S), xb[t + 1].add(S)];
                let isum = isum_quad2::<2>(&w, a.map(|a| (*a).qs.as_ptr()));
                acc[t] = step(acc[t], a[0], isum[0]);
                acc[t + 1] = step(acc[t + 1], a[1], isum[1]);
                group_end(t + 2, acc);
            });
        }
    }
}

impl KTile for Q4K {
    const BYTES: usize = K4_BYTES;
    #[inline(always)]
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        a: &mut [float32x4_t; T],
    ) {
        // SAFETY: the caller's contract (see `KTile::quad`).
        unsafe {
            let d = f16x4(p.add(K4_D + 8 * j));
            let dmin = f16x4(p.add(K4_DMIN + 8 * j));
            q4k_sub::<SDOT, T, 0>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 1>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 2>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 3>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 4>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 5>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 6>(p, j, (d, dmin), xb, a);
            q4k_sub::<SDOT, T, 7>(p, j, (d, dmin), xb, a);
        }
    }
}

/// The 16 rows' 6-bit scales and mins of sub-block `S` of the Q4_K / Q5_K tile at `p` (byte
/// r = row r): [`k4_scale_min`] on whole planes, so one 16-byte load serves all four quads.
///
/// SAFETY (callers): `p` points at a whole tile.
#[inline(always)]
unsafe fn k4_scale_min_tile<const S: usize>(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the planes lie inside the tile (the caller's contract); the rest is
    // register-only.
    unsafe {
        let plane = |i: usize| vld1q_u8(p.add(K4_SC + ROWS * i));
        if S < 4 {
            let low = vdupq_n_u8(63);
            (vandq_u8(plane(S), low), vandq_u8(plane(S + 4), low))
        } else {
            // Low 4 bits from plane S + 4 (low nibble: scale, high: min), high 2 bits from
            // the top of planes S - 4 (scale) and S.
            let lo = plane(S + 4);
            let sc = vsliq_n_u8::<4>(
                vandq_u8(lo, vdupq_n_u8(0x0F)),
                vshrq_n_u8::<6>(plane(S - 4)),
            );
            let m = vsliq_n_u8::<4>(vshrq_n_u8::<4>(lo), vshrq_n_u8::<6>(plane(S)));
            (sc, m)
        }
    }
}

/// Bytes of `v` widened to u32, one vector per row quad (rows 4j..4j + 4).
#[inline(always)]
fn widen_u8_u32(v: uint8x16_t) -> [uint32x4_t; 4] {
    // SAFETY: register-only, baseline NEON.
    unsafe {
        let (lo, hi) = (vmovl_u8(vget_low_u8(v)), vmovl_high_u8(v));
        [
            vmovl_u16(vget_low_u16(lo)),
            vmovl_high_u16(lo),
            vmovl_u16(vget_low_u16(hi)),
            vmovl_high_u16(hi),
        ]
    }
}

/// The exact i32 sums of `N` sub-blocks of a Q4_K / Q5_K tile, all four row quads (one
/// vector each), against the 32 activations at `x[s]`, plain NEON. `w(g, j)` gives granule
/// `g` of quad `j`'s weights of each sub-block (from the same loads: Q4_K's two nibbles), at
/// most 31; with `NARROW` at most 15, so two i16 lanes add before widening.
///
/// With `SDOT` one `sdot` by element per weight vector instead (a chain per quad and
/// sub-block).
///
/// SAFETY (callers): each `x[s]` points at 32 readable bytes and `w` reads inside the tile;
/// with `SDOT` the CPU has dotprod.
#[inline(always)]
unsafe fn k4_isum_tile<const SDOT: bool, const NARROW: bool, const N: usize>(
    x: [*const i8; N],
    w: impl Fn(usize, usize) -> [int8x16_t; N],
) -> [[int32x4_t; 4]; N] {
    // SAFETY: the loads read `x[s][0..32]`; everything else is register-only or `w`'s;
    // dotprod as the caller promised.
    unsafe {
        if SDOT {
            let mut acc = [[vdupq_n_s32(0); 4]; N];
            let xr = x.map(|x| vld1q_s8(x));
            // Written out: LLVM keeps loops around the `asm!` of `sdot_lane` rolled.
            k4_sdot_granule::<0, N>(xr, &w, &mut acc);
            k4_sdot_granule::<1, N>(xr, &w, &mut acc);
            k4_sdot_granule::<2, N>(xr, &w, &mut acc);
            k4_sdot_granule::<3, N>(xr, &w, &mut acc);
            let xr = x.map(|x| vld1q_s8(x.add(16)));
            k4_sdot_granule::<4, N>(xr, &w, &mut acc);
            k4_sdot_granule::<5, N>(xr, &w, &mut acc);
            k4_sdot_granule::<6, N>(xr, &w, &mut acc);
            k4_sdot_granule::<7, N>(xr, &w, &mut acc);
            return acc;
        }
        // i16 lane (row, position) adds one product per granule: 8 of |u * x| <= 15 * 127
        // (Q4_K: 15240, and two such lanes 30480), or 31 * 127 (Q5_K: 31496 <= 32767,
        // widened by `saddlp` alone).
        let mut lo = [[vdupq_n_s16(0); 4]; N];
        let mut hi = [[vdupq_n_s16(0); 4]; N];
        let xr = x.map(|x| vreinterpretq_s32_s8(vld1q_s8(x)));
        // Written out: LLVM keeps a loop this long rolled.
        k4_granule_tile::<0, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<1, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<2, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<3, N>(xr, &w, &mut lo, &mut hi);
        let xr = x.map(|x| vreinterpretq_s32_s8(vld1q_s8(x.add(16))));
        k4_granule_tile::<4, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<5, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<6, N>(xr, &w, &mut lo, &mut hi);
        k4_granule_tile::<7, N>(xr, &w, &mut lo, &mut hi);
        std::array::from_fn(|s| {
            std::array::from_fn(|j| {
                if NARROW {
                    vpaddlq_s16(vpaddq_s16(lo[s][j], hi[s][j]))
                } else {
                    vpaddq_s32(vpaddlq_s16(lo[s][j]), vpaddlq_s16(hi[s][j]))
                }
            })
        })
    }
}

/// Granule `G` of [`k4_isum_tile`] with `sdot` (`xr`: the sub-blocks' activation halves that
/// hold group `G`).
///
/// SAFETY (callers): the CPU has dotprod.
#[inline(always)]
// Indices into several arrays at once (an iterator cost a cycle per row-block in the llvm-mca
// A55 model).
#[allow(clippy::needless_range_loop)]
unsafe fn k4_sdot_granule<const G: usize, const N: usize>(
    xr: [int8x16_t; N],
    w: &impl Fn(usize, usize) -> [int8x16_t; N],
    acc: &mut [[int32x4_t; 4]; N],
) {
    // SAFETY: the caller's contract.
    unsafe {
        for j in 0..4 {
            let wg = w(G, j);
            for s in 0..N {
                acc[s][j] = sdot_lane(acc[s][j], wg[s], xr[s], G % 4);
            }
        }
    }
}

/// Granule `G` of [`k4_isum_tile`]: each sub-block's products of the four quads (`xr`: the
/// sub-blocks' activation halves that hold group `G`).
#[inline(always)]
fn k4_granule_tile<const G: usize, const N: usize>(
    xr: [int32x4_t; N],
    w: &impl Fn(usize, usize) -> [int8x16_t; N],
    lo: &mut [[int16x8_t; 4]; N],
    hi: &mut [[int16x8_t; 4]; N],
) {
    // SAFETY: register-only, baseline NEON (`w` is the caller's).
    unsafe {
        let xb = xr.map(|xr| lane_bytes(xr, G % 4));
        for j in 0..4 {
            let wg = w(G, j);
            for s in 0..N {
                let (wl, xl) = (vget_low_s8(wg[s]), vget_low_s8(xb[s]));
                if G == 0 {
                    lo[s][j] = vmull_s8(wl, xl);
                    hi[s][j] = vmull_high_s8(wg[s], xb[s]);
                } else {
                    lo[s][j] = vmlal_s8(lo[s][j], wl, xl);
                    hi[s][j] = vmlal_high_s8(hi[s][j], wg[s], xb[s]);
                }
            }
        }
    }
}

/// Sub-blocks `S0 = 2k` and `S1 = 2k + 1` of the Q4_K tile at `p` (the low and high nibbles
/// of the same granules), all four row quads, one token (`a`: its Q8A block 0 of this
/// super-block), plain NEON. Tile-major where [`q4k_sub`] is quad-major: each weight load,
/// activation lane broadcast, scale plane and activation scale serves both sub-blocks or all
/// four quads. Per row the same exact i32 sums and the same f32 steps in the same order: the
/// same bits. llvm-mca, cycles per row-block: plain on the A53 152.5 (quad-major) -> 111.3
/// (116.1 a sub-block at a time, each loading the granules again); `sdot` on the A55 99.3 ->
/// 74.9.
///
/// SAFETY (callers): `p` points at a whole tile, `a` at 8 readable Q8A blocks; with `SDOT`
/// the CPU has dotprod.
#[inline(always)]
unsafe fn q4k_pair_tile<const SDOT: bool, const S0: usize, const S1: usize>(
    p: *const u8,
    (d, ndmin): (&[float32x4_t; 4], &[float32x4_t; 4]),
    a: *const BlockQ8A,
    acc: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        const { assert!(S0.is_multiple_of(2) && S1 == S0 + 1) };
        // Both pairs' scale planes S + 4 are the same loads: without this LLVM keeps them
        // live from the first pair on and spills.
        let p = opaque_ptr(p);
        let qs = p.add(K4_QS + 256 * S0);
        let x = [(*a.add(S0)).qs.as_ptr(), (*a.add(S1)).qs.as_ptr()];
        let isum = k4_isum_tile::<SDOT, true, 2>(x, |g, j| {
            let v = vld1q_u8(qs.add(64 * g + 16 * j));
            [
                vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))),
                vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)),
            ]
        });
        q4k_tail_tile::<S0>(p, (d, ndmin), a, &isum[0], acc);
        q4k_tail_tile::<S1>(p, (d, ndmin), a, &isum[1], acc);
    }
}

/// The f32 steps of sub-block `S` of the Q4_K tile at `p`, all four row quads, one token
/// (`a`: its Q8A block 0 of this super-block), from the exact sums `isum`.
///
/// SAFETY (callers): `p` points at a whole tile, `a` at 8 readable Q8A blocks.
#[inline(always)]
unsafe fn q4k_tail_tile<const S: usize>(
    p: *const u8,
    (d, ndmin): (&[float32x4_t; 4], &[float32x4_t; 4]),
    a: *const BlockQ8A,
    isum: &[int32x4_t; 4],
    acc: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        let a = a.add(S);
        let (sc, m) = k4_scale_min_tile::<S>(p);
        let (sc, m) = (widen_u8_u32(sc), widen_u8_u32(m));
        // `d` and `s` are the block's first two fields.
        let ds = vld1_f32(a as *const f32);
        for j in 0..4 {
            // Both products exact in f32, as in `q4k_scales`; `ndmin` is `-dmin`, so `ndm` is
            // the spec's `-(dmin * m)` (negation is exact) and one FMA adds `ndm * s`.
            let dsc = vmulq_f32(d[j], vcvtq_f32_u32(sc[j]));
            let ndm = vmulq_f32(ndmin[j], vcvtq_f32_u32(m[j]));
            let tmp = vmulq_lane_f32::<0>(vcvtq_f32_s32(isum[j]), ds);
            acc[j] = vfmaq_f32(acc[j], dsc, tmp);
            acc[j] = vfmaq_lane_f32::<1>(acc[j], ndm, ds);
        }
    }
}

/// Q6_K: per Q8A block 8 registers of 6-bit quants (a nibble of ql joined with 2 bits of qh),
/// the two 16-element groups' `d * sc`, then per token two half dots, each corrected for the
/// offset 32 through the activation half sums and scaled by one FMA.
struct Q6K;

/// The 4 activation bytes of i32 lane `i` of `xr`, broadcast to all 16 bytes (`i` is a
/// constant after unrolling, so this is one `dup`).
#[inline(always)]
fn lane_bytes(xr: int32x4_t, i: usize) -> int8x16_t {
    // SAFETY: NEON is baseline on aarch64; register-only.
    unsafe {
        vreinterpretq_s8_s32(match i {
            0 => vdupq_laneq_s32::<0>(xr),
            1 => vdupq_laneq_s32::<1>(xr),
            2 => vdupq_laneq_s32::<2>(xr),
            _ => vdupq_laneq_s32::<3>(xr),
        })
    }
}

/// The 16 six-bit quants (one row quad's granule) of Q8A block `4N + K` whose ql and qh
/// granule bytes are at `ql` and `qh`.
///
/// SAFETY (callers): both point at 16 readable bytes.
#[inline(always)]
unsafe fn q6k_u<const K: usize>(ql: *const u8, qh: *const u8) -> int8x16_t {
    // SAFETY: the two loads read 16 bytes each (the caller's contract).
    unsafe {
        let l = vld1q_u8(ql);
        let hb = vld1q_u8(qh);
        // Low nibble (K < 2) or high nibble (K >= 2) of ql, bits 2K, 2K + 1 of qh to bits 4,
        // 5; the shift-inserts leave junk only above bit 5, which the mask drops (for K = 3
        // there is none: LLVM drops that mask).
        let u = match K {
            0 => vsliq_n_u8::<4>(l, hb),
            1 => vsliq_n_u8::<4>(l, vshrq_n_u8::<2>(hb)),
            2 => vsriq_n_u8::<4>(hb, l),
            _ => vsriq_n_u8::<4>(vshrq_n_u8::<2>(hb), l),
        };
        vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(0x3F)))
    }
}

/// Q8A block `4N + K` of row quad `j` of a Q6_K tile at `p` for `T` tokens.
#[inline(always)]
unsafe fn q6k_block<const SDOT: bool, const T: usize, const N: usize, const K: usize>(
    p: *const u8,
    j: usize,
    d: float32x4_t,
    xb: &[*const BlockQ8A; T],
    acc: &mut [float32x4_t; T],
) {
    let qb = 4 * N + K;
    // SAFETY: every load lies inside the tile at `p` or the activation blocks (the caller's
    // contract); the rest is register-only.
    unsafe {
        // The two groups' signed scales (lanes 0..4: group 2qb, 4..8: 2qb + 1); d * sc is
        // exact in f32 (11 x 8 bits).
        let sc = two_planes(
            p.add(K6_SC + ROWS * (2 * qb) + 4 * j),
            p.add(K6_SC + ROWS * (2 * qb + 1) + 4 * j),
        );
        let sc = vmovl_s8(vreinterpret_s8_u8(sc));
        let dsc0 = vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(sc))));
        let dsc1 = vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(sc)));
        let ql = p.add(k6_ql(2 * N + (K & 1)) + 16 * j);
        let qh = p.add(k6_qh(N) + 16 * j);
        let mut w = [[vdupq_n_s8(0); 4]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (i, wg) in wh.iter_mut().enumerate() {
                let g = 4 * h + i;
                *wg = q6k_u::<K>(ql.add(64 * g), qh.add(64 * g));
            }
        }
        if T > 1 {
            // Several tokens: the weights as `u - 32` (one `sub` per register, shared by all
            // tokens) instead of each token's offset correction `-32 * sums[h]`.
            let w = w.map(|wh| wh.map(|v| vsubq_s8(v, vdupq_n_s8(32))));
            q6k_tokens::<SDOT, T>(&w, qb, (dsc0, dsc1), xb, acc);
            return;
        }
        for t in 0..T {
            let a = xb[t].add(qb);
            let x = (*a).qs.as_ptr();
            // sum((u - 32) * x) = sum(u * x) - 32 * sums[h], exact.
            let i0 = isum_quad::<SDOT, 1>(
                std::array::from_ref(&w[0]),
                x,
                vdupq_n_s32(-32 * (*a).sums[0] as i32),
            );
            let i1 = isum_quad::<SDOT, 1>(
                std::array::from_ref(&w[1]),
                x.add(16),
                vdupq_n_s32(-32 * (*a).sums[1] as i32),
            );
            let xd = (*a).d;
            acc[t] = vfmaq_f32(acc[t], dsc0, vmulq_n_f32(vcvtq_f32_s32(i0), xd));
            acc[t] = vfmaq_f32(acc[t], dsc1, vmulq_n_f32(vcvtq_f32_s32(i1), xd));
        }
    }
}

/// The tokens of [`q6k_block`] (more than one) against its weights `w` already as `u - 32`
/// (in [-32, 31]): per token the two halves' exact sums `sum((u - 32) * x)`, each scaled by
/// one FMA, as for one token. Tokens written out ([`each_token`]).
///
/// SAFETY (callers): each `xb[t]` points at 8 readable blocks; with `SDOT` the CPU has
/// dotprod.
#[inline(always)]
unsafe fn q6k_tokens<const SDOT: bool, const T: usize>(
    w: &[[int8x16_t; 4]; 2],
    qb: usize,
    (dsc0, dsc1): (float32x4_t, float32x4_t),
    xb: &[*const BlockQ8A; T],
    acc: &mut [float32x4_t; T],
) {
    // SAFETY: loads inside block `qb` of each token; the rest is register-only.
    unsafe {
        let step = |acc: &mut [float32x4_t; T], t: usize, i0: int32x4_t, i1: int32x4_t| {
            let xd = (*xb[t].add(qb)).d;
            acc[t] = vfmaq_f32(acc[t], dsc0, vmulq_n_f32(vcvtq_f32_s32(i0), xd));
            acc[t] = vfmaq_f32(acc[t], dsc1, vmulq_n_f32(vcvtq_f32_s32(i1), xd));
        };
        let (w0, w1) = (std::array::from_ref(&w[0]), std::array::from_ref(&w[1]));
        // i16 lanes: 4 products of |(u - 32) * x| <= 32 * 127 (16256 <= 32767).
        if SDOT || T % 2 == 1 {
            let zero = vdupq_n_s32(0);
            each_token!(T, |t| {
                let xt = (*group_ptr(t, xb[t]).add(qb)).qs.as_ptr();
                let i0 = isum_quad::<SDOT, 1>(w0, xt, zero);
                let i1 = isum_quad::<SDOT, 1>(w1, xt.add(16), zero);
                step(acc, t, i0, i1);
                group_end(t + 1, acc);
            });
        } else {
            // Plain: two tokens at a time.
            each_pair!(T, |t| {
                let xt = [group_ptr(t, xb[t]), xb[t + 1]].map(|a| (*a.add(qb)).qs.as_ptr());
                let i0 = isum_quad2::<1>(w0, xt);
                let i1 = isum_quad2::<1>(w1, xt.map(|x| x.add(16)));
                step(acc, t, i0[0], i1[0]);
                step(acc, t + 1, i0[1], i1[1]);
                group_end(t + 2, acc);
            });
        }
    }
}

impl KTile for Q6K {
    const BYTES: usize = K6_BYTES;
    #[inline(always)]
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        a: &mut [float32x4_t; T],
    ) {
        // SAFETY: the caller's contract (see `KTile::quad`).
        unsafe {
            let d = f16x4(p.add(K6_D + 8 * j));
            q6k_block::<SDOT, T, 0, 0>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 0, 1>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 0, 2>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 0, 3>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 1, 0>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 1, 1>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 1, 2>(p, j, d, xb, a);
            q6k_block::<SDOT, T, 1, 3>(p, j, d, xb, a);
        }
    }
}

/// Q8A block `4N + K` of the Q6_K tile at `p`, all four row quads, one token (`a`: its Q8A
/// block 0 of this super-block), plain NEON. Tile-major where [`q6k_block`] is quad-major:
/// each activation lane broadcast, offset correction and 16-byte scale plane serves the four
/// quads instead of one (llvm-mca A53: 233 -> 211 -> 177.5 cycles per row-block, the last
/// with [`opaque_ptr`] and [`settled`] per half). Per row
/// the same exact i32 sums and the same f32 steps in the same order: the same bits.
#[inline(always)]
unsafe fn q6k_block_tile<const N: usize, const K: usize>(
    p: *const u8,
    d: &[float32x4_t; 4],
    a: *const BlockQ8A,
    acc: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract, passed on. Two calls, not a loop: LLVM does not unroll
    // a loop this long, and a loop's counter and address arithmetic cost an in-order core.
    unsafe {
        q6k_half_tile::<N, K, 0>(p, d, a, acc);
        q6k_half_tile::<N, K, 1>(p, d, a, acc);
    }
}

/// Half `H` (Q8A quants 16H..16H + 16) of [`q6k_block_tile`].
#[inline(always)]
unsafe fn q6k_half_tile<const N: usize, const K: usize, const H: usize>(
    p: *const u8,
    d: &[float32x4_t; 4],
    a: *const BlockQ8A,
    acc: &mut [float32x4_t; 4],
) {
    let qb = 4 * N + K;
    // SAFETY: every load lies inside the tile at `p` or the token's 8 Q8A blocks at `a` (the
    // caller's contract); the rest is register-only.
    unsafe {
        // Blocks share ql (K, K + 2) and qh (all four of a half) granules: LLVM kept them
        // live across blocks and spilled (llvm-mca A53 211 -> 177.5 with this and `settled`).
        let p = opaque_ptr(p);
        let a = a.add(qb);
        let (x, xd) = ((*a).qs.as_ptr(), (*a).d);
        let ql = p.add(k6_ql(2 * N + (K & 1)));
        let qh = p.add(k6_qh(N));
        let xr = vreinterpretq_s32_s8(vld1q_s8(x.add(16 * H)));
        // i16 lane (row, i): 4 products of |u * x| <= 63 * 127 (32004 <= 32767), as in
        // `isum_quad`.
        let mut lo = [vdupq_n_s16(0); 4];
        let mut hi = [vdupq_n_s16(0); 4];
        for i in 0..4 {
            let g = 4 * H + i;
            let xb = lane_bytes(xr, i);
            for j in 0..4 {
                let w = q6k_u::<K>(ql.add(64 * g + 16 * j), qh.add(64 * g + 16 * j));
                if i == 0 {
                    lo[j] = vmull_s8(vget_low_s8(w), vget_low_s8(xb));
                    hi[j] = vmull_high_s8(w, xb);
                } else {
                    lo[j] = vmlal_s8(lo[j], vget_low_s8(w), vget_low_s8(xb));
                    hi[j] = vmlal_high_s8(hi[j], w, xb);
                }
            }
        }
        // Group 2qb + H's signed scales of the 16 rows, and the offset 32's correction.
        let sc = vld1q_s8(p.add(K6_SC + ROWS * (2 * qb + H)) as *const i8);
        let sc = [vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc)];
        let init = vdupq_n_s32(-32 * (*a).sums[H] as i32);
        for j in 0..4 {
            let s = sc[j / 2];
            let s = if j % 2 == 0 {
                vmovl_s16(vget_low_s16(s))
            } else {
                vmovl_high_s16(s)
            };
            let dsc = vmulq_f32(d[j], vcvtq_f32_s32(s));
            let isum = vaddq_s32(init, vpaddq_s32(vpaddlq_s16(lo[j]), vpaddlq_s16(hi[j])));
            acc[j] = settled(vfmaq_f32(acc[j], dsc, vmulq_n_f32(vcvtq_f32_s32(isum), xd)));
        }
    }
}

/// `init + ` the exact i32 sums of rows `4j..4j + 4` over 8 granules of signed weights as
/// large as 127 in magnitude (IQ4_XS's table values): as [`isum_quad`], but the plain flavour
/// adds only two products per i16 lane (`2 * 127 * 127 = 32258 <= 32767`) before widening.
///
/// SAFETY (callers): `x` points at 32 readable bytes; with `SDOT` the CPU has dotprod.
#[inline(always)]
unsafe fn isum_quad_wide<const SDOT: bool>(
    w: &[[int8x16_t; 4]; 2],
    x: *const i8,
    init: int32x4_t,
) -> int32x4_t {
    if SDOT {
        // SAFETY: the caller's contract.
        return unsafe { isum_quad::<true, 2>(w, x, init) };
    }
    // SAFETY: the loads read `x[0..32]`; everything else is register-only.
    unsafe {
        let (mut slo, mut shi) = (vdupq_n_s32(0), vdupq_n_s32(0));
        for (h, wh) in w.iter().enumerate() {
            let xr = vreinterpretq_s32_s8(vld1q_s8(x.add(16 * h)));
            for i in (0..4).step_by(2) {
                let (x0, x1) = (lane_bytes(xr, i), lane_bytes(xr, i + 1));
                let lo = vmull_s8(vget_low_s8(wh[i]), vget_low_s8(x0));
                let lo = vmlal_s8(lo, vget_low_s8(wh[i + 1]), vget_low_s8(x1));
                let hi = vmull_high_s8(wh[i], x0);
                let hi = vmlal_high_s8(hi, wh[i + 1], x1);
                slo = vpadalq_s16(slo, lo);
                shi = vpadalq_s16(shi, hi);
            }
        }
        vaddq_s32(init, vpaddq_s32(slo, shi))
    }
}

/// `v >> n` on every byte, `n` (0..8) a constant after inlining (`ushl` by a negative count;
/// LLVM folds it to an immediate shift).
#[inline(always)]
fn shr_u8(v: uint8x16_t, n: usize) -> uint8x16_t {
    // SAFETY: register-only, baseline NEON.
    unsafe { vshlq_u8(v, vdupq_n_s8(-(n as i8))) }
}

/// Q5_K: per sub-block 8 registers of 5-bit quants (Q4_K's nibble and one `qh` bit), then per
/// token the reference's terms `d_x * f32(sc * isum)` and `d_x * f32(m * sum(q_x))`, added in
/// pairs of sub-blocks into `sd` / `sm`, and once per tile `acc + (d * sd - dmin * sm)`.
struct Q5K;

/// Sub-block `S` of row quad `j` of a Q5_K tile at `p` for `T` tokens: each token's
/// `(d_x * f32(sc * isum), d_x * f32(m * sum(q_x)))`.
#[inline(always)]
unsafe fn q5k_sub<const SDOT: bool, const T: usize, const S: usize>(
    p: *const u8,
    j: usize,
    xb: &[*const BlockQ8A; T],
) -> [(float32x4_t, float32x4_t); T] {
    // SAFETY: every load lies inside the tile at `p` or the activation blocks (the caller's
    // contract); the rest is register-only.
    unsafe {
        let (w, scm) = q5k_quad::<S>(p, j);
        let zero = vdupq_n_f32(0.0);
        let mut out = [(zero, zero); T];
        each_token!(T, |t| {
            let a = xb[t].add(S);
            // i16 lanes: 8 products of at most 31 * 127 (31496 <= 32767), see `isum_quad`.
            let isum = isum_quad::<SDOT, 2>(&w, (*a).qs.as_ptr(), vdupq_n_s32(0));
            out[t] = q5k_terms(scm, a, isum);
        });
        out
    }
}

/// Sub-block `S`'s 5-bit weights of row quad `j` of the Q5_K tile at `p` (8 registers) and
/// the quad's `(sc, m)`.
///
/// SAFETY (callers): `p` points at a whole tile, `j < 4`.
#[inline(always)]
unsafe fn q5k_quad<const S: usize>(
    p: *const u8,
    j: usize,
) -> ([[int8x16_t; 4]; 2], (int32x4_t, int32x4_t)) {
    // SAFETY: every load lies inside the tile; the rest is register-only.
    unsafe {
        let v = k4_scale_min::<S>(p, j);
        let sc = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(v)));
        let m = vreinterpretq_s32_u32(vmovl_high_u16(v));
        let qs = p.add(K5_QS + 512 * (S / 2) + 16 * j);
        let qh = p.add(K5_QH + 16 * j);
        let mut w = [[vdupq_n_s8(0); 4]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (i, wg) in wh.iter_mut().enumerate() {
                let g = 4 * h + i;
                let q = vld1q_u8(qs.add(64 * g));
                let nib = if S % 2 == 1 { vshrq_n_u8::<4>(q) } else { q };
                // Bit S of qh to bit 4 beside the nibble (junk above bit 4 masked off).
                let u = vsliq_n_u8::<4>(nib, shr_u8(vld1q_u8(qh.add(64 * g)), S));
                *wg = vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(0x1F)));
            }
        }
        (w, (sc, m))
    }
}

/// One token's `(d_x * f32(sc * isum), d_x * f32(m * sum(q_x)))` ([`q5k_sub`]; `a`: its Q8A
/// block of the sub-block).
///
/// SAFETY (callers): `a` points at a readable block.
#[inline(always)]
unsafe fn q5k_terms(
    (sc, m): (int32x4_t, int32x4_t),
    a: *const BlockQ8A,
    isum: int32x4_t,
) -> (float32x4_t, float32x4_t) {
    // SAFETY: reads inside `a`; the rest is register-only.
    unsafe {
        let qsum = (*a).sums[0] as i32 + (*a).sums[1] as i32;
        let xd = (*a).d;
        (
            vmulq_n_f32(vcvtq_f32_s32(vmulq_s32(sc, isum)), xd),
            vmulq_n_f32(vcvtq_f32_s32(vmulq_n_s32(m, qsum)), xd),
        )
    }
}

/// Sub-blocks `S` and `S + 1` of a Q5_K tile: `sd += x1 + x2`, `sm += y1 + y2`.
#[inline(always)]
unsafe fn q5k_pair<const SDOT: bool, const T: usize, const S: usize, const S1: usize>(
    p: *const u8,
    j: usize,
    xb: &[*const BlockQ8A; T],
    sd: &mut [float32x4_t; T],
    sm: &mut [float32x4_t; T],
) {
    // SAFETY: the caller's contract, passed on; the rest is register-only.
    unsafe {
        if !SDOT && T.is_multiple_of(2) {
            // Plain: both sub-blocks' weights held, then two tokens at a time, in groups.
            let (wa, scma) = q5k_quad::<S>(p, j);
            let (wb, scmb) = q5k_quad::<S1>(p, j);
            each_pair!(T, |t| {
                let a = [group_ptr(t, xb[t]), xb[t + 1]];
                // i16 lanes: 8 products of at most 31 * 127 (31496), see `isum_quad`.
                let ia = isum_quad2::<2>(&wa, a.map(|a| (*a.add(S)).qs.as_ptr()));
                let ib = isum_quad2::<2>(&wb, a.map(|a| (*a.add(S1)).qs.as_ptr()));
                for k in 0..2 {
                    let x = q5k_terms(scma, a[k].add(S), ia[k]);
                    let y = q5k_terms(scmb, a[k].add(S1), ib[k]);
                    sd[t + k] = vaddq_f32(sd[t + k], vaddq_f32(x.0, y.0));
                    sm[t + k] = vaddq_f32(sm[t + k], vaddq_f32(x.1, y.1));
                }
                group_end(t + 2, sd);
                group_end(t + 2, sm);
            });
            return;
        }
        let a = q5k_sub::<SDOT, T, S>(p, j, xb);
        let b = q5k_sub::<SDOT, T, S1>(p, j, xb);
        for t in 0..T {
            sd[t] = vaddq_f32(sd[t], vaddq_f32(a[t].0, b[t].0));
            sm[t] = vaddq_f32(sm[t], vaddq_f32(a[t].1, b[t].1));
        }
    }
}

impl KTile for Q5K {
    const BYTES: usize = K5_BYTES;
    #[inline(always)]
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        acc: &mut [float32x4_t; T],
    ) {
        // SAFETY: the caller's contract (see `KTile::quad`).
        unsafe {
            let d = f16x4(p.add(K5_D + 8 * j));
            let dmin = f16x4(p.add(K5_DMIN + 8 * j));
            let mut sd = [vdupq_n_f32(0.0); T];
            let mut sm = [vdupq_n_f32(0.0); T];
            q5k_pair::<SDOT, T, 0, 1>(p, j, xb, &mut sd, &mut sm);
            q5k_pair::<SDOT, T, 2, 3>(p, j, xb, &mut sd, &mut sm);
            q5k_pair::<SDOT, T, 4, 5>(p, j, xb, &mut sd, &mut sm);
            q5k_pair::<SDOT, T, 6, 7>(p, j, xb, &mut sd, &mut sm);
            for t in 0..T {
                let v = vsubq_f32(vmulq_f32(d, sd[t]), vmulq_f32(dmin, sm[t]));
                acc[t] = vaddq_f32(acc[t], v);
            }
        }
    }
}

/// Bit `S` of `qh` moved to bit 4 (other bits junk), one shift at most.
#[inline(always)]
fn qh_to_bit4<const S: usize>(qh: uint8x16_t) -> uint8x16_t {
    // SAFETY: register-only, baseline NEON.
    unsafe {
        match S {
            0 => vshlq_n_u8::<4>(qh),
            1 => vshlq_n_u8::<3>(qh),
            2 => vshlq_n_u8::<2>(qh),
            3 => vshlq_n_u8::<1>(qh),
            4 => qh,
            5 => vshrq_n_u8::<1>(qh),
            6 => vshrq_n_u8::<2>(qh),
            _ => vshrq_n_u8::<3>(qh),
        }
    }
}

/// Sub-block `S`'s exact i32 sums of the Q5_K tile at `p`, all four row quads (one vector
/// each), one token (`a`: its Q8A block 0 of this super-block), plain NEON.
///
/// SAFETY (callers): `p` points at a whole tile, `a` at 8 readable Q8A blocks.
#[inline(always)]
unsafe fn q5k_isum_tile<const S: usize>(p: *const u8, a: *const BlockQ8A) -> [int32x4_t; 4] {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        // All eight sub-blocks read the same qh granules (and pairs the same qs ones): LLVM
        // would keep them live across sub-blocks and spill.
        let p = opaque_ptr(p);
        let qs = p.add(K5_QS + 512 * (S / 2));
        let qh = p.add(K5_QH);
        let [isum] = k4_isum_tile::<false, false, 1>([(*a.add(S)).qs.as_ptr()], |g, j| {
            let at = 64 * g + 16 * j;
            [q5k_u::<S>(vld1q_u8(qs.add(at)), vld1q_u8(qh.add(at)))]
        });
        isum
    }
}

/// Sub-block `S`'s 5-bit weights of a granule from its qs bytes `q` and qh bytes `h`.
#[inline(always)]
fn q5k_u<const S: usize>(q: uint8x16_t, h: uint8x16_t) -> int8x16_t {
    // SAFETY: register-only, baseline NEON.
    unsafe {
        // Bit S of qh to bit 4 beside the nibble (`sli` keeps the low nibble of q, `sri`
        // puts the high one under the moved qh), junk above bit 4 masked off.
        let u = if S % 2 == 1 {
            vsriq_n_u8::<4>(qh_to_bit4::<S>(h), q)
        } else {
            vsliq_n_u8::<4>(q, shr_u8(h, S))
        };
        vreinterpretq_s8_u8(vandq_u8(u, vdupq_n_u8(0x1F)))
    }
}

/// Sub-block `S`'s terms `(d_x * f32(sc * isum), d_x * f32(m * sum(q_x)))` of [`q5k_sub`]
/// for the Q5_K tile at `p`, one per row quad, from the exact sums `isum`.
///
/// SAFETY (callers): as [`q5k_isum_tile`].
#[inline(always)]
unsafe fn q5k_terms_tile<const S: usize>(
    p: *const u8,
    a: *const BlockQ8A,
    isum: &[int32x4_t; 4],
) -> [(float32x4_t, float32x4_t); 4] {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        let a = a.add(S);
        let (sc, m) = k4_scale_min_tile::<S>(p);
        let sc = widen_u8_u32(sc);
        // The mins as i16 (at most 63): `smull` by the activation sum gives m * sum(q_x)
        // (|sum| <= 32 * 127 fits an i16 lane) without widening them to i32 first.
        let m = widen_s8(vreinterpretq_s8_u8(m));
        let qsum = (*a).sums[0] + (*a).sums[1];
        let xd = (*a).d;
        std::array::from_fn(|j| {
            let mh = m[j / 2];
            let msum = if j % 2 == 0 {
                vmull_n_s16(vget_low_s16(mh), qsum)
            } else {
                vmull_high_n_s16(mh, qsum)
            };
            let sc = vreinterpretq_s32_u32(sc[j]);
            (
                vmulq_n_f32(vcvtq_f32_s32(vmulq_s32(sc, isum[j])), xd),
                vmulq_n_f32(vcvtq_f32_s32(msum), xd),
            )
        })
    }
}

/// Sub-blocks `S0` and `S1 = S0 + 1` of the Q5_K tile at `p`, all four row quads, one token
/// (`a`: its Q8A block 0 of this super-block), plain NEON: `sd += x1 + x2`, `sm += y1 + y2`,
/// as [`q5k_pair`]. Tile-major where [`q5k_sub`] is quad-major: each activation lane
/// broadcast and scale plane serves the four quads. Both sub-blocks' sums come before their
/// f32 terms (four registers held across the second, not eight). llvm-mca, cycles per
/// row-block: plain on the A53 206.3 (quad-major) -> 166.2, `sdot` on the A55 174.0 -> 130.8
/// (155.8 a sub-block at a time, as the plain one).
///
/// SAFETY (callers): as [`q5k_isum_tile`]; with `SDOT` the CPU has dotprod.
#[inline(always)]
unsafe fn q5k_pair_tile<const SDOT: bool, const S0: usize, const S1: usize>(
    p: *const u8,
    a: *const BlockQ8A,
    sd: &mut [float32x4_t; 4],
    sm: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        const { assert!(S1 == S0 + 1) };
        let [i0, i1] = if SDOT {
            // Both sub-blocks from the same loads: with `sdot` their 8 i32 chains leave the
            // registers for it (the plain flavour's 16 i16 sums did not).
            let p = opaque_ptr(p);
            let (qs, qh) = (p.add(K5_QS + 256 * S0), p.add(K5_QH));
            let x = [(*a.add(S0)).qs.as_ptr(), (*a.add(S1)).qs.as_ptr()];
            k4_isum_tile::<true, false, 2>(x, |g, j| {
                let at = 64 * g + 16 * j;
                let (q, h) = (vld1q_u8(qs.add(at)), vld1q_u8(qh.add(at)));
                [q5k_u::<S0>(q, h), q5k_u::<S1>(q, h)]
            })
        } else {
            [q5k_isum_tile::<S0>(p, a), q5k_isum_tile::<S1>(p, a)]
        };
        let x = q5k_terms_tile::<S0>(p, a, &i0);
        let y = q5k_terms_tile::<S1>(p, a, &i1);
        for j in 0..4 {
            sd[j] = settled(vaddq_f32(sd[j], vaddq_f32(x[j].0, y[j].0)));
            sm[j] = settled(vaddq_f32(sm[j], vaddq_f32(x[j].1, y[j].1)));
        }
    }
}

/// Q3_K and Q2_K: 2-bit quants (Q3_K: and an `hmask` bit), 16-element scale groups; per Q8A
/// block the two halves' exact sums, `isum = sc_0 * ih_0 + sc_1 * ih_1`, and (Q2_K)
/// `msum = m_0 * sums[0] + m_1 * sums[1]`, then the reference's `sd += d_x * f32(isum)`
/// (`sm` alike); once per tile `acc + d * sd` (Q3_K) or `acc + (d * sd - dmin * sm)` (Q2_K).
trait K16 {
    const BYTES: usize;
    /// Where the f16 mins sit (Q2_K).
    const DMIN: Option<usize>;
    /// Row quad `j`'s weight vectors of Q8A block `G` (signed: Q3_K `u - 4`, Q2_K `u`).
    ///
    /// SAFETY (callers): `p` points at a whole tile.
    unsafe fn weights<const G: usize>(p: *const u8, j: usize) -> [[int8x16_t; 4]; 2];
    /// Row quad `j`'s scales and mins (0 for Q3_K) of groups `2G` and `2G + 1`.
    ///
    /// SAFETY (callers): as [`K16::weights`].
    unsafe fn scales<const G: usize>(p: *const u8, j: usize) -> [int32x4_t; 4];
    /// The plain one-token path's weights ([`k16_half_tile`]): granule `g` of row quad `j`
    /// of Q8A block `G`, unsigned (`u`: Q3_K with its hmask bit as bit 2) and `2^P[G]` times
    /// too large (each field taken where the fewest instructions leave it).
    ///
    /// SAFETY (callers): as [`K16::weights`].
    unsafe fn scaled<const G: usize>(p: *const u8, g: usize, j: usize) -> uint8x16_t;
    /// Per Q8A block the power of two of [`K16::scaled`] left in the sums that reach
    /// [`cvt_field`] (Q2_K's k = 2 fields leave [`k16_half_tile`] through an exact shift).
    const P: [i32; 8];
    /// Blocks whose sums pass through i32 lanes in [`k16_half_tile`] (Q2_K's k = 2: 16 times
    /// too large, the row sum would not fit an i16 lane).
    const WIDE: [bool; 8];
    /// The offset of `u` (Q3_K 4, Q2_K 0: its mins go through `sm`).
    const OFF: i32;
    /// The 16 rows' scales and mins (0 for Q3_K) of groups `2G` and `2G + 1` as i16, rows
    /// 0..8 then 8..16: one 16-byte plane load serves the whole tile.
    ///
    /// SAFETY (callers): as [`K16::weights`].
    unsafe fn scales_tile<const G: usize>(p: *const u8) -> [[int16x8_t; 2]; 4];
}

/// Bytes of `v` widened to i16: rows 0..8, rows 8..16.
#[inline(always)]
fn widen_s8(v: int8x16_t) -> [int16x8_t; 2] {
    // SAFETY: register-only, baseline NEON.
    unsafe { [vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v)] }
}

/// `f32(v / 2^P[G])`: `v` is exactly `2^P[G]` times an i32, and `scvtf` with fraction bits
/// rounds that exact quotient once, as `f32` of it would.
#[inline(always)]
fn cvt_field<K: K16, const G: usize>(v: int32x4_t) -> float32x4_t {
    // SAFETY: register-only, baseline NEON.
    unsafe {
        match K::P[G] {
            0 => vcvtq_f32_s32(v),
            1 => vcvtq_n_f32_s32::<1>(v),
            _ => vcvtq_n_f32_s32::<2>(v),
        }
    }
}

struct Q3K;
struct Q2K;

/// Row quad `j`'s 2-bit fields of Q8A block `G` (= 4n + k: bits 2k, 2k + 1 of qs chunk n,
/// whose granules start at `qs + 512 n`), 8 registers.
#[inline(always)]
unsafe fn two_bits<const G: usize>(qs: *const u8, j: usize) -> [[uint8x16_t; 4]; 2] {
    let (n, k) = (G / 4, G % 4);
    // SAFETY: 16 bytes of each of the chunk's 8 granules (the caller's contract).
    unsafe {
        let base = qs.add(512 * n + 16 * j);
        std::array::from_fn(|h| {
            std::array::from_fn(|i| {
                vandq_u8(
                    shr_u8(vld1q_u8(base.add(64 * (4 * h + i))), 2 * k),
                    vdupq_n_u8(3),
                )
            })
        })
    }
}

impl K16 for Q3K {
    const BYTES: usize = K3_BYTES;
    const DMIN: Option<usize> = None;
    #[inline(always)]
    unsafe fn weights<const G: usize>(p: *const u8, j: usize) -> [[int8x16_t; 4]; 2] {
        let (n, k) = (G / 4, G % 4);
        // SAFETY: the caller's contract; the hmask granules lie inside the tile.
        unsafe {
            let q = two_bits::<G>(p.add(K3_QS), j);
            let hm = p.add(K3_HM + 16 * j);
            let bit = vdupq_n_u8(1 << (4 * n + k));
            std::array::from_fn(|h| {
                std::array::from_fn(|i| {
                    // u - 4 = q - 4 where the hmask bit is clear, q where it is set.
                    let set = vtstq_u8(vld1q_u8(hm.add(64 * (4 * h + i))), bit);
                    let four = vbicq_u8(vdupq_n_u8(4), set);
                    vreinterpretq_s8_u8(vsubq_u8(q[h][i], four))
                })
            })
        }
    }
    #[inline(always)]
    unsafe fn scales<const G: usize>(p: *const u8, j: usize) -> [int32x4_t; 4] {
        // Groups a = 2G, b = 2G + 1 (both in the same quarter): low 4 bits from plane
        // `g % 8` (high nibble for g >= 8), high 2 bits from plane `8 + g % 4` at bit
        // `2 (g / 4)`; minus 32 (`scales_q3k`).
        let (a, b) = (2 * G, 2 * G + 1);
        // SAFETY: the scale planes lie inside the tile; the rest is register-only.
        unsafe {
            let plane = |i: usize| p.add(K3_SC + ROWS * i + 4 * j);
            let lo = two_planes(plane(a % 8), plane(b % 8));
            let lo = vand_u8(vshl_u8(lo, vdup_n_s8(-4 * (a / 8) as i8)), vdup_n_u8(0x0F));
            let hi = two_planes(plane(8 + a % 4), plane(8 + b % 4));
            let hi = vand_u8(vshl_u8(hi, vdup_n_s8(-2 * (a / 4) as i8)), vdup_n_u8(3));
            let s = vsub_s8(vreinterpret_s8_u8(vsli_n_u8::<4>(lo, hi)), vdup_n_s8(32));
            let s = vmovl_s8(s);
            let zero = vdupq_n_s32(0);
            [vmovl_s16(vget_low_s16(s)), vmovl_high_s16(s), zero, zero]
        }
    }
    const P: [i32; 8] = [0, 2, 0, 1, 0, 2, 0, 0];
    const WIDE: [bool; 8] = [false; 8];
    const OFF: i32 = 4;
    #[inline(always)]
    unsafe fn scaled<const G: usize>(p: *const u8, g: usize, j: usize) -> uint8x16_t {
        // SAFETY: the qs and hmask granules lie inside the tile (the caller's contract).
        unsafe {
            // q: bits 2k, 2k + 1 of qs (k = G % 4); h: bit G of hm. 2^P u = 2^P (q + 4h),
            // put together by a shift-insert (`sli` keeps the low bits of its first operand,
            // `sri` the high ones) and a mask: two to four instructions, against four for the
            // signed `u - 4` (the offset comes off the sums instead, `K16::OFF`).
            let qs = vld1q_u8(p.add(K3_QS + 512 * (G / 4) + 64 * g + 16 * j));
            let hm = vld1q_u8(p.add(K3_HM + 64 * g + 16 * j));
            let m = |v: uint8x16_t, c: u8| vandq_u8(v, vdupq_n_u8(c));
            // Per arm, where q and h sit before: G 0: q 0-1, h 0; 1: q 2-3, h 1; 2: q 4-5,
            // h 2; 3: q 6-7, h 3; 4: q 0-1, h 4; 5: q 2-3, h 5; 6: q 4-5, h 6; 7: q 6-7, h 7.
            match G {
                0 => m(vsliq_n_u8::<2>(qs, hm), 0x07),
                1 => m(vsliq_n_u8::<4>(qs, vshrq_n_u8::<1>(hm)), 0x1C),
                2 => vsriq_n_u8::<6>(m(hm, 0x04), vshlq_n_u8::<2>(qs)),
                3 => m(vsriq_n_u8::<5>(hm, qs), 0x0E),
                4 => m(vsliq_n_u8::<2>(qs, vshrq_n_u8::<4>(hm)), 0x07),
                5 => m(vsliq_n_u8::<4>(qs, vshrq_n_u8::<5>(hm)), 0x1C),
                6 => m(
                    vshrq_n_u8::<4>(vsliq_n_u8::<6>(qs, vshrq_n_u8::<6>(hm))),
                    0x07,
                ),
                _ => vsriq_n_u8::<6>(vshrq_n_u8::<5>(hm), qs),
            }
        }
    }
    #[inline(always)]
    unsafe fn scales_tile<const G: usize>(p: *const u8) -> [[int16x8_t; 2]; 4] {
        // SAFETY: the scale planes lie inside the tile; the rest is register-only.
        unsafe {
            let plane = |i: usize| vld1q_u8(p.add(K3_SC + ROWS * i));
            // As `scales`, for all 16 rows at once.
            let sc = |g: usize| {
                let lo = vandq_u8(shr_u8(plane(g % 8), 4 * (g / 8)), vdupq_n_u8(0x0F));
                let hi = vandq_u8(shr_u8(plane(8 + g % 4), 2 * (g / 4)), vdupq_n_u8(3));
                let s = vreinterpretq_s8_u8(vsliq_n_u8::<4>(lo, hi));
                widen_s8(vsubq_s8(s, vdupq_n_s8(32)))
            };
            let zero = [vdupq_n_s16(0); 2];
            [sc(2 * G), sc(2 * G + 1), zero, zero]
        }
    }
}

impl K16 for Q2K {
    const BYTES: usize = K2_BYTES;
    const DMIN: Option<usize> = Some(K2_DMIN);
    #[inline(always)]
    unsafe fn weights<const G: usize>(p: *const u8, j: usize) -> [[int8x16_t; 4]; 2] {
        // SAFETY: the caller's contract.
        unsafe { two_bits::<G>(p.add(K2_QS), j).map(|h| h.map(|v| vreinterpretq_s8_u8(v))) }
    }
    #[inline(always)]
    unsafe fn scales<const G: usize>(p: *const u8, j: usize) -> [int32x4_t; 4] {
        // SAFETY: the scale planes lie inside the tile; the rest is register-only.
        unsafe {
            let v = two_planes(
                p.add(K2_SC + ROWS * (2 * G) + 4 * j),
                p.add(K2_SC + ROWS * (2 * G + 1) + 4 * j),
            );
            let sc = vmovl_u8(vand_u8(v, vdup_n_u8(0x0F)));
            let m = vmovl_u8(vshr_n_u8::<4>(v));
            let w = |v: uint16x4_t| vreinterpretq_s32_u32(vmovl_u16(v));
            [
                w(vget_low_u16(sc)),
                w(vget_high_u16(sc)),
                w(vget_low_u16(m)),
                w(vget_high_u16(m)),
            ]
        }
    }
    const P: [i32; 8] = [0, 2, 0, 0, 0, 2, 0, 0];
    const WIDE: [bool; 8] = [false, false, true, false, false, false, true, false];
    const OFF: i32 = 0;
    #[inline(always)]
    unsafe fn scaled<const G: usize>(p: *const u8, g: usize, j: usize) -> uint8x16_t {
        // SAFETY: the qs granule lies inside the tile (the caller's contract).
        unsafe {
            let v = vld1q_u8(p.add(K2_QS + 512 * (G / 4) + 64 * g + 16 * j));
            // The field k = G % 4 masked in place (4^k times its value) for k < 3, shifted
            // down for k = 3 (0xC0 is no i8): one instruction.
            match G % 4 {
                3 => vshrq_n_u8::<6>(v),
                k => vandq_u8(v, vdupq_n_u8(3 << (2 * k))),
            }
        }
    }
    #[inline(always)]
    unsafe fn scales_tile<const G: usize>(p: *const u8) -> [[int16x8_t; 2]; 4] {
        // SAFETY: the scale planes lie inside the tile; the rest is register-only.
        unsafe {
            let v0 = vld1q_u8(p.add(K2_SC + ROWS * (2 * G)));
            let v1 = vld1q_u8(p.add(K2_SC + ROWS * (2 * G + 1)));
            // Scales and mins are 0..16: as i8 they widen the same.
            let w = |v: uint8x16_t| widen_s8(vreinterpretq_s8_u8(v));
            let low = vdupq_n_u8(0x0F);
            [
                w(vandq_u8(v0, low)),
                w(vandq_u8(v1, low)),
                w(vshrq_n_u8::<4>(v0)),
                w(vshrq_n_u8::<4>(v1)),
            ]
        }
    }
}

/// Q8A block `G` of row quad `j` of a Q3_K / Q2_K tile for `T` tokens onto `sd` and `sm`.
#[inline(always)]
unsafe fn k16_block<K: K16, const SDOT: bool, const T: usize, const G: usize>(
    p: *const u8,
    j: usize,
    xb: &[*const BlockQ8A; T],
    sd: &mut [float32x4_t; T],
    sm: &mut [float32x4_t; T],
) {
    // SAFETY: every load lies inside the tile at `p` or the activation blocks (the caller's
    // contract); the rest is register-only.
    unsafe {
        let w = K::weights::<G>(p, j);
        let [sc0, sc1, m0, m1] = K::scales::<G>(p, j);
        // Token t's f32 steps from its two halves' exact sums.
        let step = |sd: &mut [float32x4_t; T],
                    sm: &mut [float32x4_t; T],
                    t: usize,
                    i0: int32x4_t,
                    i1: int32x4_t| {
            let a = xb[t].add(G);
            let isum = vmlaq_s32(vmulq_s32(sc0, i0), sc1, i1);
            let xd = (*a).d;
            sd[t] = vaddq_f32(sd[t], vmulq_n_f32(vcvtq_f32_s32(isum), xd));
            if K::DMIN.is_some() {
                let msum = vmlaq_n_s32(
                    vmulq_n_s32(m0, (*a).sums[0] as i32),
                    m1,
                    (*a).sums[1] as i32,
                );
                sm[t] = vaddq_f32(sm[t], vmulq_n_f32(vcvtq_f32_s32(msum), xd));
            }
        };
        let (w0, w1) = (std::array::from_ref(&w[0]), std::array::from_ref(&w[1]));
        // i16 lanes: 4 products of at most 4 * 127 each.
        if SDOT || T % 2 == 1 {
            let zero = vdupq_n_s32(0);
            each_token!(T, |t| {
                let xt = (*group_ptr(t, xb[t]).add(G)).qs.as_ptr();
                let i0 = isum_quad::<SDOT, 1>(w0, xt, zero);
                let i1 = isum_quad::<SDOT, 1>(w1, xt.add(16), zero);
                step(sd, sm, t, i0, i1);
                group_end(t + 1, sd);
                if K::DMIN.is_some() {
                    group_end(t + 1, sm);
                }
            });
        } else {
            // Plain: two tokens at a time.
            each_pair!(T, |t| {
                let xt = [group_ptr(t, xb[t]), xb[t + 1]].map(|a| (*a.add(G)).qs.as_ptr());
                let i0 = isum_quad2::<1>(w0, xt);
                let i1 = isum_quad2::<1>(w1, xt.map(|x| x.add(16)));
                step(sd, sm, t, i0[0], i1[0]);
                step(sd, sm, t + 1, i0[1], i1[1]);
                group_end(t + 2, sd);
                if K::DMIN.is_some() {
                    group_end(t + 2, sm);
                }
            });
        }
    }
}

/// The Q3_K / Q2_K [`KTile`].
struct Sixteen<K>(std::marker::PhantomData<K>);

impl<K: K16> KTile for Sixteen<K> {
    const BYTES: usize = K::BYTES;
    #[inline(always)]
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        acc: &mut [float32x4_t; T],
    ) {
        // SAFETY: the caller's contract (see `KTile::quad`).
        unsafe {
            // Q3_K's and Q2_K's super-scales are both at 0.
            const _: () = assert!(K3_D == 0 && K2_D == 0);
            let d = f16x4(p.add(8 * j));
            let mut sd = [vdupq_n_f32(0.0); T];
            let mut sm = [vdupq_n_f32(0.0); T];
            k16_block::<K, SDOT, T, 0>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 1>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 2>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 3>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 4>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 5>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 6>(p, j, xb, &mut sd, &mut sm);
            k16_block::<K, SDOT, T, 7>(p, j, xb, &mut sd, &mut sm);
            match K::DMIN {
                Some(at) => {
                    let dmin = f16x4(p.add(at + 8 * j));
                    for t in 0..T {
                        let v = vsubq_f32(vmulq_f32(d, sd[t]), vmulq_f32(dmin, sm[t]));
                        acc[t] = vaddq_f32(acc[t], v);
                    }
                }
                None => {
                    for t in 0..T {
                        acc[t] = vaddq_f32(acc[t], vmulq_f32(d, sd[t]));
                    }
                }
            }
        }
    }
}

/// Half `H` (Q8A quants 16H..16H + 16 at `x`, their sum `xsum`) of Q8A block `G` of the
/// Q3_K / Q2_K tile at `p`, all four row quads: the 16 rows' exact
/// `ih = sum(u * x) - OFF * xsum`, `2^P[G]` times too large, as i16 (rows 0..8, 8..16).
/// Plain NEON, or with `SDOT` [`k16_half_tile_sdot`].
///
/// SAFETY (callers): `p` points at a whole tile, `x` at 32 readable bytes; with `SDOT` the
/// CPU has dotprod.
#[inline(always)]
unsafe fn k16_half_tile<K: K16, const SDOT: bool, const G: usize, const H: usize>(
    p: *const u8,
    x: *const i8,
    xsum: i16,
) -> [int16x8_t; 2] {
    if SDOT {
        // SAFETY: the caller's contract.
        return unsafe { k16_half_tile_sdot::<K, G, H>(p, x, xsum) };
    }
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        let xr = vreinterpretq_s32_s8(vld1q_s8(x.add(16 * H)));
        // The products (|u| <= 48, |x| <= 127) are exact in i16; the adds wrap modulo 2^16,
        // which changes no bit of a sum that fits an i16 lane where it is widened: the row's
        // 2^P ih (|ih| <= 16 * 4 * 127 = 8128, P <= 2: 32512), or for `WIDE` blocks (Q2_K k
        // = 2, u <= 48) the 4 products of a lane at `saddlp` (4 * 48 * 127 = 24384).
        let mut lo = [vdupq_n_s16(0); 4];
        let mut hi = [vdupq_n_s16(0); 4];
        for i in 0..4 {
            let g = 4 * H + i;
            let xb = lane_bytes(xr, i);
            for j in 0..4 {
                let w = vreinterpretq_s8_u8(K::scaled::<G>(p, g, j));
                if i == 0 {
                    lo[j] = vmull_s8(vget_low_s8(w), vget_low_s8(xb));
                    hi[j] = vmull_high_s8(w, xb);
                } else {
                    lo[j] = vmlal_s8(lo[j], vget_low_s8(w), vget_low_s8(xb));
                    hi[j] = vmlal_high_s8(hi[j], w, xb);
                }
            }
        }
        let r = if K::WIDE[G] {
            // To i32 lanes, then the exact quotient by 16 back to i16 (|ih| <= 16 * 3 * 127;
            // `shrn` keeps the low 16 bits of an exact multiple's quotient).
            let q: [int32x4_t; 4] =
                std::array::from_fn(|j| vpaddq_s32(vpaddlq_s16(lo[j]), vpaddlq_s16(hi[j])));
            [
                vshrn_high_n_s32::<4>(vshrn_n_s32::<4>(q[0]), q[1]),
                vshrn_high_n_s32::<4>(vshrn_n_s32::<4>(q[2]), q[3]),
            ]
        } else {
            let r: [int16x8_t; 4] = std::array::from_fn(|j| vpaddq_s16(lo[j], hi[j]));
            [vpaddq_s16(r[0], r[1]), vpaddq_s16(r[2], r[3])]
        };
        if K::OFF == 0 {
            return r;
        }
        // The offset, 2^P OFF * xsum (modulo 2^16, as the sums).
        let off = vdupq_n_s16(((K::OFF << K::P[G]) * xsum as i32) as i16);
        r.map(|v| vsubq_s16(v, off))
    }
}

/// [`k16_half_tile`] with `sdot` by element: per quad one i32 chain, started at the offset
/// `-2^P OFF * xsum`, then to i16 (the row sums fit, as in the plain flavour; `WIDE` blocks
/// through the exact shift by 4).
///
/// SAFETY (callers): as [`k16_half_tile`], and the CPU has dotprod.
#[inline(always)]
unsafe fn k16_half_tile_sdot<K: K16, const G: usize, const H: usize>(
    p: *const u8,
    x: *const i8,
    xsum: i16,
) -> [int16x8_t; 2] {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        let xr = vld1q_s8(x.add(16 * H));
        let mut acc = [vdupq_n_s32(-(K::OFF << K::P[G]) * xsum as i32); 4];
        // Written out: LLVM keeps loops around the `asm!` of `sdot_lane` rolled.
        k16_sdot_group::<K, G, H, 0>(p, xr, &mut acc);
        k16_sdot_group::<K, G, H, 1>(p, xr, &mut acc);
        k16_sdot_group::<K, G, H, 2>(p, xr, &mut acc);
        k16_sdot_group::<K, G, H, 3>(p, xr, &mut acc);
        if K::WIDE[G] {
            [
                vshrn_high_n_s32::<4>(vshrn_n_s32::<4>(acc[0]), acc[1]),
                vshrn_high_n_s32::<4>(vshrn_n_s32::<4>(acc[2]), acc[3]),
            ]
        } else {
            // The low halves of the i32 lanes.
            let s = acc.map(|v| vreinterpretq_s16_s32(v));
            [vuzp1q_s16(s[0], s[1]), vuzp1q_s16(s[2], s[3])]
        }
    }
}

/// Activation group `I` (bytes 4I..4I + 4 of `xr`) of [`k16_half_tile_sdot`] onto the four
/// quads' chains.
///
/// SAFETY (callers): as [`k16_half_tile_sdot`].
#[inline(always)]
unsafe fn k16_sdot_group<K: K16, const G: usize, const H: usize, const I: usize>(
    p: *const u8,
    xr: int8x16_t,
    acc: &mut [int32x4_t; 4],
) {
    // SAFETY: the caller's contract.
    unsafe {
        let w = |j: usize| vreinterpretq_s8_u8(K::scaled::<G>(p, 4 * H + I, j));
        acc[0] = sdot_lane(acc[0], w(0), xr, I);
        acc[1] = sdot_lane(acc[1], w(1), xr, I);
        acc[2] = sdot_lane(acc[2], w(2), xr, I);
        acc[3] = sdot_lane(acc[3], w(3), xr, I);
    }
}

/// Q8A block `G` of the Q3_K / Q2_K tile at `p`, all four row quads, one token (`a`: its Q8A
/// block 0 of this super-block) onto `sd` and `sm`, plain NEON. Tile-major where
/// [`k16_block`] is quad-major: each activation lane broadcast and scale plane serves the
/// four quads; the weights come from the fewest instructions, scaled by a power of two
/// ([`K16::scaled`]) that the conversion takes back ([`cvt_field`]); the sums stay in i16
/// lanes to the row ([`k16_half_tile`]), so the scales multiply with widening (`smull`).
/// Per row the same exact i32 sums and the same f32 steps in the same order: the same bits.
/// llvm-mca, cycles per row-block: plain on the A53 Q2_K 171.5 -> 124.8, Q3_K 220.0 ->
/// 175.6; `sdot` on the A55 Q2_K 125.3 -> 108.2, Q3_K 173.8 -> 166.7.
///
/// SAFETY (callers): `p` points at a whole tile, `a` at 8 readable Q8A blocks; with `SDOT`
/// the CPU has dotprod.
#[inline(always)]
unsafe fn k16_block_tile<K: K16, const SDOT: bool, const G: usize>(
    p: *const u8,
    a: *const BlockQ8A,
    sd: &mut [float32x4_t; 4],
    sm: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        // Blocks 4n..4n + 4 read the same qs (and Q3_K all eight the same hmask) granules:
        // LLVM would keep them live across blocks, 32 registers, and spill.
        let p = opaque_ptr(p);
        let a = a.add(G);
        let x = (*a).qs.as_ptr();
        let i0 = k16_half_tile::<K, SDOT, G, 0>(p, x, (*a).sums[0]);
        let i1 = k16_half_tile::<K, SDOT, G, 1>(p, x, (*a).sums[1]);
        let [s0, s1, m0, m1] = K::scales_tile::<G>(p);
        let xd = (*a).d;
        // sums[0], sums[1] as i16 lanes 0, 1.
        let sums = vreinterpret_s16_s32(vld1_dup_s32((*a).sums.as_ptr() as *const i32));
        for j in 0..4 {
            let h = j / 2;
            // isum = sc_0 ih_0 + sc_1 ih_1 (times 4 for k = 1), exact in i32.
            let (isum, msum) = if j % 2 == 0 {
                let lo = vget_low_s16;
                (
                    vmlal_s16(vmull_s16(lo(s0[h]), lo(i0[h])), lo(s1[h]), lo(i1[h])),
                    vmlal_lane_s16::<1>(vmull_lane_s16::<0>(lo(m0[h]), sums), lo(m1[h]), sums),
                )
            } else {
                (
                    vmlal_high_s16(vmull_high_s16(s0[h], i0[h]), s1[h], i1[h]),
                    vmlal_high_lane_s16::<1>(vmull_high_lane_s16::<0>(m0[h], sums), m1[h], sums),
                )
            };
            sd[j] = vaddq_f32(sd[j], vmulq_n_f32(cvt_field::<K, G>(isum), xd));
            if K::DMIN.is_some() {
                sm[j] = vaddq_f32(sm[j], vmulq_n_f32(vcvtq_f32_s32(msum), xd));
            }
        }
    }
}

/// The one-token plain Q3_K / Q2_K kernel, a tile at a time ([`k16_block_tile`]).
///
/// SAFETY (callers): with `SDOT` the CPU has dotprod (bounds are asserted here).
#[inline(always)]
unsafe fn k16_one_tile<K: K16, const SDOT: bool>(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let nt = tiles.len() / K::BYTES;
    assert!(
        x.len() >= 8 * nt,
        "k16_one_tile: 8 activation blocks per tile"
    );
    // SAFETY: tile b < nt lies inside `tiles` and blocks 8b..8b + 8 inside `x` (asserted);
    // NEON is baseline on aarch64, dotprod as the caller promised.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nt {
            let p = tiles.as_ptr().add(b * K::BYTES);
            let a = x.as_ptr().add(8 * b);
            let mut sd = [vdupq_n_f32(0.0); 4];
            let mut sm = [vdupq_n_f32(0.0); 4];
            k16_block_tile::<K, SDOT, 0>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 1>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 2>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 3>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 4>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 5>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 6>(p, a, &mut sd, &mut sm);
            k16_block_tile::<K, SDOT, 7>(p, a, &mut sd, &mut sm);
            for j in 0..4 {
                // Q3_K's and Q2_K's super-scales are both at 0.
                let d = f16x4(p.add(8 * j));
                acc[j] = match K::DMIN {
                    Some(at) => {
                        let dmin = f16x4(p.add(at + 8 * j));
                        vaddq_f32(
                            acc[j],
                            vsubq_f32(vmulq_f32(d, sd[j]), vmulq_f32(dmin, sm[j])),
                        )
                    }
                    None => vaddq_f32(acc[j], vmulq_f32(d, sd[j])),
                };
            }
        }
        let mut out = [0f32; ROWS];
        for (j, v) in acc.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(4 * j), *v);
        }
        out
    }
}

/// The one-token plain Q3_K kernel ([`k16_one_tile`]).
#[inline(never)]
fn q3k_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: bounds are asserted inside; NEON is baseline on aarch64.
    unsafe { k16_one_tile::<Q3K, false>(tiles, x) }
}

/// The one-token plain Q2_K kernel ([`k16_one_tile`]).
#[inline(never)]
fn q2k_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: bounds are asserted inside; NEON is baseline on aarch64.
    unsafe { k16_one_tile::<Q2K, false>(tiles, x) }
}

/// The one-token dotprod Q3_K kernel ([`k16_one_tile`] with `sdot`; tile-major, as the
/// plain one, where the multi-token calls stay quad-major).
#[target_feature(enable = "dotprod")]
#[inline(never)]
unsafe fn q3k_one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: dotprod is enabled here; bounds are asserted inside.
    unsafe { k16_one_tile::<Q3K, true>(tiles, x) }
}

/// The one-token dotprod Q2_K kernel ([`k16_one_tile`] with `sdot`).
#[target_feature(enable = "dotprod")]
#[inline(never)]
unsafe fn q2k_one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: dotprod is enabled here; bounds are asserted inside.
    unsafe { k16_one_tile::<Q2K, true>(tiles, x) }
}

/// IQ4_XS: per sub-block 8 registers of signed table values (`tbl`), `d * (ls - 32)` for the
/// quad, then per token `acc = fma(d * (ls - 32), f32(isum) * d_x, acc)`.
struct IQ4XS;

/// Sub-block `S` of row quad `j` of an IQ4_XS tile at `p` for `T` tokens.
#[inline(always)]
unsafe fn iq4xs_sub<const SDOT: bool, const T: usize, const S: usize>(
    p: *const u8,
    j: usize,
    d: float32x4_t,
    tbl: int8x16_t,
    xb: &[*const BlockQ8A; T],
    acc: &mut [float32x4_t; T],
) {
    // SAFETY: every load lies inside the tile at `p` or the activation blocks (the caller's
    // contract); the rest is register-only.
    unsafe {
        // Lanes 0..4: the quad's `scales_l` byte S / 2, lanes 4..8: its `scales_h` byte S / 4;
        // ls = (low nibble or high nibble) | (2 bits at 2 (S % 4)) << 4.
        let v = two_planes(
            p.add(KX_SL + ROWS * (S / 2) + 4 * j),
            p.add(KX_SH + ROWS * (S / 4) + 4 * j),
        );
        let (s_lo, s_hi) = ((4 * (S % 2)) as u64, (2 * (S % 4)) as u64);
        // Per byte lane the right-shift count as a negative `ushl` count.
        let shifts = ((s_lo.wrapping_neg() & 0xFF) * 0x0101_0101)
            | (((s_hi.wrapping_neg() & 0xFF) * 0x0101_0101) << 32);
        let t = vand_u8(
            vshl_u8(v, vcreate_s8(shifts)),
            vcreate_u8(0x0303_0303_0F0F_0F0F),
        );
        let ls = vsli_n_u8::<4>(t, vext_u8::<4>(t, t));
        let ls = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(ls))));
        let dsc = vmulq_f32(d, vcvtq_f32_s32(vsubq_s32(ls, vdupq_n_s32(32))));
        let qs = p.add(KX_QS + 256 * S + 16 * j);
        let mut w = [[vdupq_n_s8(0); 4]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (i, wg) in wh.iter_mut().enumerate() {
                let q = vld1q_u8(qs.add(64 * i));
                let nib = if h == 0 {
                    vandq_u8(q, vdupq_n_u8(0x0F))
                } else {
                    vshrq_n_u8::<4>(q)
                };
                *wg = vqtbl1q_s8(tbl, nib);
            }
        }
        each_token!(T, |t| {
            let a = group_ptr(t, xb[t]).add(S);
            let isum = isum_quad_wide::<SDOT>(&w, (*a).qs.as_ptr(), vdupq_n_s32(0));
            acc[t] = vfmaq_f32(acc[t], dsc, vmulq_n_f32(vcvtq_f32_s32(isum), (*a).d));
            group_end(t + 1, acc);
        });
    }
}

/// Sub-block `S` of the IQ4_XS tile at `p`, all four row quads, one token (`a`: its Q8A
/// block 0 of this super-block; `d`: the quads' super-scales; `tbl`: the value table), plain
/// NEON. Tile-major where [`iq4xs_sub`] is quad-major: each activation lane broadcast and
/// scale plane serves the four quads. Per row the same exact i32 sums and the same f32 steps
/// in the same order: the same bits. llvm-mca, cycles per row-block: plain on the A53 186.3
/// (quad-major) -> 140.8, `sdot` on the A55 110.3 -> 89.1.
///
/// SAFETY (callers): `p` points at a whole tile, `a` at 8 readable Q8A blocks; with `SDOT`
/// the CPU has dotprod.
#[inline(always)]
unsafe fn iq4xs_sub_tile<const SDOT: bool, const S: usize>(
    p: *const u8,
    d: &[float32x4_t; 4],
    tbl: int8x16_t,
    a: *const BlockQ8A,
    acc: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        let p = opaque_ptr(p);
        let a = a.add(S);
        let x = (*a).qs.as_ptr();
        let xr = [0, 1].map(|h| vreinterpretq_s32_s8(vld1q_s8(x.add(16 * h))));
        let qs = p.add(KX_QS + 256 * S);
        // Per quad the i32 sums of rows 4j, 4j + 1 (pairs of lanes) and 4j + 2, 4j + 3; with
        // `SDOT` two chains of one lane per row.
        let mut s = [[vdupq_n_s32(0); 2]; 4];
        // Written out: LLVM keeps a loop this long rolled.
        iq4xs_granules_tile::<SDOT, 0>(qs, tbl, xr, &mut s);
        iq4xs_granules_tile::<SDOT, 2>(qs, tbl, xr, &mut s);
        // The 16 rows' ls - 32 (6-bit ls: the `scales_l` nibble, 2 bits of `scales_h` above).
        let sl = vld1q_u8(p.add(KX_SL + ROWS * (S / 2)));
        let sh = vld1q_u8(p.add(KX_SH + ROWS * (S / 4)));
        let lo = shr_u8(sl, 4 * (S % 2));
        let hi = vandq_u8(shr_u8(sh, 2 * (S % 4)), vdupq_n_u8(3));
        // `sli` keeps the low nibble of `lo` only; `hi` is 2 bits.
        let ls = vsliq_n_u8::<4>(lo, hi);
        let ls = widen_s8(vsubq_s8(vreinterpretq_s8_u8(ls), vdupq_n_s8(32)));
        let xd = (*a).d;
        for j in 0..4 {
            let l = ls[j / 2];
            let l = if j % 2 == 0 {
                vmovl_s16(vget_low_s16(l))
            } else {
                vmovl_high_s16(l)
            };
            // d * (ls - 32) is exact, as in `iq4xs_sub`.
            let dsc = vmulq_f32(d[j], vcvtq_f32_s32(l));
            let isum = if SDOT {
                vaddq_s32(s[j][0], s[j][1])
            } else {
                vpaddq_s32(s[j][0], s[j][1])
            };
            acc[j] = settled(vfmaq_f32(acc[j], dsc, vmulq_n_f32(vcvtq_f32_s32(isum), xd)));
        }
    }
}

/// Granules `I`, `I + 1` of an IQ4_XS sub-block (at `qs`), all four quads, both halves (low
/// nibbles: activations `xr[0]`, high: `xr[1]`) onto the quads' i32 sums `s`.
///
/// SAFETY (callers): `qs` points at the sub-block's 4 granules; with `SDOT` the CPU has
/// dotprod.
#[inline(always)]
unsafe fn iq4xs_granules_tile<const SDOT: bool, const I: usize>(
    qs: *const u8,
    tbl: int8x16_t,
    xr: [int32x4_t; 2],
    s: &mut [[int32x4_t; 2]; 4],
) {
    // SAFETY: the caller's contract; the rest is register-only.
    unsafe {
        if SDOT {
            let xr = xr.map(|v| vreinterpretq_s8_s32(v));
            for (j, s) in s.iter_mut().enumerate() {
                // Chain k: granule I + k's low nibbles (activations 0..16), high (16..32).
                // Written out: LLVM keeps a loop around the `asm!` of `sdot_lane` rolled.
                let chain = |acc: int32x4_t, k: usize| {
                    let v = vld1q_u8(qs.add(64 * (I + k) + 16 * j));
                    let w0 = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0F)));
                    let w1 = vqtbl1q_s8(tbl, vshrq_n_u8::<4>(v));
                    sdot_lane(sdot_lane(acc, w0, xr[0], I + k), w1, xr[1], I + k)
                };
                s[0] = chain(s[0], 0);
                s[1] = chain(s[1], 1);
            }
            return;
        }
        let xb = xr.map(|xr| [lane_bytes(xr, I), lane_bytes(xr, I + 1)]);
        for (j, s) in s.iter_mut().enumerate() {
            let v = [0, 1].map(|k| vld1q_u8(qs.add(64 * (I + k) + 16 * j)));
            for (h, xb) in xb.iter().enumerate() {
                let w = v.map(|v| {
                    let nib = if h == 0 {
                        vandq_u8(v, vdupq_n_u8(0x0F))
                    } else {
                        vshrq_n_u8::<4>(v)
                    };
                    vqtbl1q_s8(tbl, nib)
                });
                // Two products per i16 lane, as in `isum_quad_wide` (2 * 127 * 127 = 32258).
                let lo = vmull_s8(vget_low_s8(w[0]), vget_low_s8(xb[0]));
                let lo = vmlal_s8(lo, vget_low_s8(w[1]), vget_low_s8(xb[1]));
                let hi = vmull_high_s8(w[0], xb[0]);
                let hi = vmlal_high_s8(hi, w[1], xb[1]);
                s[0] = vpadalq_s16(s[0], lo);
                s[1] = vpadalq_s16(s[1], hi);
            }
        }
    }
}

impl KTile for IQ4XS {
    const BYTES: usize = KX_BYTES;
    #[inline(always)]
    unsafe fn quad<const SDOT: bool, const T: usize>(
        p: *const u8,
        j: usize,
        xb: &[*const BlockQ8A; T],
        a: &mut [float32x4_t; T],
    ) {
        // SAFETY: the caller's contract (see `KTile::quad`); the table is 16 bytes.
        unsafe {
            let d = f16x4(p.add(KX_D + 8 * j));
            let tbl = vld1q_s8(KVALUES_IQ4NL.as_ptr());
            iq4xs_sub::<SDOT, T, 0>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 1>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 2>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 3>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 4>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 5>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 6>(p, j, d, tbl, xb, a);
            iq4xs_sub::<SDOT, T, 7>(p, j, d, tbl, xb, a);
        }
    }
}

/// The one-token IQ4_XS kernel, a tile at a time ([`iq4xs_sub_tile`]).
///
/// SAFETY (callers): with `SDOT` the CPU has dotprod (bounds are asserted here).
#[inline(always)]
unsafe fn iq4xs_one_tile<const SDOT: bool>(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let nt = tiles.len() / KX_BYTES;
    assert!(
        x.len() >= 8 * nt,
        "iq4xs_one_tile: 8 activation blocks per tile"
    );
    // SAFETY: tile b < nt lies inside `tiles` and blocks 8b..8b + 8 inside `x` (asserted);
    // NEON is baseline on aarch64, dotprod as the caller promised; the table is 16 bytes.
    unsafe {
        let tbl = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nt {
            let p = tiles.as_ptr().add(b * KX_BYTES);
            let a = x.as_ptr().add(8 * b);
            let d: [float32x4_t; 4] = std::array::from_fn(|j| f16x4(p.add(KX_D + 8 * j)));
            iq4xs_sub_tile::<SDOT, 0>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 1>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 2>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 3>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 4>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 5>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 6>(p, &d, tbl, a, &mut acc);
            iq4xs_sub_tile::<SDOT, 7>(p, &d, tbl, a, &mut acc);
        }
        store_rows(&acc)
    }
}

/// The one-token plain IQ4_XS kernel ([`iq4xs_one_tile`]).
#[inline(never)]
fn iq4xs_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: bounds are asserted inside; NEON is baseline on aarch64.
    unsafe { iq4xs_one_tile::<false>(tiles, x) }
}

/// The one-token dotprod IQ4_XS kernel ([`iq4xs_one_tile`] with `sdot`; the multi-token calls
/// stay quad-major).
#[target_feature(enable = "dotprod")]
#[inline(never)]
unsafe fn iq4xs_one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: dotprod is enabled here; bounds are asserted inside.
    unsafe { iq4xs_one_tile::<true>(tiles, x) }
}

/// The one-token Q5_K kernel, a tile at a time ([`q5k_pair_tile`]).
///
/// SAFETY (callers): with `SDOT` the CPU has dotprod (bounds are asserted here).
#[inline(always)]
unsafe fn q5k_one_tile<const SDOT: bool>(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let nt = tiles.len() / K5_BYTES;
    assert!(
        x.len() >= 8 * nt,
        "q5k_one_tile: 8 activation blocks per tile"
    );
    // SAFETY: tile b < nt lies inside `tiles` and blocks 8b..8b + 8 inside `x` (asserted);
    // NEON is baseline on aarch64, dotprod as the caller promised.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nt {
            let p = tiles.as_ptr().add(b * K5_BYTES);
            let a = x.as_ptr().add(8 * b);
            let mut sd = [vdupq_n_f32(0.0); 4];
            let mut sm = [vdupq_n_f32(0.0); 4];
            q5k_pair_tile::<SDOT, 0, 1>(p, a, &mut sd, &mut sm);
            q5k_pair_tile::<SDOT, 2, 3>(p, a, &mut sd, &mut sm);
            q5k_pair_tile::<SDOT, 4, 5>(p, a, &mut sd, &mut sm);
            q5k_pair_tile::<SDOT, 6, 7>(p, a, &mut sd, &mut sm);
            for j in 0..4 {
                let d = f16x4(p.add(K5_D + 8 * j));
                let dmin = f16x4(p.add(K5_DMIN + 8 * j));
                let v = vsubq_f32(vmulq_f32(d, sd[j]), vmulq_f32(dmin, sm[j]));
                acc[j] = vaddq_f32(acc[j], v);
            }
        }
        store_rows(&acc)
    }
}

/// The one-token plain Q5_K kernel ([`q5k_one_tile`]).
#[inline(never)]
fn q5k_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: bounds are asserted inside; NEON is baseline on aarch64.
    unsafe { q5k_one_tile::<false>(tiles, x) }
}

/// The one-token dotprod Q5_K kernel ([`q5k_one_tile`] with `sdot`; the multi-token calls stay
/// quad-major).
#[target_feature(enable = "dotprod")]
#[inline(never)]
unsafe fn q5k_one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: dotprod is enabled here; bounds are asserted inside.
    unsafe { q5k_one_tile::<true>(tiles, x) }
}

/// The one-token Q4_K kernel, a tile at a time ([`q4k_pair_tile`]).
///
/// SAFETY (callers): with `SDOT` the CPU has dotprod (bounds are asserted here).
#[inline(always)]
unsafe fn q4k_one_tile<const SDOT: bool>(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let nt = tiles.len() / K4_BYTES;
    assert!(
        x.len() >= 8 * nt,
        "q4k_one_tile: 8 activation blocks per tile"
    );
    // SAFETY: tile b < nt lies inside `tiles` and blocks 8b..8b + 8 inside `x` (asserted);
    // NEON is baseline on aarch64, dotprod as the caller promised.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nt {
            let p = tiles.as_ptr().add(b * K4_BYTES);
            let a = x.as_ptr().add(8 * b);
            let d: [float32x4_t; 4] = std::array::from_fn(|j| f16x4(p.add(K4_D + 8 * j)));
            let ndmin: [float32x4_t; 4] =
                std::array::from_fn(|j| vnegq_f32(f16x4(p.add(K4_DMIN + 8 * j))));
            q4k_pair_tile::<SDOT, 0, 1>(p, (&d, &ndmin), a, &mut acc);
            q4k_pair_tile::<SDOT, 2, 3>(p, (&d, &ndmin), a, &mut acc);
            q4k_pair_tile::<SDOT, 4, 5>(p, (&d, &ndmin), a, &mut acc);
            q4k_pair_tile::<SDOT, 6, 7>(p, (&d, &ndmin), a, &mut acc);
        }
        store_rows(&acc)
    }
}

/// The one-token plain Q4_K kernel ([`q4k_one_tile`]).
#[inline(never)]
fn q4k_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: bounds are asserted inside; NEON is baseline on aarch64.
    unsafe { q4k_one_tile::<false>(tiles, x) }
}

/// The one-token dotprod Q4_K kernel ([`q4k_one_tile`] with `sdot`; tile-major, as the plain
/// one, where the multi-token calls stay quad-major).
#[target_feature(enable = "dotprod")]
#[inline(never)]
unsafe fn q4k_one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    // SAFETY: dotprod is enabled here; bounds are asserted inside.
    unsafe { q4k_one_tile::<true>(tiles, x) }
}

/// The 16 rows of four quad accumulators.
#[inline(always)]
fn store_rows(acc: &[float32x4_t; 4]) -> [f32; ROWS] {
    let mut out = [0f32; ROWS];
    for (j, v) in acc.iter().enumerate() {
        // SAFETY: lanes 4j..4j + 4 of `out` (j < 4); baseline NEON.
        unsafe { vst1q_f32(out.as_mut_ptr().add(4 * j), *v) };
    }
    out
}

/// The one-token plain Q6_K kernel, a tile at a time ([`q6k_block_tile`]).
#[inline(never)]
fn q6k_one_plain(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let nt = tiles.len() / K6_BYTES;
    assert!(
        x.len() >= 8 * nt,
        "q6k_one_plain: 8 activation blocks per tile"
    );
    // SAFETY: tile b < nt lies inside `tiles` and blocks 8b..8b + 8 inside `x` (asserted);
    // NEON is baseline on aarch64.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nt {
            let p = tiles.as_ptr().add(b * K6_BYTES);
            let a = x.as_ptr().add(8 * b);
            let d: [float32x4_t; 4] = std::array::from_fn(|j| f16x4(p.add(K6_D + 8 * j)));
            q6k_block_tile::<0, 0>(p, &d, a, &mut acc);
            q6k_block_tile::<0, 1>(p, &d, a, &mut acc);
            q6k_block_tile::<0, 2>(p, &d, a, &mut acc);
            q6k_block_tile::<0, 3>(p, &d, a, &mut acc);
            q6k_block_tile::<1, 0>(p, &d, a, &mut acc);
            q6k_block_tile::<1, 1>(p, &d, a, &mut acc);
            q6k_block_tile::<1, 2>(p, &d, a, &mut acc);
            q6k_block_tile::<1, 3>(p, &d, a, &mut acc);
        }
        let mut out = [0f32; ROWS];
        for (j, v) in acc.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(4 * j), *v);
        }
        out
    }
}

/// `T` activation rows against one group's tiles.
///
/// SAFETY (callers): with `SDOT` the CPU has dotprod.
#[inline(always)]
unsafe fn run<K: KTile, const SDOT: bool, const T: usize>(
    tiles: &[u8],
    x: [&[BlockQ8A]; T],
) -> [[f32; ROWS]; T] {
    let nt = tiles.len() / K::BYTES;
    assert!(x.iter().all(|x| x.len() >= 8 * nt));
    // SAFETY: tile b < nt lies inside `tiles`; token t's blocks 8b..8b + 8 inside `x[t]`
    // (asserted above); dotprod as the caller promised.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 4]; T];
        // One flat loop over (tile, row quad). In the llvm-mca models per row-block (Q4_K /
        // Q6_K): dotprod on the A55 99 / 151 cycles against 111 / 166 with a tile per
        // iteration and its quads written out; plain on the A53 189 / 268 against 189 / 272.
        for i in 0..4 * nt {
            let (b, j) = (i / 4, i % 4);
            let p = tiles.as_ptr().add(b * K::BYTES);
            let mut xb = [std::ptr::null::<BlockQ8A>(); T];
            for t in 0..T {
                xb[t] = x[t].as_ptr().add(8 * b);
            }
            let mut a: [float32x4_t; T] = std::array::from_fn(|t| acc[t][j]);
            K::quad::<SDOT, T>(p, j, &xb, &mut a);
            for (acc, a) in acc.iter_mut().zip(a) {
                acc[j] = a;
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (j, v) in a.iter().enumerate() {
                vst1q_f32(o.as_mut_ptr().add(4 * j), *v);
            }
        }
        out
    }
}

/// The 8-token kernel of a type: [`run`] with `T = 8` (unsafe: the `sdot` one needs dotprod).
type Eight = unsafe fn(&[u8], [&[BlockQ8A]; 8]) -> [[f32; ROWS]; 8];

/// Tokens in chunks of 8, then 4, then 1 (each token's bits are independent of the chunk);
/// `eight` and `one` are the 8-token and one-token kernels (their own functions, so their
/// tile loops can be modelled alone).
#[inline(always)]
unsafe fn rows16_any<K: KTile, const SDOT: bool>(
    tiles: &[u8],
    x: &[&[BlockQ8A]],
    out: &mut [[f32; ROWS]],
    eight: Eight,
    one: fn(&[u8], &[BlockQ8A]) -> [f32; ROWS],
) {
    assert_eq!(x.len(), out.len(), "rows16: one output per activation row");
    let mut t = 0;
    // As `one` below: a direct call may be inlined.
    let eight = std::hint::black_box(eight);
    // SAFETY: dotprod as the caller promised.
    unsafe {
        while t + 8 <= x.len() {
            let o = eight(tiles, std::array::from_fn(|i| x[t + i]));
            out[t..t + 8].copy_from_slice(&o);
            t += 8;
        }
        while t + 4 <= x.len() {
            let o = run::<K, SDOT, 4>(tiles, std::array::from_fn(|i| x[t + i]));
            out[t..t + 4].copy_from_slice(&o);
            t += 4;
        }
    }
    // Called through an opaque pointer: LLVM inlined the dotprod one even as `inline(never)`.
    let one = std::hint::black_box(one);
    while t < x.len() {
        out[t] = one(tiles, x[t]);
        t += 1;
    }
}

macro_rules! entries {
    ($kind:ty, $plain:ident, $one_plain:ident, $sdot:ident, $one_sdot:ident, $tf:ident, $one_tf:ident,
        $eight_plain:ident, $eight_tf:ident) => {
        #[target_feature(enable = "dotprod")]
        #[inline(never)]
        unsafe fn $one_tf(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
            // SAFETY: dotprod is enabled here; bounds as in `$plain`.
            unsafe { run::<$kind, true, 1>(tiles, [x])[0] }
        }
        entries!($kind, $plain, $one_plain, $sdot, $one_sdot, $tf, own $one_tf, $eight_plain, $eight_tf);
    };
    // `$one_tf` written out elsewhere.
    ($kind:ty, $plain:ident, $one_plain:ident, $sdot:ident, $one_sdot:ident, $tf:ident, own $one_tf:ident,
        $eight_plain:ident, $eight_tf:ident) => {
        /// The 8-token plain kernel (its own symbol for `scripts/arm-proxy.sh`).
        #[inline(never)]
        fn $eight_plain(tiles: &[u8], x: [&[BlockQ8A]; 8]) -> [[f32; ROWS]; 8] {
            // SAFETY: the plain flavour needs no extension; `run` bounds-checks.
            unsafe { run::<$kind, false, 8>(tiles, x) }
        }
        /// The 8-token dotprod kernel (its own symbol for `scripts/arm-proxy.sh`).
        #[target_feature(enable = "dotprod")]
        #[inline(never)]
        unsafe fn $eight_tf(tiles: &[u8], x: [&[BlockQ8A]; 8]) -> [[f32; ROWS]; 8] {
            // SAFETY: dotprod is enabled here; `run` bounds-checks.
            unsafe { run::<$kind, true, 8>(tiles, x) }
        }
        fn $plain(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: the plain flavour needs no extension; `run` bounds-checks the
            // activation rows against the tile count and reads only whole tiles.
            unsafe { rows16_any::<$kind, false>(tiles, x, out, $eight_plain, $one_plain) }
        }
        fn $one_sdot(tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
            // SAFETY: only reachable through `kernels(true)`, whose callers checked dotprod.
            unsafe { $one_tf(tiles, x) }
        }
        #[target_feature(enable = "dotprod")]
        unsafe fn $tf(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: dotprod is enabled here; bounds as in `$plain`.
            unsafe { rows16_any::<$kind, true>(tiles, x, out, $eight_tf, $one_sdot) }
        }
        fn $sdot(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: only reachable through `kernels(true)`, whose callers checked dotprod.
            unsafe { $tf(tiles, x, out) }
        }
    };
}

entries!(
    Q4K,
    rows16_q4_k_plain,
    q4k_one_plain,
    rows16_q4_k_sdot,
    q4k_one_sdot,
    rows16_q4_k_tf,
    own q4k_one_tf,
    q4k_eight_plain,
    q4k_eight_tf
);
entries!(
    Q6K,
    rows16_q6_k_plain,
    q6k_one_plain,
    rows16_q6_k_sdot,
    q6k_one_sdot,
    rows16_q6_k_tf,
    q6k_one_tf,
    q6k_eight_plain,
    q6k_eight_tf
);
entries!(
    Q5K,
    rows16_q5_k_plain,
    q5k_one_plain,
    rows16_q5_k_sdot,
    q5k_one_sdot,
    rows16_q5_k_tf,
    own q5k_one_tf,
    q5k_eight_plain,
    q5k_eight_tf
);
entries!(
    Sixteen<Q3K>,
    rows16_q3_k_plain,
    q3k_one_plain,
    rows16_q3_k_sdot,
    q3k_one_sdot,
    rows16_q3_k_tf,
    own q3k_one_tf,
    q3k_eight_plain,
    q3k_eight_tf
);
entries!(
    Sixteen<Q2K>,
    rows16_q2_k_plain,
    q2k_one_plain,
    rows16_q2_k_sdot,
    q2k_one_sdot,
    rows16_q2_k_tf,
    own q2k_one_tf,
    q2k_eight_plain,
    q2k_eight_tf
);
entries!(
    IQ4XS,
    rows16_iq4_xs_plain,
    iq4xs_one_plain,
    rows16_iq4_xs_sdot,
    iq4xs_one_sdot,
    rows16_iq4_xs_tf,
    own iq4xs_one_tf,
    iq4xs_eight_plain,
    iq4xs_eight_tf
);
