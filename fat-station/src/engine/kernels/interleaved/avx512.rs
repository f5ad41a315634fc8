//! AVX-512 VNNI kernels over [`super::Interleaved`] tiles: lane r of every register is row r.
//!
//! Per tile: 8 vectors of unsigned weight bytes (unpacked once for all tokens of the call),
//! then per token 8 `vpdpbusd` against broadcast dwords of the activation block, the exact
//! integer offset correction and one FMA into that token's 16-row accumulator. The sequence
//! per token is the same for any token count, so every token gets [`super::rows16_ref`]'s bits.
//!
//! Only [`kernels`] exposes these, and only after the caller checked
//! [`super::super::Isa::Avx512`] is available.

use super::super::blocks::BlockQ8A;
use super::{Rows16Dot, D_BYTES, Q5_HM, Q5_QS, ROWS};
use knot_format::dtype::DType;
use std::arch::x86_64::*;

/// The 16-row kernels by type (callers must have checked `Isa::Avx512.available()`).
pub(in super::super) fn kernels() -> Vec<(DType, Rows16Dot)> {
    vec![
        (DType::Q4_0, rows16_q4_0 as Rows16Dot),
        (DType::Q5_0, rows16_q5_0 as Rows16Dot),
        (DType::Q8_0, rows16_q8_0 as Rows16Dot),
    ]
}

/// How one type's tile becomes 8 vectors of unsigned weight bytes.
trait Tile {
    const BYTES: usize;
    const OFF: i32;
    /// SAFETY (callers): `p` points at `BYTES` readable bytes and AVX-512 BW is enabled.
    unsafe fn unpack(p: *const u8) -> [__m512i; 8];
}

struct Q4_0;
struct Q5_0;
struct Q8_0;

/// The low and high nibbles of the 4 qs chunks: vectors 0..4 and 4..8.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> [__m512i; 8] {
    let m4 = _mm512_set1_epi8(0x0F);
    let mut w = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        let q = _mm512_loadu_si512(qs.add(64 * k) as *const _);
        w[k] = _mm512_and_si512(q, m4);
        w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
    w
}

impl Tile for Q4_0 {
    const BYTES: usize = 16 * 18;
    const OFF: i32 = 8;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        nibbles(p.add(D_BYTES))
    }
}

impl Tile for Q5_0 {
    const BYTES: usize = 16 * 22;
    const OFF: i32 = 16;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        let mut w = nibbles(p.add(Q5_QS));
        let c16 = _mm512_set1_epi8(16);
        for (g, v) in w.iter_mut().enumerate() {
            let m = (p.add(Q5_HM + 8 * g) as *const u64).read_unaligned();
            *v = _mm512_mask_add_epi8(*v, m, *v, c16);
        }
        w
    }
}

impl Tile for Q8_0 {
    const BYTES: usize = 16 * 34;
    const OFF: i32 = 128;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [__m512i; 8] {
        std::array::from_fn(|g| _mm512_loadu_si512(p.add(D_BYTES + 64 * g) as *const _))
    }
}

/// `T` activation rows against one group's tiles.
#[inline(always)]
unsafe fn rows16<L: Tile, const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T] {
    let nb = tiles.len() / L::BYTES;
    assert!(x.iter().all(|x| x.len() >= nb));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let p = tiles.as_ptr().add(b * L::BYTES);
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
        let w = L::unpack(p);
        for t in 0..T {
            let a = x[t].get_unchecked(b);
            let q = a.qs.as_ptr() as *const i32;
            // Two chains of four; integer sums are exact, so the split changes no bit.
            let mut s0 = _mm512_setzero_si512();
            let mut s1 = _mm512_setzero_si512();
            for g in (0..8).step_by(2) {
                s0 = _mm512_dpbusd_epi32(s0, w[g], _mm512_set1_epi32(q.add(g).read_unaligned()));
                s1 = _mm512_dpbusd_epi32(
                    s1,
                    w[g + 1],
                    _mm512_set1_epi32(q.add(g + 1).read_unaligned()),
                );
            }
            let corr = L::OFF * (a.sums[0] as i32 + a.sums[1] as i32);
            let isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(corr));
            let tmp = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a.d));
            acc[t] = _mm512_fmadd_ps(dw, tmp, acc[t]);
        }
    }
    let mut out = [[0f32; ROWS]; T];
    for t in 0..T {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// Tokens in chunks of 8, then 4, then 1 (each token's bits are independent of the chunk).
#[inline(always)]
unsafe fn rows16_any<L: Tile>(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
    assert_eq!(x.len(), out.len(), "rows16: one output per activation row");
    let mut t = 0;
    while t + 8 <= x.len() {
        let o = rows16::<L, 8>(tiles, std::array::from_fn(|i| x[t + i]));
        out[t..t + 8].copy_from_slice(&o);
        t += 8;
    }
    while t + 4 <= x.len() {
        let o = rows16::<L, 4>(tiles, std::array::from_fn(|i| x[t + i]));
        out[t..t + 4].copy_from_slice(&o);
        t += 4;
    }
    while t < x.len() {
        out[t] = rows16::<L, 1>(tiles, [x[t]])[0];
        t += 1;
    }
}

macro_rules! entry {
    ($name:ident, $imp:ident, $tile:ty) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
        unsafe fn $imp(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            rows16_any::<$tile>(tiles, x, out)
        }
        fn $name(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
            // SAFETY: only reachable through `kernels`, used after `Isa::Avx512.available()`
            // confirmed avx512f/bw/vl/dq/vnni, avx2, fma and f16c; `rows16` bounds-checks the
            // activation rows against the tile count and reads only whole tiles.
            unsafe { $imp(tiles, x, out) }
        }
    };
}

entry!(rows16_q4_0, imp_q4_0, Q4_0);
entry!(rows16_q5_0, imp_q5_0, Q5_0);
entry!(rows16_q8_0, imp_q8_0, Q8_0);
