//! Attention scores sixteen cached positions at a time: for each of 16 key rows, the pairwise
//! fold of the 16 partial sums `acc[i] = sum_c q[16c + i] * k[16c + i]` over the whole
//! 16-element chunks of the head (the body of `ops::dot_f32`, without its tail).
//!
//! One position at a time, that fold is a chain of narrowing horizontal adds per position and
//! cost more than the products (a 64-element head: ~50 cycles a position on Zen 5, decode at
//! 1536 positions of context half its speed at 16). With 16 positions the four levels of the
//! fold become 15 full-width adds whose operands are gathered by two shuffles each: the
//! transposed reduction, each lane still adding exactly the pair the plain fold adds.
//!
//! [`for_lanes`] gives the kernel for the process's lane ISA, or `None` where the plain loop
//! is the one to run.

use super::lanes::LaneIsa;

/// `out[j]` = the fold of row `j`'s 16 partial sums over `q`'s whole 16-element chunks, row
/// `j` starting at `k[at + j * stride]`. Panics where row 15 would run past `k`.
pub type Scores16 = fn(q: &[f32], k: &[f32], at: usize, stride: usize, out: &mut [f32; 16]);

/// The kernel for `isa`, where it has one.
pub fn for_lanes(isa: LaneIsa) -> Option<Scores16> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        LaneIsa::Avx512 => Some(avx512_scores16 as Scores16),
        #[cfg(target_arch = "x86_64")]
        LaneIsa::Avx2 => Some(avx2_scores16 as Scores16),
        // NEON is aarch64's baseline: its plain loops are the NEON ones.
        #[cfg(target_arch = "aarch64")]
        LaneIsa::Scalar => Some(neon_scores16 as Scores16),
        _ => None,
    }
}

/// The plain definition (for tests of the kernels): each row's partial sums, then the fold.
pub fn scores16_plain(q: &[f32], k: &[f32], at: usize, stride: usize, out: &mut [f32; 16]) {
    let whole = q.len() / 16;
    for (j, o) in out.iter_mut().enumerate() {
        let r = &k[at + j * stride..][..16 * whole];
        let mut acc = [0.0f32; 16];
        for c in 0..whole {
            for i in 0..16 {
                acc[i] += q[16 * c + i] * r[16 * c + i];
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                acc[i] += acc[i + w];
            }
        }
        *o = acc[0];
    }
}

/// The first row's start, after checking that all 16 rows of `q.len() / 16` whole chunks
/// lie inside `k`.
fn first_row(q: &[f32], k: &[f32], at: usize, stride: usize) -> *const f32 {
    let end = stride
        .checked_mul(15)
        .and_then(|s| s.checked_add(at))
        .and_then(|s| s.checked_add(q.len() / 16 * 16));
    assert!(
        end.is_some_and(|e| e <= k.len()),
        "scores: rows past the cache"
    );
    k[at..].as_ptr()
}

#[cfg(target_arch = "x86_64")]
fn avx512_scores16(q: &[f32], k: &[f32], at: usize, stride: usize, out: &mut [f32; 16]) {
    let rows = first_row(q, k, at, stride);
    assert!(
        std::arch::is_x86_feature_detected!("avx512f"),
        "scores: no AVX-512F on this CPU"
    );
    // SAFETY: AVX-512F checked just above; the 16 rows lie inside `k` (`first_row`).
    unsafe { avx512_scores16_imp(q, rows, stride, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_scores16_imp(q: &[f32], rows: *const f32, stride: usize, out: &mut [f32; 16]) {
    use std::arch::x86_64::*;
    // SAFETY: the loads read chunk c < q.len() / 16 of `q` and of the 16 rows at `rows`,
    // `stride` apart (the caller's check); AVX-512F present (the caller's check).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in 0..q.len() / 16 {
            let qc = _mm512_loadu_ps(q.as_ptr().add(16 * c));
            for (j, a) in acc.iter_mut().enumerate() {
                let kc = _mm512_loadu_ps(rows.add(j * stride + 16 * c));
                // A multiply, then an add: the plain loop's two roundings, not one FMA.
                *a = _mm512_add_ps(*a, _mm512_mul_ps(qc, kc));
            }
        }
        // Level 1 (lanes i < 8 += i + 8): vector m holds rows 2m (lanes 0..8), 2m + 1 (8..16).
        let b: [__m512; 8] = std::array::from_fn(|m| {
            let (x, y) = (acc[2 * m], acc[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(x, y),
                _mm512_shuffle_f32x4::<0xEE>(x, y),
            )
        });
        // Level 2 (i < 4 += i + 4): quarter k of vector m holds row 4m + k.
        let c: [__m512; 4] = std::array::from_fn(|m| {
            let (x, y) = (b[2 * m], b[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(x, y),
                _mm512_shuffle_f32x4::<0xDD>(x, y),
            )
        });
        // Level 3 (i < 2 += i + 2): quarter k of vector m holds rows 8m + k (lanes 0, 1) and
        // 8m + 4 + k (lanes 2, 3).
        let d: [__m512; 2] = std::array::from_fn(|m| {
            let (x, y) = (c[2 * m], c[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(x, y),
                _mm512_shuffle_ps::<0xEE>(x, y),
            )
        });
        // Level 4 (lane 0 += lane 1): lane 4k + s holds row k + 4s.
        let e = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(d[0], d[1]),
            _mm512_shuffle_ps::<0xDD>(d[0], d[1]),
        );
        // Row j = k + 4s back to lane j.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_storeu_ps(out.as_mut_ptr(), _mm512_permutexvar_ps(order, e));
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_scores16(q: &[f32], k: &[f32], at: usize, stride: usize, out: &mut [f32; 16]) {
    let rows = first_row(q, k, at, stride);
    assert!(
        std::arch::is_x86_feature_detected!("avx2"),
        "scores: no AVX2 on this CPU"
    );
    for (g, out4) in out.chunks_exact_mut(4).enumerate() {
        // SAFETY: AVX2 checked just above; rows 4g..4g + 4 lie inside `k` (`first_row`).
        let folds = unsafe { avx2_scores4_imp(q, rows.add(4 * g * stride), stride) };
        out4.copy_from_slice(&folds);
    }
}

/// Four rows' folds: each row's 16 partial sums are two 256-bit accumulators (so 4 rows fill
/// 8 of the 16 registers); level 1 of the fold adds them, levels 2-4 are the transposed
/// reduction of [`avx512_scores16_imp`] on 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_scores4_imp(q: &[f32], rows: *const f32, stride: usize) -> [f32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: the loads read chunk c < q.len() / 16 of `q` and of the 4 rows at `rows`,
    // `stride` apart (the caller's check); AVX2 present (the caller's check).
    unsafe {
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        for c in 0..q.len() / 16 {
            let q0 = _mm256_loadu_ps(q.as_ptr().add(16 * c));
            let q1 = _mm256_loadu_ps(q.as_ptr().add(16 * c + 8));
            for j in 0..4 {
                let r = rows.add(j * stride + 16 * c);
                // A multiply, then an add: the plain loop's two roundings, not one FMA.
                lo[j] = _mm256_add_ps(lo[j], _mm256_mul_ps(q0, _mm256_loadu_ps(r)));
                hi[j] = _mm256_add_ps(hi[j], _mm256_mul_ps(q1, _mm256_loadu_ps(r.add(8))));
            }
        }
        // Level 1 (i < 8 += i + 8).
        let r: [__m256; 4] = std::array::from_fn(|j| _mm256_add_ps(lo[j], hi[j]));
        // Level 2 (i < 4 += i + 4): half h of vector m holds row 2m + h.
        let s: [__m256; 2] = std::array::from_fn(|m| {
            let (x, y) = (r[2 * m], r[2 * m + 1]);
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(x, y),
                _mm256_permute2f128_ps::<0x31>(x, y),
            )
        });
        // Level 3 (i < 2 += i + 2): half h holds row h (lanes 0, 1) and row 2 + h (2, 3).
        let t = _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(s[0], s[1]),
            _mm256_shuffle_ps::<0xEE>(s[0], s[1]),
        );
        // Level 4 (lane 0 += lane 1): lane 4h + g holds row h + 2g (g < 2).
        let e = _mm256_add_ps(
            _mm256_shuffle_ps::<0x88>(t, t),
            _mm256_shuffle_ps::<0xDD>(t, t),
        );
        let order = _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5);
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_permutevar8x32_ps(e, order));
        [out[0], out[1], out[2], out[3]]
    }
}

#[cfg(target_arch = "aarch64")]
fn neon_scores16(q: &[f32], k: &[f32], at: usize, stride: usize, out: &mut [f32; 16]) {
    let rows = first_row(q, k, at, stride);
    for (g, out4) in out.chunks_exact_mut(4).enumerate() {
        // SAFETY: rows 4g..4g + 4 lie inside `k` (`first_row`); NEON is aarch64's baseline.
        let folds = unsafe { neon_scores4_imp(q, rows.add(4 * g * stride), stride) };
        out4.copy_from_slice(&folds);
    }
}

/// Four rows' folds: a row's 16 partial sums are four 128-bit accumulators, whose levels 1
/// and 2 are vertical adds; levels 3 and 4 take the four rows together (halves combined,
/// then even and odd lanes unzipped), which leaves row j in lane j.
#[cfg(target_arch = "aarch64")]
unsafe fn neon_scores4_imp(q: &[f32], rows: *const f32, stride: usize) -> [f32; 4] {
    use std::arch::aarch64::*;
    // SAFETY: the loads read chunk c < q.len() / 16 of `q` and of the 4 rows at `rows`,
    // `stride` apart (the caller's check); NEON is always present on aarch64.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
        for c in 0..q.len() / 16 {
            let qp = q.as_ptr().add(16 * c);
            let qc: [float32x4_t; 4] = std::array::from_fn(|l| vld1q_f32(qp.add(4 * l)));
            for (j, a) in acc.iter_mut().enumerate() {
                let rp = rows.add(j * stride + 16 * c);
                for l in 0..4 {
                    // A multiply, then an add: the plain loop's two roundings, not one FMA.
                    a[l] = vaddq_f32(a[l], vmulq_f32(qc[l], vld1q_f32(rp.add(4 * l))));
                }
            }
        }
        // Levels 1 (i < 8 += i + 8) and 2 (i < 4 += i + 4).
        let v: [float32x4_t; 4] = std::array::from_fn(|j| {
            let a = &acc[j];
            vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]))
        });
        // Level 3 (i < 2 += i + 2): rows 2m, 2m + 1 in the halves of vector m.
        let x: [float32x4_t; 2] = std::array::from_fn(|m| {
            let (a, b) = (v[2 * m], v[2 * m + 1]);
            vaddq_f32(
                vcombine_f32(vget_low_f32(a), vget_low_f32(b)),
                vcombine_f32(vget_high_f32(a), vget_high_f32(b)),
            )
        });
        // Level 4 (lane 0 += lane 1).
        let e = vaddq_f32(vuzp1q_f32(x[0], x[1]), vuzp2q_f32(x[0], x[1]));
        let mut out = [0.0f32; 4];
        vst1q_f32(out.as_mut_ptr(), e);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::lanes::lane_isas;

    /// Every lane ISA's kernel gives the plain fold's bits: head sizes with and without a tail
    /// past the last whole chunk, rows longer than the head, signed zeros, large and tiny values.
    #[test]
    fn kernels_give_the_plain_folds() {
        let mut seed = 0x5EED_u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        for hd in [16usize, 24, 48, 64, 80, 128, 256] {
            let q: Vec<f32> = (0..hd).map(|_| next()).collect();
            let data: Vec<Vec<f32>> = (0..16)
                .map(|j| {
                    let mut r: Vec<f32> = (0..hd + 16).map(|_| next()).collect();
                    match j {
                        0 => r.iter_mut().for_each(|x| *x = -0.0),
                        1 => r[..hd].iter_mut().for_each(|x| *x *= 1e30),
                        2 => r[..hd].iter_mut().for_each(|x| *x *= 1e-30),
                        _ => {}
                    }
                    r
                })
                .collect();
            let k = data.concat();
            let (at, stride) = (3, hd + 16);
            let mut want = [0.0f32; 16];
            scores16_plain(&q, &k, at, stride, &mut want);
            for isa in lane_isas() {
                if let Some(f) = for_lanes(isa) {
                    let mut got = [0.0f32; 16];
                    f(&q, &k, at, stride, &mut got);
                    assert_eq!(
                        got.map(f32::to_bits),
                        want.map(f32::to_bits),
                        "{isa:?} hd {hd}"
                    );
                }
            }
        }
    }

    /// A block whose last row would run past the cache is refused, not read.
    #[test]
    fn rows_past_the_cache_panic() {
        let (q, k) = (vec![1.0f32; 64], vec![1.0f32; 15 * 64 + 63]);
        for isa in lane_isas() {
            if let Some(f) = for_lanes(isa) {
                let r = std::panic::catch_unwind(|| f(&q, &k, 0, 64, &mut [0.0; 16]));
                assert!(r.is_err(), "{isa:?}");
                let r = std::panic::catch_unwind(|| f(&q, &k, 1, usize::MAX / 8, &mut [0.0; 16]));
                assert!(r.is_err(), "{isa:?}");
            }
        }
    }
}
