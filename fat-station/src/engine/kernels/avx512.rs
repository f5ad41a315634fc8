//! AVX-512 (F, BW, VL, DQ) + VNNI kernels (x86_64), same names and results as
//! [`super::reference`]; installed over the AVX2 table where the CPU has them.
//!
//! Two 32-element activation blocks fill one 512-bit register, so each `vpdpbusd` does the
//! u8 x i8 products of 64 weights straight into i32 lanes (no i16 saturation step); each lane
//! group of 8 is then scaled by its block's `d_w * d_x` with one f32 FMA. Signed weights
//! (Q8_0) use the sign trick; offset formats (`q - 8`, `q - 16`) use unsigned products and
//! subtract the offset through the activation block's `s = d_x * sum(q_x)`.
//!
//! Only [`install`] exposes these kernels, and only after the caller checked
//! [`super::Isa::Avx512`] is available; the `unsafe fn`s below must not be reached otherwise.

use super::blocks::*;
use super::{Dot, DotQ, DotQToks4};
use bytemuck::Pod;
use knot_format::dtype::DType;
use std::arch::x86_64::*;

/// Replace entries of `table` with AVX-512 kernels.
///
/// Callers must have checked `Isa::Avx512.available()`.
pub(super) fn install(table: &mut [Dot; 13]) {
    for (dtype, dot) in kernels() {
        table[super::dtype_index(dtype)] = dot;
    }
}

/// Install the AVX-512 4-token kernels (same precondition as [`install`]).
pub(super) fn install_toks4(toks4: &mut [Option<DotQToks4>; 13]) {
    for (dtype, t) in toks4_kernels() {
        toks4[super::dtype_index(dtype)] = Some(t);
    }
}

/// The AVX-512 4-token kernels by type; each agrees bit for bit with [`kernels`]' dot.
pub(super) fn toks4_kernels() -> Vec<(DType, DotQToks4)> {
    vec![
        (DType::Q4_0, tile_toks4_q4_0 as DotQToks4),
        (DType::Q4_1, tile_toks4_q4_1 as DotQToks4),
        (DType::Q5_0, tile_toks4_q5_0 as DotQToks4),
        (DType::Q5_1, tile_toks4_q5_1 as DotQToks4),
        (DType::Q8_0, tile_toks4_q8_0 as DotQToks4),
        (DType::Q4_K, tile_toks4_q4_k as DotQToks4),
        (DType::Q5_K, tile_toks4_q5_k as DotQToks4),
        (DType::Q6_K, tile_toks4_q6_k as DotQToks4),
    ]
}

/// The AVX-512 kernels by type (types not listed keep the AVX2 or scalar kernel).
pub(super) fn kernels() -> Vec<(DType, Dot)> {
    vec![
        (DType::Q4_0, Dot::Quant(vec_dot_q4_0_q8a as DotQ)),
        (DType::Q4_1, Dot::Quant(vec_dot_q4_1_q8a as DotQ)),
        (DType::Q5_0, Dot::Quant(vec_dot_q5_0_q8a as DotQ)),
        (DType::Q5_1, Dot::Quant(vec_dot_q5_1_q8a as DotQ)),
        (DType::Q8_0, Dot::Quant(vec_dot_q8_0_q8a as DotQ)),
        (DType::Q4_K, Dot::Quant(vec_dot_q4_k_q8a as DotQ)),
        (DType::Q5_K, Dot::Quant(vec_dot_q5_k_q8a as DotQ)),
        (DType::Q6_K, Dot::Quant(vec_dot_q6_k_q8a as DotQ)),
    ]
}

macro_rules! entry {
    ($name:ident, $imp:ident) => {
        fn $name(w: &[u8], x: &[BlockQ8A]) -> f32 {
            // SAFETY: only reachable through `install`/`kernels`, used after
            // `Isa::Avx512.available()` confirmed avx512f/bw/vl/dq/vnni, avx2, fma and f16c.
            unsafe { $imp(w, x) }
        }
    };
}

entry!(vec_dot_q4_0_q8a, dot_q4_0);
entry!(vec_dot_q4_1_q8a, dot_q4_1);
entry!(vec_dot_q5_0_q8a, dot_q5_0);
entry!(vec_dot_q5_1_q8a, dot_q5_1);
entry!(vec_dot_q8_0_q8a, dot_q8_0);
entry!(vec_dot_q4_k_q8a, dot_q4_k);
entry!(vec_dot_q5_k_q8a, dot_q5_k);
entry!(vec_dot_q6_k_q8a, dot_q6_k);

macro_rules! toks4_entry {
    ($name:ident, $imp:ident) => {
        fn $name(w: &[u8], x: [&[BlockQ8A]; 4]) -> [f32; 4] {
            // SAFETY: as for `entry!`: only handed out after `Isa::Avx512.available()`.
            unsafe { $imp(w, x) }
        }
    };
}

toks4_entry!(tile_toks4_q4_0, toks4_q4_0);
toks4_entry!(tile_toks4_q4_1, toks4_q4_1);
toks4_entry!(tile_toks4_q5_0, toks4_q5_0);
toks4_entry!(tile_toks4_q5_1, toks4_q5_1);
toks4_entry!(tile_toks4_q8_0, toks4_q8_0);
toks4_entry!(tile_toks4_q4_k, toks4_q4_k);
toks4_entry!(tile_toks4_q5_k, toks4_q5_k);
toks4_entry!(tile_toks4_q6_k, toks4_q6_k);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn f16c(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(
        _mm_cvtsi32_si128(u16::from_le_bytes(b) as i32),
    ))
}

/// The quants of two activation blocks in one register.
#[inline(always)]
unsafe fn ld2(a0: &BlockQ8A, a1: &BlockQ8A) -> __m512i {
    let lo = _mm256_loadu_si256(a0.qs.as_ptr() as *const __m256i);
    let hi = _mm256_loadu_si256(a1.qs.as_ptr() as *const __m256i);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `f0` in lanes 0..8, `f1` in lanes 8..16.
#[inline(always)]
unsafe fn fv(f0: f32, f1: f32) -> __m512 {
    _mm512_insertf32x8(_mm512_set1_ps(f0), _mm256_set1_ps(f1), 1)
}

/// The nibbles of two legacy blocks (16 bytes each) in element order: block 0's low then high
/// nibbles in bytes 0..32, block 1's in 32..64.
#[inline(always)]
unsafe fn nibbles_2x32(p0: *const u8, p1: *const u8) -> __m512i {
    let y = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)),
        _mm_loadu_si128(p1 as *const __m128i),
        1,
    );
    // [A, B, A >> 4, B >> 4] -> [A, A >> 4, B, B >> 4]
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(y), _mm256_srli_epi16(y, 4), 1);
    let z = _mm512_shuffle_i64x2(z, z, 0b11_01_10_00);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

#[inline(always)]
unsafe fn dpbusd(a: __m512i, b: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b)
}

// ---------------------------------------------------------------------------------------------
// Legacy quants (32-element blocks): one generic tile kernel
// ---------------------------------------------------------------------------------------------

/// Add 16 to the bytes whose bit is set in `qh0` (bytes 0..32) / `qh1` (32..64).
#[inline(always)]
unsafe fn add_high_bits(q: __m512i, qh0: [u8; 4], qh1: [u8; 4]) -> __m512i {
    let m = u32::from_le_bytes(qh0) as u64 | (u32::from_le_bytes(qh1) as u64) << 32;
    _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16))
}

/// Loop over pairs of legacy blocks with two accumulators, for `T` activation rows at once.
/// `unpack(b0, b1)` prepares a pair of weight blocks (once for all `T` rows); `dot(u, a0, a1)`
/// returns the i32 lanes of their products with one activation row's pair, the two f32
/// factors and the two scalar extra terms.
///
/// Each activation row gets its own accumulators and exactly the instruction sequence of
/// `T = 1`, so the `T`-row kernel has the bits of `T` single dots (prefill = token by token).
#[inline(always)]
unsafe fn legacy_pairs<B: Pod, U, const T: usize>(
    w: &[u8],
    x: [&[BlockQ8A]; T],
    unpack: impl Fn(&B, &B) -> U,
    dot: impl Fn(&U, &BlockQ8A, &BlockQ8A) -> (__m512i, f32, f32, f32, f32),
) -> [f32; T] {
    let w: &[B] = bytemuck::cast_slice(w);
    let n = w.len();
    assert!(x.iter().all(|x| x.len() >= n));
    // Two accumulators per row in registers (pairs alternate between them): no dependency
    // chain through memory, and a fixed association order for every row of the same length.
    let mut acc0 = [_mm512_setzero_ps(); T];
    let mut acc1 = [_mm512_setzero_ps(); T];
    let mut extra = [0f32; T];
    let mut i = 0;
    while i + 4 <= n {
        let u = unpack(w.get_unchecked(i), w.get_unchecked(i + 1));
        let v = unpack(w.get_unchecked(i + 2), w.get_unchecked(i + 3));
        for t in 0..T {
            let x = x[t];
            let (p, f0, f1, e0, e1) = dot(&u, x.get_unchecked(i), x.get_unchecked(i + 1));
            let (q, g0, g1, h0, h1) = dot(&v, x.get_unchecked(i + 2), x.get_unchecked(i + 3));
            acc0[t] = _mm512_fmadd_ps(fv(f0, f1), _mm512_cvtepi32_ps(p), acc0[t]);
            acc1[t] = _mm512_fmadd_ps(fv(g0, g1), _mm512_cvtepi32_ps(q), acc1[t]);
            extra[t] += (e0 + e1) + (h0 + h1);
        }
        i += 4;
    }
    if i + 2 <= n {
        let u = unpack(w.get_unchecked(i), w.get_unchecked(i + 1));
        for t in 0..T {
            let x = x[t];
            let (p, f0, f1, e0, e1) = dot(&u, x.get_unchecked(i), x.get_unchecked(i + 1));
            acc0[t] = _mm512_fmadd_ps(fv(f0, f1), _mm512_cvtepi32_ps(p), acc0[t]);
            extra[t] += e0 + e1;
        }
        i += 2;
    }
    if i < n {
        // Odd tail: pair the last block with itself and weight the copy by zero.
        let b = w.get_unchecked(i);
        let u = unpack(b, b);
        for t in 0..T {
            let a = x[t].get_unchecked(i);
            let (p, f0, _, e0, _) = dot(&u, a, a);
            acc0[t] = _mm512_fmadd_ps(fv(f0, 0.0), _mm512_cvtepi32_ps(p), acc0[t]);
            extra[t] += e0;
        }
    }
    std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + extra[t])
}

// ---------------------------------------------------------------------------------------------
// Legacy quants
// ---------------------------------------------------------------------------------------------

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q4_0_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    legacy_pairs(
        w,
        x,
        |b0: &BlockQ4_0, b1: &BlockQ4_0| {
            let q = nibbles_2x32(b0.qs.as_ptr(), b1.qs.as_ptr());
            (q, f16c(b0.d), f16c(b1.d))
        },
        |&(q, d0, d1), a0, a1| {
            let p = dpbusd(q, ld2(a0, a1));
            (p, d0 * a0.d, d1 * a1.d, -8.0 * d0 * a0.s, -8.0 * d1 * a1.s)
        },
    )
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q4_1_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    legacy_pairs(
        w,
        x,
        |b0: &BlockQ4_1, b1: &BlockQ4_1| {
            let q = nibbles_2x32(b0.qs.as_ptr(), b1.qs.as_ptr());
            (q, [f16c(b0.d), f16c(b1.d), f16c(b0.m), f16c(b1.m)])
        },
        |&(q, [d0, d1, m0, m1]), a0, a1| {
            let p = dpbusd(q, ld2(a0, a1));
            (p, d0 * a0.d, d1 * a1.d, m0 * a0.s, m1 * a1.s)
        },
    )
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q5_0_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    legacy_pairs(
        w,
        x,
        |b0: &BlockQ5_0, b1: &BlockQ5_0| {
            let q = add_high_bits(nibbles_2x32(b0.qs.as_ptr(), b1.qs.as_ptr()), b0.qh, b1.qh);
            (q, f16c(b0.d), f16c(b1.d))
        },
        |&(q, d0, d1), a0, a1| {
            let p = dpbusd(q, ld2(a0, a1));
            (
                p,
                d0 * a0.d,
                d1 * a1.d,
                -16.0 * d0 * a0.s,
                -16.0 * d1 * a1.s,
            )
        },
    )
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q5_1_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    legacy_pairs(
        w,
        x,
        |b0: &BlockQ5_1, b1: &BlockQ5_1| {
            let q = add_high_bits(nibbles_2x32(b0.qs.as_ptr(), b1.qs.as_ptr()), b0.qh, b1.qh);
            (q, [f16c(b0.d), f16c(b1.d), f16c(b0.m), f16c(b1.m)])
        },
        |&(q, [d0, d1, m0, m1]), a0, a1| {
            let p = dpbusd(q, ld2(a0, a1));
            (p, d0 * a0.d, d1 * a1.d, m0 * a0.s, m1 * a1.s)
        },
    )
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    legacy_pairs(
        w,
        x,
        |b0: &BlockQ8_0, b1: &BlockQ8_0| {
            let q0 = _mm256_loadu_si256(b0.qs.as_ptr() as *const __m256i);
            let q1 = _mm256_loadu_si256(b1.qs.as_ptr() as *const __m256i);
            let q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
            (
                _mm512_abs_epi8(q),
                _mm512_movepi8_mask(q),
                f16c(b0.d),
                f16c(b1.d),
            )
        },
        |&(qa, neg, d0, d1), a0, a1| {
            let xv = ld2(a0, a1);
            // Sign trick: |w| * (x * sign(w)); -128 becomes 128 as u8, still exact.
            let sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
            (dpbusd(qa, sx), d0 * a0.d, d1 * a1.d, 0.0, 0.0)
        },
    )
}

/// The table's single dot and the 4-token tile of a legacy format.
macro_rules! legacy_kernels {
    ($n:ident, $one:ident, $toks4:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
        unsafe fn $one(w: &[u8], x: &[BlockQ8A]) -> f32 {
            $n::<1>(w, [x])[0]
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
        unsafe fn $toks4(w: &[u8], x: [&[BlockQ8A]; 4]) -> [f32; 4] {
            $n::<4>(w, x)
        }
    };
}

legacy_kernels!(q4_0_n, dot_q4_0, toks4_q4_0);
legacy_kernels!(q4_1_n, dot_q4_1, toks4_q4_1);
legacy_kernels!(q5_0_n, dot_q5_0, toks4_q5_0);
legacy_kernels!(q5_1_n, dot_q5_1, toks4_q5_1);
legacy_kernels!(q8_0_n, dot_q8_0, toks4_q8_0);

// ---------------------------------------------------------------------------------------------
// k-quants (256-element super-blocks): tile kernels generic over the token count
// ---------------------------------------------------------------------------------------------

/// `xa[0].d` in lanes 0..8 and `xa[1].d` in lanes 8..16 with one load and one permute: the
/// 64 bytes from `xa[0]` end inside `xa[1]` (44-byte blocks, `d` first).
#[inline(always)]
unsafe fn dx2(xa: &[BlockQ8A]) -> __m512 {
    const _: () = assert!(std::mem::offset_of!(BlockQ8A, d) == 0 && size_of::<BlockQ8A>() == 44);
    assert!(xa.len() >= 2);
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 11, 11, 11, 11, 11, 11, 11, 11);
    _mm512_permutexvar_ps(idx, _mm512_loadu_ps(xa.as_ptr() as *const f32))
}

/// `$body` for `$t` = 0, 1, .., `$n - 1` (`$n` at most 4), written out: with constant
/// indices the per-row accumulator arrays stay in registers (a `for t in 0..T` loop over a
/// body this large is not unrolled, and its accumulators round-trip through the stack).
macro_rules! for_rows {
    ($n:expr, |$t:ident| $body:block) => {{
        const { assert!($n <= 4) };
        if $n > 0 {
            let $t = 0;
            $body
        }
        if $n > 1 {
            let $t = 1;
            $body
        }
        if $n > 2 {
            let $t = 2;
            $body
        }
        if $n > 3 {
            let $t = 3;
            $body
        }
    }};
}

/// Shared Q4_K / Q5_K body for `T` activation rows: `high(b, j, q)` adds the fifth bit to the
/// bytes of 64-chunk `j`. Each super-block's nibbles, high bits, scales and mins are unpacked
/// once for all `T` rows; each row then runs exactly the `T = 1` sequence of float operations
/// on its own accumulators (the mins term into 8 lanes, one per sub-block, then chunks 0..4
/// alternating between two accumulators), so every output has the bits of the single dot.
#[inline(always)]
unsafe fn k4_n<B: Pod, const T: usize>(
    w: &[u8],
    x: [&[BlockQ8A]; T],
    parts: impl Fn(&B) -> ([u8; 2], [u8; 2], &[u8; 12], *const u8),
    high: impl Fn(&B, usize, __m512i) -> __m512i,
) -> [f32; T] {
    let w: &[B] = bytemuck::cast_slice(w);
    assert!(x.iter().all(|x| x.len() >= w.len() * 8));
    let mask = _mm512_set1_epi8(0x0F);
    let mut acc0 = [_mm512_setzero_ps(); T];
    let mut acc1 = [_mm512_setzero_ps(); T];
    // Per row, lane k: sum over super-blocks of dmin * m_k * s (sub-block k's mins term).
    let mut mins = [_mm256_setzero_ps(); T];
    // Float offsets of `s` in 8 consecutive activation blocks (11 floats each).
    const _: () = assert!(std::mem::offset_of!(BlockQ8A, s) == 4 && size_of::<BlockQ8A>() == 44);
    let s_idx = _mm256_setr_epi32(1, 12, 23, 34, 45, 56, 67, 78);
    for (i, b) in w.iter().enumerate() {
        let (d, dmin, scales, qs) = parts(b);
        let (d, dmin) = (f16c(d), f16c(dmin));
        let (sc, mn) = super::avx2::scales_mins_k4(scales);
        // The 256 weights as u8 in element order, 64 per register (chunk j: sub-blocks 2j and
        // 2j + 1), and the per-sub-block factors d * sc.
        let z: [__m512i; 4] = std::array::from_fn(|j| {
            let q4 = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
            let z = _mm512_inserti64x4(_mm512_castsi256_si512(q4), _mm256_srli_epi16(q4, 4), 1);
            high(b, j, _mm512_and_si512(z, mask))
        });
        // (d * sc) * d_x lane for lane, as the single dot computes it.
        let dsc: [__m512; 4] =
            std::array::from_fn(|j| fv(d * sc[2 * j] as f32, d * sc[2 * j + 1] as f32));
        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            mn.as_ptr() as *const __m128i
        )));
        let dmn = _mm256_mul_ps(_mm256_set1_ps(dmin), mn);
        for_rows!(T, |t| {
            let xa = x[t].get_unchecked(8 * i..8 * i + 8);
            // The 8 blocks' `s`: floats 1 + 11k of `xa` (8 blocks, 88 floats), all in bounds.
            let s = _mm256_i32gather_ps::<4>(xa.as_ptr() as *const f32, s_idx);
            mins[t] = _mm256_fmadd_ps(dmn, s, mins[t]);
            for (j, &z) in z.iter().enumerate() {
                let (a0, a1) = (xa.get_unchecked(2 * j), xa.get_unchecked(2 * j + 1));
                let p = _mm512_cvtepi32_ps(dpbusd(z, ld2(a0, a1)));
                let f = _mm512_mul_ps(dsc[j], fv(a0.d, a1.d));
                if j & 1 == 0 {
                    acc0[t] = _mm512_fmadd_ps(f, p, acc0[t]);
                } else {
                    acc1[t] = _mm512_fmadd_ps(f, p, acc1[t]);
                }
            }
        });
    }
    std::array::from_fn(|t| {
        _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]))
            - _mm512_reduce_add_ps(_mm512_zextps256_ps512(mins[t]))
    })
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q4_k_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    k4_n(
        w,
        x,
        |b: &BlockQ4K| (b.d, b.dmin, &b.scales, b.qs.as_ptr()),
        |_, _, q| q,
    )
}

// Target features here too, so that the closures inside inherit them (and inline).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q5_k_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    k4_n(
        w,
        x,
        |b: &BlockQ5K| (b.d, b.dmin, &b.scales, b.qs.as_ptr()),
        |b, j, q| {
            let qh = _mm256_loadu_si256(b.qh.as_ptr() as *const __m256i);
            let m0 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << (2 * j)) as i8));
            let m1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8));
            let m = m0 as u64 | (m1 as u64) << 32;
            _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16))
        },
    )
}

/// Q6_K for `T` activation rows: each super-block's 6-bit quants and 16 scales are unpacked
/// once; each row runs the `T = 1` sequence (64-element chunks in order, alternating between
/// two accumulators) on its own accumulators.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q6_k_n<const T: usize>(w: &[u8], x: [&[BlockQ8A]; T]) -> [f32; T] {
    let w: &[BlockQ6K] = bytemuck::cast_slice(w);
    assert!(x.iter().all(|x| x.len() >= w.len() * 8));
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    let c32 = _mm512_set1_epi8(32);
    // Per-16-bit-lane shifts of qh: groups (0, 1) take bits 0-1 / 2-3, groups (2, 3) 4-5 / 6-7.
    let sh01 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    let sh23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    let mut acc0 = [_mm512_setzero_ps(); T];
    let mut acc1 = [_mm512_setzero_ps(); T];
    for (i, b) in w.iter().enumerate() {
        let d = f16c(b.d);
        let scales = _mm_loadu_si128(b.scales.as_ptr() as *const __m128i);
        // Chunk c = 2n + pair covers elements 64c..64c + 64 (activation blocks 2c, 2c + 1):
        // its quants as u8 (q + 32) and, per i32 lane (4 elements), d * its scale.
        let mut q = [_mm512_setzero_si512(); 4];
        for n in 0..2 {
            let ql = _mm512_loadu_si512(b.ql.as_ptr().add(64 * n) as *const _);
            let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * n) as *const __m256i);
            let qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
            let h01 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh01), m3), 4);
            let h23 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m3), 4);
            q[2 * n] = _mm512_or_si512(_mm512_and_si512(ql, m4), h01);
            q[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h23);
        }
        let sc: [__m512; 4] = std::array::from_fn(|c| {
            // Lane l covers elements 4l..4l+4: scale index 4c + l / 4.
            let s = 4 * c as i8;
            #[rustfmt::skip]
            let shuf = _mm_setr_epi8(
                s, s, s, s, s + 1, s + 1, s + 1, s + 1,
                s + 2, s + 2, s + 2, s + 2, s + 3, s + 3, s + 3, s + 3,
            );
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, shuf)));
            _mm512_mul_ps(sc, _mm512_set1_ps(d))
        });
        for_rows!(T, |t| {
            let xa = x[t].get_unchecked(8 * i..8 * i + 8);
            for c in 0..4 {
                let (a0, a1) = (xa.get_unchecked(2 * c), xa.get_unchecked(2 * c + 1));
                let xv = ld2(a0, a1);
                // sum (q - 32) q_x per i32 lane (4 elements), exact.
                let p = _mm512_sub_epi32(dpbusd(q[c], xv), dpbusd(c32, xv));
                let f = _mm512_mul_ps(sc[c], dx2(xa.get_unchecked(2 * c..)));
                if c & 1 == 0 {
                    acc0[t] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc0[t]);
                } else {
                    acc1[t] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc1[t]);
                }
            }
        });
    }
    std::array::from_fn(|t| _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])))
}

// The table's single dot (`T = 1`) and the 4-token tile of each k-quant.
legacy_kernels!(q4_k_n, dot_q4_k, toks4_q4_k);
legacy_kernels!(q5_k_n, dot_q5_k, toks4_q5_k);
legacy_kernels!(q6_k_n, dot_q6_k, toks4_q6_k);

// ---------------------------------------------------------------------------------------------
// Activation quantization
// ---------------------------------------------------------------------------------------------

/// [`super::reference::quantize_row_q8a`] with 16 activations per register, bit for bit (same
/// `d`, `s`, `sums` and `qs`, NaN and infinities included).
///
/// `roundf` (half away from zero) is built from exact steps, with no `+ 0.5` (which rounds
/// 0.49999997 up to 1): `t = trunc(y)`, then `y - t` is exact (Sterbenz for `|y| >= 1`, `t = 0`
/// below), and `t + sign(y)` where `|y - t| >= 0.5`.
///
/// # Safety
/// The CPU must have what [`super::Isa::Avx512`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quantize_row_q8a(x: &[f32], out: &mut [BlockQ8A]) {
    assert_eq!(x.len(), out.len() * 32, "quantize_row_q8a: length mismatch");
    let sign = _mm512_set1_ps(-0.0);
    let half = _mm512_set1_ps(0.5);
    let one = _mm512_set1_ps(1.0);
    let lim = _mm512_set1_ps(127.0);
    let nlim = _mm512_set1_ps(-127.0);
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        let v = [
            _mm512_loadu_ps(xb.as_ptr()),
            _mm512_loadu_ps(xb.as_ptr().add(16)),
        ];
        // max|x| skipping NaN like `f32::max` (vmaxps returns its second operand when either
        // is NaN, and the running maximum, from 0, is never NaN); exact, so in any order.
        let m = _mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_setzero_ps());
        let m = _mm512_max_ps(_mm512_abs_ps(v[1]), m);
        let amax = _mm512_reduce_max_ps(m);
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm512_set1_ps(id);
        let mut sums = [0i16; 2];
        for (h, v) in v.into_iter().enumerate() {
            let y = _mm512_mul_ps(v, idv);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let frac = _mm512_abs_ps(_mm512_sub_ps(y, t));
            // Infinite y: frac is NaN, the ordered compare is false and t stays infinite.
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let sgn1 = _mm512_or_ps(_mm512_and_ps(y, sign), one);
            let r = _mm512_mask_add_ps(t, up, t, sgn1);
            // clamp(-127, 127) keeping NaN (vminps/vmaxps return the NaN second operand), then
            // NaN -> 0 as `NaN as i8` does.
            let r = _mm512_max_ps(nlim, _mm512_min_ps(lim, r));
            let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
            let q = _mm512_maskz_cvttps_epi32(ord, r);
            _mm_storeu_si128(
                o.qs.as_mut_ptr().add(16 * h) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
            sums[h] = _mm512_reduce_add_epi32(q) as i16;
        }
        o.d = d;
        o.s = d * (sums[0] as i32 + sums[1] as i32) as f32;
        o.sums = sums;
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocks::BlockQ8A;
    use super::super::tests::{random_row, random_x, Rng};
    use super::super::*;
    use bytemuck::Zeroable;

    /// 4-token kernels give exactly the bits of the single dot, for every token.
    #[test]
    fn tiles_are_bit_identical_to_single_dots() {
        if !Isa::Avx512.available() {
            eprintln!("AVX-512 VNNI not available: skipped");
            return;
        }
        let k = Kernels::for_isa(Isa::Avx512).unwrap();
        let mut rng = Rng::new(77);
        for (dtype, toks4) in super::toks4_kernels() {
            let Dot::Quant(one) = k.dot(dtype) else {
                panic!("{dtype}: not a quantized kernel");
            };
            for cols in [32usize, 96, 512, 896, 4864] {
                if cols % dtype.block_elems() != 0 {
                    continue;
                }
                let rows: Vec<Vec<u8>> =
                    (0..4).map(|_| random_row(dtype, cols, &mut rng)).collect();
                let xs: Vec<Vec<BlockQ8A>> = (0..4)
                    .map(|_| {
                        let mut xq = Vec::new();
                        quantize_q8a(&random_x(cols, &mut rng), &mut xq);
                        xq
                    })
                    .collect();
                for row in &rows {
                    let t4 = toks4(row, std::array::from_fn(|i| &xs[i][..]));
                    for (i, x) in xs.iter().enumerate() {
                        let b = one(row, x);
                        assert_eq!(
                            t4[i].to_bits(),
                            b.to_bits(),
                            "{dtype} cols {cols} toks4[{i}]"
                        );
                    }
                }
            }
        }
    }

    /// `super::quantize_row_q8a` against the reference, every byte of every block.
    fn q8a_bit_identical(x: &[f32], what: &str) {
        let n = x.len() / 32;
        let mut want = vec![BlockQ8A::zeroed(); n];
        let mut got = vec![BlockQ8A::zeroed(); n];
        reference::quantize_row_q8a(x, &mut want);
        // SAFETY: the callers checked `Isa::Avx512.available()`.
        unsafe { super::quantize_row_q8a(x, &mut got) };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                bytemuck::bytes_of(g),
                bytemuck::bytes_of(w),
                "{what}, block {i}: avx512 {g:?} vs reference {w:?}\nx = {:?}",
                &x[32 * i..32 * i + 32]
            );
        }
    }

    /// `f` moved by `k` ulps (through zero and to infinity as the bits go).
    fn ulps(f: f32, k: i32) -> f32 {
        if f == 0.0 {
            return f32::from_bits(k.unsigned_abs()) * if k < 0 { -1.0 } else { 1.0 };
        }
        let b = f.to_bits() as i32;
        f32::from_bits(if f > 0.0 { b + k } else { b - k } as u32)
    }

    /// Vectorized activation quantization has the reference's bits: `d`, `s`, `sums`, `qs`,
    /// on exact ties of `round` (half away from zero), values a few ulps either side of them,
    /// values at and next to the block maximum, Qwen-like rows with outliers near 1000, and
    /// NaN / infinities / zeros / subnormals.
    #[test]
    fn avx512_quantize_q8a_is_bit_identical() {
        if !Isa::Avx512.available() {
            eprintln!("AVX-512 VNNI not available: skipped");
            return;
        }
        let mut rng = Rng::new(2026);
        // 1. Blocks with max|x| = 127 (d = 1, 1 / d = 1): y = x exactly, so every quarter
        //    step of -127..=127 (ties at .5) and 1, 2, 3 ulps either side of it.
        let mut vals = vec![
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            1.5,
            2.5,
            126.5,
            -126.5,
        ];
        for n in -127..=127 {
            for k in 0..4 {
                let y = n as f32 + k as f32 / 4.0;
                for u in -3..=3 {
                    vals.push(ulps(y, u));
                }
            }
        }
        vals.retain(|v| v.abs() <= 127.0);
        let mut x = Vec::new();
        for (i, c) in vals.chunks(31).enumerate() {
            let mut b = vec![0f32; 32];
            b[..c.len()].copy_from_slice(c);
            b[31] = if i % 2 == 0 { 127.0 } else { -127.0 };
            b.swap(31, i % 32);
            x.extend_from_slice(&b);
        }
        q8a_bit_identical(&x, "d = 1 ties");
        // 2. Random block maxima from 1e-11 to 3000: x = (n + 1/2) * d and its neighbours, so
        //    x * (1 / d) falls on or next to a tie, plus values next to the maximum itself.
        let mut ties = 0;
        let mut x = Vec::new();
        for _ in 0..4000 {
            let amax =
                10f32.powf(rng.f32() * 4.75 - 1.25) * if rng.f32() < 0.5 { 1.0 } else { 1e-5 };
            let d = amax / 127.0;
            let id = 1.0 / d;
            let mut b = [0f32; 32];
            b[0] = if rng.f32() < 0.0 { -amax } else { amax };
            for (j, v) in b.iter_mut().enumerate().skip(1) {
                *v = match j {
                    1..=3 => ulps(amax, -(j as i32)),
                    4..=6 => -ulps(amax, 3 - j as i32),
                    _ => {
                        let n = (rng.f32() * 127.0).trunc();
                        ulps((n + 0.5) * d, (rng.next_u64() % 7) as i32 - 3)
                    }
                };
                let y = *v * id;
                if (y - y.trunc()).abs() == 0.5 {
                    ties += 1;
                }
            }
            b.swap(0, (rng.next_u64() % 32) as usize);
            x.extend_from_slice(&b);
        }
        assert!(ties > 2_000, "only {ties} exact ties generated");
        q8a_bit_identical(&x, "random maxima near ties");
        // 3. Qwen-like rows: the test generator (outliers to 1000), and a single huge outlier
        //    per block with activations around 0.01..3 (most quantize to a few steps or 0).
        q8a_bit_identical(&random_x(32 * 4096, &mut rng), "random_x");
        let x: Vec<f32> = (0..32 * 4096)
            .map(|i| match i % 32 {
                0 => 900.0 + 200.0 * rng.f32(),
                _ => rng.f32() * 10f32.powf(rng.f32() * 1.5 - 1.5),
            })
            .collect();
        q8a_bit_identical(&x, "outlier rows");
        // 4. Special values.
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-42,
            f32::MAX,
            f32::MIN,
            1.0,
        ];
        let mut x = vec![0f32; 32]; // all zero
        x.extend((0..32).map(|i| if i == 7 { f32::NAN } else { i as f32 - 16.0 }));
        x.extend((0..32).map(|i| 1e-40 * (i as f32 - 16.0))); // 1 / d overflows to inf
        for _ in 0..2000 {
            x.extend((0..32).map(|_| {
                if rng.f32() < -0.8 {
                    specials[(rng.next_u64() % specials.len() as u64) as usize]
                } else {
                    rng.f32() * 5.0
                }
            }));
        }
        q8a_bit_identical(&x, "special values");
    }

    /// Every f32 in [-127.5, 127.5] (blocks with max|x| = 127, so y = x), against the
    /// reference: `cargo test --release -p fat-station --lib exhaustive -- --ignored`.
    #[test]
    #[ignore = "exhaustive: about 2.2e9 values, run in release"]
    fn avx512_quantize_q8a_exhaustive_in_range() {
        if !Isa::Avx512.available() {
            eprintln!("AVX-512 VNNI not available: skipped");
            return;
        }
        let top = 127.5f32.to_bits();
        let mut bits = 0u32;
        let mut x = Vec::with_capacity(32 * 65536);
        while bits <= top {
            x.clear();
            while x.len() < 32 * 65536 && bits <= top {
                // 127, 15 values with both signs, -127.
                x.push(127.0);
                for _ in 0..15 {
                    let v = f32::from_bits(bits.min(top));
                    x.extend([v, -v]);
                    bits += 1;
                }
                x.push(-127.0);
            }
            q8a_bit_identical(&x, "exhaustive");
        }
    }

    /// Every AVX-512 kernel against the scalar reference, including odd block counts.
    #[test]
    fn avx512_matches_reference() {
        if !Isa::Avx512.available() {
            eprintln!("AVX-512 VNNI not available: skipped");
            return;
        }
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        let mut rng = Rng::new(12);
        for (dtype, dot) in super::kernels() {
            for cols in [256usize, 512, 768, 4864, 96, 32, 64, 160] {
                if cols % dtype.block_elems() != 0 {
                    continue;
                }
                for _ in 0..10 {
                    let w = random_row(dtype, cols, &mut rng);
                    let x = random_x(cols, &mut rng);
                    let mut xq = Vec::new();
                    quantize_q8a(&x, &mut xq);
                    let mut wd = vec![0f32; cols];
                    dequantize_row(dtype, &w, &mut wd);
                    let mag: f32 = wd.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                    let (Dot::Quant(f), Dot::Quant(r)) = (dot, reference.dot(dtype)) else {
                        panic!("{dtype}: not a quantized kernel");
                    };
                    let (got, want) = (f(&w, &xq), r(&w, &xq));
                    assert!(
                        (got - want).abs() <= 1e-5 * mag,
                        "{dtype} cols {cols}: avx512 {got} vs reference {want} (mag {mag})"
                    );
                }
            }
        }
    }
}
