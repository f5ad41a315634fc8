//! AVX2 + FMA + F16C kernels (x86_64), same names and results as [`super::reference`].
//!
//! Integer products use `maddubs` (u8 x i8 -> pairs of i16, cannot saturate here: weights are
//! at most 63 in magnitude for the unsigned paths, 128 for the sign trick, activations 127),
//! then `madd` with ones to i32 lanes, summed to each block's exact integer sum. The f32 steps
//! are the reference's, scalar, in its order (the canonical order of
//! [`super::reference::block_step`] for Q4_0, Q5_0, Q8_0, Q4_K, Q6_K), so every quantized
//! kernel here has the reference's bits, as NEON's and the 16-row kernels do. Signed weights
//! use the sign trick: `|w| * (x * sign(w))`. The float dots (F32, F16, BF16) follow the
//! canonical lane order of [`super::reference::float_dot`] too.
//!
//! Only [`kernels`] exposes these kernels, and only after the caller checked
//! [`super::Isa::Avx2`] is available; the `unsafe fn`s below must not be reached otherwise.

use super::blocks::*;
use super::reference::{block_step, float_lanes_sum, FLOAT_LANES};
use super::{Dot, DotF, DotF4, DotQ};
use knot_format::dtype::DType;
use std::arch::x86_64::*;

/// The AVX2 kernels by type (types not listed keep the scalar reference).
///
/// Callers must have checked `Isa::Avx2.available()` (AVX2, FMA and F16C present).
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
/// handed out by [`kernels`], whose callers checked the CPU features.
macro_rules! entry {
    ($name:ident, $imp:ident, $x:ty) => {
        fn $name(w: &[u8], x: &[$x]) -> f32 {
            // SAFETY: only reachable through `kernels`, used after
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

/// The canonical fold of 8 lanes: l + 4, then l + 2, then the pair.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// f16 (little-endian bytes) to f32 with F16C.
#[inline(always)]
unsafe fn f16c(b: [u8; 2]) -> f32 {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(
            _mm_cvtsi32_si128(u16::from_le_bytes(b) as i32),
        ))
    }
}

/// 16 bytes of nibbles to 32 bytes: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline(always)]
unsafe fn nibbles_32(p: *const u8) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let t = _mm_loadu_si128(p as *const __m128i);
        let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
    }
}

/// The 32 bits of `qh` (little-endian) as 32 bytes, 0xFF where the bit is set.
#[inline(always)]
pub(super) unsafe fn bits_32(qh: [u8; 4]) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
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
}

/// Sum of u8 x i8 products, 8 lanes of i32 (pairs then quads).
#[inline(always)]
unsafe fn dot_us(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)) }
}

/// Sum of i8 x i8 products via the sign trick, 8 lanes of i32.
#[inline(always)]
unsafe fn dot_ss(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe { dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)) }
}

#[inline(always)]
unsafe fn load_q8a(a: &BlockQ8A) -> __m256i {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe { _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i) }
}

// ---------------------------------------------------------------------------------------------
// Float weights
// ---------------------------------------------------------------------------------------------

/// The AVX2 four-row float dots ([`super::DotF4`]), F32 only: two rows at a time, so each
/// activation load serves two rows (row by row, the activation row, as large as an F32 weight
/// row, is reloaded for every row). One token 20.3 -> 22.1 GB/s, the 8-token tile 47 -> 57
/// (kernel-bench, 1 thread). F16 and BF16 stay row by row: in pairs they went 18 -> 15 and 18
/// -> 12 (two weight streams against one; their activation row is twice the weight row).
/// Callers must have checked `Isa::Avx2.available()`.
pub(super) fn float4_kernels() -> Vec<(DType, DotF4)> {
    vec![(DType::F32, dot4_f32 as DotF4)]
}

fn dot4_f32(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    // SAFETY: only reachable through `float4_kernels`, used after `Isa::Avx2.available()`.
    let pair = |a: &[u8], b: &[u8]| unsafe { dot2_f32([a, b], x) };
    let (p, q) = (pair(w[0], w[1]), pair(w[2], w[3]));
    [p[0], p[1], q[0], q[1]]
}

/// Shared body of the float dots, in the canonical order of [`super::reference::float_dot`],
/// for `R` rows against one activation row: `load(r, i)` gives row r's weights i..i+8 as f32
/// (only called with i + 8 <= n), `one(r, i)` its weight i; four accumulators per row are the
/// 32 lanes. Rows of a multiple of 32 reduce in registers; a ragged tail goes through the
/// lanes in memory (same steps, scalar).
#[inline(always)]
unsafe fn dot_rows<const R: usize>(
    n: usize,
    x: &[f32],
    load: impl Fn(usize, usize) -> __m256,
    one: impl Fn(usize, usize) -> f32,
) -> [f32; R] {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        assert!(x.len() >= n);
        let xp = x.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let xv = _mm256_loadu_ps(xp.add(i + 8 * k));
                for (r, a) in acc.iter_mut().enumerate() {
                    a[k] = _mm256_fmadd_ps(load(r, i + 8 * k), xv, a[k]);
                }
            }
            i += 32;
        }
        std::array::from_fn(|r| {
            let acc = &acc[r];
            if i == n {
                // The tree's first two levels (lanes l + 16, then l + 8), then hsum_ps's three.
                return hsum_ps(_mm256_add_ps(
                    _mm256_add_ps(acc[0], acc[2]),
                    _mm256_add_ps(acc[1], acc[3]),
                ));
            }
            let mut lanes = [0f32; FLOAT_LANES];
            for (k, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *a);
            }
            for j in i..n {
                lanes[j % FLOAT_LANES] = one(r, j).mul_add(x[j], lanes[j % FLOAT_LANES]);
            }
            float_lanes_sum(lanes)
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    // SAFETY: `dot2_f32`'s, for one row.
    unsafe { rows_f32([w], x)[0] }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot2_f32(w: [&[u8]; 2], x: &[f32]) -> [f32; 2] {
    // SAFETY: AVX2, FMA and F16C present (the caller's contract; `target_feature`).
    unsafe { rows_f32(w, x) }
}

/// `R` f32 rows against `x`.
#[inline(always)]
unsafe fn rows_f32<const R: usize>(w: [&[u8]; R], x: &[f32]) -> [f32; R] {
    // SAFETY: the reads below stay inside the rows (lengths asserted here); AVX2, FMA and
    // F16C present (module doc).
    unsafe {
        let n = x.len();
        assert!(w.iter().all(|w| w.len() >= n * 4));
        let wp = w.map(|w| w.as_ptr() as *const f32);
        dot_rows(
            n,
            x,
            |r, i| _mm256_loadu_ps(wp[r].add(i)),
            |r, i| wp[r].add(i).read_unaligned(),
        )
    }
}

/// Shared body of the 16-bit float dots of `R` rows; `cvt` widens 8 halves to 8 f32.
#[inline(always)]
unsafe fn rows_half<const R: usize>(
    w: [&[u8]; R],
    x: &[f32],
    cvt: impl Fn(__m128i) -> __m256,
    one: impl Fn([u8; 2]) -> f32,
) -> [f32; R] {
    // SAFETY: the reads below stay inside the rows (lengths asserted here); AVX2, FMA and
    // F16C present (module doc).
    unsafe {
        let n = x.len();
        assert!(w.iter().all(|w| w.len() >= n * 2));
        let wp = w.map(|w| w.as_ptr());
        dot_rows(
            n,
            x,
            |r, i| cvt(_mm_loadu_si128(wp[r].add(2 * i) as *const __m128i)),
            |r, i| one([w[r][2 * i], w[r][2 * i + 1]]),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    // SAFETY: AVX2, FMA and F16C present (the caller's contract; `target_feature`).
    unsafe { rows_half([w], x, |h| _mm256_cvtph_ps(h), f16_le)[0] }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    // SAFETY: as for `dot_f16`.
    unsafe {
        rows_half(
            [w],
            x,
            |h| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)),
            bf16_le,
        )[0]
    }
}

// ---------------------------------------------------------------------------------------------
// Legacy quants: one block of 32 against one Q8A block
// ---------------------------------------------------------------------------------------------

/// Sum of the 8 i32 lanes (exact: the lanes hold small integer sums).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        hsum_epi32_128(_mm_add_epi32(
            _mm256_castsi256_si128(v),
            _mm256_extracti128_si256(v, 1),
        ))
    }
}

/// Sum of the 4 i32 lanes.
#[inline(always)]
unsafe fn hsum_epi32_128(s: __m128i) -> i32 {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// The lane sums of four i32x8 vectors, `[sum(v0), sum(v1), sum(v2), sum(v3)]` (exact).
#[inline(always)]
unsafe fn hsum4_epi32(v: [__m256i; 4]) -> __m128i {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe {
        // [v0 pairs, v1 pairs | ...], then [v0 quads, v1, v2, v3 | v0 quads, v1, v2, v3].
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
    }
}

/// `sums[0] + sums[1]` of four activation blocks as i32 lanes.
#[inline(always)]
unsafe fn q8a_sums4(a: &[BlockQ8A]) -> __m128i {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let s = |a: &BlockQ8A| a.sums[0] as i32 + a.sums[1] as i32;
        _mm_setr_epi32(s(&a[0]), s(&a[1]), s(&a[2]), s(&a[3]))
    }
}

/// The four lanes of `v`.
#[inline(always)]
unsafe fn lanes(v: __m128) -> [f32; 4] {
    // SAFETY: register-only intrinsics; AVX2, FMA and F16C present (module doc: reached only
    // after detection).
    unsafe { std::mem::transmute::<__m128, [f32; 4]>(v) }
}

/// The canonical steps of the offset formats (Q4_0, Q5_0, Q8_0): per block in order,
/// [`block_step`] with the exact `isum = sum(u * q_x) - off * sum(q_x)`; `u(block, act)` gives
/// the block's unsigned-weight products as i32 lanes (`off` = 0 for signed products).
///
/// Four blocks per step: their lane sums reduced together, `f32(isum) * d_x` on four lanes
/// (the same rounding as the scalar product), then the four multiply-adds in block order.
#[inline(always)]
unsafe fn offset_loop<B: Pod>(
    w: &[u8],
    x: &[BlockQ8A],
    off: i32,
    d: impl Fn(&B) -> [u8; 2],
    u: impl Fn(&B, &BlockQ8A) -> __m256i,
) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let w: &[B] = bytemuck::cast_slice(w);
        assert!(x.len() >= w.len());
        let mut acc = 0f32;
        let n4 = w.len() / 4 * 4;
        for i in (0..n4).step_by(4) {
            let (b, a) = (w.get_unchecked(i..i + 4), x.get_unchecked(i..i + 4));
            let s = hsum4_epi32([
                u(&b[0], &a[0]),
                u(&b[1], &a[1]),
                u(&b[2], &a[2]),
                u(&b[3], &a[3]),
            ]);
            let isum = _mm_sub_epi32(s, _mm_mullo_epi32(q8a_sums4(a), _mm_set1_epi32(off)));
            let dx = _mm_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d);
            let t = lanes(_mm_mul_ps(_mm_cvtepi32_ps(isum), dx));
            let h = |k: usize| u16::from_le_bytes(d(&b[k])) as i16;
            let dw = lanes(_mm_cvtph_ps(_mm_setr_epi16(
                h(0),
                h(1),
                h(2),
                h(3),
                0,
                0,
                0,
                0,
            )));
            for k in 0..4 {
                acc = dw[k].mul_add(t[k], acc);
            }
        }
        for (b, a) in w[n4..].iter().zip(&x[n4..]) {
            let isum = hsum_epi32(u(b, a)) - off * (a.sums[0] as i32 + a.sums[1] as i32);
            acc = block_step(acc, f16c(d(b)), isum, a.d);
        }
        acc
    }
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
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
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
}

use bytemuck::Pod;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        // sum (q - 8) q_x = sum q q_x - 8 sum q_x: unsigned products, offset from the block sums.
        offset_loop(
            w,
            x,
            8,
            |b: &BlockQ4_0| b.d,
            |b, a| dot_us(nibbles_32(b.qs.as_ptr()), load_q8a(a)),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        min_loop(
            w,
            x,
            |b: &BlockQ4_1| (b.d, b.m),
            |b, a| dot_us(nibbles_32(b.qs.as_ptr()), load_q8a(a)),
        )
    }
}

/// The 5-bit quants of a Q5_0 / Q5_1 block as 32 unsigned bytes.
#[inline(always)]
unsafe fn q5_32(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let hi = _mm256_and_si256(bits_32(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles_32(qs.as_ptr()), hi)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        offset_loop(
            w,
            x,
            16,
            |b: &BlockQ5_0| b.d,
            |b, a| dot_us(q5_32(&b.qs, b.qh), load_q8a(a)),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        min_loop(
            w,
            x,
            |b: &BlockQ5_1| (b.d, b.m),
            |b, a| dot_us(q5_32(&b.qs, b.qh), load_q8a(a)),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        offset_loop(
            w,
            x,
            0,
            |b: &BlockQ8_0| b.d,
            |b, a| {
                dot_ss(
                    _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i),
                    load_q8a(a),
                )
            },
        )
    }
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
/// their activation blocks, as two i32x4 (sub-blocks 0..4, 4..8); `high(j)` gives the fifth-bit bytes (0 or 16) for the low and high
/// nibbles of 64-chunk `j`.
#[inline(always)]
unsafe fn k4_isums(
    qs: *const u8,
    xa: &[BlockQ8A],
    high: impl Fn(usize) -> (__m256i, __m256i),
) -> [__m128i; 2] {
    // SAFETY: every read below is inside the block or tile at the caller's pointer (this
    // function's contract, as its callers keep it); AVX2, FMA and F16C present (module doc).
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut p = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let q4 = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
            let (h0, h1) = high(j);
            let lo = _mm256_or_si256(_mm256_and_si256(q4, mask), h0);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), mask), h1);
            p[2 * j] = dot_us(lo, load_q8a(&xa[2 * j]));
            p[2 * j + 1] = dot_us(hi, load_q8a(&xa[2 * j + 1]));
        }
        [
            hsum4_epi32([p[0], p[1], p[2], p[3]]),
            hsum4_epi32([p[4], p[5], p[6], p[7]]),
        ]
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
        let w: &[BlockQ4K] = bytemuck::cast_slice(w);
        assert!(x.len() >= w.len() * 8);
        let zero = _mm256_setzero_si256();
        let mut acc = 0f32;
        for (b, xa) in w.iter().zip(x.chunks_exact(8)) {
            let (d, dmin) = (f16c(b.d), f16c(b.dmin));
            let (sc, mn) = scales_mins_k4(&b.scales);
            let isum = k4_isums(b.qs.as_ptr(), xa, |_| (zero, zero));
            // Per sub-block, on four lanes: f32(isum) * d_x, d * sc, -(dmin * m) (exact products),
            // the activation's s; then the canonical order: two multiply-adds per sub-block.
            let (sc, mn) = (u64::from_le_bytes(sc), u64::from_le_bytes(mn));
            let f = |v: u64, h: usize| {
                _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((v >> (32 * h)) as i32)))
            };
            for h in 0..2 {
                let a = &xa[4 * h..4 * h + 4];
                let dx = _mm_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d);
                let t = lanes(_mm_mul_ps(_mm_cvtepi32_ps(isum[h]), dx));
                let dsc = lanes(_mm_mul_ps(f(sc, h), _mm_set1_ps(d)));
                let dm = lanes(_mm_mul_ps(f(mn, h), _mm_set1_ps(-dmin)));
                for k in 0..4 {
                    acc = dsc[k].mul_add(t[k], acc);
                    acc = dm[k].mul_add(a[k].s, acc);
                }
            }
        }
        acc
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
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
            let isum: [i32; 8] = std::mem::transmute::<[__m128i; 2], [i32; 8]>(isum);
            let (sc, mn) = scales_mins_k4(&b.scales);
            // The reference's order: sd and sm per pair of sub-blocks, then the block's term.
            let (mut sd, mut sm) = (0f32, 0f32);
            for j in 0..4 {
                let (a1, a2) = (&xa[2 * j], &xa[2 * j + 1]);
                let (s1, s2) = (2 * j, 2 * j + 1);
                sd += a1.d * (sc[s1] as i32 * isum[s1]) as f32
                    + a2.d * (sc[s2] as i32 * isum[s2]) as f32;
                sm += a1.d * (mn[s1] as i32 * (a1.sums[0] as i32 + a1.sums[1] as i32)) as f32
                    + a2.d * (mn[s2] as i32 * (a2.sums[0] as i32 + a2.sums[1] as i32)) as f32;
            }
            sum += f16c(b.d) * sd - f16c(b.dmin) * sm;
        }
        sum
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(w: &[u8], x: &[BlockQ8A]) -> f32 {
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX2, FMA and F16C present (module doc).
    unsafe {
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
                let a = xa.get_unchecked(4 * n..4 * n + 4);
                // Unsigned 6-bit products of group k (lanes 0..4: elements 0..16, 4..8: 16..32).
                let p: [__m256i; 4] = std::array::from_fn(|k| {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], load_q8a(&a[k])), ones)
                });
                // [g0 half 0, g1 h0, g2 h0, g3 h0 | g0 h1, g1 h1, g2 h1, g3 h1] ...
                let h =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
                let (h0, h1) = (_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                // ... in scale order i = 2k + h: [g0 h0, g0 h1, g1 h0, g1 h1], [g2 .., g3 ..].
                let u = [_mm_unpacklo_epi32(h0, h1), _mm_unpackhi_epi32(h0, h1)];
                for (v, u) in u.into_iter().enumerate() {
                    let (a0, a1) = (&a[2 * v], &a[2 * v + 1]);
                    // The -32 offset, exactly: 32 * the activation half sums, same lane order.
                    let qs = _mm_setr_epi32(
                        a0.sums[0] as i32,
                        a0.sums[1] as i32,
                        a1.sums[0] as i32,
                        a1.sums[1] as i32,
                    );
                    let isum = _mm_sub_epi32(u, _mm_slli_epi32(qs, 5));
                    let dx = _mm_setr_ps(a0.d, a0.d, a1.d, a1.d);
                    let t = lanes(_mm_mul_ps(_mm_cvtepi32_ps(isum), dx));
                    // Scales 8n + 4v .. + 4 (i8) as i32 lanes: 4 bytes inside the 16 of `scales`.
                    let sc4 = std::ptr::read_unaligned(
                        b.scales.as_ptr().add(8 * n + 4 * v) as *const i32
                    );
                    let sc = _mm_cvtepi8_epi32(_mm_cvtsi32_si128(sc4));
                    let dsc = lanes(_mm_mul_ps(_mm_cvtepi32_ps(sc), _mm_set1_ps(d)));
                    for i in 0..4 {
                        acc = dsc[i].mul_add(t[i], acc);
                    }
                }
            }
        }
        acc
    }
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
            for cols in [256usize, 512, 768, 4864, 96, 32, 100, 7] {
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
                    // Every kernel gives the reference's bits (its canonical order).
                    assert!(
                        (got - want).abs() <= 1e-5 * mag,
                        "{dtype} cols {cols}: avx2 {got} vs reference {want} (mag {mag})"
                    );
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
