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
    /// of `x` (all as long as a row): per sub-group, per token, one pass ([`one_token`]); the
    /// sub-group stays in L2 for the tokens after the first. `load(p)`: 16 weights at `p` as
    /// f32.
    ///
    /// (Tried for several tokens, with 16-row sub-groups: widening a block of 8 chunks to f32
    /// once into a buffer, then each token's FMAs from it, accumulators in memory between
    /// blocks. From cache it ran 9.5x one token's time for 8 tokens (F16), against 8x for
    /// this.)
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
            for (xt, o) in x.iter().zip(out.iter_mut()) {
                // SAFETY: `bytes` is one whole sub-group of `cols`-element rows and every `x`
                // row has `cols` elements (asserted above); the caller's contract for the rest.
                unsafe { one_token::<E>(bytes, xt, o, sub * S, &load) };
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
