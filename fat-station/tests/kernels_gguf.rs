//! Kernels against an independent implementation: PyPI `gguf`'s dequantizers, run by
//! `scripts/kernels/make_dequant_golden.py` over rows of the real models' tensors and over
//! synthetic blocks, saved in `tests/golden/kernels/dequant.bin`.

use fat_station::engine::kernels::{dequantize_row, matmul, QMatrix};
use knot_format::DType;

const GOLDEN: &[u8] = include_bytes!("golden/kernels/dequant.bin");

/// One golden record: raw block bytes and gguf's dequantized values.
struct Record<'a> {
    name: String,
    dtype: DType,
    rows: usize,
    cols: usize,
    raw: &'a [u8],
    values: Vec<f32>,
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> &'a [u8] {
    assert!(buf.len() >= n, "golden file truncated");
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    head
}

fn u32_at(buf: &mut &[u8]) -> u32 {
    u32::from_le_bytes(take(buf, 4).try_into().expect("4 bytes"))
}

fn records() -> Vec<Record<'static>> {
    let mut buf = GOLDEN;
    assert_eq!(take(&mut buf, 8), b"KGOLD1\0\0", "golden magic");
    let n = u32_at(&mut buf);
    let mut out = Vec::new();
    for _ in 0..n {
        let id = u32_at(&mut buf);
        let dtype = DType::from_ggml_id(id).unwrap_or_else(|| panic!("unknown ggml type {id}"));
        let rows = u32_at(&mut buf) as usize;
        let cols = u32_at(&mut buf) as usize;
        let name_len = u16::from_le_bytes(take(&mut buf, 2).try_into().expect("2 bytes")) as usize;
        let name = String::from_utf8(take(&mut buf, name_len).to_vec()).expect("utf-8 name");
        let row_bytes = cols / dtype.block_elems() * dtype.block_bytes();
        let raw = take(&mut buf, rows * row_bytes);
        let values = take(&mut buf, rows * cols * 4)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push(Record {
            name,
            dtype,
            rows,
            cols,
            raw,
            values,
        });
    }
    assert!(buf.is_empty(), "trailing bytes in golden file");
    out
}

#[test]
fn golden_covers_every_dtype_and_both_models() {
    let recs = records();
    for dtype in DType::ALL {
        assert!(
            recs.iter().any(|r| r.dtype == dtype),
            "no golden record for {dtype}"
        );
    }
    for (model, dtypes) in [
        (
            "qwen2.5",
            &[DType::Q5_0, DType::Q8_0, DType::Q6_K, DType::Q4_K][..],
        ),
        ("smollm2", &[DType::Q4_1, DType::Q8_0][..]),
    ] {
        for d in dtypes {
            assert!(
                recs.iter()
                    .any(|r| r.dtype == *d && r.name.starts_with(model)),
                "no real {model} record for {d}"
            );
        }
    }
}

#[test]
fn dequantize_matches_gguf_python() {
    for rec in records() {
        let m = QMatrix::new(rec.dtype, rec.rows, rec.cols, rec.raw).expect("golden geometry");
        let mut got = vec![0f32; rec.cols];
        for r in 0..rec.rows {
            dequantize_row(rec.dtype, m.row(r), &mut got);
            let want = &rec.values[r * rec.cols..(r + 1) * rec.cols];
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                // Both sides compute the same f32 expression: bit-exact.
                assert!(
                    g.to_bits() == w.to_bits(),
                    "{} ({}) row {r} elem {i}: {g} vs gguf {w}",
                    rec.name,
                    rec.dtype
                );
            }
        }
    }
}

/// matmul of the real rows against activations with an outlier, versus gguf's dequantized
/// rows dotted in f64: within the Q8A activation bound `sum |w| * amax_32 / 254`.
#[test]
fn matmul_matches_gguf_dequantized_rows() {
    for rec in records() {
        let m = QMatrix::new(rec.dtype, rec.rows, rec.cols, rec.raw).expect("golden geometry");
        let n_tok = 2;
        let x: Vec<f32> = (0..n_tok * rec.cols)
            .map(|i| {
                let v = ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 4.0;
                if i % 211 == 3 {
                    v * 400.0
                } else {
                    v
                }
            })
            .collect();
        let mut y = vec![0f32; n_tok * rec.rows];
        matmul(&m, &x, n_tok, &mut y);
        let quant = !matches!(rec.dtype, DType::F32 | DType::F16 | DType::BF16);
        for t in 0..n_tok {
            let xt = &x[t * rec.cols..(t + 1) * rec.cols];
            for r in 0..rec.rows {
                let w = &rec.values[r * rec.cols..(r + 1) * rec.cols];
                let exact: f64 = w.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mag: f64 = w
                    .iter()
                    .zip(xt)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let bound: f64 = if quant {
                    w.chunks(32)
                        .zip(xt.chunks(32))
                        .map(|(wb, xb)| {
                            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0
                        })
                        .sum()
                } else {
                    0.0
                };
                let got = y[t * rec.rows + r] as f64;
                assert!(
                    (got - exact).abs() <= bound * 1.001 + 2e-6 * mag + 1e-30,
                    "{} t{t} r{r}: {got} vs {exact} (bound {bound})",
                    rec.name
                );
            }
        }
    }
}
