//! AVX-512 (F, BW, VL, DQ) + VNNI activation quantization (x86_64), bit for bit the
//! reference's [`super::reference::quantize_row_q8a`], and the four-row float dots
//! ([`super::DotF4`], the canonical order of [`super::reference::float_dot`]).
//!
//! The AVX-512 matrix kernels are the 16-row interleaved ones ([`super::interleaved`]); rows
//! outside a full group of 16 and the types without a 16-row layout take the AVX2 block
//! kernels, which follow the same canonical order. (The earlier AVX-512 block and 4-token
//! kernels scaled each lane group by `d_w * d_x` with one FMA per register and summed the lanes
//! at the end: their own order, so their bits matched no other flavour; they are gone.)
//!
//! Only [`super::quantize_q8a`] and the kernel table reach this, after checking
//! [`super::Isa::Avx512`].

use super::avx2::hsum_ps;
use super::blocks::*;
use super::reference::{float_lanes_sum, FLOAT_LANES};
use super::DotF4;
use knot_format::dtype::DType;
use std::arch::x86_64::*;

// ---------------------------------------------------------------------------------------------
// Float rows, four at a time
// ---------------------------------------------------------------------------------------------

/// The four-row float dots by type. Callers must have checked `Isa::Avx512.available()`.
///
/// Why four rows: one float row streamed from DRAM ran at about half the read roofline (its
/// activation row, as large as the weight row, is reloaded for every row and competes with
/// the stream for the cache); four rows share each activation load. Matrices with an
/// interleaved copy ([`super::interleaved::floats`], one stream) use these only for the rows
/// past their last full group of 16.
pub(super) fn float4_kernels() -> Vec<(DType, DotF4)> {
    vec![
        (DType::F32, dot4_f32 as DotF4),
        (DType::F16, dot4_f16 as DotF4),
        (DType::BF16, dot4_bf16 as DotF4),
    ]
}

fn dot4_f32(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    // SAFETY: only reachable through `float4_kernels`, used after `Isa::Avx512.available()`.
    unsafe { dot4_f32_imp(w, x) }
}

fn dot4_f16(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    // SAFETY: as for `dot4_f32`.
    unsafe { dot4_f16_imp(w, x) }
}

fn dot4_bf16(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    // SAFETY: as for `dot4_f32`.
    unsafe { dot4_bf16_imp(w, x) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dot4_f32_imp(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() >= 4 * n));
    let p = w.map(|r| r.as_ptr() as *const f32);
    // SAFETY: element i < n of row r is inside its slice (asserted above); AVX-512 present.
    unsafe {
        dot4_lanes(
            x,
            |r, i| _mm512_loadu_ps(p[r].add(i)),
            |r, i| p[r].add(i).read_unaligned(),
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dot4_f16_imp(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() >= 2 * n));
    let p = w.map(|r| r.as_ptr());
    // SAFETY: element i < n of row r is inside its slice (asserted above); AVX-512 present.
    unsafe {
        dot4_lanes(
            x,
            |r, i| _mm512_cvtph_ps(_mm256_loadu_si256(p[r].add(2 * i) as *const __m256i)),
            |r, i| f16_le([*p[r].add(2 * i), *p[r].add(2 * i + 1)]),
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn dot4_bf16_imp(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    let n = x.len();
    assert!(w.iter().all(|r| r.len() >= 2 * n));
    let p = w.map(|r| r.as_ptr());
    // SAFETY: element i < n of row r is inside its slice (asserted above); AVX-512 present.
    unsafe {
        dot4_lanes(
            x,
            |r, i| {
                let h = _mm256_loadu_si256(p[r].add(2 * i) as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            },
            |r, i| bf16_le([*p[r].add(2 * i), *p[r].add(2 * i + 1)]),
        )
    }
}

/// Four rows' dots in the canonical lane order: two 16-lane accumulators per row hold lanes
/// 0..16 and 16..32 (the AVX2 kernel's four 8-lane ones, pairwise), the same fused
/// multiply-add per lane; then the canonical fold (lanes l + 16, l + 8, then `hsum_ps`'s
/// 4, 2, 1), or, with
/// a tail, the lanes spilled and finished as the reference does. `load(r, i)`: row r's 16
/// weights from element i as f32; `one(r, i)`: one weight.
#[inline(always)]
unsafe fn dot4_lanes(
    x: &[f32],
    load: impl Fn(usize, usize) -> __m512,
    one: impl Fn(usize, usize) -> f32,
) -> [f32; 4] {
    // SAFETY: the callers' loads stay inside their rows for i + 32 <= n; x reads likewise;
    // AVX-512 present (the callers' target features).
    unsafe {
        let n = x.len();
        let xp = x.as_ptr();
        let mut lo = [_mm512_setzero_ps(); 4];
        let mut hi = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            let (x0, x1) = (_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(xp.add(i + 16)));
            for r in 0..4 {
                lo[r] = _mm512_fmadd_ps(load(r, i), x0, lo[r]);
                hi[r] = _mm512_fmadd_ps(load(r, i + 16), x1, hi[r]);
            }
            i += 32;
        }
        std::array::from_fn(|r| {
            if i == n {
                return fold_lanes(lo[r], hi[r]);
            }
            let mut lanes = [0f32; FLOAT_LANES];
            _mm512_storeu_ps(lanes.as_mut_ptr(), lo[r]);
            _mm512_storeu_ps(lanes.as_mut_ptr().add(16), hi[r]);
            for j in i..n {
                lanes[j % FLOAT_LANES] = one(r, j).mul_add(x[j], lanes[j % FLOAT_LANES]);
            }
            float_lanes_sum(lanes)
        })
    }
}

/// The canonical fold of one row's 32 lanes held as two 16-lane accumulators: lanes l + 16,
/// then l + 8, then [`hsum_ps`]'s 4, 2, 1 ([`super::reference::float_lanes_sum`]'s tree).
///
/// SAFETY (callers): AVX-512 present.
#[inline(always)]
pub(super) unsafe fn fold_lanes(lo: __m512, hi: __m512) -> f32 {
    // SAFETY: register-only intrinsics; AVX-512 present (the caller's contract).
    unsafe {
        let s = _mm512_add_ps(lo, hi);
        let s = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
        hsum_ps(s)
    }
}

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
    // SAFETY: the reads below stay inside the slices and blocks passed in (their lengths are
    // checked on entry to the kernel); AVX-512 present (module doc).
    unsafe {
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
}

#[cfg(test)]
mod tests {
    use super::super::blocks::BlockQ8A;
    use super::super::tests::{random_x, Rng};
    use super::super::*;
    use bytemuck::Zeroable;

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
}
