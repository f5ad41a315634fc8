//! Row-interleaved float weights (F32, F16, BF16): a matrix's 16-row groups regrouped so that
//! a matvec streams one run of bytes front to back, as the quantized tiles do.
//!
//! A group of 16 rows is two sub-groups of [`SUB_ROWS`] = 8 rows, each stored whole before
//! the next: per 32-element chunk c (in order), the 8 rows' elements `32c..32c + 32`, row
//! after row (8 x 32 x element bytes). The kernel keeps two 16-lane accumulators per row of a
//! sub-group (lanes `i % 32`: the canonical order of
//! [`super::super::reference::float_dot`]), so 8 rows are what fits the 32 vector registers:
//! with 16 the loop spilled (F16 from DRAM 28 GB/s against 33 with 8, and the F16 Qwen-0.5B
//! decoded 22 tok/s against 30), and streaming 16-row chunks in two passes of 8 was slower
//! still. Columns must be a multiple of 32 (else the matrix keeps the row kernels).
//!
//! Why: the row kernels read four rows at once as four streams, which ran at 53% (F16, BF16)
//! and 76% (F32) of the read roofline at one thread from DRAM; one interleaved stream runs at
//! 90-99% (kernel-bench).
//!
//! Same bits as the row kernels and the reference: each row's products go into the same lanes
//! in the same order, folded by the same tree.

use super::ROWS;
use knot_format::dtype::DType;

/// Rows per sub-group.
pub(super) const SUB_ROWS: usize = 8;

/// Whether `dtype` is a float type (these groups' layout rather than tiles of blocks).
pub(super) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Elements per chunk (one accumulator pair's width).
pub(super) const CHUNK: usize = 32;

/// Group `rows` (16 rows of `cols` elements, `cols` a multiple of [`CHUNK`]) of a float type
/// into `out` (the same number of bytes) in the layout above.
pub(super) fn pack_group(dtype: DType, rows: &[&[u8]; ROWS], out: &mut [u8]) {
    let piece = CHUNK * dtype.block_bytes();
    let mut dst = out.chunks_exact_mut(piece);
    for sub in rows.chunks_exact(SUB_ROWS) {
        let chunks = sub[0].len() / piece;
        for c in 0..chunks {
            for row in sub {
                if let Some(d) = dst.next() {
                    d.copy_from_slice(&row[c * piece..(c + 1) * piece]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(in crate::kernels) mod avx512 {
    //! The AVX-512 float group kernels (callers must have checked `Isa::Avx512.available()`).

    use super::super::super::avx512::fold_lanes;
    use super::super::{Rows16FloatDot, ROWS};
    use super::{CHUNK, SUB_ROWS as S};
    use crate::kernels::roofline::touch_page;
    use knot_format::dtype::DType;
    use std::arch::x86_64::*;

    /// The float group kernels by type.
    pub(in crate::kernels) fn kernels() -> Vec<(DType, Rows16FloatDot)> {
        vec![
            (DType::F32, f32_group as Rows16FloatDot),
            (DType::F16, f16_group as Rows16FloatDot),
            (DType::BF16, bf16_group as Rows16FloatDot),
        ]
    }

    fn f32_group(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: only reachable through `kernels`, used after `Isa::Avx512.available()`.
        unsafe { f32_imp(g, x, out) }
    }

    fn f16_group(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: as for `f32_group`.
        unsafe { f16_imp(g, x, out) }
    }

    fn bf16_group(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: as for `f32_group`.
        unsafe { bf16_imp(g, x, out) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn f32_imp(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: `group` keeps every load inside `g` (its contract); AVX-512 present.
        unsafe { group::<4>(g, x, out, |p| _mm512_loadu_ps(p as *const f32)) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn f16_imp(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: as for `f32_imp`; widening f16 is exact.
        unsafe {
            group::<2>(g, x, out, |p| {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            })
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn bf16_imp(g: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]) {
        // SAFETY: as for `f32_imp`; bf16 is the high half of an f32.
        unsafe {
            group::<2>(g, x, out, |p| {
                let h = _mm256_loadu_si256(p as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            })
        }
    }

    /// One group of two 8-row sub-groups (`S`; element bytes `E`) against each activation row
    /// of `x` (all as long as a row). Per sub-group: the first token in one front-to-back
    /// pass over all 8 rows ([`one_token`]: the way DRAM streams best), which leaves the
    /// sub-group in L2; the others from there, [`BLOCK_ROWS`] rows by [`BLOCK_TOKENS`] tokens
    /// at a time ([`block`]). `load(p)`: 16 weights at `p` as f32.
    ///
    /// Why blocks: token by token, each weight was loaded and widened once per FMA, and 8
    /// tokens took 8x one token's time (kernel-bench 8-token tile from DRAM, GB/s x tokens:
    /// F32 80, F16 52); a 4 x 3 block loads and widens each weight once for 3 tokens, its 24
    /// accumulators and 6 activation vectors in registers: F32 109, F16 72 (2 x 4: 100 and
    /// 66; 2 x 6: 102 and 67; 4 x 2: 96 and 66). Token 0 apart: with every token in blocks
    /// (whose passes read the sub-group 4 rows of 8 at a time) DRAM streamed worse, F32 62
    /// and F16 45. (Tried first: widening 8 chunks to f32 once into a buffer, FMAs from it,
    /// accumulators in memory between blocks: slower than token by token.)
    ///
    /// SAFETY (callers): AVX-512 present; `load` reads only the 16 elements at its pointer.
    #[inline(always)]
    unsafe fn group<const E: usize>(
        g: &[u8],
        x: &[&[f32]],
        out: &mut [[f32; ROWS]],
        load: impl Fn(*const u8) -> __m512,
    ) {
        assert_eq!(
            x.len(),
            out.len(),
            "float group: one output per activation row"
        );
        let cols = g.len() / (ROWS * E);
        assert!(cols.is_multiple_of(CHUNK) && g.len() == ROWS * cols * E);
        assert!(x.iter().all(|x| x.len() == cols));
        for (sub, bytes) in g.chunks_exact(S * cols * E).enumerate() {
            let Some((x0, rest)) = x.split_first() else {
                return;
            };
            // SAFETY: `bytes` is one whole sub-group of `cols`-element rows and every `x` row
            // has `cols` elements (asserted above); the caller's contract for the rest.
            unsafe { one_token::<E>(bytes, x0, &mut out[0], sub * S, &load) };
            for (xs, os) in rest
                .chunks(BLOCK_TOKENS)
                .zip(out[1..].chunks_mut(BLOCK_TOKENS))
            {
                for quad in 0..S / BLOCK_ROWS {
                    let first = sub * S + quad * BLOCK_ROWS;
                    // SAFETY: as above; `quad * BLOCK_ROWS + BLOCK_ROWS <= S`.
                    unsafe {
                        match xs.len() {
                            3 => block::<E, 3>(bytes, quad, xs, os, first, &load),
                            2 => block::<E, 2>(bytes, quad, xs, os, first, &load),
                            _ => block::<E, 1>(bytes, quad, xs, os, first, &load),
                        }
                    }
                }
            }
        }
    }

    /// Rows and tokens of a [`block`].
    const BLOCK_ROWS: usize = 4;
    const BLOCK_TOKENS: usize = 3;

    /// Rows `quad * BLOCK_ROWS..(quad + 1) * BLOCK_ROWS` of sub-group `bytes` against the `N` activation
    /// rows `x`: `out[t][first + r]`. Per (row, token) the chunks in order into the same two
    /// accumulators as [`one_token`]: the same bits.
    ///
    /// SAFETY (callers): as [`one_token`], `x.len() == out.len() == N`, `quad < S / BLOCK_ROWS`.
    #[inline(always)]
    unsafe fn block<const E: usize, const N: usize>(
        bytes: &[u8],
        quad: usize,
        x: &[&[f32]],
        out: &mut [[f32; ROWS]],
        first: usize,
        load: &impl Fn(*const u8) -> __m512,
    ) {
        let piece = S * CHUNK * E;
        let xp: [*const f32; N] = std::array::from_fn(|t| x[t].as_ptr());
        // SAFETY: register-only; AVX-512 present (the caller's contract).
        let mut acc = unsafe { [[[_mm512_setzero_ps(); 2]; BLOCK_ROWS]; N] };
        for c in 0..x[0].len() / CHUNK {
            // SAFETY: rows `quad * BLOCK_ROWS..` of chunk c lie inside `bytes`; every x
            // row has elements 32c..32c + 32 (the caller's contract).
            unsafe {
                let p = bytes
                    .as_ptr()
                    .add(c * piece + quad * BLOCK_ROWS * CHUNK * E);
                let xv: [[__m512; 2]; N] = std::array::from_fn(|t| {
                    [
                        _mm512_loadu_ps(xp[t].add(CHUNK * c)),
                        _mm512_loadu_ps(xp[t].add(CHUNK * c + 16)),
                    ]
                });
                for r in 0..BLOCK_ROWS {
                    let w = p.add(r * CHUNK * E);
                    let (lo, hi) = (load(w), load(w.add(16 * E)));
                    for (a, xt) in acc.iter_mut().zip(&xv) {
                        a[r][0] = _mm512_fmadd_ps(lo, xt[0], a[r][0]);
                        a[r][1] = _mm512_fmadd_ps(hi, xt[1], a[r][1]);
                    }
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (r, ar) in a.iter().enumerate() {
                // SAFETY: register-only; AVX-512 present (the caller's contract).
                o[first + r] = unsafe { fold_lanes(ar[0], ar[1]) };
            }
        }
    }

    /// One sub-group `bytes` against one activation row, one front-to-back pass with two
    /// accumulators per row in registers: `out[first + r]` = row r's dot.
    ///
    /// SAFETY (callers): as [`group`], with `bytes` one sub-group of `x.len()`-element rows.
    #[inline(always)]
    unsafe fn one_token<const E: usize>(
        bytes: &[u8],
        x: &[f32],
        out: &mut [f32; ROWS],
        first: usize,
        load: &impl Fn(*const u8) -> __m512,
    ) {
        let piece = S * CHUNK * E;
        let xp = x.as_ptr();
        // SAFETY: register-only; AVX-512 present (the caller's contract).
        let (mut lo, mut hi) = unsafe { ([_mm512_setzero_ps(); S], [_mm512_setzero_ps(); S]) };
        for c in 0..x.len() / CHUNK {
            // SAFETY: chunk c of the sub-group is `piece` bytes inside `bytes`; x's elements
            // 32c..32c + 32 exist (the caller's contract); the page touch is a prefetch.
            unsafe {
                let p = bytes.as_ptr().add(c * piece);
                touch_page(p, piece);
                let x0 = _mm512_loadu_ps(xp.add(CHUNK * c));
                let x1 = _mm512_loadu_ps(xp.add(CHUNK * c + 16));
                for r in 0..S {
                    let w = p.add(r * CHUNK * E);
                    lo[r] = _mm512_fmadd_ps(load(w), x0, lo[r]);
                    hi[r] = _mm512_fmadd_ps(load(w.add(16 * E)), x1, hi[r]);
                }
            }
        }
        for r in 0..S {
            // SAFETY: register-only; AVX-512 present (the caller's contract).
            out[first + r] = unsafe { fold_lanes(lo[r], hi[r]) };
        }
    }
}
