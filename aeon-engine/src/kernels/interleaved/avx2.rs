//! AVX2 + FMA + F16C kernels over [`super::Interleaved`] tiles, for x86 CPUs without AVX-512:
//! a 16-row group is two 256-bit halves, lane r of half h is row 8h + r.
//!
//! Per tile: 8 weight vectors per half (64-byte chunk g = two ymm), unpacked once for all
//! tokens of the call; per token and group g, `maddubs` against the broadcast dword g of the
//! activation block, its i16 pair sums added in i16 as far as they cannot saturate (Q4_0, Q4_1, Q4_K:
//! all 8 groups, at most 8 * 2 * 15 * 128 = 30720; Q5_0, Q5_1: 4 groups, 4 * 2 * 31 * 128 = 31744;
//! Q6_K: 2 groups, 2 * 2 * 63 * 128 = 32256), then `madd` with ones to i32. Q8_0's unsigned
//! bytes go back to signed quants and take the sign trick (`|w|` against `x * sign(w)`, pairs
//! at most 2 * 128 * 127), so its sums need no offset correction (the same integers as the
//! specification's `sum(u * q_x) - 128 * sum(q_x)`). The f32 steps are the specification's,
//! per half, in its order, so every token gets [`super::rows16_ref`]'s bits at any count.
//!
//! Tokens go in pairs, so each weight vector (spilled: 16 of them fill the register file) is
//! loaded once for two (at 8 tokens 3-8% faster). One token of Q2_K, Q4_K, Q5_K and Q6_K goes
//! in granule order instead ([`q2k_one_tile`], [`q4k_one_pair`], [`q5k_one_pair`],
//! [`q6k_one_half`]): each loaded vector serves every block whose fields it holds. Pages are
//! touched and k-quant tiles prefetched ahead as the AVX-512 kernels do (decode 43-44 to
//! 48-50 tok/s). Loops over the weight arrays are written out: nested `array::from_fn` / `map`
//! closures were left as calls outside the `target_feature` context (Q8_0, Q4_K, Q6_K at 1-3
//! GB/s).
//!
//! Qwen2.5-Coder-0.5B Q4_K_M on one thread (aeon-bench, `FAT_KERNELS=avx2` on a Zen 4 KVM
//! guest): prefill 34-36 -> 141-172 tok/s and decode 22-25 -> 46-54 against the per-row AVX2
//! block kernels (AVX-512 there: 287-292 and 58-62).
//!
//! Every kernel comes in two flavours that differ only in how byte products become i32 sums
//! ([`Dots`]): AVX2's `maddubs` + `madd` above ([`kernels`], [`super::super::Isa::Avx2`]) and
//! AVX-VNNI's 256-bit `vpdpbusd` ([`vnni_kernels`], [`super::super::Isa::AvxVnni`]: Intel client
//! cores since Alder Lake and their E-cores, AMD Zen 5), each exposed only after the caller
//! checked its instruction set is available.

use super::super::avx2::bits_32;
use super::super::blocks::{BlockQ8A, KVALUES_IQ4NL, KVALUES_MXFP4};
use super::super::roofline::touch_page;
use super::avx512::{prefetch, K16_AHEAD_ONE};
use super::kquants::{
    k3_fields, k6_qh, k6_ql, K2_BYTES, K2_DMIN, K2_QS, K2_SC, K3_BLOCK, K3_BYTES, K3_Q, K3_SC,
    K4_BYTES, K4_D, K4_DMIN, K4_QS, K4_SC, K5_BYTES, K5_D, K5_DMIN, K5_QH, K5_QS, K5_SC, K6_BYTES,
    K6_D, K6_SC, KX_BYTES, KX_D, KX_QS, KX_SH, KX_SL,
};
use super::{
    rows16_any, Kernel, Rows16Dot, D_BYTES, MIN_AT, MX_QS, Q41_QS, Q51_HM, Q51_QS, Q5_HM, Q5_QS,
    ROWS,
};
use knot_format::dtype::DType;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Tiles ahead that the k-quant kernels prefetch into L2 for several tokens (the AVX-512
/// kernels' figure: see `avx512::AHEAD`).
const AHEAD: usize = 8;
/// Tiles ahead for one token: 4, not AVX-512's 2 (kernel-bench, 896x4864 from DRAM, one
/// thread: Q4_K 20-21 -> 19-24 GB/s, Q6_K 20 -> 22; 1 tile ahead was slower, 6 no faster).
const AHEAD_ONE: usize = 4;

/// Weight vectors of one 32-element block: `[half][group]`, group g holding elements
/// 4g..4g+4 of the half's 8 rows.
type Wv = [[__m256i; 8]; 2];

/// How a kernel adds unsigned-by-signed byte products into exact i32 lane sums: the one
/// difference between the AVX2 and the AVX-VNNI flavour of every kernel below.
trait Dots {
    /// Whether [`Signed`] weights go as `w + 128` against `q_x`, the offset's
    /// `128 * sum(q_x)` taken back from the sum (one product instruction), rather than as `|w|`
    /// against `q_x * sign(w)` (the sign trick, which `maddubs`' i16 pairs need).
    const OFFSET_SIGNED: bool;
    /// Whether byte weights up to 255 may go into a product unshifted: with no i16 stage
    /// (`vpdpbusd` adds four products straight into i32) Q2_K's 2-bit fields can be masked
    /// where they sit in their byte (up to 192) instead of shifted down ([`field_shift`]).
    const WIDE_BYTES: bool;
    /// `s32 += ` each i32 lane's 4 products `w * x` (u8 by i8), as one group of a run of
    /// groups whose i16 pair sums the caller bounds below saturation (`first`, `last`: where
    /// the group sits in its run; `s16`: the run's pair sums, where the flavour keeps them).
    /// SAFETY (callers): the flavour's instruction set is enabled.
    unsafe fn add(
        s32: &mut __m256i,
        s16: &mut __m256i,
        w: __m256i,
        x: __m256i,
        first: bool,
        last: bool,
    );
}

/// AVX2: `maddubs` pair sums added in i16 over the run, widened by `madd` with ones at its
/// end (each group alone would be three instructions).
struct Maddubs;

/// AVX-VNNI (Intel client cores since Alder Lake, Gracemont E-cores, AMD Zen 5): one 256-bit
/// `vpdpbusd`, no i16 stage, so no run bound. The same integers, so the same bits.
struct Vnni;

impl Dots for Maddubs {
    const OFFSET_SIGNED: bool = false;
    const WIDE_BYTES: bool = false;
    #[inline(always)]
    unsafe fn add(
        s32: &mut __m256i,
        s16: &mut __m256i,
        w: __m256i,
        x: __m256i,
        first: bool,
        last: bool,
    ) {
        // SAFETY: register-only intrinsics; AVX2 present (the trait's contract).
        unsafe {
            let p = _mm256_maddubs_epi16(w, x);
            *s16 = if first { p } else { _mm256_add_epi16(*s16, p) };
            if last {
                *s32 = _mm256_add_epi32(*s32, _mm256_madd_epi16(*s16, _mm256_set1_epi16(1)));
            }
        }
    }
}

impl Dots for Vnni {
    const OFFSET_SIGNED: bool = true;
    const WIDE_BYTES: bool = true;
    #[inline(always)]
    unsafe fn add(s32: &mut __m256i, _: &mut __m256i, w: __m256i, x: __m256i, _: bool, _: bool) {
        // SAFETY: a register-only intrinsic; AVX-VNNI present (the trait's contract).
        unsafe { *s32 = _mm256_dpbusd_avx_epi32(*s32, w, x) }
    }
}

/// The exact i32 sums `sum(w * q_x)` of both halves for unsigned weights `w` against one
/// activation block of each of `P` tokens, groups `G0..G0 + N`; the pair sums of `run`
/// consecutive groups are added in i16 (the caller's bound: they cannot saturate). Several
/// tokens share each weight vector's load.
// Group and half indices address several arrays at once (the tile's layout).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dot_unsigned<V: Dots, const G0: usize, const N: usize, const P: usize>(
    run: usize,
    w: &Wv,
    a: [&BlockQ8A; P],
) -> [[__m256i; 2]; P] {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut s32 = [[_mm256_setzero_si256(); 2]; P];
        let mut s16 = [[_mm256_setzero_si256(); 2]; P];
        for g in G0..G0 + N {
            let mut bx = [_mm256_setzero_si256(); P];
            for (bx, a) in bx.iter_mut().zip(a) {
                *bx = _mm256_set1_epi32((a.qs.as_ptr() as *const i32).add(g).read_unaligned());
            }
            let first = (g - G0).is_multiple_of(run);
            let last = (g - G0) % run == run - 1 || g == G0 + N - 1;
            for h in 0..2 {
                for k in 0..P {
                    V::add(&mut s32[k][h], &mut s16[k][h], w[h][g], bx[k], first, last);
                }
            }
        }
        s32
    }
}

/// How one 32-element type's tile becomes weight vectors and dots.
trait Tile {
    const BYTES: usize;
    /// What the dot's sums are offset by: `isum = dot - OFF * sum(q_x)`.
    const OFF: i32;
    /// Groups whose i16 pair sums can be added without saturating.
    const RUN: usize;
    /// Where the f16 mins sit (Q4_1, Q5_1: weight `d * u + m`, `OFF` 0).
    const MIN: Option<usize> = None;
    /// Weight vector `[h][g]` of the tile at `p`.
    /// SAFETY (callers): `p` points at `BYTES` readable bytes and AVX2 is enabled.
    unsafe fn vector(p: *const u8, h: usize, g: usize) -> __m256i;
}

/// All 16 weight vectors of a tile.
#[inline(always)]
unsafe fn unpack<L: Tile>(p: *const u8) -> Wv {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut w = [[_mm256_setzero_si256(); 8]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (g, v) in wh.iter_mut().enumerate() {
                *v = L::vector(p, h, g);
            }
        }
        w
    }
}

/// [`dot_unsigned`] over all 8 groups for one token, each weight vector made where it is
/// used (one token: nothing to share, and no weight vector spilled).
#[inline(always)]
unsafe fn dot_fused<V: Dots, L: Tile>(p: *const u8, a: &BlockQ8A) -> [__m256i; 2] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut s32 = [_mm256_setzero_si256(); 2];
        let mut s16 = [_mm256_setzero_si256(); 2];
        for g in 0..8 {
            let bx = _mm256_set1_epi32((a.qs.as_ptr() as *const i32).add(g).read_unaligned());
            let (first, last) = (g % L::RUN == 0, g % L::RUN == L::RUN - 1 || g == 7);
            for h in 0..2 {
                V::add(
                    &mut s32[h],
                    &mut s16[h],
                    L::vector(p, h, g),
                    bx,
                    first,
                    last,
                );
            }
        }
        s32
    }
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

/// Weight vector `[h][g]` of the nibbles at `qs`: the low (g < 4) or high nibbles of qs
/// chunk g % 4.
#[inline(always)]
unsafe fn nibble(qs: *const u8, h: usize, g: usize) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let q = _mm256_loadu_si256(qs.add(64 * (g % 4) + 32 * h) as *const __m256i);
        let q = if g < 4 { q } else { _mm256_srli_epi16(q, 4) };
        _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
    }
}

impl Tile for Q4_0 {
    const BYTES: usize = 16 * 18;
    const OFF: i32 = 8;
    const RUN: usize = 8;
    #[inline(always)]
    unsafe fn vector(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { nibble(p.add(D_BYTES), h, g) }
    }
}

impl Tile for Q4_1 {
    const BYTES: usize = 16 * 20;
    const OFF: i32 = 0;
    const RUN: usize = 8;
    const MIN: Option<usize> = Some(MIN_AT);
    #[inline(always)]
    unsafe fn vector(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { nibble(p.add(Q41_QS), h, g) }
    }
}

/// Weight vector `[h][g]` of 5-bit quants: nibbles at `qs`, plus 16 where the masks at `hm`
/// have a bit.
#[inline(always)]
unsafe fn five_bits(p: *const u8, hm: usize, qs: usize, h: usize, g: usize) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        // Bits 32h..32h + 32 of mask g: rows 8h..8h + 8, byte for byte.
        let m = (p.add(hm + 8 * g + 4 * h) as *const [u8; 4]).read_unaligned();
        let hb = _mm256_and_si256(bits_32(m), _mm256_set1_epi8(16));
        _mm256_or_si256(nibble(p.add(qs), h, g), hb)
    }
}

impl Tile for Q5_0 {
    const BYTES: usize = 16 * 22;
    const OFF: i32 = 16;
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn vector(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { five_bits(p, Q5_HM, Q5_QS, h, g) }
    }
}

impl Tile for Q5_1 {
    const BYTES: usize = 16 * 24;
    const OFF: i32 = 0;
    const RUN: usize = 4;
    const MIN: Option<usize> = Some(MIN_AT);
    #[inline(always)]
    unsafe fn vector(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { five_bits(p, Q51_HM, Q51_QS, h, g) }
    }
}

/// A tile of signed 8-bit weights (Q8_0's quants, IQ4_NL's table values): no offset, dotted
/// with the sign trick, whose pairs (at most 2 * 128 * 127) cannot saturate.
trait Signed {
    const BYTES: usize;
    /// One token takes [`Q8_0::dot8_fused`] (IQ4_NL: see there; MXFP4 15.4 -> 16.0 GB/s of
    /// weights from DRAM; Q8_0 unchanged, so left on the shared unpack).
    const FUSED_ONE: bool = false;
    /// Signed weight vector `[h][g]` of the tile at `p`.
    /// SAFETY (callers): `p` points at `BYTES` readable bytes and AVX2 is enabled.
    unsafe fn signed(p: *const u8, h: usize, g: usize) -> __m256i;
    /// [`Signed::signed`] + 128, as unsigned bytes.
    /// SAFETY (callers): as [`Signed::signed`].
    #[inline(always)]
    unsafe fn offset(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: this function's contract; AVX2 present (module doc).
        unsafe { _mm256_xor_si256(Self::signed(p, h, g), _mm256_set1_epi8(-128)) }
    }
    /// The two halves' weight scales `d_w` (f16 at the tile's start; MXFP4: e8m0 bytes).
    /// SAFETY (callers): as [`Signed::signed`].
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> [__m256; 2] {
        // SAFETY: the 32 bytes at `p` are the tile's scales (this function's contract).
        unsafe { scales16(p) }
    }
}

impl Signed for Q8_0 {
    const BYTES: usize = 16 * 34;
    #[inline(always)]
    unsafe fn signed(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { _mm256_xor_si256(Self::offset(p, h, g), _mm256_set1_epi8(-128)) }
    }
    #[inline(always)]
    unsafe fn offset(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: as `signed`.
        unsafe { _mm256_loadu_si256(p.add(D_BYTES + 64 * g + 32 * h) as *const __m256i) }
    }
}

struct IQ4NL;

impl Signed for IQ4NL {
    const BYTES: usize = 16 * 18;
    const FUSED_ONE: bool = true;
    #[inline(always)]
    unsafe fn signed(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: the nibbles sit `D_BYTES` into the tile (this function's contract).
        unsafe { lookup(&KVALUES_IQ4NL, nibble(p.add(D_BYTES), h, g)) }
    }
    #[inline(always)]
    unsafe fn offset(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: as `signed`.
        unsafe { lookup(&IQ4NL_OFFSET, nibble(p.add(D_BYTES), h, g)) }
    }
}

/// `table[i]` for each byte index `i` (0..16).
#[inline(always)]
unsafe fn lookup(table: &[i8; 16], i: __m256i) -> __m256i {
    // SAFETY: the 16 bytes read are `table`'s; AVX2 present (module doc).
    unsafe {
        let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
        _mm256_shuffle_epi8(t, i)
    }
}

const IQ4NL_OFFSET: [i8; 16] = offset_table(KVALUES_IQ4NL);
const MXFP4_OFFSET: [i8; 16] = offset_table(KVALUES_MXFP4);

/// A table of signed weights as [`Signed::offset`] bytes (each + 128, wrapping into i8).
const fn offset_table(t: [i8; 16]) -> [i8; 16] {
    let mut o = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        o[i] = (t[i] as u8 ^ 0x80) as i8;
        i += 1;
    }
    o
}

struct MXFP4;

impl Signed for MXFP4 {
    const BYTES: usize = 16 * 17;
    const FUSED_ONE: bool = true;
    #[inline(always)]
    unsafe fn signed(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: the codes sit `MX_QS` into the tile (this function's contract).
        unsafe { lookup(&KVALUES_MXFP4, nibble(p.add(MX_QS), h, g)) }
    }
    #[inline(always)]
    unsafe fn offset(p: *const u8, h: usize, g: usize) -> __m256i {
        // SAFETY: as `signed`.
        unsafe { lookup(&MXFP4_OFFSET, nibble(p.add(MX_QS), h, g)) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const u8) -> [__m256; 2] {
        // SAFETY: the 16 bytes at `p` are the tile's e8m0 scales (this function's contract);
        // AVX2 present (module doc).
        unsafe {
            // `e8m0_half` per lane: bits (e - 1) << 23, or 0x00200000 << e for e < 2.
            std::array::from_fn(|h| {
                let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * h) as *const __m128i));
                let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
                let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
                let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
                _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small))
            })
        }
    }
}

/// The signed weights and their magnitudes.
impl Q8_0 {
    #[allow(clippy::needless_range_loop)] // indices into several arrays at once
    #[inline(always)]
    unsafe fn unpack8<V: Dots, S: Signed>(p: *const u8) -> [Wv; 2] {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe {
            let mut w = [[[_mm256_setzero_si256(); 8]; 2]; 2];
            for h in 0..2 {
                for g in 0..8 {
                    if V::OFFSET_SIGNED {
                        w[0][h][g] = S::offset(p, h, g);
                        continue;
                    }
                    w[0][h][g] = S::signed(p, h, g);
                    // |-128| is 0x80, read as 128 by `maddubs`' unsigned operand: exact.
                    w[1][h][g] = _mm256_abs_epi8(w[0][h][g]);
                }
            }
            w
        }
    }

    /// `sum(w * q_x)` of both halves for `P` tokens, exact: `|w| * (q_x * sign(w))`, each
    /// pair at most 2 * 128 * 127, widened to i32 at once; or ([`Dots::OFFSET_SIGNED`])
    /// `(w + 128) * q_x` from `-128 * sum(q_x)`.
    #[allow(clippy::needless_range_loop)] // indices into several arrays at once
    #[inline(always)]
    unsafe fn dot8<V: Dots, const P: usize>(w: &[Wv; 2], a: [&BlockQ8A; P]) -> [[__m256i; 2]; P] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let mut s = [[_mm256_setzero_si256(); 2]; P];
            if V::OFFSET_SIGNED {
                for (s, a) in s.iter_mut().zip(a) {
                    *s = [offset_start(a); 2];
                }
            }
            let mut s16 = _mm256_setzero_si256();
            for g in 0..8 {
                let mut bx = [_mm256_setzero_si256(); P];
                for (bx, a) in bx.iter_mut().zip(a) {
                    *bx = _mm256_set1_epi32((a.qs.as_ptr() as *const i32).add(g).read_unaligned());
                }
                for h in 0..2 {
                    let (wg, aw) = (w[0][h][g], w[1][h][g]);
                    for k in 0..P {
                        let (w, x) = if V::OFFSET_SIGNED {
                            (wg, bx[k])
                        } else {
                            (aw, _mm256_sign_epi8(bx[k], wg))
                        };
                        V::add(&mut s[k][h], &mut s16, w, x, true, true);
                    }
                }
            }
            s
        }
    }
}

impl Q8_0 {
    /// One token's [`Q8_0::dot8`], each signed weight vector made where it is used and the
    /// sign moved onto it: `|q_x| * (w * sign(q_x))`, the same products (pairs at most
    /// 2 * 128 * 127) and so the same i32 sums (or, [`Dots::OFFSET_SIGNED`], as `dot8`).
    ///
    /// Why: [`Q8_0::unpack8`] keeps 32 vectors (the weights and their magnitudes) for the
    /// tokens to share; one token has nothing to share, and they went through the stack.
    /// IQ4_NL at one token from DRAM: see [`IQ4NL`]'s kernel.
    #[inline(always)]
    unsafe fn dot8_fused<V: Dots, S: Signed>(p: *const u8, a: &BlockQ8A) -> [__m256i; 2] {
        // SAFETY: the reads below stay inside the tile and block passed in (this function's
        // contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
        unsafe {
            let mut s = if V::OFFSET_SIGNED {
                [offset_start(a); 2]
            } else {
                [_mm256_setzero_si256(); 2]
            };
            let mut s16 = _mm256_setzero_si256();
            for g in 0..8 {
                let bx = _mm256_set1_epi32((a.qs.as_ptr() as *const i32).add(g).read_unaligned());
                let ax = _mm256_abs_epi8(bx);
                for (h, s) in s.iter_mut().enumerate() {
                    let (w, x) = if V::OFFSET_SIGNED {
                        (S::offset(p, h, g), bx)
                    } else {
                        (ax, _mm256_sign_epi8(S::signed(p, h, g), bx))
                    };
                    V::add(s, &mut s16, w, x, true, true);
                }
            }
            s
        }
    }
}

/// Where a [`Dots::OFFSET_SIGNED`] sum of block `a` starts: `-128 * sum(q_x)` in every lane.
#[inline(always)]
unsafe fn offset_start(a: &BlockQ8A) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 present (module doc).
    unsafe { _mm256_set1_epi32(-128 * (a.sums[0] as i32 + a.sums[1] as i32)) }
}

/// The f32 steps of one block for one token: per half, `acc = fma(d_w, f32(isum) * d_x, acc)`.
#[inline(always)]
unsafe fn block_step(acc: &mut [__m256; 2], dw: &[__m256; 2], s: [__m256i; 2], corr: i32, dx: f32) {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        let (corr, dx) = (_mm256_set1_epi32(corr), _mm256_set1_ps(dx));
        for h in 0..2 {
            let tmp = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s[h], corr)), dx);
            acc[h] = _mm256_fmadd_ps(dw[h], tmp, acc[h]);
        }
    }
}

/// One block's f32 steps for one token of a [`Tile`]: [`block_step`], or for the types with
/// a min (`mw`) the reference's `acc + (d_w * d_x * isum + m_w * d_x * sum(q_x))`, each
/// product rounded on its own (no fma), as the scalar expression is.
#[inline(always)]
unsafe fn tile_step<L: Tile>(
    acc: &mut [__m256; 2],
    dw: &[__m256; 2],
    mw: &[__m256; 2],
    s: [__m256i; 2],
    a: &BlockQ8A,
) {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let qsum = a.sums[0] as i32 + a.sums[1] as i32;
        if L::MIN.is_none() {
            return block_step(acc, dw, s, L::OFF * qsum, a.d);
        }
        let (dx, qs) = (_mm256_set1_ps(a.d), _mm256_set1_ps(qsum as f32));
        for h in 0..2 {
            let dot = _mm256_mul_ps(_mm256_mul_ps(dw[h], dx), _mm256_cvtepi32_ps(s[h]));
            let min = _mm256_mul_ps(_mm256_mul_ps(mw[h], dx), qs);
            acc[h] = _mm256_add_ps(acc[h], _mm256_add_ps(dot, min));
        }
    }
}

/// 16 f16 scales at `p` as two halves of f32.
#[inline(always)]
unsafe fn scales16(p: *const u8) -> [__m256; 2] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        [
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
        ]
    }
}

/// `T` activation rows against one group's tiles of a 32-element type.
#[inline(always)]
unsafe fn rows16<V: Dots, L: Tile, const T: usize>(
    tiles: &[u8],
    x: [&[BlockQ8A]; T],
) -> [[f32; ROWS]; T] {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let nb = tiles.len() / L::BYTES;
        assert!(x.iter().all(|x| x.len() >= nb));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..nb {
            let p = tiles.as_ptr().add(b * L::BYTES);
            touch_page(p, L::BYTES);
            // About 16 KiB ahead, one token too: from DRAM on a Zen 5 host Q4_0 26 -> 30-33
            // GB/s, Q4_1 27 -> 32-35, IQ4_NL 22-25 -> 25-31 (kernel-bench, one thread,
            // alternating builds; the AVX-512 kernels' finding, `avx512::rows16`).
            prefetch(p.wrapping_add(16384 / L::BYTES * L::BYTES), L::BYTES);
            let dw = scales16(p);
            let mw = match L::MIN {
                Some(at) => scales16(p.add(at)),
                None => dw,
            };
            if T == 1 {
                let a = x[0].get_unchecked(b);
                tile_step::<L>(&mut acc[0], &dw, &mw, dot_fused::<V, L>(p, a), a);
                continue;
            }
            let w = unpack::<L>(p);
            let mut t = 0;
            while t + 2 <= T {
                let a = [x[t].get_unchecked(b), x[t + 1].get_unchecked(b)];
                let s = dot_unsigned::<V, 0, 8, 2>(L::RUN, &w, a);
                for k in 0..2 {
                    tile_step::<L>(&mut acc[t + k], &dw, &mw, s[k], a[k]);
                }
                t += 2;
            }
            if t < T {
                let a = x[t].get_unchecked(b);
                tile_step::<L>(&mut acc[t], &dw, &mw, dot_fused::<V, L>(p, a), a);
            }
        }
        rows_out(&acc)
    }
}

/// [`rows16`] for the [`Signed`] tiles (their weights are a pair of [`Wv`], no offset).
#[inline(always)]
unsafe fn rows16_8<V: Dots, S: Signed, const T: usize>(
    tiles: &[u8],
    x: [&[BlockQ8A]; T],
) -> [[f32; ROWS]; T] {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let bytes = S::BYTES;
        let nb = tiles.len() / bytes;
        assert!(x.iter().all(|x| x.len() >= nb));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..nb {
            let p = tiles.as_ptr().add(b * bytes);
            touch_page(p, bytes);
            // As `rows16`'s.
            prefetch(p.wrapping_add(16384 / bytes * bytes), bytes);
            let dw = S::scales(p);
            if T == 1 && S::FUSED_ONE {
                let a = x[0].get_unchecked(b);
                block_step(&mut acc[0], &dw, Q8_0::dot8_fused::<V, S>(p, a), 0, a.d);
                continue;
            }
            let w = Q8_0::unpack8::<V, S>(p);
            let mut t = 0;
            while t + 2 <= T {
                let a = [x[t].get_unchecked(b), x[t + 1].get_unchecked(b)];
                let s = Q8_0::dot8::<V, _>(&w, a);
                for k in 0..2 {
                    block_step(&mut acc[t + k], &dw, s[k], 0, a[k].d);
                }
                t += 2;
            }
            if t < T {
                let a = x[t].get_unchecked(b);
                block_step(&mut acc[t], &dw, Q8_0::dot8::<V, _>(&w, [a])[0], 0, a.d);
            }
        }
        rows_out(&acc)
    }
}

/// Each token's two halves as 16 floats.
#[inline(always)]
unsafe fn rows_out<const T: usize>(acc: &[[__m256; 2]; T]) -> [[f32; ROWS]; T] {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t][0]);
            _mm256_storeu_ps(out[t].as_mut_ptr().add(8), acc[t][1]);
        }
        out
    }
}

/// The 32-element types' kernel, [`rows16`] over a [`Tile`].
struct Blocks<L, V>(PhantomData<(L, V)>);

impl<L: Tile, V: Dots> Kernel for Blocks<L, V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe { rows16::<V, L, T>(tiles, x) }
    }
}

/// The [`Signed`] types' kernel, [`rows16_8`] over their tiles.
struct Eight<S, V>(PhantomData<(S, V)>);

impl<S: Signed, V: Dots> Kernel for Eight<S, V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe { rows16_8::<V, S, T>(tiles, x) }
    }
}

/// Eight bytes of a scale plane (the half's rows) as i32 lanes, unsigned or signed.
#[inline(always)]
unsafe fn plane_u8(p: *const u8) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
}

#[inline(always)]
unsafe fn plane_i8(p: *const u8) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
}

/// Q4_K tiles: per sub-block s, 8 vectors per half of 4-bit quants (low or high nibbles of the
/// granules of qs chunk s / 2), `d * sc` and `dmin * m` per half, then per token one sub-block
/// dot, its scale FMA and its min FMA.
struct Q4K<V>(PhantomData<V>);

/// `get_scale_min_k4` of sub-block `S` for 8 rows at once, from the scale planes at `sc`
/// (offset to the half's rows): (scales, mins) as i32 lanes.
#[inline(always)]
unsafe fn scale_min_planes<const S: usize>(sc: *const u8) -> (__m256i, __m256i) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let plane = |i: usize| plane_u8(sc.add(ROWS * i));
        let m6 = _mm256_set1_epi32(63);
        if S < 4 {
            (
                _mm256_and_si256(plane(S), m6),
                _mm256_and_si256(plane(S + 4), m6),
            )
        } else {
            let (lo, hi_sc, hi_m) = (plane(S + 4), plane(S - 4), plane(S));
            (
                _mm256_or_si256(
                    _mm256_and_si256(lo, _mm256_set1_epi32(0xF)),
                    _mm256_slli_epi32(_mm256_srli_epi32(hi_sc, 6), 4),
                ),
                _mm256_or_si256(
                    _mm256_srli_epi32(lo, 4),
                    _mm256_slli_epi32(_mm256_srli_epi32(hi_m, 6), 4),
                ),
            )
        }
    }
}

/// Sub-block `S` of a Q4_K tile at `p` for `T` tokens (`xb`: each token's 8 blocks of this
/// super-block).
#[inline(always)]
unsafe fn q4k_sub<V: Dots, const S: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    d: &[__m256; 2],
    dmin: &[__m256; 2],
    xb: &[*const BlockQ8A; T],
    acc: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        // An eighth of a tile ahead per sub-block, spread out as the AVX-512 kernel does.
        prefetch(ahead.wrapping_add(S * K4_BYTES / 8), K4_BYTES / 8);
        let mut dsc = [_mm256_setzero_ps(); 2];
        let mut dm = [_mm256_setzero_ps(); 2];
        for h in 0..2 {
            let (sc, m) = scale_min_planes::<S>(p.add(K4_SC + 8 * h));
            dsc[h] = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc));
            dm[h] = _mm256_mul_ps(dmin[h], _mm256_cvtepi32_ps(m));
        }
        let qs = p.add(K4_QS + 512 * (S / 2));
        let m4 = _mm256_set1_epi8(0x0F);
        let mut w: Wv = [[_mm256_setzero_si256(); 8]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (k, v) in wh.iter_mut().enumerate() {
                let q = _mm256_loadu_si256(qs.add(64 * k + 32 * h) as *const __m256i);
                let q = if S % 2 == 1 {
                    _mm256_srli_epi16(q, 4)
                } else {
                    q
                };
                *v = _mm256_and_si256(q, m4);
            }
        }
        let mut t = 0;
        while t + 2 <= T {
            q4k_tokens::<V, S, 2, T>(t, &w, &dsc, &dm, xb, acc);
            t += 2;
        }
        if t < T {
            q4k_tokens::<V, S, 1, T>(t, &w, &dsc, &dm, xb, acc);
        }
    }
}

/// Q4_K for one token, sub-blocks `S0` and `S1 = S0 + 1` of a tile (the low and high nibbles
/// of qs chunk `S0 / 2`): each granule vector loaded once for both, the two sub-blocks' dots
/// summed side by side, a half of the rows at a time; then per sub-block [`q4k_tokens`]'
/// steps (the same integers, the same f32 sequence per half, so the same bits).
#[inline(always)]
unsafe fn q4k_one_pair<V: Dots, const S0: usize, const S1: usize>(
    p: *const u8,
    ahead: *const u8,
    d: &[__m256; 2],
    dmin: &[__m256; 2],
    xb: *const BlockQ8A,
    acc: &mut [__m256; 2],
) {
    // SAFETY: every read below is inside the tile at `p` or the tile's 8 activation blocks at
    // `xb` (the caller's); the prefetches never fault; AVX2, FMA and F16C present (module doc).
    unsafe {
        let qs = p.add(K4_QS + 512 * (S0 / 2));
        let m4 = _mm256_set1_epi8(0x0F);
        let (a0, a1) = (&*xb.add(S0), &*xb.add(S1));
        let (q0, q1) = (a0.qs.as_ptr() as *const i32, a1.qs.as_ptr() as *const i32);
        for h in 0..2 {
            prefetch(ahead.wrapping_add((S0 + h) * K4_BYTES / 8), K4_BYTES / 8);
            let mut s32 = [_mm256_setzero_si256(); 2];
            let mut s16 = [_mm256_setzero_si256(); 2];
            for g in 0..8 {
                let v = _mm256_loadu_si256(qs.add(64 * g + 32 * h) as *const __m256i);
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                let (x0, x1) = (q0.add(g).read_unaligned(), q1.add(g).read_unaligned());
                let (first, last) = (g == 0, g == 7);
                V::add(
                    &mut s32[0],
                    &mut s16[0],
                    lo,
                    _mm256_set1_epi32(x0),
                    first,
                    last,
                );
                V::add(
                    &mut s32[1],
                    &mut s16[1],
                    hi,
                    _mm256_set1_epi32(x1),
                    first,
                    last,
                );
            }
            let sc = p.add(K4_SC + 8 * h);
            let planes = [scale_min_planes::<S0>(sc), scale_min_planes::<S1>(sc)];
            for ((isum, (sc, m)), a) in s32.into_iter().zip(planes).zip([a0, a1]) {
                let dsc = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc));
                let dm = _mm256_mul_ps(dmin[h], _mm256_cvtepi32_ps(m));
                let tmp = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a.d));
                acc[h] = _mm256_fmadd_ps(dsc, tmp, acc[h]);
                acc[h] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(a.s), acc[h]);
            }
        }
    }
}

/// Tokens `t0..t0 + P` of [`q4k_sub`]: the sub-block dot, its scale FMA and its min FMA.
#[inline(always)]
unsafe fn q4k_tokens<V: Dots, const S: usize, const P: usize, const T: usize>(
    t0: usize,
    w: &Wv,
    dsc: &[__m256; 2],
    dm: &[__m256; 2],
    xb: &[*const BlockQ8A; T],
    acc: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut a = [&*xb[t0].add(S); P];
        for (k, a) in a.iter_mut().enumerate() {
            *a = &*xb[t0 + k].add(S);
        }
        let isum = dot_unsigned::<V, 0, 8, P>(8, w, a);
        for k in 0..P {
            let (xd, xs) = (_mm256_set1_ps(a[k].d), _mm256_set1_ps(a[k].s));
            let acc = &mut acc[t0 + k];
            for h in 0..2 {
                let tmp = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[k][h]), xd);
                acc[h] = _mm256_fmadd_ps(dsc[h], tmp, acc[h]);
                // fnmadd rounds -(dm * s) + acc once: the spec's fma(-(dmin * m), s, acc).
                acc[h] = _mm256_fnmadd_ps(dm[h], xs, acc[h]);
            }
        }
    }
}

impl<V: Dots> Kernel for Q4K<V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let nt = tiles.len() / K4_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K4_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K4_BYTES);
                touch_page(p, K4_BYTES);
                let d = scales16(p.add(K4_D));
                let dmin = scales16(p.add(K4_DMIN));
                let mut xb = [std::ptr::null::<BlockQ8A>(); T];
                for (xb, x) in xb.iter_mut().zip(x) {
                    *xb = x.as_ptr().add(8 * b);
                }
                if T == 1 {
                    let (x, acc) = (xb[0], &mut acc[0]);
                    q4k_one_pair::<V, 0, 1>(p, ahead, &d, &dmin, x, acc);
                    q4k_one_pair::<V, 2, 3>(p, ahead, &d, &dmin, x, acc);
                    q4k_one_pair::<V, 4, 5>(p, ahead, &d, &dmin, x, acc);
                    q4k_one_pair::<V, 6, 7>(p, ahead, &d, &dmin, x, acc);
                    continue;
                }
                q4k_sub::<V, 0, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 1, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 2, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 3, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 4, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 5, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 6, T>(p, ahead, &d, &dmin, &xb, &mut acc);
                q4k_sub::<V, 7, T>(p, ahead, &d, &dmin, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

/// Q5_K tiles: per sub-block s, 8 vectors per half of 5-bit quants (Q4_K's nibbles plus 16
/// where bit s of the qh granule is set), their pair sums added in i16 four groups at a time
/// (4 * 2 * 31 * 128 = 31744); per token the reference's terms, as the AVX-512 kernel.
struct Q5K<V>(PhantomData<V>);

/// Sub-block `S` of a Q5_K tile at `p` for `T` tokens: each token's scale term
/// `x = a.d * f32(sc * isum)` per half. Even `S`: into `x0`; odd `S`: `sd += x0 + x`, the
/// reference's pair sum.
///
/// Why the min terms go apart ([`q5k_mins`]) and `f32(sc * isum)` is `f32(sc) * f32(isum)`
/// (exact: both and their product below 2^24): per sub-block both terms of both halves for
/// 8 tokens were 32 vectors kept to the pair's sum, and `vpmulld` is slower than `vmulps`.
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
#[inline(always)]
unsafe fn q5k_sub<V: Dots, const S: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    fsc: &[[__m256; 2]; 8],
    xb: &[*const BlockQ8A; T],
    x0: &mut [[__m256; 2]; T],
    sd: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        prefetch(ahead.wrapping_add(S * K5_BYTES / 8), K5_BYTES / 8);
        let qs = p.add(K5_QS + 512 * (S / 2));
        let (m4, c16, bit) = (
            _mm256_set1_epi8(0x0F),
            _mm256_set1_epi8(16),
            _mm256_set1_epi8(1 << S),
        );
        let mut w: Wv = [[_mm256_setzero_si256(); 8]; 2];
        for h in 0..2 {
            for k in 0..8 {
                let q = _mm256_loadu_si256(qs.add(64 * k + 32 * h) as *const __m256i);
                let q = if S % 2 == 1 {
                    _mm256_srli_epi16(q, 4)
                } else {
                    q
                };
                let hb = _mm256_loadu_si256(p.add(K5_QH + 64 * k + 32 * h) as *const __m256i);
                let hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), c16);
                w[h][k] = _mm256_or_si256(_mm256_and_si256(q, m4), hb);
            }
        }
        // Tokens in pairs: each weight vector loaded once for two.
        let mut t = 0;
        while t + 2 <= T {
            q5k_tokens::<V, S, 2, T>(t, &w, &fsc[S], xb, x0, sd);
            t += 2;
        }
        if t < T {
            q5k_tokens::<V, S, 1, T>(t, &w, &fsc[S], xb, x0, sd);
        }
    }
}

/// Q5_K for one token, sub-blocks `S0` and `S1 = S0 + 1` of a tile: each qs vector loaded
/// once for its low and high nibbles and each qh vector once for both fifth bits (bit `S`
/// shifted to bit 4 and masked: the 16-bit shifts only move bits the mask drops across byte
/// edges), the two dots summed side by side, a half of the rows at a time; then
/// [`q5k_tokens`]' pair sum `sd += x0 + x1` (the same integers and f32 steps, so the same
/// bits).
#[inline(always)]
unsafe fn q5k_one_pair<V: Dots, const S0: usize, const S1: usize>(
    p: *const u8,
    ahead: *const u8,
    fsc: &[[__m256; 2]; 8],
    xb: *const BlockQ8A,
    sd: &mut [__m256; 2],
) {
    // SAFETY: every read below is inside the tile at `p` or the tile's 8 activation blocks at
    // `xb` (the caller's); the prefetches never fault; AVX2, FMA and F16C present (module doc).
    unsafe {
        let qs = p.add(K5_QS + 512 * (S0 / 2));
        let (m4, c16) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(16));
        let fifth = |hb: __m256i, s: usize| {
            let b = match s {
                0 => _mm256_slli_epi16(hb, 4),
                1 => _mm256_slli_epi16(hb, 3),
                2 => _mm256_slli_epi16(hb, 2),
                3 => _mm256_slli_epi16(hb, 1),
                4 => hb,
                5 => _mm256_srli_epi16(hb, 1),
                6 => _mm256_srli_epi16(hb, 2),
                _ => _mm256_srli_epi16(hb, 3),
            };
            _mm256_and_si256(b, c16)
        };
        let (a0, a1) = (&*xb.add(S0), &*xb.add(S1));
        let (q0, q1) = (a0.qs.as_ptr() as *const i32, a1.qs.as_ptr() as *const i32);
        for h in 0..2 {
            prefetch(ahead.wrapping_add((S0 + h) * K5_BYTES / 8), K5_BYTES / 8);
            let mut s32 = [_mm256_setzero_si256(); 2];
            let mut s16 = [_mm256_setzero_si256(); 2];
            for k in 0..8 {
                let v = _mm256_loadu_si256(qs.add(64 * k + 32 * h) as *const __m256i);
                let hb = _mm256_loadu_si256(p.add(K5_QH + 64 * k + 32 * h) as *const __m256i);
                let lo = _mm256_or_si256(_mm256_and_si256(v, m4), fifth(hb, S0));
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                let hi = _mm256_or_si256(hi, fifth(hb, S1));
                let (x0, x1) = (q0.add(k).read_unaligned(), q1.add(k).read_unaligned());
                let (first, last) = (k % 4 == 0, k % 4 == 3);
                V::add(
                    &mut s32[0],
                    &mut s16[0],
                    lo,
                    _mm256_set1_epi32(x0),
                    first,
                    last,
                );
                V::add(
                    &mut s32[1],
                    &mut s16[1],
                    hi,
                    _mm256_set1_epi32(x1),
                    first,
                    last,
                );
            }
            let term = |isum: __m256i, fsc: __m256, a: &BlockQ8A| {
                _mm256_mul_ps(
                    _mm256_set1_ps(a.d),
                    _mm256_mul_ps(fsc, _mm256_cvtepi32_ps(isum)),
                )
            };
            let x0 = term(s32[0], fsc[S0][h], a0);
            let x1 = term(s32[1], fsc[S1][h], a1);
            sd[h] = _mm256_add_ps(sd[h], _mm256_add_ps(x0, x1));
        }
    }
}

/// Tokens `t0..t0 + P` of [`q5k_sub`].
#[inline(always)]
unsafe fn q5k_tokens<V: Dots, const S: usize, const P: usize, const T: usize>(
    t0: usize,
    w: &Wv,
    fsc: &[__m256; 2],
    xb: &[*const BlockQ8A; T],
    x0: &mut [[__m256; 2]; T],
    sd: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut a = [&*xb[t0].add(S); P];
        for (k, a) in a.iter_mut().enumerate() {
            *a = &*xb[t0 + k].add(S);
        }
        let isum = dot_unsigned::<V, 0, 8, P>(4, w, a);
        for k in 0..P {
            let dx = _mm256_set1_ps(a[k].d);
            for h in 0..2 {
                let x = _mm256_mul_ps(dx, _mm256_mul_ps(fsc[h], _mm256_cvtepi32_ps(isum[k][h])));
                if S.is_multiple_of(2) {
                    x0[t0 + k][h] = x;
                } else {
                    sd[t0 + k][h] = _mm256_add_ps(sd[t0 + k][h], _mm256_add_ps(x0[t0 + k][h], x));
                }
            }
        }
    }
}

/// Each token's `sm` of a Q5_K tile per half: per pair of sub-blocks `sm += y0 + y1`, with
/// the reference's `y = a.d * f32(m * sum(q_x))` (`f32(m) * f32(sum)` exactly).
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
#[inline(always)]
unsafe fn q5k_mins<const T: usize>(
    fm: &[[__m256; 2]; 8],
    xb: &[*const BlockQ8A; T],
    sm: &mut [[__m256; 2]; T],
) {
    // SAFETY: the activation blocks read are the tile's 8 of each token (the caller checked
    // the lengths); AVX2, FMA and F16C present (module doc).
    unsafe {
        for t in 0..T {
            for j in 0..4 {
                let mut y = [[_mm256_setzero_ps(); 2]; 2];
                for i in 0..2 {
                    let a = &*xb[t].add(2 * j + i);
                    let dx = _mm256_set1_ps(a.d);
                    let qsum = _mm256_set1_ps((a.sums[0] as i32 + a.sums[1] as i32) as f32);
                    for h in 0..2 {
                        y[i][h] = _mm256_mul_ps(dx, _mm256_mul_ps(fm[2 * j + i][h], qsum));
                    }
                }
                for h in 0..2 {
                    sm[t][h] = _mm256_add_ps(sm[t][h], _mm256_add_ps(y[0][h], y[1][h]));
                }
            }
        }
    }
}

/// Sub-block `S`'s scale and min for half `h`'s rows (planes at `sc`), as floats.
#[inline(always)]
unsafe fn q5k_scale<const S: usize>(
    sc: *const u8,
    h: usize,
    fsc: &mut [[__m256; 2]; 8],
    fm: &mut [[__m256; 2]; 8],
) {
    // SAFETY: every read below is inside the tile at the caller's pointer (this function's
    // contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let (c, m) = scale_min_planes::<S>(sc);
        fsc[S][h] = _mm256_cvtepi32_ps(c);
        fm[S][h] = _mm256_cvtepi32_ps(m);
    }
}

/// The float scales and mins of all 8 sub-blocks of a Q5_K tile, per half.
#[inline(always)]
unsafe fn q5k_scales(p: *const u8) -> ([[__m256; 2]; 8], [[__m256; 2]; 8]) {
    // SAFETY: every read below is inside the tile at the caller's pointer (this function's
    // contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut fsc = [[_mm256_setzero_ps(); 2]; 8];
        let mut fm = [[_mm256_setzero_ps(); 2]; 8];
        for h in 0..2 {
            let sc = p.add(K5_SC + 8 * h);
            q5k_scale::<0>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<1>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<2>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<3>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<4>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<5>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<6>(sc, h, &mut fsc, &mut fm);
            q5k_scale::<7>(sc, h, &mut fsc, &mut fm);
        }
        (fsc, fm)
    }
}

impl<V: Dots> Kernel for Q5K<V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let nt = tiles.len() / K5_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K5_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K5_BYTES);
                touch_page(p, K5_BYTES);
                let mut xb = [std::ptr::null::<BlockQ8A>(); T];
                for (xb, x) in xb.iter_mut().zip(x) {
                    *xb = x.as_ptr().add(8 * b);
                }
                let (fsc, fm) = q5k_scales(p);
                let mut sm = [[_mm256_setzero_ps(); 2]; T];
                q5k_mins(&fm, &xb, &mut sm);
                let mut sd = [[_mm256_setzero_ps(); 2]; T];
                if T == 1 {
                    let (x, sd) = (xb[0], &mut sd[0]);
                    q5k_one_pair::<V, 0, 1>(p, ahead, &fsc, x, sd);
                    q5k_one_pair::<V, 2, 3>(p, ahead, &fsc, x, sd);
                    q5k_one_pair::<V, 4, 5>(p, ahead, &fsc, x, sd);
                    q5k_one_pair::<V, 6, 7>(p, ahead, &fsc, x, sd);
                } else {
                    // Each token's even sub-block term, waiting for its pair.
                    let mut x0 = [[_mm256_setzero_ps(); 2]; T];
                    q5k_sub::<V, 0, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 1, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 2, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 3, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 4, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 5, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 6, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                    q5k_sub::<V, 7, T>(p, ahead, &fsc, &xb, &mut x0, &mut sd);
                }
                let d = scales16(p.add(K5_D));
                let dmin = scales16(p.add(K5_DMIN));
                for t in 0..T {
                    for h in 0..2 {
                        let v = _mm256_sub_ps(
                            _mm256_mul_ps(d[h], sd[t][h]),
                            _mm256_mul_ps(dmin[h], sm[t][h]),
                        );
                        acc[t][h] = _mm256_add_ps(acc[t][h], v);
                    }
                }
            }
            rows_out(&acc)
        }
    }
}

/// Q3_K and Q2_K tiles (16-element scale groups, 2-bit quants in qs chunks), as the AVX-512
/// kernel: how one type's Q8A block `G` of a tile becomes weights and scales, per half.
trait K16 {
    const BYTES: usize;
    /// `u - OFF` is the weight (Q3_K 4; Q2_K 0).
    const OFF: i32;
    /// Where the f16 mins sit (Q2_K).
    const DMIN: Option<usize>;
    /// Weight vector `[h][k]` of block `G` (k 0..4: scale group 2G, 4..8: 2G + 1).
    unsafe fn vector<const G: usize>(p: *const u8, h: usize, k: usize) -> __m256i;
    /// The scale and min (i32 lanes) of scale group 2G + j for half h's rows.
    unsafe fn scale<const G: usize>(
        p: *const u8,
        pre: &[u8; 256],
        h: usize,
        j: usize,
    ) -> (__m256i, __m256i);
    /// Once per tile: whatever [`K16::scale`] reads from `pre` (Q3_K: its 16 scale groups as
    /// signed bytes, plane k at 16k).
    #[inline(always)]
    unsafe fn prepare(_p: *const u8, _pre: &mut [u8; 256]) {}
    /// One token over the whole tile at `p` onto `sd` and `sm` where the type has a kernel
    /// for that (Q2_K: [`q2k_one_tile`]); `false`: none, [`k16_block`] takes it per block.
    #[inline(always)]
    unsafe fn one_token_tile<V: Dots>(
        _p: *const u8,
        _ahead: *const u8,
        _xb: *const BlockQ8A,
        _sd: &mut [__m256; 2],
        _sm: &mut [__m256; 2],
    ) -> bool {
        false
    }
}

struct Q3K;
struct Q2K;

/// The 2-bit field of block `G`, vector `[h][k]`, from the qs granules at `qs`.
#[inline(always)]
unsafe fn two_bits<const G: usize>(qs: *const u8, h: usize, k: usize) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let v = _mm256_loadu_si256(qs.add(512 * (G / 4) + 64 * k + 32 * h) as *const __m256i);
        let v = match G % 4 {
            0 => v,
            1 => _mm256_srli_epi16(v, 2),
            2 => _mm256_srli_epi16(v, 4),
            _ => _mm256_srli_epi16(v, 6),
        };
        _mm256_and_si256(v, _mm256_set1_epi8(3))
    }
}

impl K16 for Q3K {
    const BYTES: usize = K3_BYTES;
    const OFF: i32 = 4;
    const DMIN: Option<usize> = None;
    #[inline(always)]
    unsafe fn vector<const G: usize>(p: *const u8, h: usize, k: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe {
            // The 3-bit fields of `k3_fields` (16-bit shifts: what they pull in from the next
            // byte is masked off).
            let (c, shift, _, hi) = k3_fields(k);
            let granule = |c: usize| {
                _mm256_loadu_si256(p.add(K3_Q + K3_BLOCK * G + 64 * c + 32 * h) as *const __m256i)
            };
            let v = granule(c);
            let v = match shift {
                0 => v,
                3 => _mm256_srli_epi16(v, 3),
                _ => _mm256_srli_epi16(v, 6),
            };
            match hi {
                None => _mm256_and_si256(v, _mm256_set1_epi8(7)),
                Some(at) => {
                    let z2 = granule(2);
                    let b2 = if at == 6 {
                        _mm256_srli_epi16(z2, 4)
                    } else {
                        _mm256_srli_epi16(z2, 5)
                    };
                    _mm256_or_si256(
                        _mm256_and_si256(v, _mm256_set1_epi8(3)),
                        _mm256_and_si256(b2, _mm256_set1_epi8(4)),
                    )
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn prepare(p: *const u8, pre: &mut [u8; 256]) {
        // SAFETY: the reads are the tile's 12 scale planes (192 bytes at `K3_SC`), the writes
        // `pre`'s 256 bytes; AVX2 present (module doc).
        unsafe {
            // `scales_q3k` for 16 rows, as the AVX-512 kernel's `prepare`: once per tile.
            let m4 = _mm256_set1_epi8(0x0F);
            let m30 = _mm256_set1_epi8(0x30);
            let c32 = _mm256_set1_epi8(32);
            for half in 0..2 {
                let ld =
                    |o: usize| _mm256_loadu_si256(p.add(K3_SC + o + 32 * half) as *const __m256i);
                let (l0, l1, hb) = (ld(0), ld(64), ld(128));
                let join = |lo: __m256i, hi: __m256i| {
                    let v = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m30));
                    _mm256_sub_epi8(v, c32)
                };
                let groups = [
                    join(l0, _mm256_slli_epi16(hb, 4)),
                    join(l1, _mm256_slli_epi16(hb, 2)),
                    join(_mm256_srli_epi16(l0, 4), hb),
                    join(_mm256_srli_epi16(l1, 4), _mm256_srli_epi16(hb, 2)),
                ];
                for (k, v) in groups.iter().enumerate() {
                    let at = pre.as_mut_ptr().add(64 * k + 32 * half);
                    _mm256_storeu_si256(at as *mut __m256i, *v);
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn scale<const G: usize>(
        _p: *const u8,
        pre: &[u8; 256],
        h: usize,
        j: usize,
    ) -> (__m256i, __m256i) {
        // SAFETY: the reads are inside `pre`; AVX2 present (module doc).
        unsafe {
            let at = pre.as_ptr().add(16 * (2 * G + j) + 8 * h);
            (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i)),
                _mm256_setzero_si256(),
            )
        }
    }
}

impl K16 for Q2K {
    const BYTES: usize = K2_BYTES;
    const OFF: i32 = 0;
    const DMIN: Option<usize> = Some(K2_DMIN);
    #[inline(always)]
    unsafe fn one_token_tile<V: Dots>(
        p: *const u8,
        ahead: *const u8,
        xb: *const BlockQ8A,
        sd: &mut [__m256; 2],
        sm: &mut [__m256; 2],
    ) -> bool {
        // SAFETY: the trait's contract is `q2k_one_tile`'s.
        unsafe { q2k_one_tile::<V>(p, ahead, xb, sd, sm) };
        true
    }
    #[inline(always)]
    unsafe fn vector<const G: usize>(p: *const u8, h: usize, k: usize) -> __m256i {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe { two_bits::<G>(p.add(K2_QS), h, k) }
    }
    #[inline(always)]
    unsafe fn scale<const G: usize>(
        p: *const u8,
        _pre: &[u8; 256],
        h: usize,
        j: usize,
    ) -> (__m256i, __m256i) {
        // SAFETY: every read below is inside the block or tile at the caller's pointer (this
        // function's contract, as its callers keep it); AVX2, FMA and F16C present (module
        // doc).
        unsafe {
            let v = plane_u8(p.add(K2_SC + ROWS * (2 * G + j) + 8 * h));
            (
                _mm256_and_si256(v, _mm256_set1_epi32(0xF)),
                _mm256_srli_epi32(v, 4),
            )
        }
    }
}

/// Q8A block `G` of a Q3_K / Q2_K tile for `T` tokens (pairs share the weight loads): the
/// AVX-512 kernel's steps per half.
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
#[inline(always)]
unsafe fn k16_block<V: Dots, K: K16, const G: usize, const T: usize>(
    p: *const u8,
    pre: &[u8; 256],
    ahead: *const u8,
    xb: &[*const BlockQ8A; T],
    sd: &mut [[__m256; 2]; T],
    sm: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        prefetch(ahead.wrapping_add(G * K::BYTES / 8), K::BYTES / 8);
        if T == 1 {
            return k16_one::<V, K, G>(p, pre, &*xb[0].add(G), &mut sd[0]);
        }
        let mut w: Wv = [[_mm256_setzero_si256(); 8]; 2];
        let mut sc = [[(_mm256_setzero_si256(), _mm256_setzero_si256()); 2]; 2];
        for h in 0..2 {
            for k in 0..8 {
                w[h][k] = K::vector::<G>(p, h, k);
            }
            for j in 0..2 {
                sc[h][j] = K::scale::<G>(p, pre, h, j);
            }
        }
        // Q2_K: each row's (m_0, m_1) as the i16 halves of its lane, for one `vpmaddwd`
        // against the block's two i16 sums per token (4 fewer instructions per token and half
        // than two `vpmulld` of broadcast sums).
        let mins: [__m256i; 2] =
            std::array::from_fn(|h| _mm256_or_si256(sc[h][0].1, _mm256_slli_epi32(sc[h][1].1, 16)));
        let mut t = 0;
        while t + 2 <= T {
            k16_tokens::<V, K, G, 2, T>(t, &w, &sc, &mins, xb, sd, sm);
            t += 2;
        }
        if t < T {
            k16_tokens::<V, K, G, 1, T>(t, &w, &sc, &mins, xb, sd, sm);
        }
    }
}

/// [`k16_block`] for one token of a type without mins (Q3_K; Q2_K takes
/// [`K16::one_token_tile`]), a half (8 rows) at a time, each weight vector used as soon as it
/// is unpacked: the same integers and f32 steps. Why: holding the block's 16 weight vectors
/// for all tokens spilled a third of the one-token loop's instructions to the stack (16 ymm
/// registers), and the kernel ran at 13 GB/s of Q2_K weights from cache.
#[inline(always)]
unsafe fn k16_one<V: Dots, K: K16, const G: usize>(
    p: *const u8,
    pre: &[u8; 256],
    a: &BlockQ8A,
    sd: &mut [__m256; 2],
) {
    debug_assert!(
        K::DMIN.is_none(),
        "a type with mins has its own one-token tile"
    );
    // SAFETY: every read below is inside the tile at `p`, `pre` or the activation block `a`
    // (the caller's); AVX2, FMA and F16C present (module doc).
    unsafe {
        let q = a.qs.as_ptr() as *const i32;
        let dx = _mm256_set1_ps(a.d);
        for (h, sd) in sd.iter_mut().enumerate() {
            // Four products of at most 7 x 127 x 2 per i16 lane: no saturation. (Loops, not
            // a closure: a closure this size is not inlined, and outside the target-feature
            // function its intrinsics become calls.)
            let mut group = [_mm256_setzero_si256(); 2];
            for (j, sum) in group.iter_mut().enumerate() {
                // The offset correction is the sum's start (exact integers: same sum).
                *sum = _mm256_set1_epi32(-K::OFF * a.sums[j] as i32);
                let mut s16 = _mm256_setzero_si256();
                for g in 4 * j..4 * j + 4 {
                    let x = _mm256_set1_epi32(q.add(g).read_unaligned());
                    let w = K::vector::<G>(p, h, g);
                    V::add(sum, &mut s16, w, x, g == 4 * j, g == 4 * j + 3);
                }
            }
            let (sc0, _) = K::scale::<G>(p, pre, h, 0);
            let (sc1, _) = K::scale::<G>(p, pre, h, 1);
            let isum = _mm256_add_epi32(
                _mm256_mullo_epi32(sc0, group[0]),
                _mm256_mullo_epi32(sc1, group[1]),
            );
            *sd = _mm256_add_ps(*sd, _mm256_mul_ps(dx, _mm256_cvtepi32_ps(isum)));
        }
    }
}

/// Where block `4c + j`'s 2-bit field sits (in pairs of bits) when [`q2k_one_tile`] masks it:
/// in place with `vpdpbusd`; with `maddubs`, whose i16 pair sums run over four groups, the
/// high two fields are shifted down by 4 first, so a masked field is at most 12 (4 * 2 * 12 *
/// 128 = 12288 fits i16; 192, bits 6-7 in place, would not).
#[inline(always)]
const fn field_shift<V: Dots>(j: usize) -> usize {
    if V::WIDE_BYTES {
        j
    } else {
        j % 2
    }
}

/// Q2_K for one token, a whole tile in qs-chunk order: each 32-byte weight vector is loaded
/// once per pass for the two Q8A blocks whose 2-bit fields a pass takes (block 4c + j at bits
/// 2j, 2j + 1), each block's two scale groups summed in chains of their own. A field is only
/// masked, not shifted down ([`field_shift`]), so its sums come out exactly `4^s` times too
/// large (|isum| < 2^18, times 64 fits i32) and one arithmetic shift gives them back. Then per
/// block [`k16_tokens`]' f32 steps in block order: the same integers and the same f32 sequence
/// per half, so the same bits. Why: [`k16_one`] a block at a time, eight times per tile, let LLVM
/// load each vector once for all four of its blocks and hold the results across them (240
/// stack accesses among a tile's 1108 instructions). Kernel-bench from DRAM, one thread,
/// alternating runs: AVX-VNNI 14.9-15.6 -> 19.1-19.8 GB/s of weights, AVX2 13.1-13.5 ->
/// 17.3-17.6 (all four blocks in one pass: AVX-VNNI 18.3-19.0, AVX2 unchanged).
#[inline(always)]
unsafe fn q2k_one_tile<V: Dots>(
    p: *const u8,
    ahead: *const u8,
    xb: *const BlockQ8A,
    sd: &mut [__m256; 2],
    sm: &mut [__m256; 2],
) {
    // SAFETY: every read below is inside the tile at `p` or the tile's 8 activation blocks at
    // `xb` (the caller's); the prefetches never fault; AVX2, FMA and F16C present (module doc).
    unsafe {
        for c in 0..2 {
            for h in 0..2 {
                prefetch(
                    ahead.wrapping_add((4 * c + 2 * h) * K2_BYTES / 8),
                    K2_BYTES / 4,
                );
                // Chains [j][s]: block 4c + j, scale group 2(4c + j) + s; blocks in two passes
                // of two (four chains each, and the i16 pair sums of `maddubs` beside them).
                let mut s32 = [[_mm256_setzero_si256(); 2]; 4];
                for pass in 0..2 {
                    let mut s16 = [[_mm256_setzero_si256(); 2]; 2];
                    for k in 0..8 {
                        let v = _mm256_loadu_si256(
                            p.add(K2_QS + 512 * c + 64 * k + 32 * h) as *const __m256i
                        );
                        let v = if !V::WIDE_BYTES && pass == 1 {
                            _mm256_srli_epi16(v, 4)
                        } else {
                            v
                        };
                        for i in 0..2 {
                            let j = 2 * pass + i;
                            let q = (*xb.add(4 * c + j)).qs.as_ptr() as *const i32;
                            let x = _mm256_set1_epi32(q.add(k).read_unaligned());
                            let m = (3u8 << (2 * field_shift::<V>(j))) as i8;
                            let w = _mm256_and_si256(v, _mm256_set1_epi8(m));
                            let (s32, s16) = (&mut s32[j][k / 4], &mut s16[i][k / 4]);
                            V::add(s32, s16, w, x, k % 4 == 0, k % 4 == 3);
                        }
                    }
                }
                for (j, s) in s32.iter().enumerate() {
                    let g = 4 * c + j;
                    let a = &*xb.add(g);
                    let v0 = plane_u8(p.add(K2_SC + ROWS * (2 * g) + 8 * h));
                    let v1 = plane_u8(p.add(K2_SC + ROWS * (2 * g + 1) + 8 * h));
                    let m4 = _mm256_set1_epi32(0xF);
                    let isum = _mm256_add_epi32(
                        _mm256_mullo_epi32(_mm256_and_si256(v0, m4), s[0]),
                        _mm256_mullo_epi32(_mm256_and_si256(v1, m4), s[1]),
                    );
                    let isum = match field_shift::<V>(j) {
                        0 => isum,
                        1 => _mm256_srai_epi32::<2>(isum),
                        2 => _mm256_srai_epi32::<4>(isum),
                        _ => _mm256_srai_epi32::<6>(isum),
                    };
                    let dx = _mm256_set1_ps(a.d);
                    sd[h] = _mm256_add_ps(sd[h], _mm256_mul_ps(dx, _mm256_cvtepi32_ps(isum)));
                    let mins = _mm256_or_si256(
                        _mm256_srli_epi32(v0, 4),
                        _mm256_slli_epi32(_mm256_srli_epi32(v1, 4), 16),
                    );
                    let sums = (a.sums.as_ptr() as *const i32).read_unaligned();
                    let msum = _mm256_madd_epi16(mins, _mm256_set1_epi32(sums));
                    sm[h] = _mm256_add_ps(sm[h], _mm256_mul_ps(dx, _mm256_cvtepi32_ps(msum)));
                }
            }
        }
    }
}

/// Tokens `t0..t0 + P` of [`k16_block`].
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
#[inline(always)]
unsafe fn k16_tokens<V: Dots, K: K16, const G: usize, const P: usize, const T: usize>(
    t0: usize,
    w: &Wv,
    sc: &[[(__m256i, __m256i); 2]; 2],
    mins: &[__m256i; 2],
    xb: &[*const BlockQ8A; T],
    sd: &mut [[__m256; 2]; T],
    sm: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut a = [&*xb[t0].add(G); P];
        for (k, a) in a.iter_mut().enumerate() {
            *a = &*xb[t0 + k].add(G);
        }
        let i0 = dot_unsigned::<V, 0, 4, P>(4, w, a);
        let i1 = dot_unsigned::<V, 4, 4, P>(4, w, a);
        for k in 0..P {
            let dx = _mm256_set1_ps(a[k].d);
            let off = |j: usize| _mm256_set1_epi32(K::OFF * a[k].sums[j] as i32);
            for h in 0..2 {
                let isum = _mm256_add_epi32(
                    _mm256_mullo_epi32(sc[h][0].0, _mm256_sub_epi32(i0[k][h], off(0))),
                    _mm256_mullo_epi32(sc[h][1].0, _mm256_sub_epi32(i1[k][h], off(1))),
                );
                let (sd, sm) = (&mut sd[t0 + k][h], &mut sm[t0 + k][h]);
                *sd = _mm256_add_ps(*sd, _mm256_mul_ps(dx, _mm256_cvtepi32_ps(isum)));
                if K::DMIN.is_some() {
                    let sums = (a[k].sums.as_ptr() as *const i32).read_unaligned();
                    let msum = _mm256_madd_epi16(mins[h], _mm256_set1_epi32(sums));
                    *sm = _mm256_add_ps(*sm, _mm256_mul_ps(dx, _mm256_cvtepi32_ps(msum)));
                }
            }
        }
    }
}

/// The Q3_K / Q2_K kernel: [`k16_block`] over a tile's 8 blocks, then once per tile
/// `acc + d * sd` (Q3_K) or `acc + (d * sd - dmin * sm)` (Q2_K).
struct Sixteen<K, V>(PhantomData<(K, V)>);

impl<K: K16, V: Dots> Kernel for Sixteen<K, V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let nt = tiles.len() / K::BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            let mut pre = [0u8; 256];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K::BYTES);
                let ahead = p.wrapping_add(if T == 1 { K16_AHEAD_ONE } else { AHEAD } * K::BYTES);
                touch_page(p, K::BYTES);
                let mut xb = [std::ptr::null::<BlockQ8A>(); T];
                for (xb, x) in xb.iter_mut().zip(x) {
                    *xb = x.as_ptr().add(8 * b);
                }
                let mut sd = [[_mm256_setzero_ps(); 2]; T];
                let mut sm = [[_mm256_setzero_ps(); 2]; T];
                let whole =
                    T == 1 && K::one_token_tile::<V>(p, ahead, xb[0], &mut sd[0], &mut sm[0]);
                if !whole {
                    K::prepare(p, &mut pre);
                    k16_block::<V, K, 0, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 1, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 2, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 3, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 4, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 5, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 6, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                    k16_block::<V, K, 7, T>(p, &pre, ahead, &xb, &mut sd, &mut sm);
                }
                let d = scales16(p);
                let dmin = match K::DMIN {
                    Some(at) => scales16(p.add(at)),
                    None => d,
                };
                for t in 0..T {
                    for h in 0..2 {
                        let v = if K::DMIN.is_some() {
                            _mm256_sub_ps(
                                _mm256_mul_ps(d[h], sd[t][h]),
                                _mm256_mul_ps(dmin[h], sm[t][h]),
                            )
                        } else {
                            _mm256_mul_ps(d[h], sd[t][h])
                        };
                        acc[t][h] = _mm256_add_ps(acc[t][h], v);
                    }
                }
            }
            rows_out(&acc)
        }
    }
}

/// IQ4_XS tiles: per sub-block s, the signed table values (IQ4_NL's [`Signed`] lookup) dotted
/// with the sign trick, the half's `d * (ls - 32)`, then per token the canonical step.
struct IQ4XS<V>(PhantomData<V>);

/// Sub-block `S` of an IQ4_XS tile at `p` for `T` tokens.
#[allow(clippy::needless_range_loop)] // indices into several arrays at once
#[inline(always)]
unsafe fn iq4xs_sub<V: Dots, const S: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    d: &[__m256; 2],
    xb: &[*const BlockQ8A; T],
    acc: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        prefetch(ahead.wrapping_add(S * KX_BYTES / 8), KX_BYTES / 8);
        let mut dsc = [_mm256_setzero_ps(); 2];
        for h in 0..2 {
            let lo = plane_u8(p.add(KX_SL + ROWS * (S / 2) + 8 * h));
            let lo = if S.is_multiple_of(2) {
                _mm256_and_si256(lo, _mm256_set1_epi32(0xF))
            } else {
                _mm256_srli_epi32(lo, 4)
            };
            let hi = plane_u8(p.add(KX_SH + ROWS * (S / 4) + 8 * h));
            let hi = _mm256_and_si256(
                _mm256_srlv_epi32(hi, _mm256_set1_epi32(2 * (S % 4) as i32)),
                _mm256_set1_epi32(3),
            );
            let ls = _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4));
            let sc = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
            dsc[h] = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc));
        }
        // IQ4NL reads its nibbles D_BYTES past the pointer it is given.
        let qs = p.add(KX_QS + 256 * S - D_BYTES);
        if T == 1 {
            let a = &*xb[0].add(S);
            block_step(
                &mut acc[0],
                &dsc,
                Q8_0::dot8_fused::<V, IQ4NL>(qs, a),
                0,
                a.d,
            );
            return;
        }
        let w = Q8_0::unpack8::<V, IQ4NL>(qs);
        let mut t = 0;
        while t + 2 <= T {
            let a = [&*xb[t].add(S), &*xb[t + 1].add(S)];
            let s = Q8_0::dot8::<V, _>(&w, a);
            for k in 0..2 {
                block_step(&mut acc[t + k], &dsc, s[k], 0, a[k].d);
            }
            t += 2;
        }
        if t < T {
            let a = &*xb[t].add(S);
            block_step(&mut acc[t], &dsc, Q8_0::dot8::<V, _>(&w, [a])[0], 0, a.d);
        }
    }
}

impl<V: Dots> Kernel for IQ4XS<V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let nt = tiles.len() / KX_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * KX_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * KX_BYTES);
                touch_page(p, KX_BYTES);
                let d = scales16(p.add(KX_D));
                let mut xb = [std::ptr::null::<BlockQ8A>(); T];
                for (xb, x) in xb.iter_mut().zip(x) {
                    *xb = x.as_ptr().add(8 * b);
                }
                iq4xs_sub::<V, 0, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 1, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 2, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 3, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 4, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 5, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 6, T>(p, ahead, &d, &xb, &mut acc);
                iq4xs_sub::<V, 7, T>(p, ahead, &d, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

/// Q6_K tiles: per Q8A block `4n + k` of the super-block, 8 vectors per half of 6-bit quants
/// (a nibble of ql granules `16n + 8(k & 1) + g` joined with 2 bits of qh granules `8n + g`),
/// the two 16-element groups' `d * sc`, then per token two half dots, each corrected for the
/// offset 32 and scaled by one FMA.
struct Q6K<V>(PhantomData<V>);

/// Q8A block `4 * N + K` of a Q6_K tile at `p` for `T` tokens (`xb`: each token's 8 blocks of
/// this super-block).
#[inline(always)]
unsafe fn q6k_block<V: Dots, const N: usize, const K: usize, const T: usize>(
    p: *const u8,
    ahead: *const u8,
    d: &[__m256; 2],
    xb: &[*const BlockQ8A; T],
    acc: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let qb = 4 * N + K;
        prefetch(ahead.wrapping_add(qb * K6_BYTES / 8), K6_BYTES / 8);
        // dsc[e][h]: scale group 2qb + e, rows of half h.
        let mut dsc = [[_mm256_setzero_ps(); 2]; 2];
        for (e, de) in dsc.iter_mut().enumerate() {
            for (h, v) in de.iter_mut().enumerate() {
                let sc = plane_i8(p.add(K6_SC + ROWS * (2 * qb + e) + 8 * h));
                *v = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc));
            }
        }
        let ql = p.add(k6_ql(2 * N + (K & 1)));
        let qh = p.add(k6_qh(N));
        let mut w: Wv = [[_mm256_setzero_si256(); 8]; 2];
        for (h, wh) in w.iter_mut().enumerate() {
            for (g, v) in wh.iter_mut().enumerate() {
                *v = q6k_vector::<K>(ql, qh, h, g);
            }
        }
        let mut t = 0;
        while t + 2 <= T {
            q6k_tokens::<V, 2, T>(t, qb, &w, &dsc, xb, acc);
            t += 2;
        }
        if t < T {
            q6k_tokens::<V, 1, T>(t, qb, &w, &dsc, xb, acc);
        }
    }
}

/// Q6_K for one token, half `N` of a tile (Q8A blocks 4N..4N + 4) in granule order: each
/// `qh` granule vector is loaded once for its four blocks and each `ql` one for its two
/// (low and high nibbles), the 8 chains (block, scale group) of one half of the rows summed
/// side by side; then per block and scale group [`q6k_tokens`]' steps in block order (the
/// same integers, the same f32 sequence per half, so the same bits). Why: a block at a time
/// each vector was loaded and shifted for each of its blocks, from cache 21-23 GB/s of
/// weights (AVX2) and 25 (AVX-VNNI), now 27 and 28 (kernel-bench, one thread, alternating).
#[inline(always)]
unsafe fn q6k_one_half<V: Dots, const N: usize>(
    p: *const u8,
    ahead: *const u8,
    d: &[__m256; 2],
    xb: *const BlockQ8A,
    acc: &mut [__m256; 2],
) {
    // SAFETY: every read below is inside the tile at `p` or the tile's 8 activation blocks at
    // `xb` (the caller's); the prefetches never fault; AVX2, FMA and F16C present (module doc).
    unsafe {
        let (ql0, ql1, qh) = (
            p.add(k6_ql(2 * N)),
            p.add(k6_ql(2 * N + 1)),
            p.add(k6_qh(N)),
        );
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        for h in 0..2 {
            prefetch(
                ahead.wrapping_add((4 * N + 2 * h) * K6_BYTES / 8),
                K6_BYTES / 4,
            );
            // Chains [K][e]: block 4N + K, scale group 2(4N + K) + e.
            let mut s32 = [[_mm256_setzero_si256(); 2]; 4];
            let mut s16 = [[_mm256_setzero_si256(); 2]; 4];
            for g in 0..8 {
                let at = 64 * g + 32 * h;
                let l0 = _mm256_loadu_si256(ql0.add(at) as *const __m256i);
                let l1 = _mm256_loadu_si256(ql1.add(at) as *const __m256i);
                let hb = _mm256_loadu_si256(qh.add(at) as *const __m256i);
                // As [`q6k_vector`] for K = 0..4.
                let w = [
                    (l0, _mm256_slli_epi16(hb, 4)),
                    (l1, _mm256_slli_epi16(hb, 2)),
                    (_mm256_srli_epi16(l0, 4), hb),
                    (_mm256_srli_epi16(l1, 4), _mm256_srli_epi16(hb, 2)),
                ];
                for (k, (l, hi)) in w.into_iter().enumerate() {
                    let w = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(hi, m30));
                    let q = (*xb.add(4 * N + k)).qs.as_ptr() as *const i32;
                    let x = _mm256_set1_epi32(q.add(g).read_unaligned());
                    let (s32, s16) = (&mut s32[k][g / 4], &mut s16[k][g / 4]);
                    V::add(s32, s16, w, x, g % 2 == 0, g % 2 == 1);
                }
            }
            for (k, i) in s32.iter().enumerate() {
                let qb = 4 * N + k;
                let a = &*xb.add(qb);
                let xd = _mm256_set1_ps(a.d);
                for (e, i) in i.iter().enumerate() {
                    let sc = plane_i8(p.add(K6_SC + ROWS * (2 * qb + e) + 8 * h));
                    let dsc = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(sc));
                    let corr = _mm256_set1_epi32(32 * a.sums[e] as i32);
                    let s = _mm256_sub_epi32(*i, corr);
                    let tmp = _mm256_mul_ps(_mm256_cvtepi32_ps(s), xd);
                    acc[h] = _mm256_fmadd_ps(dsc, tmp, acc[h]);
                }
            }
        }
    }
}

/// Weight vector `[h][g]` of Q8A block `4n + K` of a Q6_K tile (`ql`, `qh`: its granules).
#[inline(always)]
unsafe fn q6k_vector<const K: usize>(ql: *const u8, qh: *const u8, h: usize, g: usize) -> __m256i {
    // SAFETY: every read below is inside the tile at the caller's pointers (this function's
    // contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let l = _mm256_loadu_si256(ql.add(64 * g + 32 * h) as *const __m256i);
        let l = if K >= 2 { _mm256_srli_epi16(l, 4) } else { l };
        let hb = _mm256_loadu_si256(qh.add(64 * g + 32 * h) as *const __m256i);
        // Bits 2K, 2K + 1 of each qh byte to bits 4, 5 (the 16-bit shifts only move bits
        // that the 0x30 mask drops across byte edges).
        let hb = match K {
            0 => _mm256_slli_epi16(hb, 4),
            1 => _mm256_slli_epi16(hb, 2),
            2 => hb,
            _ => _mm256_srli_epi16(hb, 2),
        };
        _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(hb, m30))
    }
}

/// Tokens `t0..t0 + P` of [`q6k_block`]: two half dots, each corrected for the offset 32 and
/// scaled by one FMA, halves in order.
#[inline(always)]
unsafe fn q6k_tokens<V: Dots, const P: usize, const T: usize>(
    t0: usize,
    qb: usize,
    w: &Wv,
    dsc: &[[__m256; 2]; 2],
    xb: &[*const BlockQ8A; T],
    acc: &mut [[__m256; 2]; T],
) {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mut a = [&*xb[t0].add(qb); P];
        for (k, a) in a.iter_mut().enumerate() {
            *a = &*xb[t0 + k].add(qb);
        }
        let i = [
            dot_unsigned::<V, 0, 4, P>(2, w, a),
            dot_unsigned::<V, 4, 4, P>(2, w, a),
        ];
        for k in 0..P {
            let xd = _mm256_set1_ps(a[k].d);
            let acc = &mut acc[t0 + k];
            for (e, i) in i.iter().enumerate() {
                let corr = _mm256_set1_epi32(32 * a[k].sums[e] as i32);
                for h in 0..2 {
                    let s = _mm256_sub_epi32(i[k][h], corr);
                    let tmp = _mm256_mul_ps(_mm256_cvtepi32_ps(s), xd);
                    acc[h] = _mm256_fmadd_ps(dsc[e][h], tmp, acc[h]);
                }
            }
        }
    }
}

impl<V: Dots> Kernel for Q6K<V> {
    #[inline(always)]
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
        // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths
        // are checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
        unsafe {
            let nt = tiles.len() / K6_BYTES;
            assert!(x.iter().all(|x| x.len() >= 8 * nt));
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nt {
                let p = tiles.as_ptr().add(b * K6_BYTES);
                let ahead = p.wrapping_add(if T == 1 { AHEAD_ONE } else { AHEAD } * K6_BYTES);
                touch_page(p, K6_BYTES);
                let d = scales16(p.add(K6_D));
                let mut xb = [std::ptr::null::<BlockQ8A>(); T];
                for (xb, x) in xb.iter_mut().zip(x) {
                    *xb = x.as_ptr().add(8 * b);
                }
                if T == 1 {
                    q6k_one_half::<V, 0>(p, ahead, &d, xb[0], &mut acc[0]);
                    q6k_one_half::<V, 1>(p, ahead, &d, xb[0], &mut acc[0]);
                    continue;
                }
                q6k_block::<V, 0, 0, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 0, 1, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 0, 2, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 0, 3, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 1, 0, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 1, 1, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 1, 2, T>(p, ahead, &d, &xb, &mut acc);
                q6k_block::<V, 1, 3, T>(p, ahead, &d, &xb, &mut acc);
            }
            rows_out(&acc)
        }
    }
}

/// One flavour's `$name()`: every type's kernel with the products of `$v`, compiled for `$feat`.
macro_rules! avx2_kernels {
    ($name:ident, $feat:literal, $isa:ident, $v:ty) => {
        rows16_kernels!(
            $name,
            $feat,
            $isa,
            Q4_0 => Blocks<Q4_0, $v>,
            Q4_1 => Blocks<Q4_1, $v>,
            Q5_0 => Blocks<Q5_0, $v>,
            Q5_1 => Blocks<Q5_1, $v>,
            Q8_0 => Eight<Q8_0, $v>,
            IQ4_NL => Eight<IQ4NL, $v>,
            MXFP4 => Eight<MXFP4, $v>,
            Q2_K => Sixteen<Q2K, $v>,
            Q3_K => Sixteen<Q3K, $v>,
            Q4_K => Q4K<$v>,
            Q5_K => Q5K<$v>,
            Q6_K => Q6K<$v>,
            IQ4_XS => IQ4XS<$v>,
        );
    };
}

avx2_kernels!(kernels, "avx2,fma,f16c", Avx2, Maddubs);
avx2_kernels!(vnni_kernels, "avx2,fma,f16c,avxvnni", AvxVnni, Vnni);
