//! NEON kernels over [`super::Interleaved`] tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), in two
//! flavours: plain
//! (ARMv8.0, e.g. the Cortex-A53: `smull`/`smlal` into i16 lanes) and dotprod (`sdot`).
//!
//! A 128-bit register holds 4 weights of 4 rows (a "quad": rows 4j..4j+4, 16 bytes of a
//! 64-byte tile chunk), so the 32 weights x 16 rows of a tile are 32 vectors: 4 quads of each
//! of 8 element groups g (elements 4g..4g+4). Chunk k of the 4 below gives groups k (low
//! nibbles / first half) and k + 4 (high nibbles / second half) of all 4 quads.
//!
//! - dotprod: one indexed `sdot v.4s, w.16b, x.4b[k]` adds the 4 products of group g to each
//!   of 4 rows: 32 per tile and token, no activation broadcasts (x holds 4 groups).
//! - plain: the activation group broadcast to every lane (`ld1r`; `dup` of a lane for several
//!   tokens), `smull`/`smlal` (low rows)
//!   and `smull2`/`smlal2` (high rows) into i16 lanes, then pairwise adds into the rows.
//!
//! Per tile, per quad: the exact i32 sums, minus the offset correction, then
//! `acc = fma(d_w, f32(isum) * d_x, acc)` on 4 rows at once: [`super::rows16_ref`]'s bits.
//! One token: tile by tile, weights unpacked chunk by chunk straight into the products.
//! Several tokens (prefill): quad by quad over all tiles, each tile's 8 vectors of the quad
//! unpacked once for all tokens and kept in registers with every token's 4-row accumulator
//! (the group's tiles, a few KiB, come from L1 after the first quad). Per row and token the
//! integer sums are exact and the f32 steps are the same in the same order either way, so
//! every token gets a one-token call's bits.
//!
//! Unpacking (per weight, the part that dominates decode):
//! - Q4_0: `and` / `ushr` of the qs bytes: unsigned u in 0..16, the offset 8 is folded into
//!   the accumulator's initial value (`-8 * sum(q_x)`).
//! - Q5_0: signed weights directly: with the aarch64 mask layout (byte 4r+i, bit g = NOT the
//!   5th bit, see the module doc of [`super`]) `cmtst` against `1 << g` gives 0xFF where the
//!   5th bit is clear, and `sli`/`sri` by 4 put that into the high nibble next to the low /
//!   high quant nibble: `nib - 16` or `nib`, i.e. `nib + 16 h - 16`. Two ops per vector.
//! - Q8_0: the signed quants as stored on aarch64 (no XOR), loads only.
//! - Q4_1: as Q4_0 with no offset; Q5_1: as Q5_0 (signed `u - 16`), the 16 added back through
//!   the accumulator's initial value (`+16 * sum(q_x)`). Their f32 step is the reference's
//!   `acc + (d_w * d_x * f32(isum) + m_w * d_x * f32(sum(q_x)))`, every product rounded on
//!   its own (no fma).
//! - IQ4_NL: the nibbles as Q4_0, then one `tbl` into the signed table: weights in
//!   [-127, 113], two products per i16 lane as Q8_0.
//! - MXFP4: as IQ4_NL into the doubled e2m1 table (|v| <= 12: as many products per lane as
//!   Q4_0); the 16 e8m0 scales decoded per tile in scalar (`e8m0_half`, exact).
//!
//! Only [`kernels`] exposes these; the dotprod ones only after the caller checked
//! [`super::super::Isa::NeonDotprod`] is available.

use super::super::blocks::BlockQ8A;
use super::super::blocks::{e8m0_half, KVALUES_IQ4NL, KVALUES_MXFP4};
use super::super::neon::f16x4;
use super::{Rows16Dot, D_BYTES, MIN_AT, MX_QS, Q41_QS, Q51_HM, Q51_QS, Q5_HM, Q5_QS, ROWS};
use knot_format::dtype::DType;
use std::arch::aarch64::*;
use std::arch::asm;

/// The 16-row kernels by type (`dotprod`: the `sdot` flavour; the caller must have checked
/// `Isa::NeonDotprod.available()`).
pub(in super::super) fn kernels(dotprod: bool) -> Vec<(DType, Rows16Dot)> {
    let k: [(DType, Rows16Dot, Rows16Dot); 7] = [
        (DType::Q4_0, q4_0_plain, q4_0_sdot),
        (DType::Q4_1, q4_1_plain, q4_1_sdot),
        (DType::Q5_0, q5_0_plain, q5_0_sdot),
        (DType::Q5_1, q5_1_plain, q5_1_sdot),
        (DType::Q8_0, q8_0_plain, q8_0_sdot),
        (DType::IQ4_NL, iq4_nl_plain, iq4_nl_sdot),
        (DType::MXFP4, mxfp4_plain, mxfp4_sdot),
    ];
    k.iter()
        .map(|&(t, plain, sdot)| (t, if dotprod { sdot } else { plain }))
        .collect()
}

/// Chunk k of a tile: `[groups k, groups k + 4]`, each the 4 quads' weight vectors.
type Chunk = [[int8x16_t; 4]; 2];

/// How one type's tile becomes weight vectors.
trait Tile {
    const BYTES: usize;
    /// Subtracted per token as `OFF * sum(q_x)`: the specification's `isum` is
    /// `sum(unpacked * q_x) - OFF * sum(q_x)` (Q5_1: -16, its unpacked bytes are `u - 16`).
    const OFF: i32;
    /// Where the f16 mins sit (Q4_1, Q5_1: the f32 step with a min, see the module doc).
    const MIN: Option<usize> = None;
    /// |unpacked byte| <= 16, so the plain flavour may add 16 products (|q_x| <= 127) in one
    /// i16 lane: `16 * 16 * 127 = 32512 <= 32767`. Else (Q8_0) at most 2 per lane.
    const SMALL: bool;
    /// Tokens per group in the plain multi-token loop ([`rows16_quads`]): a group's
    /// activation loads wait for the previous group's results. Left alone (8), LLVM
    /// interleaves all 8 tokens and spills; in groups of 4 the llvm-mca A53 model of the
    /// 8-token loop gains for Q8_0 (156.3 -> 137.0 cycles per row-block), IQ4_NL (161.5 ->
    /// 144.0), Q4_1 (121.3 -> 117.3) and Q5_0 (99.5 -> 95.3), loses for Q4_0 (105.5 -> 129.5).
    /// (Q8_0, IQ4_NL and Q4_1 went on to [`Tile::BY_TOKEN`]; Q5_0 keeps its groups of 4.)
    const GROUP: usize = 8;
    /// Plain flavour: several tokens take the one-token pass token by token, not
    /// [`rows16_quads`]. For the types where the llvm-mca A53 model of the 8-token loop costs
    /// more than 8 one-token passes (`scripts/arm-proxy.sh`, cycles per row-block for 8
    /// tokens: Q4_0 105.5 against 8 x 11.6 = 92.8, Q4_1 117.3 against 101.6, Q8_0 137.0
    /// against 99.2, IQ4_NL 144.0 against 129.6): the one-token pass shares each activation
    /// broadcast among all 16 rows, the quad loop among 4. Same bits either way.
    const BY_TOKEN: bool = false;
    /// Per-tile state the chunks share (Q5_0: the 64 mask bytes).
    type Pre: Copy;
    /// SAFETY (callers): `p` points at `BYTES` readable bytes.
    unsafe fn pre(p: *const u8) -> Self::Pre;
    /// Chunk `K` (0..4). SAFETY (callers): as [`Tile::pre`].
    unsafe fn chunk<const K: usize>(p: *const u8, pre: Self::Pre) -> Chunk;
    /// Quad `j`'s 8 weight vectors, groups 0..8 (several tokens).
    /// SAFETY (callers): as [`Tile::pre`], `j < 4`.
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8];
    /// The 16 rows' weight scales `d_w` as 4 quads (f16 at the tile's start; MXFP4: e8m0).
    /// SAFETY (callers): as [`Tile::pre`].
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: the caller's contract (the tile's first 32 bytes).
        unsafe { scales(p) }
    }
    /// Quad `j`'s 4 weight scales. SAFETY (callers): as [`Tile::quad`].
    #[inline(always)]
    unsafe fn quad_scales(p: *const u8, j: usize) -> float32x4_t {
        // SAFETY: the caller's contract (bytes 8j..8j + 8 of the tile's scales).
        unsafe { f16x4(p.add(8 * j)) }
    }
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;
struct IQ4NL;
struct MXFP4;

/// 64 bytes as 4 registers (one `ld1`).
#[inline(always)]
unsafe fn load4(p: *const u8) -> [uint8x16_t; 4] {
    // SAFETY: callers pass 64 readable bytes (alignment 1 is fine for `ld1`).
    let v = unsafe { vld1q_u8_x4(p) };
    [v.0, v.1, v.2, v.3]
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a register reinterpretation.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// Chunk `K` of the nibble quants at `qs`: unsigned `u` in 0..16.
#[inline(always)]
unsafe fn nibble_chunk<const K: usize>(p: *const u8, qs: usize) -> Chunk {
    // SAFETY: chunk K's 64 bytes lie inside the tile (the caller's contract).
    let q = unsafe { load4(p.add(qs + 64 * K)) };
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        [
            q.map(|v| s8(vandq_u8(v, m4))),
            q.map(|v| s8(vshrq_n_u8::<4>(v))),
        ]
    }
}

/// Quad `j`'s 8 vectors of the nibble quants at `qs` (groups 0..8).
#[inline(always)]
unsafe fn nibble_quad(p: *const u8, qs: usize, j: usize) -> [int8x16_t; 8] {
    // SAFETY: 16 bytes of each chunk inside the tile (j < 4); register-only NEON.
    unsafe {
        let q: [uint8x16_t; 4] = std::array::from_fn(|k| vld1q_u8(p.add(qs + 64 * k + 16 * j)));
        let m4 = vdupq_n_u8(0x0F);
        std::array::from_fn(|g| {
            if g < 4 {
                s8(vandq_u8(q[g], m4))
            } else {
                s8(vshrq_n_u8::<4>(q[g - 4]))
            }
        })
    }
}

impl Tile for Q4_0 {
    const BYTES: usize = 16 * 18;
    const BY_TOKEN: bool = true;
    const OFF: i32 = 8;
    const SMALL: bool = true; // u in 0..16: 16 * 15 * 127 = 30480 per i16 lane at most
    type Pre = ();
    #[inline(always)]
    unsafe fn pre(_: *const u8) {}
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, _: ()) -> Chunk {
        // SAFETY: the caller's contract.
        unsafe { nibble_chunk::<K>(p, D_BYTES) }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract.
        unsafe { nibble_quad(p, D_BYTES, j) }
    }
}

impl Tile for Q4_1 {
    const BYTES: usize = 16 * 20;
    const BY_TOKEN: bool = true;
    const OFF: i32 = 0;
    const MIN: Option<usize> = Some(MIN_AT);
    const SMALL: bool = true; // as Q4_0
    type Pre = ();
    #[inline(always)]
    unsafe fn pre(_: *const u8) {}
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, _: ()) -> Chunk {
        // SAFETY: the caller's contract.
        unsafe { nibble_chunk::<K>(p, Q41_QS) }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract.
        unsafe { nibble_quad(p, Q41_QS, j) }
    }
}

impl Tile for IQ4NL {
    const BYTES: usize = 16 * 18;
    const BY_TOKEN: bool = true;
    const OFF: i32 = 0;
    const SMALL: bool = false; // table values down to -127: two products per i16 lane
    type Pre = int8x16_t;
    #[inline(always)]
    unsafe fn pre(_: *const u8) -> int8x16_t {
        // SAFETY: the 16-byte table.
        unsafe { vld1q_s8(KVALUES_IQ4NL.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, tbl: int8x16_t) -> Chunk {
        // SAFETY: the caller's contract; `tbl` is baseline NEON (indices < 16).
        unsafe {
            nibble_chunk::<K>(p, D_BYTES)
                .map(|h| h.map(|v| vqtbl1q_s8(tbl, vreinterpretq_u8_s8(v))))
        }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract; the table as in `pre`.
        unsafe {
            let tbl = vld1q_s8(KVALUES_IQ4NL.as_ptr());
            nibble_quad(p, D_BYTES, j).map(|v| vqtbl1q_s8(tbl, vreinterpretq_u8_s8(v)))
        }
    }
}

impl Tile for MXFP4 {
    const BYTES: usize = 16 * 17;
    const OFF: i32 = 0;
    const SMALL: bool = true; // doubled e2m1 values, |v| <= 12
    type Pre = int8x16_t;
    #[inline(always)]
    unsafe fn pre(_: *const u8) -> int8x16_t {
        // SAFETY: the 16-byte table.
        unsafe { vld1q_s8(KVALUES_MXFP4.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, tbl: int8x16_t) -> Chunk {
        // SAFETY: the caller's contract; `tbl` is baseline NEON (indices < 16).
        unsafe {
            nibble_chunk::<K>(p, MX_QS).map(|h| h.map(|v| vqtbl1q_s8(tbl, vreinterpretq_u8_s8(v))))
        }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract; the table as in `pre`.
        unsafe {
            let tbl = vld1q_s8(KVALUES_MXFP4.as_ptr());
            nibble_quad(p, MX_QS, j).map(|v| vqtbl1q_s8(tbl, vreinterpretq_u8_s8(v)))
        }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> [float32x4_t; 4] {
        // SAFETY: the caller's contract (the tile's 16 e8m0 bytes).
        std::array::from_fn(|j| unsafe { Self::quad_scales(p, j) })
    }
    #[inline(always)]
    unsafe fn quad_scales(p: *const u8, j: usize) -> float32x4_t {
        // A scale per 4 rows per tile, off the per-weight path: scalar `e8m0_half`, exact.
        // SAFETY: bytes 4j..4j + 4 of the tile's e8m0 scales (the caller's contract).
        unsafe {
            let d: [f32; 4] = std::array::from_fn(|i| e8m0_half(*p.add(4 * j + i)));
            vld1q_f32(d.as_ptr())
        }
    }
}

/// Chunk `K` of 5-bit quants (masks `h` from `hm`, nibbles at `qs`) as signed `u - 16`.
#[inline(always)]
unsafe fn five_chunk<const K: usize>(p: *const u8, qs: usize, h: [uint8x16_t; 4]) -> Chunk {
    // SAFETY: chunk K's 64 qs bytes lie inside the tile (the caller's contract).
    let q = unsafe { load4(p.add(qs + 64 * K)) };
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let (blo, bhi) = (opaque(vdupq_n_u8(1 << K)), opaque(vdupq_n_u8(1 << (K + 4))));
        let mut out = [[vdupq_n_s8(0); 4]; 2];
        for j in 0..4 {
            // 0xFF where the 5th bit is clear (the mask bytes are stored inverted).
            let (clo, chi) = (vtstq_u8(h[j], blo), vtstq_u8(h[j], bhi));
            // High nibble | 0xF0 where clear: `nib + 16 h - 16` as a signed byte.
            out[1][j] = s8(vsriq_n_u8::<4>(chi, q[j]));
            out[0][j] = s8(vsliq_n_u8::<4>(q[j], clo));
        }
        out
    }
}

/// Quad `j`'s 8 vectors of 5-bit quants (masks at `hm`, nibbles at `qs`) as signed `u - 16`.
#[inline(always)]
unsafe fn five_quad(p: *const u8, hm: usize, qs: usize, j: usize) -> [int8x16_t; 8] {
    // SAFETY: quad j's 16 mask bytes and 16 bytes of each qs chunk lie inside the tile;
    // register-only NEON. As `five_chunk`: 0xFF where the 5th bit is clear, then `sli`/`sri`.
    unsafe {
        let h = vld1q_u8(p.add(hm + 16 * j));
        let q: [uint8x16_t; 4] = std::array::from_fn(|k| vld1q_u8(p.add(qs + 64 * k + 16 * j)));
        std::array::from_fn(|g| {
            let clear = vtstq_u8(h, opaque(vdupq_n_u8(1 << g)));
            if g < 4 {
                s8(vsliq_n_u8::<4>(q[g], clear))
            } else {
                s8(vsriq_n_u8::<4>(clear, q[g - 4]))
            }
        })
    }
}

impl Tile for Q5_0 {
    const BYTES: usize = 16 * 22;
    const OFF: i32 = 0;
    const GROUP: usize = 4;
    const SMALL: bool = true; // weights in -16..16: 16 * 16 * 127 = 32512 per i16 lane at most
    type Pre = [uint8x16_t; 4];
    #[inline(always)]
    unsafe fn pre(p: *const u8) -> [uint8x16_t; 4] {
        // SAFETY: the 64 mask bytes lie inside the tile.
        unsafe { load4(p.add(Q5_HM)) }
    }
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, h: [uint8x16_t; 4]) -> Chunk {
        // SAFETY: the caller's contract.
        unsafe { five_chunk::<K>(p, Q5_QS, h) }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract.
        unsafe { five_quad(p, Q5_HM, Q5_QS, j) }
    }
}

impl Tile for Q5_1 {
    const BYTES: usize = 16 * 24;
    // The unpacked bytes are `u - 16`; the specification's isum is `sum(u * q_x)`.
    const OFF: i32 = -16;
    const MIN: Option<usize> = Some(MIN_AT);
    const SMALL: bool = true; // as Q5_0
    type Pre = [uint8x16_t; 4];
    #[inline(always)]
    unsafe fn pre(p: *const u8) -> [uint8x16_t; 4] {
        // SAFETY: the 64 mask bytes lie inside the tile.
        unsafe { load4(p.add(Q51_HM)) }
    }
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, h: [uint8x16_t; 4]) -> Chunk {
        // SAFETY: the caller's contract.
        unsafe { five_chunk::<K>(p, Q51_QS, h) }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: the caller's contract.
        unsafe { five_quad(p, Q51_HM, Q51_QS, j) }
    }
}

impl Tile for Q8_0 {
    const BYTES: usize = 16 * 34;
    const BY_TOKEN: bool = true;
    const OFF: i32 = 0;
    const SMALL: bool = false;
    type Pre = ();
    #[inline(always)]
    unsafe fn pre(_: *const u8) {}
    #[inline(always)]
    unsafe fn chunk<const K: usize>(p: *const u8, _: ()) -> Chunk {
        // SAFETY: groups K and K + 4 (64 bytes each) lie inside the tile.
        unsafe {
            [
                load4(p.add(D_BYTES + 64 * K)).map(s8),
                load4(p.add(D_BYTES + 64 * (K + 4))).map(s8),
            ]
        }
    }
    #[inline(always)]
    unsafe fn quad(p: *const u8, j: usize) -> [int8x16_t; 8] {
        // SAFETY: 16 bytes of each group inside the tile (j < 4).
        unsafe { std::array::from_fn(|g| vld1q_s8(p.add(D_BYTES + 64 * g + 16 * j) as *const i8)) }
    }
}

/// Where a one-token pass reads the weight vectors from (one implementor left, [`Direct`]:
/// a buffered multi-token source was slower than [`rows16_quads`]).
trait Src {
    /// SAFETY (callers): the source's bytes are readable (see the implementors).
    unsafe fn chunk<const K: usize>(&self) -> Chunk;
}

/// Straight from the tile at `p` (one token).
struct Direct<L: Tile> {
    p: *const u8,
    pre: L::Pre,
}

impl<L: Tile> Src for Direct<L> {
    #[inline(always)]
    unsafe fn chunk<const K: usize>(&self) -> Chunk {
        // SAFETY: `p` is a whole tile (the caller's contract).
        unsafe { L::chunk::<K>(self.p, self.pre) }
    }
}

/// `acc + ` the products of group `I` (activation bytes 4I..4I + 4 of `x`) with `w`, one
/// i32 lane per row (`sdot` by element). SAFETY (callers): a `dotprod` function on a CPU
/// that has it.
#[inline(always)]
unsafe fn sdot_lane<const I: usize>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction; reached only from `dotprod` functions (the caller's
    // contract). The directive lets the assembler take `sdot` where LLVM did not inline this
    // into the `dotprod` function.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{i}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            i = const I,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// 16 f16 scales at `p` as 4 quads of f32 (`fcvtl`, `fcvtl2`: ARMv8.0 baseline).
#[inline(always)]
unsafe fn scales(p: *const u8) -> [float32x4_t; 4] {
    // SAFETY: the tile's first 32 bytes.
    let (a, b) = unsafe { (vld1q_u8(p), vld1q_u8(p.add(16))) };
    let (mut o0, mut o1, mut o2, mut o3): (float32x4_t, float32x4_t, float32x4_t, float32x4_t);
    // SAFETY: register-only, baseline AdvSIMD instructions.
    unsafe {
        asm!(
            "fcvtl {o0:v}.4s, {a:v}.4h",
            "fcvtl2 {o1:v}.4s, {a:v}.8h",
            "fcvtl {o2:v}.4s, {b:v}.4h",
            "fcvtl2 {o3:v}.4s, {b:v}.8h",
            a = in(vreg) a,
            b = in(vreg) b,
            o0 = out(vreg) o0,
            o1 = out(vreg) o1,
            o2 = out(vreg) o2,
            o3 = out(vreg) o3,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    [o0, o1, o2, o3]
}

/// Group `4 * H + K`'s 4 activation bytes broadcast to every 32-bit lane, from the block's
/// quants in two registers (`x`): one `dup` each (8 `ld1r` per tile would also need 8 address
/// adds: `ld1r` takes no offset). As an `asm!` so LLVM does not see the halves are equal
/// (it would then rewrite `smull2 w, x` as an `ext` of `w` and a `smull`).
#[inline(always)]
fn bcast<const K: usize, const H: usize>(x: (int8x16_t, int8x16_t)) -> int8x16_t {
    let v = if H == 0 { x.0 } else { x.1 };
    let out: int8x16_t;
    // SAFETY: register-only, baseline AdvSIMD instruction (K < 4).
    unsafe {
        asm!(
            "dup {o:v}.4s, {v:v}.s[{k}]",
            v = in(vreg) v,
            o = lateout(vreg) out,
            k = const K,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `v`, hidden from the optimiser: LLVM rewrites a `cmtst` against a known `1` as `and` +
/// `neg` (and rematerializes the other bit constants with `movi` inside the loop).
#[inline(always)]
fn opaque(v: uint8x16_t) -> uint8x16_t {
    let mut v = v;
    // SAFETY: an empty instruction template; the register passes through unchanged.
    unsafe {
        asm!("/* {v:v} */", v = inout(vreg) v, options(pure, nomem, nostack, preserves_flags))
    };
    v
}

/// Chunk `K`'s products for one token, dotprod: into one i32 lane per row.
#[inline(always)]
unsafe fn chunk_sdot<S: Src, const K: usize>(
    src: &S,
    x: (int8x16_t, int8x16_t),
    s: &mut [int32x4_t; 4],
) {
    // SAFETY: the caller's source; `sdot_lane` as the caller's flavour.
    unsafe {
        let w = src.chunk::<K>();
        for j in 0..4 {
            s[j] = sdot_lane::<K>(s[j], w[0][j], x.0);
        }
        for j in 0..4 {
            s[j] = sdot_lane::<K>(s[j], w[1][j], x.1);
        }
    }
}

/// Chunk `K`'s products for one token, plain, small weights: added into i16 lanes
/// `p[j] = (rows 4j, 4j + 1; rows 4j + 2, 4j + 3)`, 4 elements each. Over the 4 chunks a lane
/// takes 8 products (bounded by [`Tile::SMALL`]).
#[inline(always)]
unsafe fn chunk_small<S: Src, const K: usize>(
    src: &S,
    x: (int8x16_t, int8x16_t),
    p: &mut [[int16x8_t; 2]; 4],
) {
    // SAFETY: the caller's source; the rest is register-only NEON (baseline).
    unsafe {
        let w = src.chunk::<K>();
        let (xl, xh) = (bcast::<K, 0>(x), bcast::<K, 1>(x));
        for j in 0..4 {
            let (w0, w1) = (w[0][j], w[1][j]);
            let (lo, hi) = if K == 0 {
                (
                    vmull_s8(vget_low_s8(w0), vget_low_s8(xl)),
                    vmull_high_s8(w0, xl),
                )
            } else {
                (
                    vmlal_s8(p[j][0], vget_low_s8(w0), vget_low_s8(xl)),
                    vmlal_high_s8(p[j][1], w0, xl),
                )
            };
            p[j][0] = vmlal_s8(lo, vget_low_s8(w1), vget_low_s8(xh));
            p[j][1] = vmlal_high_s8(hi, w1, xh);
        }
    }
}

/// Chunk `K`'s products for one token, plain, Q8_0: two products per i16 lane (at most
/// `2 * 128 * 127 = 32512`), then pairwise into `s[j] = (rows 4j, 4j + 1; rows 4j + 2, 4j + 3)`,
/// two i32 lanes per row.
#[inline(always)]
unsafe fn chunk_wide<S: Src, const K: usize>(
    src: &S,
    x: (int8x16_t, int8x16_t),
    s: &mut [[int32x4_t; 2]; 4],
) {
    // SAFETY: the caller's source; the rest is register-only NEON (baseline).
    unsafe {
        let w = src.chunk::<K>();
        let (xl, xh) = (bcast::<K, 0>(x), bcast::<K, 1>(x));
        for j in 0..4 {
            let (w0, w1) = (w[0][j], w[1][j]);
            let lo = vmull_s8(vget_low_s8(w0), vget_low_s8(xl));
            let lo = vmlal_s8(lo, vget_low_s8(w1), vget_low_s8(xh));
            let hi = vmull_high_s8(w0, xl);
            let hi = vmlal_high_s8(hi, w1, xh);
            s[j][0] = vpadalq_s16(s[j][0], lo);
            s[j][1] = vpadalq_s16(s[j][1], hi);
        }
    }
}

/// One tile's canonical step for one token: the exact sums `isum - OFF * sum(q_x)` of the 16
/// rows, then `acc = fma(d_w, f32(isum) * d_x, acc)` per quad.
#[inline(always)]
unsafe fn token_step<L: Tile, S: Src, const SDOT: bool>(
    src: &S,
    a: &BlockQ8A,
    dw: &[float32x4_t; 4],
    mw: &[float32x4_t; 4],
    acc: &mut [float32x4_t; 4],
) {
    // SAFETY: the caller's source and flavour; the rest is register-only NEON (baseline) and
    // loads inside `a`.
    unsafe {
        let init = vdupq_n_s32(-L::OFF * (a.sums[0] as i32 + a.sums[1] as i32));
        let x = (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16)));
        let isum: [int32x4_t; 4] = if SDOT {
            let mut s = [init; 4];
            chunk_sdot::<S, 0>(src, x, &mut s);
            chunk_sdot::<S, 1>(src, x, &mut s);
            chunk_sdot::<S, 2>(src, x, &mut s);
            chunk_sdot::<S, 3>(src, x, &mut s);
            s
        } else if L::SMALL {
            let mut p = [[vdupq_n_s16(0); 2]; 4];
            chunk_small::<S, 0>(src, x, &mut p);
            chunk_small::<S, 1>(src, x, &mut p);
            chunk_small::<S, 2>(src, x, &mut p);
            chunk_small::<S, 3>(src, x, &mut p);
            // addp: 16 products per lane (the `SMALL` bound), then widened onto `init`.
            p.map(|[lo, hi]| vpadalq_s16(init, vpaddq_s16(lo, hi)))
        } else {
            let mut s = [[vdupq_n_s32(0); 2]; 4];
            chunk_wide::<S, 0>(src, x, &mut s);
            chunk_wide::<S, 1>(src, x, &mut s);
            chunk_wide::<S, 2>(src, x, &mut s);
            chunk_wide::<S, 3>(src, x, &mut s);
            s.map(|[lo, hi]| vaddq_s32(init, vpaddq_s32(lo, hi)))
        };
        for j in 0..4 {
            acc[j] = f32_step::<L>(acc[j], dw[j], mw[j], isum[j], a);
        }
    }
}

/// One block's f32 step on 4 rows: `fma(d_w, f32(isum) * d_x, acc)`, or for the types with
/// a min the reference's `acc + (d_w * d_x * f32(isum) + m_w * d_x * f32(sum(q_x)))`, each
/// product rounded on its own.
#[inline(always)]
unsafe fn f32_step<L: Tile>(
    acc: float32x4_t,
    dw: float32x4_t,
    mw: float32x4_t,
    isum: int32x4_t,
    a: &BlockQ8A,
) -> float32x4_t {
    // SAFETY: register-only NEON (baseline).
    unsafe {
        let xd = vdupq_n_f32(a.d);
        if L::MIN.is_none() {
            return vfmaq_f32(acc, dw, vmulq_f32(vcvtq_f32_s32(isum), xd));
        }
        let qsum = vdupq_n_f32((a.sums[0] as i32 + a.sums[1] as i32) as f32);
        let dot = vmulq_f32(vmulq_f32(dw, xd), vcvtq_f32_s32(isum));
        let min = vmulq_f32(vmulq_f32(mw, xd), qsum);
        vaddq_f32(acc, vaddq_f32(dot, min))
    }
}

/// Quad `w`'s exact sums `isum - OFF * sum(q_x)` (4 rows) against one activation block.
#[inline(always)]
unsafe fn quad_isum<L: Tile, const SDOT: bool>(w: &[int8x16_t; 8], a: &BlockQ8A) -> int32x4_t {
    // SAFETY: loads inside `a`; `sdot_lane` as the caller's flavour; the rest is
    // register-only NEON (baseline).
    unsafe {
        let init = vdupq_n_s32(-L::OFF * (a.sums[0] as i32 + a.sums[1] as i32));
        if SDOT {
            let (x0, x1) = (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16)));
            let s = sdot_lane::<0>(init, w[0], x0);
            let s = sdot_lane::<1>(s, w[1], x0);
            let s = sdot_lane::<2>(s, w[2], x0);
            let s = sdot_lane::<3>(s, w[3], x0);
            let s = sdot_lane::<0>(s, w[4], x1);
            let s = sdot_lane::<1>(s, w[5], x1);
            let s = sdot_lane::<2>(s, w[6], x1);
            sdot_lane::<3>(s, w[7], x1)
        } else {
            // Each group's 4 bytes broadcast by `dup` of a 32-bit lane from two 16-byte
            // loads (`ld1r` takes no address offset: 8 of them per token cost 8 adds too).
            let (x0, x1) = (
                vreinterpretq_s32_s8(vld1q_s8(a.qs.as_ptr())),
                vreinterpretq_s32_s8(vld1q_s8(a.qs.as_ptr().add(16))),
            );
            let x: [int8x16_t; 8] = [
                vreinterpretq_s8_s32(vdupq_laneq_s32::<0>(x0)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<1>(x0)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<2>(x0)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<3>(x0)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<0>(x1)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<1>(x1)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<2>(x1)),
                vreinterpretq_s8_s32(vdupq_laneq_s32::<3>(x1)),
            ];
            if L::SMALL {
                // 8 products per i16 lane, 16 after the addp (the `SMALL` bound).
                let mut lo = vmull_s8(vget_low_s8(w[0]), vget_low_s8(x[0]));
                let mut hi = smull2(w[0], x[0]);
                for g in 1..8 {
                    lo = vmlal_s8(lo, vget_low_s8(w[g]), vget_low_s8(x[g]));
                    hi = smlal2(hi, w[g], x[g]);
                }
                vpadalq_s16(init, vpaddq_s16(lo, hi))
            } else {
                // Q8_0: 2 products per i16 lane (at most 2 * 128 * 127 = 32512), then widened.
                let (mut slo, mut shi) = (vdupq_n_s32(0), vdupq_n_s32(0));
                for g in (0..8).step_by(2) {
                    let lo = vmull_s8(vget_low_s8(w[g]), vget_low_s8(x[g]));
                    let lo = vmlal_s8(lo, vget_low_s8(w[g + 1]), vget_low_s8(x[g + 1]));
                    let hi = smlal2(smull2(w[g], x[g]), w[g + 1], x[g + 1]);
                    slo = vpadalq_s16(slo, lo);
                    shi = vpadalq_s16(shi, hi);
                }
                vaddq_s32(init, vpaddq_s32(slo, shi))
            }
        }
    }
}

/// `smull2` (the high 8 byte pairs' products) as one instruction: with the intrinsic, LLVM
/// hoists the weights' high halves out of the token loop (one more register per weight
/// vector: the 8-token loop spilled) and then pays an `ext` of the activations per token.
#[inline(always)]
fn smull2(a: int8x16_t, b: int8x16_t) -> int16x8_t {
    let out: int16x8_t;
    // SAFETY: register-only, baseline AdvSIMD instruction.
    unsafe {
        asm!(
            "smull2 {o:v}.8h, {a:v}.16b, {b:v}.16b",
            a = in(vreg) a,
            b = in(vreg) b,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `acc + ` [`smull2`] as one `smlal2` (see there).
#[inline(always)]
fn smlal2(acc: int16x8_t, a: int8x16_t, b: int8x16_t) -> int16x8_t {
    let mut acc = acc;
    // SAFETY: register-only, baseline AdvSIMD instruction.
    unsafe {
        asm!(
            "smlal2 {acc:v}.8h, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `if t < T { body }` for t = 0..8 written out: LLVM leaves a loop over the tokens rolled
/// (its accumulators then live in memory), and `T` is a constant, so the dead copies vanish.
macro_rules! each_token {
    ($T:expr, |$t:ident| $body:block) => {
        each_token!(@ $T, $t, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $T:expr, $t:ident, $body:block, $($i:literal)*) => {
        $(if $i < $T {
            let $t: usize = $i;
            $body
        })*
    };
}
pub(super) use each_token;

/// `p`, hidden from LLVM behind an empty `asm!` with side effects: loads through it are not
/// merged with loads through another pointer, nor hoisted above the previous [`settled`].
/// Shared with [`super::neon_kquants`].
#[inline(always)]
// The asm reads no memory: it only hides which pointer comes out.
#[allow(clippy::pointers_in_nomem_asm_block)]
pub(super) fn opaque_ptr<T>(p: *const T) -> *const T {
    let mut p = p;
    // SAFETY: an empty instruction sequence; it only claims to change the register.
    unsafe { asm!("/* {p} */", p = inout(reg) p, options(nomem, nostack, preserves_flags)) };
    p
}

/// `v`, computed here: an empty `asm!` with side effects, ordered before the next
/// [`opaque_ptr`]. LLVM otherwise interleaves all 8 tokens of a multi-token loop and spills,
/// and in the Q5_K, IQ4_XS and Q6_K one-token kernels sinks a block's f32 steps below the next
/// ones' integer work (llvm-mca A53 Q5_K 170.1 -> 166.2, IQ4_XS 150.3 -> 140.8, Q6_K 191.0 ->
/// 177.5; Q4_K's pairs are faster without, 118.6 -> 111.3). Shared with
/// [`super::neon_kquants`].
#[inline(always)]
pub(super) fn settled(v: float32x4_t) -> float32x4_t {
    let mut v = v;
    // SAFETY: an empty instruction sequence; it only claims to change the register.
    unsafe { asm!("/* {v:v} */", v = inout(vreg) v, options(nomem, nostack, preserves_flags)) };
    v
}

/// `T` tokens, one quad (4 rows) at a time over all tiles: the quad's 8 weight vectors are
/// unpacked once per tile for the `T` tokens and stay in registers, and each token's 4-row
/// accumulator too (the group's tiles, a few KiB, come from L1 after the first quad).
#[inline(always)]
unsafe fn rows16_quads<L: Tile, const SDOT: bool, const T: usize>(
    tiles: &[u8],
    x: &[&[BlockQ8A]],
    out: &mut [[f32; ROWS]],
) -> usize {
    let nb = tiles.len() / L::BYTES;
    let xp: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr());
    for j in 0..4 {
        // SAFETY: register-only NEON (the aarch64 baseline).
        let mut acc = [unsafe { vdupq_n_f32(0.0) }; T];
        for b in 0..nb {
            // SAFETY: block b < nb is a whole tile and every x[t] has >= nb blocks (the
            // caller's checks); `SDOT` as the caller's flavour.
            unsafe {
                let p = tiles.as_ptr().add(b * L::BYTES);
                let w = L::quad(p, j);
                let dw = L::quad_scales(p, j);
                let mw = match L::MIN {
                    Some(at) => f16x4(p.add(at + 8 * j)),
                    None => dw,
                };
                each_token!(T, |t| {
                    // Plain: tokens in groups of `L::GROUP`, each group's activation loads
                    // after the previous group's results (see `opaque_ptr`).
                    let grouped = !SDOT && L::GROUP < T;
                    let p = xp[t].add(b);
                    let p = if grouped && t.is_multiple_of(L::GROUP) {
                        opaque_ptr(p)
                    } else {
                        p
                    };
                    let a = &*p;
                    acc[t] = f32_step::<L>(acc[t], dw, mw, quad_isum::<L, SDOT>(&w, a), a);
                    if grouped && (t + 1).is_multiple_of(L::GROUP) {
                        for v in &mut acc[t + 1 - L::GROUP..=t] {
                            *v = settled(*v);
                        }
                    }
                });
            }
        }
        for t in 0..T {
            // SAFETY: 4 floats at 4j..4j + 4 of a 16-float row.
            unsafe { vst1q_f32(out[t][4 * j..].as_mut_ptr(), acc[t]) };
        }
    }
    T
}

/// [`rows16_quads`] with `T = 8` of one type and flavour, its own function (so that
/// `scripts/arm-proxy.sh` finds its loop). SAFETY (callers): as [`rows16_quads`], with 8 rows
/// in `x` and `out`; for the `sdot` one the CPU has dotprod.
type Eight = unsafe fn(&[u8], &[&[BlockQ8A]], &mut [[f32; ROWS]]) -> usize;

/// One token against the whole tiles, tile by tile straight from the tiles.
///
/// SAFETY (callers): `x` has a block per tile; `SDOT` as the caller's flavour.
#[inline(always)]
unsafe fn one_token<L: Tile, const SDOT: bool>(
    tiles: &[u8],
    x: &[BlockQ8A],
    out: &mut [f32; ROWS],
) {
    let nb = tiles.len() / L::BYTES;
    // SAFETY: block b < nb is a whole tile and x has >= nb blocks (the caller's contract).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for b in 0..nb {
            let p = tiles.as_ptr().add(b * L::BYTES);
            let src = Direct::<L> { p, pre: L::pre(p) };
            let dw = L::scales(p);
            let mw = match L::MIN {
                Some(at) => scales(p.add(at)),
                None => dw,
            };
            token_step::<L, _, SDOT>(&src, x.get_unchecked(b), &dw, &mw, &mut acc);
        }
        for (j, v) in acc.iter().enumerate() {
            // SAFETY: 4 floats at 4j..4j + 4 of a 16-float row.
            vst1q_f32(out[4 * j..].as_mut_ptr(), *v);
        }
    }
}

/// The [`Rows16Dot`] of type `L`: one token tile by tile straight from the tiles (also each
/// token of several where [`Tile::BY_TOKEN`]), more quad by quad ([`rows16_quads`]) 8
/// (`eight`), 4, 2 at a time.
#[inline(always)]
unsafe fn rows16<L: Tile, const SDOT: bool>(
    tiles: &[u8],
    x: &[&[BlockQ8A]],
    out: &mut [[f32; ROWS]],
    eight: Eight,
) {
    assert_eq!(x.len(), out.len(), "rows16: one output per activation row");
    let nb = tiles.len() / L::BYTES;
    assert!(x.iter().all(|x| x.len() >= nb), "rows16: short activations");
    // SAFETY: block b < nb is a whole tile and every x[t] has >= nb blocks
    // (asserted above); `SDOT` as the entry point's flavour.
    unsafe {
        if x.len() == 1 {
            return one_token::<L, SDOT>(tiles, x[0], &mut out[0]);
        }
        if !SDOT && L::BY_TOKEN {
            for (xt, o) in x.iter().zip(out.iter_mut()) {
                one_token::<L, SDOT>(tiles, xt, o);
            }
            return;
        }
        let mut t = 0;
        // Through an opaque pointer: a direct call may be inlined.
        let eight = std::hint::black_box(eight);
        while t < x.len() {
            let (xs, os) = (&x[t..], &mut out[t..]);
            t += match xs.len() {
                8.. => eight(tiles, &xs[..8], &mut os[..8]),
                4.. => rows16_quads::<L, SDOT, 4>(tiles, xs, os),
                2.. => rows16_quads::<L, SDOT, 2>(tiles, xs, os),
                _ => rows16_quads::<L, SDOT, 1>(tiles, xs, os),
            };
        }
    }
}

/// Safe entry points: `$plain` with plain NEON (baseline on aarch64), `$sdot` through a
/// `dotprod` target-feature wrapper.
macro_rules! entries {
    ($tile:ty, $plain:ident, $sdot:ident, $tf:ident, $eight_plain:ident, $eight_tf:ident) => {
        fn $plain(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: NEON is part of the aarch64 baseline; `rows16` checks the activation
            // rows against the tile count and reads only whole tiles.
            unsafe { rows16::<$tile, false>(tiles, x, out, $eight_plain) }
        }
        #[target_feature(enable = "dotprod")]
        unsafe fn $tf(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: as `$plain`; this function has dotprod enabled.
            unsafe { rows16::<$tile, true>(tiles, x, out, $eight_tf) }
        }
        /// The 8-token plain kernel ([`Eight`]).
        #[inline(never)]
        unsafe fn $eight_plain(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) -> usize {
            // SAFETY: the caller's checks ([`Eight`]); NEON is the aarch64 baseline.
            unsafe { rows16_quads::<$tile, false, 8>(tiles, x, out) }
        }
        /// The 8-token dotprod kernel ([`Eight`]).
        #[target_feature(enable = "dotprod")]
        #[inline(never)]
        unsafe fn $eight_tf(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) -> usize {
            // SAFETY: the caller's checks ([`Eight`]); dotprod is enabled here.
            unsafe { rows16_quads::<$tile, true, 8>(tiles, x, out) }
        }
        fn $sdot(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: only handed out by `kernels(true)`, whose callers checked
            // `Isa::NeonDotprod.available()` on this CPU.
            unsafe { $tf(tiles, x, out) }
        }
    };
}

entries!(
    Q4_0,
    q4_0_plain,
    q4_0_sdot,
    q4_0_tf,
    q4_0_eight_plain,
    q4_0_eight_tf
);
entries!(
    Q5_0,
    q5_0_plain,
    q5_0_sdot,
    q5_0_tf,
    q5_0_eight_plain,
    q5_0_eight_tf
);
entries!(
    Q8_0,
    q8_0_plain,
    q8_0_sdot,
    q8_0_tf,
    q8_0_eight_plain,
    q8_0_eight_tf
);
entries!(
    Q4_1,
    q4_1_plain,
    q4_1_sdot,
    q4_1_tf,
    q4_1_eight_plain,
    q4_1_eight_tf
);
entries!(
    Q5_1,
    q5_1_plain,
    q5_1_sdot,
    q5_1_tf,
    q5_1_eight_plain,
    q5_1_eight_tf
);
entries!(
    IQ4NL,
    iq4_nl_plain,
    iq4_nl_sdot,
    iq4_nl_tf,
    iq4_nl_eight_plain,
    iq4_nl_eight_tf
);
entries!(
    MXFP4,
    mxfp4_plain,
    mxfp4_sdot,
    mxfp4_tf,
    mxfp4_eight_plain,
    mxfp4_eight_tf
);
