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

/// `out[j]` = the fold of row `j`'s 16 partial sums over `q`'s whole 16-element chunks.
/// Every row is at least `q.len() / 16 * 16` long.
pub type Scores16 = fn(q: &[f32], rows: &[&[f32]; 16], out: &mut [f32; 16]);

/// The kernel for `isa`, where it has one.
pub fn for_lanes(isa: LaneIsa) -> Option<Scores16> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        LaneIsa::Avx512 => Some(avx512_scores16 as Scores16),
        _ => None,
    }
}

/// The plain definition (for tests of the kernels): each row's partial sums, then the fold.
pub fn scores16_plain(q: &[f32], rows: &[&[f32]; 16], out: &mut [f32; 16]) {
    let whole = q.len() / 16;
    for (o, r) in out.iter_mut().zip(rows) {
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

#[cfg(target_arch = "x86_64")]
fn avx512_scores16(q: &[f32], rows: &[&[f32]; 16], out: &mut [f32; 16]) {
    let whole = q.len() / 16;
    assert!(rows.iter().all(|r| r.len() >= 16 * whole));
    assert!(
        std::arch::is_x86_feature_detected!("avx512f"),
        "scores: no AVX-512F on this CPU"
    );
    // SAFETY: AVX-512F checked just above; every row holds `16 * whole` floats (asserted).
    unsafe { avx512_scores16_imp(q, rows, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_scores16_imp(q: &[f32], rows: &[&[f32]; 16], out: &mut [f32; 16]) {
    use std::arch::x86_64::*;
    // SAFETY: the loads read chunk c < q.len() / 16 of `q` and of rows at least that long
    // (the caller's assert); AVX-512F present (the caller's check).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16];
        for c in 0..q.len() / 16 {
            let qc = _mm512_loadu_ps(q.as_ptr().add(16 * c));
            for (a, r) in acc.iter_mut().zip(rows) {
                let kc = _mm512_loadu_ps(r.as_ptr().add(16 * c));
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
            let rows: [&[f32]; 16] = std::array::from_fn(|j| &data[j][..]);
            let mut want = [0.0f32; 16];
            scores16_plain(&q, &rows, &mut want);
            for isa in lane_isas() {
                if let Some(f) = for_lanes(isa) {
                    let mut got = [0.0f32; 16];
                    f(&q, &rows, &mut got);
                    assert_eq!(
                        got.map(f32::to_bits),
                        want.map(f32::to_bits),
                        "{isa:?} hd {hd}"
                    );
                }
            }
        }
    }
}
