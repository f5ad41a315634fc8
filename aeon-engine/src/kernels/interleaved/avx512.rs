//! AVX-512 VNNI kernels over [`super::Interleaved`] tiles: lane r of every register is row r.
//!
//! Per tile: 8 vectors of unsigned weight bytes (unpacked once for all tokens of the call),
//! then per token 8 `vpdpbusd` against broadcast dwords of the activation block, the exact
//! integer offset correction and one FMA into that token's 16-row accumulator. The sequence
//! per token is the same for any token count, so every token gets [`super::rows16_ref`]'s bits.
//!
//! Q4_K and Q6_K tiles go one 32-element sub-block at a time: its 8 weight vectors are
//! unpacked once for all tokens, the per-row scales come from the tile's byte planes
//! (`vpmovzxbd` / `vpmovsxbd`), and each token gets the integer sums and FMAs of
//! [`super::kquants`]' specification, in its order.
//!
//! Only [`kernels`] exposes these, and only after the caller checked
//! [`super::super::Isa::Avx512`] is available.

use super::super::blocks::BlockQ8A;
use super::super::roofline::touch_page;
use super::kquants::{
    k6_qh, k6_ql, K2_BYTES, K2_DMIN, K2_QS, K2_SC, K3_BLOCK, K3_BYTES, K3_Q, K3_SC, K4_BYTES, K4_D,
    K4_DMIN, K4_QS, K4_SC, K5_BYTES, K5_D, K5_DMIN, K5_QH, K5_QS, K5_SC, K6_BYTES, K6_D, K6_SC,
    KX_BYTES, KX_D, KX_QS, KX_SH, KX_SL,
};
use super::{
    rows16_any, Kernel, Rows16Dot, D_BYTES, MIN_AT, Q41_QS, Q51_HM, Q51_QS, Q5_HM, Q5_QS, ROWS,
};
use super::{IQ4NL_U, MXFP4_U, MX_QS};
use knot_format::dtype::DType;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// How one type's tile becomes 8 vectors of unsigned weight bytes.
trait Tile {
    const BYTES: usize;
    const OFF: i32;
    /// Where the f16 mins sit (Q4_1, Q5_1: weight `d * u + m`, `OFF` 0).
    const MIN: Option<usize> = None;
    /// SAFETY (callers): `p` points at `BYTES` readable bytes and AVX-512 BW is enabled.
    unsafe fn unpack(p: *const u8) -> [__m512i; 8];
    /// The 16 rows' weight scales `d_w` (f16 at the tile's start; MXFP4: e8m0 bytes).
    /// SAFETY (callers): as [`Tile::unpack`].
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> __m512 {
        // SAFETY: the 32 bytes at `p` are the tile's scales (this function's contract).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

/// The low and high nibbles of the 4 qs chunks: vectors 0..4 and 4..8.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> [__m512i; 8] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut w = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            let q = _mm512_loadu_si512(qs.add(64 * k) as *const _);
            w[k] = _mm512_and_si512(q, m4);
            w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        }
        w
    }
}

impl Tile for Q4_0 {
    const BYTES: usize = 16 * 18;
    const OFF: i32 = 8;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { nibbles(p.add(D_BYTES)) }
    }
}

struct MXFP4;

impl Tile for MXFP4 {
    const BYTES: usize = 16 * 17;
    const OFF: i32 = 128;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe {
            // Each code through the doubled e2m1 table (+ 128, unsigned for `vpdpbusd`).
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_U.as_ptr() as *const __m128i));
            let mut w = nibbles(p.add(MX_QS));
            for v in w.iter_mut() {
                *v = _mm512_shuffle_epi8(table, *v);
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> __m512 {
        // SAFETY: the 16 bytes at `p` are the tile's e8m0 scales (this function's contract);
        // AVX-512 present (module doc).
        unsafe {
            // `e8m0_half` per lane: bits (e - 1) << 23, or 0x00200000 << e for e < 2.
            let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
            let normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
            let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
        }
    }
}

struct IQ4NL;

impl Tile for IQ4NL {
    const BYTES: usize = 16 * 18;
    const OFF: i32 = 128;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe {
            // Each index through the table (values + 128, unsigned for `vpdpbusd`).
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_U.as_ptr() as *const __m128i));
            let mut w = nibbles(p.add(D_BYTES));
            for v in w.iter_mut() {
                *v = _mm512_shuffle_epi8(table, *v);
            }
            w
        }
    }
}

impl Tile for Q4_1 {
    const BYTES: usize = 16 * 20;
    const OFF: i32 = 0;
    const MIN: Option<usize> = Some(MIN_AT);
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { nibbles(p.add(Q41_QS)) }
    }
}

/// The 5-bit quants of a tile: nibbles at `qs`, 16 added where the masks at `hm` have a bit.
#[inline(always)]
unsafe fn five_bits(p: *const u8, hm: usize, qs: usize) -> [__m512i; 8] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        let mut w = nibbles(p.add(qs));
        let c16 = _mm512_set1_epi8(16);
        for (g, v) in w.iter_mut().enumerate() {
            let m = (p.add(hm + 8 * g) as *const u64).read_unaligned();
            *v = _mm512_mask_add_epi8(*v, m, *v, c16);
        }
        w
    }
}

impl Tile for Q5_0 {
    const BYTES: usize = 16 * 22;
    const OFF: i32 = 16;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { five_bits(p, Q5_HM, Q5_QS) }
    }
}

impl Tile for Q5_1 {
    const BYTES: usize = 16 * 24;
    const OFF: i32 = 0;
    const MIN: Option<usize> = Some(MIN_AT);
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { five_bits(p, Q51_HM, Q51_QS) }
    }
}

impl Tile for Q8_0 {
    const BYTES: usize = 16 * 34;
    const OFF: i32 = 128;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { std::array::from_fn(|g| _mm512_loadu_si512(p.add(D_BYTES + 64 * g) as *const _)) }
    }
}

/// `T` activation rows against one group's tiles.
#[inline(always)]
unsafe fn rows16<L: Tile, const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX-512 present (module doc).
    unsafe {
        let nb = tiles.len() / L::BYTES;
        assert!(x.iter().all(|x| x.len() >= nb));
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            let p = tiles.as_ptr().add(b * L::BYTES);
            touch_page(p, L::BYTES);
            // About 16 KiB ahead, as the k-quants: from DRAM at 8 tokens this took
            // Q4_0/Q5_0/Q8_0 from 6/6/8 to 10/10/15 GB/s of weights (12/13/22 with
            // `touch_page`). One token: on the Zen 4 host of earlier sessions the hardware
            // prefetchers kept pace and these cost it (22-24 GB/s with, 28-30 without); on a
            // Zen 5 host they gain 5-20% (Q5_1 33 -> 35-40, Q4_1 36-37 -> 39-42, Q5_0 34 -> 40).
            prefetch(p.wrapping_add(16384 / L::BYTES * L::BYTES), L::BYTES);
            let dw = L::scales(p);
            let w = L::unpack(p);
            if let Some(at) = L::MIN {
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(at) as *const __m256i));
                for t in 0..T {
                    let a = x[t].get_unchecked(b);
                    let (dx, qsum) = (_mm512_set1_ps(a.d), (a.sums[0] as i32 + a.sums[1] as i32));
                    // The reference's `acc + (d_w * d_x * isum + m_w * d_x * sum(q_x))`, each
                    // product rounded on its own (no fma), as the scalar expression is.
                    let isum = _mm512_cvtepi32_ps(dot_block(_mm512_setzero_si512(), &w, a, false));
                    let dot = _mm512_mul_ps(_mm512_mul_ps(dw, dx), isum);
                    let min = _mm512_mul_ps(_mm512_mul_ps(mw, dx), _mm512_set1_ps(qsum as f32));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(dot, min));
                }
                continue;
            }
            for t in 0..T {
                let a = x[t].get_unchecked(b);
                let corr = L::OFF * (a.sums[0] as i32 + a.sums[1] as i32);
                let isum = dot_block(_mm512_set1_epi32(-corr), &w, a, T > 1);
                let tmp = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a.d));
                acc[t] = _mm512_fmadd_ps(dw, tmp, acc[t]);
            }
        }
        rows_out(&acc)
    }
}

/// `init` plus the exact i32 sums `sum(u * q_x)` of 16 rows (lanes) against one activation
/// block: vector g of `w` holds elements 4g..4g+4 of each row, matched by dword g of the
/// block's quants. The chain is split in two (its latency bounds one token) unless
/// `one_chain`: with several tokens the other tokens' chains keep the multiplier busy and the
/// join takes one of its slots per token. One chain, with the offset correction as `init`,
/// took 8-token tiles from L3 (kernel-bench, Zen 5) Q4_0 117 -> 133 GB/s, Q5_0 144 -> 182,
/// IQ4_NL 116-124 -> 148-153, MXFP4 110 -> 140-151, Q4_K 117 -> 125-127; Q5_K (125 -> 100-121),
/// IQ4_XS (112-115 -> 103-107) and Q2_K (67 -> 63) were slower with it, Q4_1 the same: they
/// keep two chains. The correction as `init` alone (two chains) changed nothing.
#[inline(always)]
unsafe fn dot_block(init: __m512i, w: &[__m512i; 8], a: &BlockQ8A, one_chain: bool) -> __m512i {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX-512 present (module doc).
    unsafe {
        let q = a.qs.as_ptr() as *const i32;
        let x = |g: usize| _mm512_set1_epi32(q.add(g).read_unaligned());
        if one_chain {
            return w
                .iter()
                .enumerate()
                .fold(init, |s, (g, wg)| _mm512_dpbusd_epi32(s, *wg, x(g)));
        }
        // Two chains of four; integer sums are exact, so the split changes no bit.
        let mut s0 = init;
        let mut s1 = _mm512_setzero_si512();
        for g in (0..8).step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, w[g], x(g));
            s1 = _mm512_dpbusd_epi32(s1, w[g + 1], x(g + 1));
        }
        _mm512_add_epi32(s0, s1)
    }
}

/// Each token's 16-row accumulator as floats.
#[inline(always)]
unsafe fn rows_out<const T: usize>(acc: &[__m512; T]) -> [[f32; ROWS]; T] {
    // SAFETY: register-only intrinsics; AVX-512 present (module doc: reached only after
    // detection).
    unsafe {
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
        }
        out
    }
}

/// The 32-element types' kernel, [`rows16`] over a [`Tile`].
struct Blocks<L>(PhantomData<L>);

impl<L: Tile> Kernel for Blocks<L> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe { rows16::<L, T>(tiles, x) }
    }
}

/// Tiles ahead that the k-quant kernels prefetch (see [`prefetch`]) for several tokens:
/// 18-26 KiB.
const AHEAD: usize = 8;

/// Tiles ahead that the k-quants (Q4_K, Q5_K, Q6_K, IQ4_XS) prefetch for one token: about
/// one DRAM latency of their compute (9-14 KiB). The best distance, and whether one token
/// wants line prefetches at all, is the host's: on the Zen 4 host of earlier sessions the
/// hardware prefetchers kept pace with Q4_K and IQ4_XS once the pages were touched and the
/// prefetch instructions cost more than they hid (Q4_K 25 GB/s from DRAM with them at 2
/// tiles, 29 without); on a Zen 5 host (2026-12-07, kernel-bench 1 thread from DRAM,
/// interleaved runs) Q4_K ran 22 without, 31 at 2 tiles, 32-35 at 4, 31 at 8; IQ4_XS 17
/// without, 33-36 at 3-4, 31 at 6; Q6_K 31 at 2, 34-36 at 3-4; Q5_K 31-33 at 3 and at 4
/// (Zen 4: 27-29 at either). Every other line only: Q4_K 30; every fourth: 20. A missed
/// prefetch costs a third to a half of the stream, a wasted one a tenth.
const AHEAD_ONE: usize = 4;

/// Tiles ahead that Q3_K and Q2_K prefetch for one token (10-14 KiB). Once the Q3_K kernel's
/// work per tile was cut to 1.4x the DRAM time (it had been 2.3x), [`AHEAD_ONE`] left it at
/// 25-27 GB/s of weights from DRAM against 33.5 from cache; 8 tiles ahead gave 32.3-32.8
/// (6: 32.6, 4: 30.2-30.5, 16: 32.3-32.9, none: 28; kernel-bench, one thread, load ~8).
pub(super) const K16_AHEAD_ONE: usize = 8;

/// Prefetches the `bytes` after `p` into L2 (`p` may point past the tiles: a prefetch never
/// faults, and the next group's tiles follow in memory).
///
/// Why: a k-quant tile is 2-3 KiB and hundreds of instructions (which LLVM schedules partly
/// back to front), so the out-of-order window no longer runs ahead into the next tiles the way
/// it does for the 32-element types. Without it the one-token kernels streamed 6-9 GB/s from
/// DRAM against 18-20 for Q4_0/Q5_0/Q8_0 (and 50 from cache); with it, an eighth of a tile per
/// sub-block, 25 (Q4_K) and 14-15 (Q6_K), and at 8 tokens 10 and 12 (from 6 and 5). Into L1
/// (`T0`) was no better than none; 4 tiles ahead was slower, 16 no faster; the whole tile at
/// once (LLVM keeps such a burst together) left Q6_K at 8 GB/s for 8 tokens.
///
/// An asm `prefetcht1` rather than `_mm_prefetch`: LLVM gathers the intrinsic's prefetches
/// into bursts all the same (the one-token Q6_K kernel had the 56 of a tile together at its
/// end: 14 GB/s from DRAM, against 25 with the asm, which stays where the source puts it;
/// Q4_K at 8 tokens 10 against 11).
#[inline(always)]
pub(super) unsafe fn prefetch(p: *const u8, bytes: usize) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        for i in (0..bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the
            // address; it writes no register, memory or flag.
            std::arch::asm!(
                "prefetcht1 [{}]",
                in(reg) p.wrapping_add(i),
                options(nostack, preserves_flags, readonly)
            );
        }
    }
}

/// One plane of 16 unsigned scale bytes as i32 lanes.
#[inline(always)]
unsafe fn plane_u8(p: *const u8) -> __m512i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)) }
}

/// Q4_K tiles: per sub-block s, 8 vectors of 4-bit quants (low or high nibbles of the
/// granules of qs chunk s / 2), `d * sc` and `dmin * m` as row vectors, then per token one
/// sub-block dot, its scale FMA and its min FMA.
///
/// Why the scales are unpacked once per tile and the high nibbles are not shifted (see
/// [`q4k_scale_bytes`] and [`q4k_sub`]): from cache the kernel ran at half the DRAM read
/// rate it had to keep pace with, and these per-sub-block steps were a fifth of its
/// instructions.
struct Q4K;

/// `get_scale_min_k4` of all 8 sub-blocks of a Q4_K tile for 16 rows at once, as bytes:
/// `[sc of sub-blocks 0..4, sc of 4..8, m of 0..4, m of 4..8]`, 128-bit lane `s % 4` of each
/// holding sub-block s's plane. Whole-register byte operations over the 12 planes (3 loads),
/// where per sub-block the same took 2-3 loads and up to 7 operations on i32 lanes.
#[inline(always)]
unsafe fn q4k_scale_bytes(sc: *const u8) -> [__m512i; 4] {
    // SAFETY: the 192 bytes at `sc` are the tile's 12 scale planes (this function's
    // contract, as its caller keeps it); AVX-512 BW present (module doc).
    unsafe {
        let lo = _mm512_loadu_si512(sc as *const _);
        let mid = _mm512_loadu_si512(sc.add(64) as *const _);
        let hi = _mm512_loadu_si512(sc.add(128) as *const _);
        let m6 = _mm512_set1_epi8(63);
        let m4 = _mm512_set1_epi8(0x0F);
        // Bits 6-7 of a byte moved to bits 4-5: masked first, so the 16-bit shift carries
        // nothing across bytes.
        let top = |v: __m512i| _mm512_srli_epi16(_mm512_and_si512(v, _mm512_set1_epi8(-64)), 2);
        [
            _mm512_and_si512(lo, m6),
            _mm512_or_si512(_mm512_and_si512(hi, m4), top(lo)),
            _mm512_and_si512(mid, m6),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(hi, 4), m4), top(mid)),
        ]
    }
}

/// 128-bit lane `l` (0..4, a constant once inlined) of `v`, its 16 bytes as i32 lanes.
#[inline(always)]
unsafe fn lane_u8_epi32(v: __m512i, l: usize) -> __m512i {
    // SAFETY: register-only intrinsics; AVX-512 F present (module doc).
    unsafe {
        let x = match l {
            0 => _mm512_castsi512_si128(v),
            1 => _mm512_extracti32x4_epi32::<1>(v),
            2 => _mm512_extracti32x4_epi32::<2>(v),
            _ => _mm512_extracti32x4_epi32::<3>(v),
        };
        _mm512_cvtepu8_epi32(x)
    }
}

/// Sub-block `S` of a Q4_K tile at `p` for `T` tokens (`xb`: each token's 8 blocks of this
/// super-block; `scb`: [`q4k_scale_bytes`] of the tile). `S` is a constant so the nibble
/// mask and the scale lane are fixed.
#[inline(always)]
unsafe fn q4k_sub<const S: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    (d, dmin): (__m512, __m512),
    scb: &[__m512i; 4],
    xb: &[*const BlockQ8A; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        // An eighth of a tile ahead per sub-block (spread out, the prefetches leave the fill
        // buffers to the demand loads); for one token [`AHEAD_ONE`] tiles ahead. The asm also
        // bounds scheduling: without a boundary per sub-block LLVM interleaves the 8
        // sub-blocks of a tile and the kernel fell to 14-17 GB/s.
        prefetch(ahead.wrapping_add(S * K4_BYTES / 8), K4_BYTES / 8);
        let sc = lane_u8_epi32(scb[S / 4], S % 4);
        let m = lane_u8_epi32(scb[2 + S / 4], S % 4);
        let dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
        let dm = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m));
        let qs = p.add(K4_QS + 512 * (S / 2));
        // Odd sub-blocks keep their nibble in place (16 u): one AND instead of a shift and an
        // AND per vector, and one exact shift of each token's sum (a multiple of 16).
        let mask = _mm512_set1_epi8(if S % 2 == 1 { -16 } else { 0x0F });
        let w: [__m512i; 8] = std::array::from_fn(|k| {
            _mm512_and_si512(_mm512_loadu_si512(qs.add(64 * k) as *const _), mask)
        });
        for t in 0..T {
            let a = &*xb[t].add(S);
            let isum = dot_block(_mm512_setzero_si512(), &w, a, T > 1);
            let isum = if S % 2 == 1 {
                _mm512_srai_epi32(isum, 4)
            } else {
                isum
            };
            let tmp = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a.d));
            acc[t] = _mm512_fmadd_ps(dsc, tmp, acc[t]);
            // fnmadd rounds -(dm * s) + acc once: the spec's fma(-(dmin * m), s, acc).
            acc[t] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(a.s), acc[t]);
        }
    }
}

impl Kernel for Q4K {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe {
            let nt = tiles.len() / K4_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K4_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K4_BYTES);
                touch_page(p, K4_BYTES);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(K4_D) as *const __m256i));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(K4_DMIN) as *const __m256i));
                let dd = (d, dmin);
                let scb = q4k_scale_bytes(p.add(K4_SC));
                let xb: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr().add(8 * b));
                q4k_sub::<0, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<1, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<2, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<3, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<4, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<5, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<6, T>(p, ahead, dd, &scb, &xb, &mut acc);
                q4k_sub::<7, T>(p, ahead, dd, &scb, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

/// Q5_K tiles: per sub-block s, 8 vectors of 5-bit quants (nibbles as Q4_K, plus 16 where bit
/// s of the qh granule is set); per token the reference's terms `a.d * f32(sc * isum)` and
/// `a.d * f32(m * sum(q_x))`, summed per pair of sub-blocks into `sd` and `sm`, and once per
/// tile `acc + (d * sd - dmin * sm)` (see [`super::kquants`]).
///
/// Tried for one token (kernel-bench from L3, 40 GB/s before; 53 with the 5th bit left out):
/// the 5th bit shifted to bit 4 and joined by `vpternlogd` instead of `vptestmb` and a masked
/// add: 40; the qh granules loaded once per tile instead of per sub-block: 40.
struct Q5K;

/// The 8 weight vectors (5-bit `u`) of sub-block `S` of a Q5_K tile at `p`.
#[inline(always)]
unsafe fn q5k_weights<const S: usize>(p: *const u8) -> [__m512i; 8] {
    // SAFETY: every read below is inside the tile at the caller's pointer (this function's
    // contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        let qs = p.add(K5_QS + 512 * (S / 2));
        let (m4, c16, bit) = (
            _mm512_set1_epi8(0x0F),
            _mm512_set1_epi8(16),
            _mm512_set1_epi8(1 << S),
        );
        std::array::from_fn(|k| {
            let v = _mm512_loadu_si512(qs.add(64 * k) as *const _);
            let v = if S % 2 == 1 {
                _mm512_srli_epi16(v, 4)
            } else {
                v
            };
            let v = _mm512_and_si512(v, m4);
            let h = _mm512_loadu_si512(p.add(K5_QH + 64 * k) as *const _);
            _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(h, bit), v, c16)
        })
    }
}

/// Sub-blocks `S0` and `S1 = S0 + 1` of a Q5_K tile: per token `sd += x0 + x1`, with the
/// reference's `x = a.d * f32(sc * isum)` (`scb`: [`q4k_scale_bytes`] of the tile, whose
/// scale planes Q5_K shares).
///
/// Why pairs, token by token, and the min terms apart ([`q5k_mins`]): per sub-block for all
/// tokens, then summing the pair, kept 2 x 16 terms live for 8 tokens, and LLVM ran the
/// token loop through the stack (32 spill copies and 16 stores per sub-block around 8
/// `vpdpbusd` per token). `f32(sc * isum)` is `f32(sc) * f32(isum)` exactly (both below
/// 2^24, and so their product: 63 * 32 * 31 * 127), a `vmulps` where `vpmulld` was slower.
#[inline(always)]
unsafe fn q5k_pair<const S0: usize, const S1: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    scb: &[__m512i; 4],
    xb: &[*const BlockQ8A; T],
    sd: &mut [__m512; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        prefetch(ahead.wrapping_add(S0 * K5_BYTES / 8), K5_BYTES / 8);
        let fsc0 = _mm512_cvtepi32_ps(lane_u8_epi32(scb[S0 / 4], S0 % 4));
        let w0 = q5k_weights::<S0>(p);
        prefetch(ahead.wrapping_add(S1 * K5_BYTES / 8), K5_BYTES / 8);
        let fsc1 = _mm512_cvtepi32_ps(lane_u8_epi32(scb[S1 / 4], S1 % 4));
        let w1 = q5k_weights::<S1>(p);
        for (t, sd) in sd.iter_mut().enumerate() {
            let (a0, a1) = (&*xb[t].add(S0), &*xb[t].add(S1));
            let i0 = _mm512_mul_ps(
                fsc0,
                _mm512_cvtepi32_ps(dot_block(_mm512_setzero_si512(), &w0, a0, false)),
            );
            let i1 = _mm512_mul_ps(
                fsc1,
                _mm512_cvtepi32_ps(dot_block(_mm512_setzero_si512(), &w1, a1, false)),
            );
            let x0 = _mm512_mul_ps(_mm512_set1_ps(a0.d), i0);
            let x1 = _mm512_mul_ps(_mm512_set1_ps(a1.d), i1);
            *sd = _mm512_add_ps(*sd, _mm512_add_ps(x0, x1));
        }
    }
}

/// Each token's `sm` of a Q5_K tile: per pair of sub-blocks `sm += y0 + y1`, with the
/// reference's `y = a.d * f32(m * sum(q_x))` (`f32(m) * f32(sum)` exactly, as in
/// [`q5k_pair`]). Apart from the weights, so the 8 mins are the only vectors it keeps.
#[inline(always)]
unsafe fn q5k_mins<const T: usize>(scb: &[__m512i; 4], xb: &[*const BlockQ8A; T]) -> [__m512; T] {
    // SAFETY: the activation blocks read are the tile's 8 of each token (the caller checked
    // the lengths); AVX-512 present (module doc).
    unsafe {
        let mut fm = [_mm512_setzero_ps(); 8];
        for (s, f) in fm.iter_mut().enumerate() {
            *f = _mm512_cvtepi32_ps(lane_u8_epi32(scb[2 + s / 4], s % 4));
        }
        // Plain loops: nested closures were left as calls outside the target-feature context.
        let mut out = [_mm512_setzero_ps(); T];
        for (t, sm) in out.iter_mut().enumerate() {
            let mut y = [_mm512_setzero_ps(); 8];
            for (s, y) in y.iter_mut().enumerate() {
                let a = &*xb[t].add(s);
                let qsum = (a.sums[0] as i32 + a.sums[1] as i32) as f32;
                *y = _mm512_mul_ps(
                    _mm512_set1_ps(a.d),
                    _mm512_mul_ps(fm[s], _mm512_set1_ps(qsum)),
                );
            }
            for j in 0..4 {
                *sm = _mm512_add_ps(*sm, _mm512_add_ps(y[2 * j], y[2 * j + 1]));
            }
        }
        out
    }
}

impl Kernel for Q5K {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe {
            let nt = tiles.len() / K5_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K5_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K5_BYTES);
                touch_page(p, K5_BYTES);
                let xb: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr().add(8 * b));
                let scb = q4k_scale_bytes(p.add(K5_SC));
                let sm = q5k_mins(&scb, &xb);
                let mut sd = [_mm512_setzero_ps(); T];
                q5k_pair::<0, 1, T>(p, ahead, &scb, &xb, &mut sd);
                q5k_pair::<2, 3, T>(p, ahead, &scb, &xb, &mut sd);
                q5k_pair::<4, 5, T>(p, ahead, &scb, &xb, &mut sd);
                q5k_pair::<6, 7, T>(p, ahead, &scb, &xb, &mut sd);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(K5_D) as *const __m256i));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(K5_DMIN) as *const __m256i));
                for t in 0..T {
                    let v = _mm512_sub_ps(_mm512_mul_ps(d, sd[t]), _mm512_mul_ps(dmin, sm[t]));
                    acc[t] = _mm512_add_ps(acc[t], v);
                }
            }
            rows_out(&acc)
        }
    }
}

/// Q3_K and Q2_K tiles (16-element scale groups, 2-bit quants in qs chunks): how one type's
/// Q8A block `G` of a tile becomes weights and scales.
trait K16 {
    const BYTES: usize;
    /// `u - OFF` is the weight (Q3_K 4; Q2_K 0).
    const OFF: i32;
    /// Where the f16 mins sit (Q2_K).
    const DMIN: Option<usize>;
    /// Weights times scale fit a byte (Q2_K: 3 x 15), so several tokens take
    /// [`k16_prescaled`].
    const PRESCALE: bool = false;
    /// The 8 weight vectors of block `G` (vectors 0..4: scale group 2G, 4..8: 2G + 1).
    unsafe fn weights<const G: usize>(p: *const u8) -> [__m512i; 8];
    /// Once per tile: whatever [`K16::scales`] reads from `pre` (Q3_K: its 16 scale groups
    /// as signed bytes, plane k at 16k).
    #[inline(always)]
    unsafe fn prepare(_p: *const u8, _pre: &mut [u8; 256]) {}
    /// The scales and mins (i32 lanes) of scale groups 2G + h.
    unsafe fn scales<const G: usize>(p: *const u8, pre: &[u8; 256]) -> [(__m512i, __m512i); 2];
}

struct Q3K;
struct Q2K;

/// The 2-bit field of block `G` from the qs granules at `qs` (chunk `G / 4`, bits 2(G % 4)).
#[inline(always)]
unsafe fn two_bits<const G: usize>(qs: *const u8) -> [__m512i; 8] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        let c = qs.add(512 * (G / 4));
        let m3 = _mm512_set1_epi8(3);
        std::array::from_fn(|k| {
            let v = _mm512_loadu_si512(c.add(64 * k) as *const _);
            let v = match G % 4 {
                0 => v,
                1 => _mm512_srli_epi16(v, 2),
                2 => _mm512_srli_epi16(v, 4),
                _ => _mm512_srli_epi16(v, 6),
            };
            _mm512_and_si512(v, m3)
        })
    }
}

impl K16 for Q3K {
    const BYTES: usize = K3_BYTES;
    const OFF: i32 = 4;
    const DMIN: Option<usize> = None;
    #[inline(always)]
    unsafe fn weights<const G: usize>(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe {
            let at = p.add(K3_Q + K3_BLOCK * G);
            let z: [__m512i; 3] =
                std::array::from_fn(|c| _mm512_loadu_si512(at.add(64 * c) as *const _));
            let m7 = _mm512_set1_epi8(7);
            let m3 = _mm512_set1_epi8(3);
            // 16-bit shifts: the bits they pull in from the next byte are masked off.
            let shr3 = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16(v, 3), m7);
            // Bits 6, 7 of `lo` as bits 0, 1, bit 2 of `hi4` (granule 2 shifted) as bit 2.
            let split = |lo: __m512i, hi4: __m512i| {
                let v = _mm512_ternarylogic_epi32::<0xE2>(_mm512_srli_epi16(lo, 6), m3, hi4);
                _mm512_and_si512(v, m7)
            };
            [
                _mm512_and_si512(z[0], m7),
                shr3(z[0]),
                split(z[0], _mm512_srli_epi16(z[2], 4)),
                _mm512_and_si512(z[1], m7),
                shr3(z[1]),
                split(z[1], _mm512_srli_epi16(z[2], 5)),
                _mm512_and_si512(z[2], m7),
                shr3(z[2]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn prepare(p: *const u8, pre: &mut [u8; 256]) {
        // SAFETY: the reads are the tile's 12 scale planes (192 bytes at `K3_SC`), the writes
        // `pre`'s 256 bytes; AVX-512 present (module doc).
        unsafe {
            // `scales_q3k` for 16 rows and 4 scale groups per vector: group k's low 4 bits
            // are the low (k < 8) or high nibble of plane k % 8, its high 2 bits are bits
            // 2(k / 4) of plane 8 + k % 4; minus 32. Once per tile rather than per block.
            let sc = p.add(K3_SC);
            let l0 = _mm512_loadu_si512(sc as *const _);
            let l1 = _mm512_loadu_si512(sc.add(64) as *const _);
            let h = _mm512_loadu_si512(sc.add(128) as *const _);
            let m4 = _mm512_set1_epi8(0x0F);
            let c32 = _mm512_set1_epi8(32);
            let hi = |v: __m512i, m: i8| _mm512_and_si512(v, _mm512_set1_epi8(m));
            // (lo & 0xF) | hi, where hi has only bits 4-5 set.
            let join = |lo: __m512i, hi: __m512i| {
                _mm512_sub_epi8(_mm512_ternarylogic_epi32::<0xEA>(lo, m4, hi), c32)
            };
            let groups = [
                join(l0, hi(_mm512_slli_epi16(h, 4), 0x30)),
                join(l1, hi(_mm512_slli_epi16(h, 2), 0x30)),
                join(_mm512_srli_epi16(l0, 4), hi(h, 0x30)),
                join(_mm512_srli_epi16(l1, 4), hi(_mm512_srli_epi16(h, 2), 0x30)),
            ];
            for (k, v) in groups.iter().enumerate() {
                _mm512_storeu_si512(pre.as_mut_ptr().add(64 * k) as *mut _, *v);
            }
        }
    }
    #[inline(always)]
    unsafe fn scales<const G: usize>(_p: *const u8, pre: &[u8; 256]) -> [(__m512i, __m512i); 2] {
        // SAFETY: the reads are inside `pre`; AVX-512 present (module doc).
        unsafe {
            std::array::from_fn(|h| {
                let at = pre.as_ptr().add(16 * (2 * G + h)) as *const __m128i;
                (
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(at)),
                    _mm512_setzero_si512(),
                )
            })
        }
    }
}

impl K16 for Q2K {
    const BYTES: usize = K2_BYTES;
    const OFF: i32 = 0;
    const DMIN: Option<usize> = Some(K2_DMIN);
    const PRESCALE: bool = true;
    #[inline(always)]
    unsafe fn weights<const G: usize>(p: *const u8) -> [__m512i; 8] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe { two_bits::<G>(p.add(K2_QS)) }
    }
    #[inline(always)]
    unsafe fn scales<const G: usize>(p: *const u8, _pre: &[u8; 256]) -> [(__m512i, __m512i); 2] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX-512 present (module doc).
        unsafe {
            std::array::from_fn(|h| {
                let v = plane_u8(p.add(K2_SC + ROWS * (2 * G + h)));
                (
                    _mm512_and_si512(v, _mm512_set1_epi32(0xF)),
                    _mm512_srli_epi32(v, 4),
                )
            })
        }
    }
}

/// Q8A block `G` of a Q3_K / Q2_K tile for `T` tokens: per token the two halves' exact sums,
/// `sd += a.d * f32(sc_0 * ih_0 + sc_1 * ih_1)` and (Q2_K) `sm += a.d * f32(m . sums)`.
#[inline(always)]
unsafe fn k16_block<K: K16, const G: usize, const T: usize>(
    p: *const u8,
    pre: &[u8; 256],
    ahead: *const u8,
    xb: &[*const BlockQ8A; T],
    sd: &mut [__m512; T],
    sm: &mut [__m512; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        prefetch(ahead.wrapping_add(G * K::BYTES / 8), K::BYTES / 8);
        if K::PRESCALE && T == 1 {
            return q2k_one::<G>(p, &*xb[0].add(G), &mut sd[0], &mut sm[0]);
        }
        let w = K::weights::<G>(p);
        let [(sc0, m0), (sc1, m1)] = K::scales::<G>(p, pre);
        if K::PRESCALE && T > 1 {
            return k16_prescaled::<T>(w, [(sc0, m0), (sc1, m1)], xb, G, sd, sm);
        }
        for t in 0..T {
            let a = &*xb[t].add(G);
            let q = a.qs.as_ptr() as *const i32;
            // The offset correction is the chain's start (exact integers: same sum).
            let half = |h: usize| {
                let mut s = _mm512_set1_epi32(-K::OFF * a.sums[h] as i32);
                for (g, wg) in w.iter().enumerate().skip(4 * h).take(4) {
                    s = _mm512_dpbusd_epi32(s, *wg, _mm512_set1_epi32(q.add(g).read_unaligned()));
                }
                s
            };
            let isum = _mm512_add_epi32(
                _mm512_mullo_epi32(sc0, half(0)),
                _mm512_mullo_epi32(sc1, half(1)),
            );
            let dx = _mm512_set1_ps(a.d);
            sd[t] = _mm512_add_ps(sd[t], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(isum)));
            if K::DMIN.is_some() {
                let msum = _mm512_add_epi32(
                    _mm512_mullo_epi32(m0, _mm512_set1_epi32(a.sums[0] as i32)),
                    _mm512_mullo_epi32(m1, _mm512_set1_epi32(a.sums[1] as i32)),
                );
                sm[t] = _mm512_add_ps(sm[t], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(msum)));
            }
        }
    }
}

/// [`k16_block`] of Q2_K for one token, the same integers with fewer instructions: the 2-bit
/// fields of block `G` sit at bits 2j, 2j + 1 (j = G % 4) of their bytes and are only masked
/// there, not shifted down (`4^j * q` <= 192 fits the unsigned byte), so both half sums and
/// `sc_0 * ih_0 + sc_1 * ih_1` come out exactly `4^j` times too large (|isum| < 2^18, times 64
/// fits i32) and one arithmetic shift gives the exact sum back. The mins' sum is one
/// `vpdpwssd` of the rows' (m_0, m_1) i16 pairs against the block's two i16 sums. Why: the
/// one-token kernel ran at half the DRAM roofline, bound by vector ALU work (16 shifts and
/// masks per block for the weights alone).
#[inline(always)]
unsafe fn q2k_one<const G: usize>(p: *const u8, a: &BlockQ8A, sd: &mut __m512, sm: &mut __m512) {
    // SAFETY: every read below is inside the tile at `p` or the activation block `a` (the
    // caller's); AVX-512 present (module doc).
    unsafe {
        let c = p.add(K2_QS + 512 * (G / 4));
        let j = G % 4;
        let mask = _mm512_set1_epi8((3u8 << (2 * j)) as i8);
        let q = a.qs.as_ptr() as *const i32;
        let half = |h: usize| {
            let mut s = _mm512_setzero_si512();
            for k in 4 * h..4 * h + 4 {
                let w = _mm512_and_si512(_mm512_loadu_si512(c.add(64 * k) as *const _), mask);
                s = _mm512_dpbusd_epi32(s, w, _mm512_set1_epi32(q.add(k).read_unaligned()));
            }
            s
        };
        let v0 = plane_u8(p.add(K2_SC + ROWS * (2 * G)));
        let v1 = plane_u8(p.add(K2_SC + ROWS * (2 * G + 1)));
        let m4 = _mm512_set1_epi32(0xF);
        let isum = _mm512_add_epi32(
            _mm512_mullo_epi32(_mm512_and_si512(v0, m4), half(0)),
            _mm512_mullo_epi32(_mm512_and_si512(v1, m4), half(1)),
        );
        let isum = match j {
            0 => isum,
            1 => _mm512_srai_epi32::<2>(isum),
            2 => _mm512_srai_epi32::<4>(isum),
            _ => _mm512_srai_epi32::<6>(isum),
        };
        let dx = _mm512_set1_ps(a.d);
        *sd = _mm512_add_ps(*sd, _mm512_mul_ps(dx, _mm512_cvtepi32_ps(isum)));
        // (m_0, m_1) as the i16 halves of each row's lane: high nibbles of the two planes.
        let mins = _mm512_ternarylogic_epi32::<0xB8>(
            _mm512_srli_epi32(v0, 4),
            _mm512_set1_epi32(0x000F_0000),
            _mm512_slli_epi32(v1, 12),
        );
        let sums = (a.sums.as_ptr() as *const i32).read_unaligned();
        let msum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins, _mm512_set1_epi32(sums));
        *sm = _mm512_add_ps(*sm, _mm512_mul_ps(dx, _mm512_cvtepi32_ps(msum)));
    }
}

/// [`k16_block`] of Q2_K for several tokens, the same integers with less work per token: each
/// row's two scales multiplied into its weights once for all tokens (`u * sc` <= 45 fits the
/// byte, and a 16-bit `vpmullw` of two such bytes cannot carry across them), so one chain of 8
/// `vpdpbusd` gives `sc_0 * ih_0 + sc_1 * ih_1` directly; the mins' `m_0 * sums_0 + m_1 *
/// sums_1` is one `vpdpwssd` of the row's (m_0, m_1) i16 pair against the block's two i16
/// sums. The 8-token tile went from 35.5 to 39.1 GB/s (kernel-bench, one thread, two
/// alternating pairs, load ~15): 72% of the `vpdpbusd` bound (one 512-bit `vpdpbusd`, 64
/// products, per cycle: 2.625 bits x 64 x 2.6 GHz = 55 GB/s of weights x tokens).
#[inline(always)]
unsafe fn k16_prescaled<const T: usize>(
    w: [__m512i; 8],
    sc: [(__m512i, __m512i); 2],
    xb: &[*const BlockQ8A; T],
    g: usize,
    sd: &mut [__m512; T],
    sm: &mut [__m512; T],
) {
    // SAFETY: the activation blocks are the caller's (block `g` of each token's run of 8);
    // AVX-512 present (module doc).
    unsafe {
        let pair = |v: __m512i| _mm512_or_si512(v, _mm512_slli_epi32(v, 16));
        let (s0, s1) = (pair(sc[0].0), pair(sc[1].0));
        let ws: [__m512i; 8] =
            std::array::from_fn(|k| _mm512_mullo_epi16(w[k], if k < 4 { s0 } else { s1 }));
        let mins = _mm512_or_si512(sc[0].1, _mm512_slli_epi32(sc[1].1, 16));
        for t in 0..T {
            let a = &*xb[t].add(g);
            let isum = dot_block(_mm512_setzero_si512(), &ws, a, false);
            let dx = _mm512_set1_ps(a.d);
            sd[t] = _mm512_add_ps(sd[t], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(isum)));
            let sums = (a.sums.as_ptr() as *const i32).read_unaligned();
            let msum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins, _mm512_set1_epi32(sums));
            sm[t] = _mm512_add_ps(sm[t], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(msum)));
        }
    }
}

/// The Q3_K / Q2_K kernel: [`k16_block`] over a tile's 8 blocks, then once per tile
/// `acc + d * sd` (Q3_K) or `acc + (d * sd - dmin * sm)` (Q2_K).
struct Sixteen<K>(PhantomData<K>);

impl<K: K16> Kernel for Sixteen<K> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe {
            let nt = tiles.len() / K::BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [_mm512_setzero_ps(); T];
            let mut pre = [0u8; 256];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K::BYTES);
                let n = if T == 1 { K16_AHEAD_ONE } else { AHEAD };
                let ahead = p.wrapping_add(n * K::BYTES);
                touch_page(p, K::BYTES);
                let xb: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr().add(8 * b));
                let mut sd = [_mm512_setzero_ps(); T];
                let mut sm = [_mm512_setzero_ps(); T];
                K::prepare(p, &mut pre);
                k16_block::<K, 0, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 1, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 2, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 3, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 4, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 5, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 6, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                k16_block::<K, 7, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
                for t in 0..T {
                    let v = match K::DMIN {
                        Some(at) => {
                            let dmin =
                                _mm512_cvtph_ps(_mm256_loadu_si256(p.add(at) as *const __m256i));
                            _mm512_sub_ps(_mm512_mul_ps(d, sd[t]), _mm512_mul_ps(dmin, sm[t]))
                        }
                        None => _mm512_mul_ps(d, sd[t]),
                    };
                    acc[t] = _mm512_add_ps(acc[t], v);
                }
            }
            rows_out(&acc)
        }
    }
}

/// IQ4_XS tiles: per sub-block s, 8 vectors of table values + 128 (as IQ4_NL's), the row
/// vector `d * (ls - 32)`, then per token the canonical step.
struct IQ4XS;

/// Sub-block `S` of an IQ4_XS tile at `p` for `T` tokens.
#[inline(always)]
unsafe fn iq4xs_sub<const S: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    d: __m512,
    xb: &[*const BlockQ8A; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        // One token: see [`AHEAD_ONE`] for the hosts where that helps and where it did not.
        prefetch(ahead.wrapping_add(S * KX_BYTES / 8), KX_BYTES / 8);
        let lo = plane_u8(p.add(KX_SL + ROWS * (S / 2)));
        let lo = if S.is_multiple_of(2) {
            _mm512_and_si512(lo, _mm512_set1_epi32(0xF))
        } else {
            _mm512_srli_epi32(lo, 4)
        };
        let hi = plane_u8(p.add(KX_SH + ROWS * (S / 4)));
        let hi = _mm512_and_si512(
            _mm512_srlv_epi32(hi, _mm512_set1_epi32(2 * (S % 4) as i32)),
            _mm512_set1_epi32(3),
        );
        let ls = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
        let dsc = _mm512_mul_ps(
            d,
            _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))),
        );
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_U.as_ptr() as *const __m128i));
        let mut w = nibbles(p.add(KX_QS + 256 * S));
        for v in w.iter_mut() {
            *v = _mm512_shuffle_epi8(table, *v);
        }
        for t in 0..T {
            let a = &*xb[t].add(S);
            let corr = _mm512_set1_epi32(-128 * (a.sums[0] as i32 + a.sums[1] as i32));
            let isum = dot_block(corr, &w, a, false);
            let tmp = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a.d));
            acc[t] = _mm512_fmadd_ps(dsc, tmp, acc[t]);
        }
    }
}

impl Kernel for IQ4XS {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe {
            let nt = tiles.len() / KX_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * KX_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * KX_BYTES);
                touch_page(p, KX_BYTES);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(KX_D) as *const __m256i));
                let xb: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr().add(8 * b));
                iq4xs_sub::<0, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<1, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<2, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<3, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<4, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<5, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<6, T>(p, ahead, d, &xb, &mut acc);
                iq4xs_sub::<7, T>(p, ahead, d, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

/// Q6_K tiles: per Q8A block `4n + k` of the super-block, 8 vectors of 6-bit quants (a nibble
/// of ql granules `16n + 8(k & 1) + g` joined with 2 bits of qh granules `8n + g`), the two
/// 16-element groups' `d * sc`, then per token two half dots, each corrected for the offset
/// 32 and scaled by one FMA.
///
/// Tried for one token (kernel-bench from L3, 46-47 GB/s before): each ql and qh granule
/// loaded once per half super-block (4 blocks; 6 loads a block instead of 16): 46-47; the
/// fields cut by `vgf2p8affineqb` (2 instructions a vector instead of 3-4): 46, as it runs on
/// `vpdpbusd`'s ports (`scripts/bench/isa-rates.sh`).
struct Q6K;

/// Q8A block `4 * N + K` of a Q6_K tile at `p` for `T` tokens (`xb`: each token's 8 blocks of
/// this super-block). `N` and `K` are constants so every shift is fixed.
#[inline(always)]
unsafe fn q6k_block<const N: usize, const K: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    d: __m512,
    xb: &[*const BlockQ8A; T],
    acc: &mut [__m512; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX-512 present (module doc).
    unsafe {
        let qb = 4 * N + K;
        // An eighth of a tile ahead per block, as Q4_K.
        prefetch(ahead.wrapping_add(qb * K6_BYTES / 8), K6_BYTES / 8);
        let dsc: [__m512; 2] = std::array::from_fn(|h| {
            let sc = _mm_loadu_si128(p.add(K6_SC + ROWS * (2 * qb + h)) as *const __m128i);
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)))
        });
        let ql = p.add(k6_ql(2 * N + (K & 1)));
        let qh = p.add(k6_qh(N));
        let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let w: [__m512i; 8] = std::array::from_fn(|g| {
            let l = _mm512_loadu_si512(ql.add(64 * g) as *const _);
            let l = if K >= 2 { _mm512_srli_epi16(l, 4) } else { l };
            let h = _mm512_loadu_si512(qh.add(64 * g) as *const _);
            // Bits 2K, 2K + 1 of each qh byte to bits 4, 5 (the 16-bit shifts only move bits
            // that the 0x30 mask drops across byte edges).
            let h = match K {
                0 => _mm512_slli_epi16(h, 4),
                1 => _mm512_slli_epi16(h, 2),
                2 => h,
                _ => _mm512_srli_epi16(h, 2),
            };
            _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(h, m30))
        });
        for t in 0..T {
            let a = &*xb[t].add(qb);
            let q = a.qs.as_ptr() as *const i32;
            // Each chain starts from the offset correction (exact integers in any order): one
            // subtraction fewer per half.
            let half = |h: usize| {
                let mut s = _mm512_set1_epi32(-32 * a.sums[h] as i32);
                for (g, wg) in w.iter().enumerate().skip(4 * h).take(4) {
                    s = _mm512_dpbusd_epi32(s, *wg, _mm512_set1_epi32(q.add(g).read_unaligned()));
                }
                s
            };
            let (i0, i1) = (half(0), half(1));
            let xd = _mm512_set1_ps(a.d);
            acc[t] = _mm512_fmadd_ps(dsc[0], _mm512_mul_ps(_mm512_cvtepi32_ps(i0), xd), acc[t]);
            acc[t] = _mm512_fmadd_ps(dsc[1], _mm512_mul_ps(_mm512_cvtepi32_ps(i1), xd), acc[t]);
        }
    }
}

impl Kernel for Q6K {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX-512 present (module doc).
        unsafe {
            let nt = tiles.len() / K6_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [_mm512_setzero_ps(); T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K6_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K6_BYTES);
                touch_page(p, K6_BYTES);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(K6_D) as *const __m256i));
                let xb: [*const BlockQ8A; T] = std::array::from_fn(|t| x[t].as_ptr().add(8 * b));
                q6k_block::<0, 0, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<0, 1, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<0, 2, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<0, 3, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<1, 0, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<1, 1, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<1, 2, T>(p, ahead, d, &xb, &mut acc);
                q6k_block::<1, 3, T>(p, ahead, d, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

rows16_kernels!(
    kernels,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c",
    Avx512,
    Q4_0 => Blocks<Q4_0>,
    Q4_1 => Blocks<Q4_1>,
    Q5_0 => Blocks<Q5_0>,
    Q5_1 => Blocks<Q5_1>,
    Q8_0 => Blocks<Q8_0>,
    IQ4_NL => Blocks<IQ4NL>,
    MXFP4 => Blocks<MXFP4>,
    Q2_K => Sixteen<Q2K>,
    Q3_K => Sixteen<Q3K>,
    Q4_K => Q4K,
    Q5_K => Q5K,
    Q6_K => Q6K,
    IQ4_XS => IQ4XS,
);
