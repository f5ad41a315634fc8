//! Kernel unit tests: dot kernels against dequantize + f64 dot, matmul tolerance and
//! determinism, and (per ISA) SIMD against the scalar reference.

use super::blocks::*;
use super::*;

/// SplitMix64: a tiny deterministic PRNG so tests need no `rand`.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(crate) fn bytes(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.next_u64() as u8;
        }
    }
}

/// Random bytes for `n_elems` of `dtype`, with sane (finite, small) scales and floats.
pub(crate) fn random_row(dtype: DType, n_elems: usize, rng: &mut Rng) -> Vec<u8> {
    let nb = n_elems / dtype.block_elems();
    let bb = dtype.block_bytes();
    let mut v = vec![0u8; nb * bb];
    match dtype {
        DType::F32 => {
            for c in v.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f32().to_le_bytes());
            }
        }
        DType::F16 => {
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.f32()).to_le_bytes());
            }
        }
        DType::BF16 => {
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.f32()).to_le_bytes());
            }
        }
        DType::MXFP4 => {
            rng.bytes(&mut v);
            // Scales 2^-20 .. 2^-1, and every 5th block one of the subnormal / smallest
            // normal halves (e = 0, 1, 2) so the e8m0 decoding's edge is covered.
            for (i, blk) in v.chunks_exact_mut(bb).enumerate() {
                blk[0] = if i % 5 == 3 {
                    (i / 5 % 3) as u8
                } else {
                    108 + blk[0] % 20
                };
            }
        }
        _ => {
            rng.bytes(&mut v);
            for blk in v.chunks_exact_mut(bb) {
                for &off in f16_fields(dtype) {
                    let s = rng.f32() * 0.01;
                    blk[off..off + 2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
                }
            }
        }
    }
    v
}

/// Random activations, with an outlier like Qwen's first position in some blocks.
pub(crate) fn random_x(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i % 97 == 5 {
                1000.0 * rng.f32()
            } else {
                rng.f32() * 3.0
            }
        })
        .collect()
}

fn dequant(dtype: DType, row: &[u8], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; cols];
    dequantize_row(dtype, row, &mut out);
    out
}

fn dequant_q8a(xq: &[BlockQ8A]) -> Vec<f32> {
    xq.iter()
        .flat_map(|b| b.qs.iter().map(move |&q| b.d * q as f32))
        .collect()
}

/// Every block-quantized type (the float types have one-element blocks).
fn quant_types() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|t| t.block_elems() > 1)
}

#[test]
fn q8a_quantization_error_is_at_most_half_a_step() {
    let mut rng = Rng::new(1);
    let x = random_x(32 * 64, &mut rng);
    let mut xq = Vec::new();
    quantize_q8a(&x, &mut xq);
    for (b, xb) in xq.iter().zip(x.chunks_exact(32)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!((b.d - amax / 127.0).abs() <= 1e-6 * amax);
        let s: [i16; 2] = [
            b.qs[..16].iter().map(|&q| q as i16).sum(),
            b.qs[16..].iter().map(|&q| q as i16).sum(),
        ];
        assert_eq!(b.sums, s);
        assert_eq!(b.s, b.d * (s[0] as i32 + s[1] as i32) as f32);
        for (q, v) in b.qs.iter().zip(xb) {
            assert!(
                (*q as f32 * b.d - v).abs() <= 0.5001 * b.d,
                "{v} -> {q} * {}",
                b.d
            );
        }
    }
}

/// Every reference dot kernel equals dequantize(w) . dequantize(xq) computed in f64: the
/// integer paths are exact, so only f32 rounding of the block sums remains.
#[test]
fn reference_dots_match_dequantized_dot() {
    let mut rng = Rng::new(2);
    let cols = 512;
    for dtype in quant_types() {
        for _ in 0..20 {
            let w = random_row(dtype, cols, &mut rng);
            let x = random_x(cols, &mut rng);
            let mut xq = Vec::new();
            quantize_q8a(&x, &mut xq);
            let wd = dequant(dtype, &w, cols);
            let xd = dequant_q8a(&xq);
            let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let Dot::Quant(f) = Kernels::for_isa(Isa::Scalar).unwrap().dot(dtype) else {
                panic!("{dtype} must be a quantized kernel")
            };
            let got = f(&w, &xq) as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * mag + 1e-30,
                "{dtype}: {got} vs {exact} (mag {mag})"
            );
        }
    }
}

#[test]
fn qmatrix_checks_geometry() {
    let data = vec![0u8; 2 * 144];
    assert!(QMatrix::new(DType::Q4_K, 2, 256, &data).is_ok());
    assert!(matches!(
        QMatrix::new(DType::Q4_K, 2, 128, &data),
        Err(KernelError::RaggedColumns { .. })
    ));
    assert!(matches!(
        QMatrix::new(DType::Q4_K, 3, 256, &data),
        Err(KernelError::WrongLength {
            expected: 432,
            actual: 288,
            ..
        })
    ));
    assert!(matches!(
        QMatrix::new(DType::Q8_0, usize::MAX, 64, &data),
        Err(KernelError::Overflow { .. })
    ));
    let m = QMatrix::new(DType::Q4_K, 2, 256, &data).unwrap();
    assert_eq!(m.row_bytes(), 144);
    assert_eq!(m.row(1).len(), 144);
}

/// matmul against dequantize + f64 dot, within the bound the Q8A scheme guarantees:
/// |sum w (x - x^)| <= sum |w| d_x / 2, plus f32 rounding.
#[test]
fn matmul_matches_f32_within_q8_bound() {
    let mut rng = Rng::new(3);
    // Odd row counts exercise partial chunks; 1 row is the tiny case.
    for (rows, cols) in [(1, 256), (37, 512), (203, 768)] {
        for dtype in DType::ALL {
            let data = random_row(dtype, rows * cols, &mut rng);
            let w = QMatrix::new(dtype, rows, cols, &data).unwrap();
            let n_tok = 3;
            let x = random_x(n_tok * cols, &mut rng);
            let mut y = vec![0f32; n_tok * rows];
            matmul(&w, &x, n_tok, &mut y);
            for t in 0..n_tok {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let wd = dequant(dtype, w.row(r), cols);
                    let exact: f64 = wd.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = wd
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let bound: f64 = if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
                        0.0
                    } else {
                        wd.chunks(32)
                            .zip(xt.chunks(32))
                            .map(|(wb, xb)| {
                                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0
                            })
                            .sum()
                    };
                    let got = y[t * rows + r] as f64;
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 2e-6 * mag + 1e-30,
                        "{dtype} [{rows}x{cols}] t{t} r{r}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// Regression guard for the determinism contract: same bits for 1 and 2 threads and for a
/// batch versus one row at a time.
#[test]
fn matmul_is_bit_identical_across_threads_and_batching() {
    let mut rng = Rng::new(4);
    let (rows, cols, n_tok) = (131, 512, 5);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let (p1, p2) = (pool(1), pool(2));
    for dtype in DType::ALL {
        let data = random_row(dtype, rows * cols, &mut rng);
        let w = QMatrix::new(dtype, rows, cols, &data).unwrap();
        let x = random_x(n_tok * cols, &mut rng);
        let mut y1 = vec![0f32; n_tok * rows];
        let mut y2 = vec![0f32; n_tok * rows];
        p1.install(|| matmul(&w, &x, n_tok, &mut y1));
        p2.install(|| matmul(&w, &x, n_tok, &mut y2));
        let mut y_single = vec![0f32; n_tok * rows];
        for t in 0..n_tok {
            let mut yt = vec![0f32; rows];
            p2.install(|| matmul(&w, &x[t * cols..(t + 1) * cols], 1, &mut yt));
            y_single[t * rows..(t + 1) * rows].copy_from_slice(&yt);
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y1), bits(&y2), "{dtype}: 1 vs 2 threads");
        assert_eq!(
            bits(&y1),
            bits(&y_single),
            "{dtype}: batched vs one row at a time"
        );
        assert!(
            y1.iter().any(|v| *v != 0.0),
            "{dtype}: outputs are all zero"
        );
    }
}

/// Every kernel flavour this CPU can run (x86: scalar, AVX2, AVX-VNNI, AVX-512; aarch64: scalar, plain
/// NEON, NEON dotprod).
pub(crate) fn flavours() -> Vec<Kernels> {
    [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Neon,
        Isa::NeonDotprod,
    ]
    .into_iter()
    .filter_map(Kernels::for_isa)
    .collect()
}

/// Cross-ISA bit identity, the kernels' half: every flavour's dot (quantized and float) and
/// every flavour's [`linear_with`] (16-row kernels where the flavour has them, block kernels
/// for the rows past the last full group) give the scalar reference's bits on random blocks,
/// for 1, 3, 8 and 11 tokens (float rows also 70, and of ragged lengths). A mixed x86 +
/// aarch64 mesh relies on this.
#[test]
fn every_flavour_gives_the_reference_bits() {
    let mut rng = Rng::new(24);
    let all = flavours();
    eprintln!(
        "flavours: {:?}",
        all.iter().map(|k| k.isa).collect::<Vec<_>>()
    );
    let scalar = Kernels::for_isa(Isa::Scalar).expect("scalar");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let float = [DType::F32, DType::F16, DType::BF16];
    for dtype in quant_types().chain(float) {
        // 37 rows: two 16-row groups and a tail of 5; one to 19 (super-)blocks per row; float
        // rows also with a lane tail (100 = 3 * 32 + 4) and shorter than one round (7).
        for cols in [256usize, 896, 4864, 100, 7] {
            if !cols.is_multiple_of(dtype.block_elems()) {
                continue;
            }
            let rows = 37;
            let data = random_row(dtype, rows * cols, &mut rng);
            let w = QMatrix::new(dtype, rows, cols, &data).unwrap();
            let lin = Linear::new(w);
            // Float kernels take up to 64 tokens a call: 70 crosses one.
            let toks: &[usize] = if dtype.block_elems() == 1 {
                &[1, 3, 8, 11, 70]
            } else {
                &[1, 3, 8, 11]
            };
            for &n_tok in toks {
                let x = random_x(n_tok * cols, &mut rng);
                let mut want = vec![0f32; n_tok * rows];
                matmul_with(&scalar, &w, &x, n_tok, &mut want);
                for k in &all {
                    let mut got = vec![f32::NAN; n_tok * rows];
                    linear_with(k, &lin, &x, n_tok, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{dtype} cols {cols} n_tok {n_tok}: {:?} linear vs scalar",
                        k.isa
                    );
                    let mut got = vec![f32::NAN; n_tok * rows];
                    matmul_with(k, &w, &x, n_tok, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{dtype} cols {cols} n_tok {n_tok}: {:?} block kernels vs scalar",
                        k.isa
                    );
                }
            }
        }
    }
}
