//! AVX2 + FMA + F16C kernels (x86_64), same names and results as [`super::reference`].
//!
//! Integer products use `maddubs` (u8 x i8 -> pairs of i16, cannot saturate here: weights are
//! at most 63 in magnitude for the unsigned paths, 128 for the sign trick, activations 127),
//! then `madd` with ones to i32 lanes, summed to each block's exact integer sum. The f32 steps
//! are the reference's, scalar, in its order (the canonical order of
//! [`super::reference::block_step`] for Q4_0, Q5_0, Q8_0, Q4_K, Q6_K), so every quantized
//! kernel here has the reference's bits, as NEON's and the 16-row kernels do. Signed weights
//! use the sign trick: `|w| * (x * sign(w))`.
//!
//! Only [`install`] exposes these kernels, and only after the caller checked
//! [`super::Isa::Avx2`] is available; the `unsafe fn`s below must not be reached otherwise.

use super::blocks::*;
use super::reference::block_step;
use super::{Dot, DotF, DotQ};
use knot_format::dtype::DType;
use std::arch::x86_64::*;

/// Replace the reference entries of `table` with AVX2 kernels.
///
/// Callers must have checked `Isa::Avx2.available()` (AVX2, FMA and F16C present).
pub(super) fn install(table: &mut [Dot; 13]) {
    for (dtype, dot) in kernels() {
        table[super::dtype_index(dtype)] = dot;
    }
}

/// The AVX2 kernels by type (types not listed keep the scalar reference).
pub(super) fn kernels() -> Vec<(DType, Dot)> {
    vec![
        (DType::F32, Dot::Float(vec_dot_f32 as DotF)),
        (DType::F16, Dot::Float(vec_dot_f16 as DotF)),
        (DType::BF16, Dot::Float(vec_dot_bf16 as DotF)),
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

/// Safe entry points over the `unsafe` target-feature kernels. They are private and only
/// handed out by [`install`]/[`kernels`], whose callers checked the CPU features.
macro_rules! entry {
    ($name:ident, $imp:ident, $x:ty) => {
        fn $name(w: &[u8], x: &[$x]) -> f32 {
            // SAFETY: only reachable through `install`/`kernels`, used after
            // `Isa::Avx2.available()` confirmed avx2, fma and f16c on this CPU.
            unsafe { $imp(w, x) }
        }
    };
}

entry!(vec_dot_f32, dot_f32, f32);
entry!(vec_dot_f16, dot_f16, f32);
entry!(vec_dot_bf16, dot_bf16, f32);
entry!(vec_dot_q4_0_q8a, dot_q4_0, BlockQ8A);
entry!(vec_dot_q4_1_q8a, dot_q4_1, BlockQ8A);
entry!(vec_dot_q5_0_q8a, dot_q5_0, BlockQ8A);
entry!(vec_dot_q5_1_q8a, dot_q5_1, BlockQ8A);
entry!(vec_dot_q8_0_q8a, dot_q8_0, BlockQ8A);
entry!(vec_dot_q4_k_q8a, dot_q4_k, BlockQ8A);
entry!(vec_dot_q5_k_q8a, dot_q5_k, BlockQ8A);
entry!(vec_dot_q6_k_q8a, dot_q6_k, BlockQ8A);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// f16 (little-endian bytes) to f32 with F16C.
#[inline(always)]
unsafe fn f16c(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(
        _mm_cvtsi32_si128(u16::from_le_bytes(b) as i32),
    ))
}

/// 16 bytes of nibbles to 32 bytes: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline(always)]
unsafe fn nibbles_32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// The 32 bits of `qh` (little-endian) as 32 bytes, 0xFF where the bit is set.
#[inline(always)]
unsafe fn bits_32(qh: [u8; 4]) -> __m256i {
    let x = u32::from_le_bytes(qh) as i32;
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Sum of u8 x i8 products, 8 lanes of i32 (pairs then quads).
#[inline(always)]
unsafe fn dot_us(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// Sum of i8 x i8 products via the sign trick, 8 lanes of i32.
#[inline(always)]
unsafe fn dot_ss(a: __m256i, b: __m256i) -> __m256i {
    dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

#[inline(always)]
unsafe fn load_q8a(a: &BlockQ8A) -> __m256i {
    _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i)
}

// ---------------------------------------------------------------------------------------------
// Float weights
// ---------------------------------------------------------------------------------------------

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    assert!(w.len() >= n * 4);
    let wp = w.as_ptr() as *const f32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let wv = _mm256_loadu_ps(wp.add(i + 8 * k));
            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(wp.add(i)),
            _mm256_loadu_ps(x.as_ptr().add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += (wp.add(i)).read_unaligned() * x[i];
        i += 1;
    }
    s
}

/// Shared body of the 16-bit float dots; `cvt` widens 8 halves to 8 f32.
#[inline(always)]
unsafe fn dot_half(
    w: &[u8],
    x: &[f32],
    cvt: impl Fn(__m128i) -> __m256,
    one: impl Fn([u8; 2]) -> f32,
) -> f32 {
    let n = x.len();
    assert!(w.len() >= n * 2);
    let wp = w.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let h = _mm_loadu_si128(wp.add(2 * (i + 8 * k)) as *const __m128i);
            *a = _mm256_fmadd_ps(cvt(h), _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        let h = _mm_loadu_si128(wp.add(2 * i) as *const __m128i);
        acc[0] = _mm256_fmadd_ps(cvt(h), _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += one([w[2 * i], w[2 * i + 1]]) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    dot_half(w, x, |h| _mm256_cvtph_ps(h), f16_le)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    dot_half(
        w,
        x,
        |h| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
        bf16_le,
    )
}

// ---------------------------------------------------------------------------------------------
// Legacy quants: one block of 32 against one Q8A block
// ---------------------------------------------------------------------------------------------

/// Sum of the 8 i32 lanes (exact: the lanes hold small integer sums).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    hsum_epi32_128(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256(v, 1),
    ))
}

/// Sum of the 4 i32 lanes.
#[inline(always)]
unsafe fn hsum_epi32_128(s: __m128i) -> i32 {
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// The canonical steps of the offset formats (Q4_0, Q5_0, Q8_0): per block in order,
/// [`block_step`] with the exact `isum = sum(u * q_x) - off * sum(q_x)`; `u(block, act)` gives
/// the block's unsigned-weight products as i32 lanes (`off` = 0 for signed products).
#[inline(always)]
unsafe fn offset_loop<B: Pod>(
    w: &[u8],
    x: &[BlockQ8A],
    off: i32,
    d: impl Fn(&B) -> [u8; 2],
    u: impl Fn(&B, &BlockQ8A) -> __m256i,
) -> f32 {
    let w: &[B] = bytemuck::cast_slice(w);
    assert!(x.len() >= w.len());
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let isum = hsum_epi32(u(b, a)) - off * (a.sums[0] as i32 + a.sums[1] as i32);
        acc = block_step(acc, f16c(d(b)), isum, a.d);
    }
    acc
}

/// The reference's order for the formats with a min (Q4_1, Q5_1): per block,
/// `sum += d_w * d_x * isum + m_w * d_x * sum(q_x)`.
#[inline(always)]
unsafe fn min_loop<B: Pod>(
    w: &[u8],
    x: &[BlockQ8A],
    dm: impl Fn(&B) -> ([u8; 2], [u8; 2]),
    u: impl Fn(&B, &BlockQ8A) -> __m256i,
) -> f32 {
    let w: &[B] = bytemuck::cast_slice(w);
    assert!(x.len() >= w.len());
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let isum = hsum_epi32(u(b, a));
        let (d, m) = dm(b);
        let qsum = a.sums[0] as i32 + a.sums[1] as i32;
        sum += f16c(d) * a.d * isum as f32 + f16c(m) * a.d * qsum as f32;
    }
    sum
}

use bytemuck::Pod;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // sum (q - 8) q_x = sum q q_x - 8 sum q_x: unsigned products, offset from the block sums.
    offset_loop(
        w,
        x,
        8,
        |b: &BlockQ4_0| b.d,
        |b, a| dot_us(nibbles_32(b.qs.as_ptr()), load_q8a(a)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(w: &[u8], x: &[BlockQ8A]) -> f32 {
    min_loop(
        w,
        x,
        |b: &BlockQ4_1| (b.d, b.m),
        |b, a| dot_us(nibbles_32(b.qs.as_ptr()), load_q8a(a)),
    )
}

/// The 5-bit quants of a Q5_0 / Q5_1 block as 32 unsigned bytes.
#[inline(always)]
unsafe fn q5_32(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    let hi = _mm256_and_si256(bits_32(qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles_32(qs.as_ptr()), hi)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    offset_loop(
        w,
        x,
        16,
        |b: &BlockQ5_0| b.d,
        |b, a| dot_us(q5_32(&b.qs, b.qh), load_q8a(a)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1(w: &[u8], x: &[BlockQ8A]) -> f32 {
    min_loop(
        w,
        x,
        |b: &BlockQ5_1| (b.d, b.m),
        |b, a| dot_us(q5_32(&b.qs, b.qh), load_q8a(a)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    offset_loop(
        w,
        x,
        0,
        |b: &BlockQ8_0| b.d,
        |b, a| dot_ss(_mm256_loadu_si256(b.qs.as_ptr() as *const __m256i), load_q8a(a)),
    )
}

// ---------------------------------------------------------------------------------------------
// k-quants: one super-block of 256 against eight Q8A blocks
// ---------------------------------------------------------------------------------------------

/// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K / Q5_K block.
#[inline(always)]
pub(super) fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let u1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let u2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc =
        ((u0 & KMASK1) as u64) | ((((u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4)) as u64) << 32);
    let mn = ((u1 & KMASK1) as u64)
        | (((((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4)) as u64) << 32);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// The exact integer dots of the 8 sub-blocks of a Q4_K / Q5_K block (unsigned quants) with
/// their activation blocks; `high(j)` gives the fifth-bit bytes (0 or 16) for the low and high
/// nibbles of 64-chunk `j`.
#[inline(always)]
unsafe fn k4_isums(
    qs: *const u8,
    xa: &[BlockQ8A],
    high: impl Fn(usize) -> (__m256i, __m256i),
) -> [i32; 8] {
    let mask = _mm256_set1_epi8(0x0F);
    let mut isum = [0i32; 8];
    for j in 0..4 {
        let q4 = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
        let (h0, h1) = high(j);
        let lo = _mm256_or_si256(_mm256_and_si256(q4, mask), h0);
        let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), mask), h1);
        isum[2 * j] = hsum_epi32(dot_us(lo, load_q8a(&xa[2 * j])));
        isum[2 * j + 1] = hsum_epi32(dot_us(hi, load_q8a(&xa[2 * j + 1])));
    }
    isum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ4K] = bytemuck::cast_slice(w);
    assert!(x.len() >= w.len() * 8);
    let zero = _mm256_setzero_si256();
    let mut acc = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let (d, dmin) = (f16c(b.d), f16c(b.dmin));
        let (sc, mn) = scales_mins_k4(&b.scales);
        let isum = k4_isums(b.qs.as_ptr(), xa, |_| (zero, zero));
        // The canonical order (see the reference): two multiply-adds per sub-block.
        for (s, a) in xa.iter().enumerate() {
            acc = (d * sc[s] as f32).mul_add(isum[s] as f32 * a.d, acc);
            acc = (-(dmin * mn[s] as f32)).mul_add(a.s, acc);
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ5K] = bytemuck::cast_slice(w);
    assert!(x.len() >= w.len() * 8);
    let sixteen = _mm256_set1_epi8(16);
    let mut sum = 0f32;
    for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
        let qh = _mm256_loadu_si256(b.qh.as_ptr() as *const __m256i);
        let isum = k4_isums(b.qs.as_ptr(), xa, |j| {
            let m0 = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
            let m1 = _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8);
            let h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), sixteen);
            let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), sixteen);
            (h0, h1)
        });
        let (sc, mn) = scales_mins_k4(&b.scales);
        // The reference's order: sd and sm per pair of sub-blocks, then the block's term.
        let (mut sd, mut sm) = (0f32, 0f32);
        for j in 0..4 {
            let (a1, a2) = (&xa[2 * j], &xa[2 * j + 1]);
            let (s1, s2) = (2 * j, 2 * j + 1);
            sd += a1.d * (sc[s1] as i32 * isum[s1]) as f32 + a2.d * (sc[s2] as i32 * isum[s2]) as f32;
            sm += a1.d * (mn[s1] as i32 * (a1.sums[0] as i32 + a1.sums[1] as i32)) as f32
                + a2.d * (mn[s2] as i32 * (a2.sums[0] as i32 + a2.sums[1] as i32)) as f32;
        }
        sum += f16c(b.d) * sd - f16c(b.dmin) * sm;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    let w: &[BlockQ6K] = bytemuck::cast_slice(w);
    assert!(x.len() >= w.len() * 8);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let ones = _mm256_set1_epi16(1);
    let mut acc = 0f32;
    for (i, b) in w.iter().enumerate() {
        let xa = x.get_unchecked(8 * i..8 * i + 8);
        let d = f16c(b.d);
        for n in 0..2 {
            let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * n) as *const __m256i);
            let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * n + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * n) as *const __m256i);
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                ),
            ];
            for (k, qk) in q.iter().enumerate() {
                let a = xa.get_unchecked(4 * n + k);
                // Unsigned 6-bit products per half (lanes 0..4: elements 0..16, 4..8: 16..32),
                // then the canonical step per half with the -32 offset taken exactly.
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, load_q8a(a)), ones);
                let u = [
                    hsum_epi32_128(_mm256_castsi256_si128(p)),
                    hsum_epi32_128(_mm256_extracti128_si256(p, 1)),
                ];
                for (h, (&u, &qsum)) in u.iter().zip(&a.sums).enumerate() {
                    let isum = u - 32 * qsum as i32;
                    let sc = b.scales[8 * n + 2 * k + h];
                    acc = (d * sc as f32).mul_add(isum as f32 * a.d, acc);
                }
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_row, random_x, Rng};
    use super::super::*;

    /// Every AVX2 kernel against the scalar reference on random rows (lengths with tails):
    /// quantized kernels bit for bit.
    #[test]
    fn avx2_matches_reference() {
        if !Isa::Avx2.available() {
            eprintln!("AVX2 not available: skipped");
            return;
        }
        let reference = Kernels::for_isa(Isa::Scalar).unwrap();
        let mut rng = Rng::new(11);
        for (dtype, dot) in super::kernels() {
            for cols in [256usize, 512, 768, 4864, 96, 32] {
                if cols % dtype.block_elems() != 0 {
                    continue;
                }
                for _ in 0..10 {
                    let w = random_row(dtype, cols, &mut rng);
                    let x = random_x(cols, &mut rng);
                    let (got, want, mag) = match (dot, reference.dot(dtype)) {
                        (Dot::Float(f), Dot::Float(r)) => {
                            let mut wd = vec![0f32; cols];
                            dequantize_row(dtype, &w, &mut wd);
                            let mag: f32 = wd.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                            (f(&w, &x), r(&w, &x), mag)
                        }
                        (Dot::Quant(f), Dot::Quant(r)) => {
                            let mut xq = Vec::new();
                            quantize_q8a(&x, &mut xq);
                            let mut wd = vec![0f32; cols];
                            dequantize_row(dtype, &w, &mut wd);
                            let mag: f32 = wd.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                            (f(&w, &xq), r(&w, &xq), mag)
                        }
                        _ => panic!("{dtype}: kernel kinds differ"),
                    };
                    // Quantized kernels: the reference's bits (the canonical order); float
                    // kernels: their own lane order, within 1e-5 of the magnitude.
                    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
                        assert!(
                            (got - want).abs() <= 1e-5 * mag,
                            "{dtype} cols {cols}: avx2 {got} vs reference {want} (mag {mag})"
                        );
                    } else {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{dtype} cols {cols}: avx2 {got} vs reference {want}"
                        );
                    }
                }
            }
        }
    }
}
