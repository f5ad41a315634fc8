//! Quantized compute kernels: dequantization and matrix products on GGML blocks.
//!
//! Weights stay in their GGML blocks (straight from the mmap), except where the kernel table
//! has 16-row kernels for a type: then a [`Linear`] keeps an [`Interleaved`] copy (same bytes,
//! 16 rows regrouped per block, built once; the mmapped pages are released). Activations are
//! quantized once per call to [`BlockQ8A`] (one f32 scale per 32 values, i8 quants) and every
//! quantized format does integer dot products against them, as llama.cpp does with Q8_0 /
//! Q8_K, but with a per-32 scale for the k-quants too (see [`BlockQ8A`]).
//! Float weights (F32, F16, BF16) are dotted against the f32 activations directly (on
//! AVX-512 from an interleaved copy too: [`interleaved::floats`]).
//!
//! Layout: [`blocks`] (ggml block structs), [`reference`] (scalar specification),
//! [`interleaved`] (the 16-row layout, its specification, AVX2, AVX-512 and NEON kernels),
//! `avx2` (x86_64 AVX2+FMA+F16C), `avx512` (AVX-512 activation quantization), `neon`
//! (aarch64, `sdot` where the CPU has dotprod), one dispatch point ([`Kernels`]) chosen once
//! per process.
//!
//! Determinism: an output value depends only on its weight row and its activation row, so
//! results are bit-identical whatever the thread count and however rows of `x` are batched.
//!
//! Cross-ISA bit identity: every quantized kernel of every flavour (scalar, AVX2, AVX-512,
//! plain NEON, NEON dotprod; block and 16-row kernels) gives the reference's bits, so a mixed x86 +
//! aarch64 mesh computes what one node computes. Integer sums are exact (any order), and the
//! f32 steps follow one canonical order per type, written in [`reference`]: for Q4_0, Q5_0,
//! Q8_0, Q4_K, Q6_K, IQ4_NL and IQ4_XS the 16-row kernels' order (blocks in order,
//! `acc = fma(d_w, f32(isum) * d_x, acc)`, see [`interleaved`]), chosen because it is the fast
//! x86 path's and costs an in-order NEON core nothing extra per legacy block; for the other
//! types the reference's plain expressions, which their 16-row kernels follow lane for lane
//! (kept so the existing NEON and AVX2 block kernels keep their bits).
//!
//! Adding a type: its `DType` (knot-format), block struct ([`blocks`]), reference dequant and
//! dot plus one arm of [`reference::row`]; SIMD kernels add `(DType, kernel)` pairs to an
//! ISA's list, and a 16-row layout adds a [`interleaved::tile_bytes`] arm with its pack,
//! unpack and specification. Float-weight dots (F32, F16, BF16) follow one order too
//! ([`reference::float_dot`]: 32 fma lanes, element i into lane i % 32, then a fixed pairwise
//! tree), four AVX2 or eight NEON accumulators.

pub mod blocks;
pub mod interleaved;
pub mod lanes;
pub mod reference;
pub mod roofline;
pub mod scan;
pub mod scores;

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "aarch64")]
pub mod neon;

use super::team;
use blocks::BlockQ8A;
use interleaved::{Interleaved, Rows16Dot, Rows16FloatDot};
use knot_format::dtype::{DType, QK};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Errors from building kernel views over tensor bytes.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The row length is not a whole number of blocks.
    #[error("{dtype}: {cols} columns is not a whole number of {block}-element blocks")]
    RaggedColumns {
        dtype: DType,
        cols: usize,
        block: usize,
    },
    /// The byte slice does not hold exactly `rows * row_bytes`.
    #[error("{dtype} [{rows} x {cols}]: expected {expected} bytes, got {actual}")]
    WrongLength {
        dtype: DType,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    /// `rows * row_bytes` overflows `usize`.
    #[error("{dtype} [{rows} x {cols}]: size overflows")]
    Overflow {
        dtype: DType,
        rows: usize,
        cols: usize,
    },
}

/// A row-major quantized matrix over borrowed bytes: `rows` rows of `cols` elements, each
/// row a whole number of `dtype` blocks. A GGUF tensor of shape `[ne0, ne1]` is `ne1` rows
/// of `ne0` columns.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Element type (block layout) of every row.
    pub dtype: DType,
    /// Number of rows (output features of a matmul).
    pub rows: usize,
    /// Elements per row (input features of a matmul).
    pub cols: usize,
    /// `rows * row_bytes()` bytes, unaligned is fine.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Checks `cols` is a whole number of blocks and `data.len() == rows * row_bytes`.
    pub fn new(
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let block = dtype.block_elems();
        if !cols.is_multiple_of(block) {
            return Err(KernelError::RaggedColumns { dtype, cols, block });
        }
        let expected = (cols / block)
            .checked_mul(dtype.block_bytes())
            .and_then(|rb| rb.checked_mul(rows))
            .ok_or(KernelError::Overflow { dtype, rows, cols })?;
        if data.len() != expected {
            return Err(KernelError::WrongLength {
                dtype,
                rows,
                cols,
                expected,
                actual: data.len(),
            });
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_elems() * self.dtype.block_bytes()
    }

    /// The bytes of row `r` (panics when `r >= rows`).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// Dequantize one row (`dst.len()` elements, `src` exactly their blocks) into `dst`.
///
/// Panics when `dst.len()` is not a whole number of blocks or `src` has the wrong length.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let be = dtype.block_elems();
    assert!(
        dst.len().is_multiple_of(be),
        "dequantize_row: {} elements is not whole {dtype} blocks",
        dst.len()
    );
    assert_eq!(
        src.len(),
        dst.len() / be * dtype.block_bytes(),
        "dequantize_row: {dtype} byte length"
    );
    (reference::row(dtype).dequant)(src, dst)
}

/// Dot of a float-format weight row with f32 activations.
pub type DotF = fn(&[u8], &[f32]) -> f32;
/// Dots of four float-format weight rows with one f32 activation row, each row in the
/// canonical order of [`reference::float_dot`] (the bits of four [`DotF`] calls): the
/// activation loads serve the four rows.
pub type DotF4 = fn([&[u8]; 4], &[f32]) -> [f32; 4];
/// Dot of a quantized weight row with Q8A activations.
pub type DotQ = fn(&[u8], &[BlockQ8A]) -> f32;

/// The dot-product kernel for one weight type.
#[derive(Clone, Copy)]
pub enum Dot {
    /// F32 / F16 / BF16 rows against f32 activations.
    Float(DotF),
    /// Block-quantized rows against [`BlockQ8A`] activations.
    Quant(DotQ),
}

/// Dequantization of one row of a weight type (`dst` whole blocks, `src` their bytes).
pub type Dequant = fn(&[u8], &mut [f32]);

/// One weight type's kernels under one instruction set: a row of [`Kernels`]. The reference
/// rows ([`reference::row`]) list every [`DType`] once; an ISA replaces the entries it has.
#[derive(Clone, Copy)]
pub struct KernelRow {
    /// Row to f32 (the reference's on every ISA: it runs once per row, off the hot path).
    pub dequant: Dequant,
    /// One weight row against one activation row.
    pub dot: Dot,
    /// 16 rows over [`Interleaved`] tiles (of [`interleaved::tile_bytes`] each) against up
    /// to 8 activation rows, where this ISA has a kernel for the type.
    pub rows16: Option<Rows16Dot>,
    /// 16 float rows over their [`Interleaved`] group ([`interleaved::floats`]) against f32
    /// activation rows, where this ISA has a kernel for the type.
    pub rows16_float: Option<Rows16FloatDot>,
    /// Four float rows at once ([`DotF4`]), where this ISA has it for the type.
    pub float4: Option<DotF4>,
}

/// Instruction sets a kernel table can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable scalar reference.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 [`Isa::Avx2`] + AVX-VNNI (256-bit `vpdpbusd`: Intel client cores since Alder
    /// Lake, Gracemont / Crestmont E-cores as in the N100, AMD Zen 5); bit-identical to it.
    AvxVnni,
    /// x86_64 AVX-512 F/BW/VL/DQ + VNNI on top of [`Isa::Avx2`].
    Avx512,
    /// aarch64 NEON (baseline ARMv8.0: `smull`/`sadalp` integer dots).
    Neon,
    /// aarch64 NEON with the ARMv8.2 dotprod extension (`sdot`); bit-identical to [`Isa::Neon`].
    NeonDotprod,
}

impl Isa {
    /// Whether this CPU can run the kernels for `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => Isa::Avx2.available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => neon::dotprod_available(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best instruction set this CPU supports. `FAT_KERNELS=scalar|avx2|avxvnni|avx512` caps it
    /// (for comparisons; an unavailable choice falls back to the best available below it);
    /// on aarch64 `FAT_KERNELS=scalar|neon` (`neon`: plain NEON even where dotprod exists).
    pub fn detect() -> Isa {
        #[cfg(target_arch = "aarch64")]
        return match std::env::var("FAT_KERNELS").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("neon") => Isa::Neon,
            _ if Isa::NeonDotprod.available() => Isa::NeonDotprod,
            _ => Isa::Neon,
        };
        #[allow(unreachable_code)]
        let order = [Isa::Avx512, Isa::AvxVnni, Isa::Avx2];
        let cap = match std::env::var("FAT_KERNELS").as_deref() {
            Ok("scalar") => return Isa::Scalar,
            Ok("avxvnni") => 1,
            Ok("avx2") => 2,
            _ => 0,
        };
        order[cap..]
            .iter()
            .copied()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }
}

/// A kernel table: one [`KernelRow`] per [`DType`] (at [`DType::index`]), all for the same
/// [`Isa`].
pub struct Kernels {
    /// The instruction set the table was built for.
    pub isa: Isa,
    rows: [KernelRow; DType::COUNT],
}

impl Kernels {
    /// The table for `isa`, or `None` when this CPU cannot run it.
    pub fn for_isa(isa: Isa) -> Option<Kernels> {
        if !isa.available() {
            return None;
        }
        let mut k = Kernels {
            isa: Isa::Scalar,
            rows: DType::ALL.map(reference::row),
        };
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) {
            k.isa = Isa::Avx2;
            k.set_dots(avx2::kernels());
            k.set_rows16(interleaved::avx2::kernels());
            for (dtype, f) in avx2::float4_kernels() {
                k.rows[dtype.index()].float4 = Some(f);
            }
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::AvxVnni {
            k.isa = Isa::AvxVnni;
            k.set_rows16(interleaved::avx2::vnni_kernels());
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            k.isa = Isa::Avx512;
            k.set_rows16(interleaved::avx512::kernels());
            for (dtype, f) in avx512::float4_kernels() {
                k.rows[dtype.index()].float4 = Some(f);
            }
            for (dtype, f) in interleaved::floats::avx512::kernels() {
                k.rows[dtype.index()].rows16_float = Some(f);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if matches!(isa, Isa::Neon | Isa::NeonDotprod) {
            k.isa = isa;
            let dotprod = isa == Isa::NeonDotprod;
            k.set_dots(neon::kernels(dotprod));
            k.set_rows16(interleaved::neon::kernels(dotprod));
            k.set_rows16(interleaved::neon_kquants::kernels(dotprod));
        }
        Some(k)
    }

    /// Replaces the dot products of the listed types.
    #[allow(dead_code)] // unused only where no SIMD flavour is compiled in
    fn set_dots(&mut self, dots: impl IntoIterator<Item = (DType, Dot)>) {
        for (dtype, dot) in dots {
            self.rows[dtype.index()].dot = dot;
        }
    }

    /// Installs the 16-row kernels of the listed types.
    #[allow(dead_code)] // unused only where no SIMD flavour is compiled in
    fn set_rows16(&mut self, kernels: impl IntoIterator<Item = (DType, Rows16Dot)>) {
        for (dtype, f) in kernels {
            self.rows[dtype.index()].rows16 = Some(f);
        }
    }

    /// The kernels for `dtype`.
    pub fn row(&self, dtype: DType) -> &KernelRow {
        &self.rows[dtype.index()]
    }

    /// The dot-product kernel for `dtype`.
    pub fn dot(&self, dtype: DType) -> Dot {
        self.row(dtype).dot
    }

    /// This table without its 16-row kernels: [`linear_with`] then uses the block kernels
    /// (benchmarks compare the two).
    pub fn without_rows16(mut self) -> Kernels {
        self.rows.iter_mut().for_each(|r| {
            r.rows16 = None;
            r.rows16_float = None;
        });
        self
    }

    /// The 16-row kernel over [`Interleaved`] weights of `dtype`, where this table has one.
    pub fn rows16(&self, dtype: DType) -> Option<Rows16Dot> {
        self.row(dtype).rows16
    }

    /// The 16-row float kernel over [`Interleaved`] weights of `dtype`, where this table has
    /// one.
    pub fn rows16_float(&self, dtype: DType) -> Option<Rows16FloatDot> {
        self.row(dtype).rows16_float
    }

    /// Whether this table reads `dtype` from an [`Interleaved`] copy.
    pub fn packs(&self, dtype: DType) -> bool {
        self.rows16(dtype).is_some() || self.rows16_float(dtype).is_some()
    }
}

/// The process-wide kernel table, chosen once on first use.
pub fn kernels() -> &'static Kernels {
    static K: OnceLock<Kernels> = OnceLock::new();
    K.get_or_init(|| {
        let isa = Isa::detect();
        tracing::debug!(?isa, "kernel dispatch");
        Kernels::for_isa(isa)
            .unwrap_or_else(|| Kernels::for_isa(Isa::Scalar).expect("scalar always available"))
    })
}

/// Quantize `x` (`n` rows of `cols`, cols a multiple of 32) into `out`, resized to fit.
pub fn quantize_q8a(x: &[f32], out: &mut Vec<BlockQ8A>) {
    assert!(
        x.len().is_multiple_of(QK),
        "quantize_q8a: {} is not a multiple of {QK}",
        x.len()
    );
    out.clear();
    out.resize(x.len() / QK, bytemuck::Zeroable::zeroed());
    #[cfg(target_arch = "x86_64")]
    if kernels().isa == Isa::Avx512 {
        // SAFETY: the table is only built for `Avx512` where `Isa::Avx512.available()`.
        // Bit-identical to the reference, so the choice never changes a result.
        unsafe { avx512::quantize_row_q8a(x, out) };
        return;
    }
    reference::quantize_row_q8a(x, out);
}

thread_local! {
    /// Per-thread activation scratch, reused across calls (no allocation per call once warm).
    static XQ: RefCell<Vec<BlockQ8A>> = const { RefCell::new(Vec::new()) };
}

/// Whether the matrix products add the weight bytes they read to [`WEIGHT_BYTES`].
static COUNTING: AtomicBool = AtomicBool::new(false);
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Starts (`true`) or stops counting the weight bytes every matrix product reads (each
/// matrix's whole rows once per call, whatever the batch: what a decoded token streams), and
/// returns the count so far, reset to 0. aeon-bench's bytes per decoded token as the kernels
/// see them, against the page-level measurement of scripts/bench/moe_bytes.py. Off, it costs
/// one relaxed load per product.
pub fn count_weight_bytes(on: bool) -> u64 {
    COUNTING.store(on, Ordering::Relaxed);
    WEIGHT_BYTES.swap(0, Ordering::Relaxed)
}

fn counted(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        WEIGHT_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Rows per parallel task: small enough to balance 2+ threads on a 896-row matvec, large enough
/// that scheduling costs nothing next to the dot products.
const MIN_ROWS_PER_TASK: usize = 16;

/// `y[t * w.rows + r] = dot(W row r, x[t * w.cols ..][..w.cols])` for `t in 0..n_tok`.
///
/// Parallel over output rows (see [`team`]); each weight row is read once for all `n_tok`
/// activation rows. Deterministic: each output depends only on (W row r, x row t).
///
/// Panics when `x.len() != n_tok * w.cols` or `y.len() != n_tok * w.rows`.
pub fn matmul(w: &QMatrix, x: &[f32], n_tok: usize, y: &mut [f32]) {
    matmul_with(kernels(), w, x, n_tok, y)
}

/// [`matmul`] with an explicit kernel table (tests compare instruction sets with it).
pub fn matmul_with(k: &Kernels, w: &QMatrix, x: &[f32], n_tok: usize, y: &mut [f32]) {
    assert_eq!(x.len(), n_tok * w.cols, "matmul: x is not n_tok x cols");
    assert_eq!(y.len(), n_tok * w.rows, "matmul: y is not n_tok x rows");
    if n_tok == 0 || w.rows == 0 {
        return;
    }
    counted(w.data.len());
    match k.dot(w.dtype) {
        Dot::Float(f) => match k.row(w.dtype).float4 {
            Some(f4) => run_rows4(w, n_tok, y, |rows, t| {
                f4(rows, &x[t * w.cols..(t + 1) * w.cols])
            }),
            None => run_rows(w, n_tok, y, |row, t| {
                f(row, &x[t * w.cols..(t + 1) * w.cols])
            }),
        },
        Dot::Quant(f) => with_q8a(x, |xq| {
            let nb = w.cols / QK;
            run_rows(w, n_tok, y, |row, t| f(row, &xq[t * nb..(t + 1) * nb]))
        }),
    }
}

/// Runs `body` on `x` quantized to [`BlockQ8A`] in this thread's reused scratch.
fn with_q8a<R>(x: &[f32], body: impl FnOnce(&[BlockQ8A]) -> R) -> R {
    let mut fresh = Vec::new();
    XQ.with(|cell| {
        // A nested call on this thread (never expected) gets its own buffer.
        let mut guard = cell.try_borrow_mut();
        let xq = match guard.as_deref_mut() {
            Ok(v) => v,
            Err(_) => &mut fresh,
        };
        quantize_q8a(x, xq);
        body(xq)
    })
}

/// A weight matrix as the forward pass uses it: the mmapped blocks, plus (built on first use,
/// where the process's kernel table has a 16-row kernel for the type) an [`Interleaved`] copy.
///
/// Dereferences to the [`QMatrix`], so `w.rows`, `w.dtype`, `w.row(r)` read as before.
pub struct Linear<'a> {
    /// The blocks as stored.
    pub q: QMatrix<'a>,
    /// The file `q` is mapped from: its pages are released once the copy exists.
    source: Option<&'a knot_format::Knot>,
    interleaved: OnceLock<Option<Interleaved>>,
}

impl<'a> Linear<'a> {
    /// A matrix with no interleaved copy yet.
    pub fn new(q: QMatrix<'a>) -> Self {
        Linear {
            q,
            source: None,
            interleaved: OnceLock::new(),
        }
    }

    /// A matrix whose bytes lie in `knot`'s mapping: after packing, the packed rows' pages
    /// are released ([`knot_format::Knot::release`]) so the process holds each weight once.
    pub fn mapped(q: QMatrix<'a>, knot: &'a knot_format::Knot) -> Self {
        Linear {
            source: Some(knot),
            ..Linear::new(q)
        }
    }

    /// Never make the interleaved copy: the kernels read the mapped blocks, which the OS can
    /// evict and page back in from the file (a station whose memory is below its weights;
    /// the copy is anonymous memory, which without swap cannot be evicted). Same bits either
    /// way. No effect once the copy exists.
    pub fn keep_in_file(&self) {
        let _ = self.interleaved.set(None);
    }

    /// Bytes an interleaved copy would take under `k` (the matrix's own size), 0 when `k` has
    /// no 16-row kernel for the type.
    pub fn packable_bytes(&self, k: &Kernels) -> usize {
        if k.packs(self.q.dtype) && interleaved::packable(&self.q) {
            self.q.data.len()
        } else {
            0
        }
    }

    /// The interleaved copy when `k` has a 16-row kernel for the type, packed on first call
    /// (concurrent callers wait for the one packing).
    pub fn interleaved(&self, k: &Kernels) -> Option<&Interleaved> {
        if !k.packs(self.q.dtype) {
            return None;
        }
        self.interleaved
            .get_or_init(|| {
                let p = match self.source {
                    Some(knot) => Interleaved::pack_releasing(&self.q, &|b| knot.release(b))?,
                    None => Interleaved::pack(&self.q)?,
                };
                tracing::debug!(dtype = %self.q.dtype, rows = self.q.rows, cols = self.q.cols, "interleaved");
                Some(p)
            })
            .as_ref()
    }
}

impl<'a> std::ops::Deref for Linear<'a> {
    type Target = QMatrix<'a>;
    fn deref(&self) -> &QMatrix<'a> {
        &self.q
    }
}

/// [`matmul`] for a [`Linear`]: the 16-row kernels over its interleaved copy where the kernel
/// table has them (rows past the last full group of 16 take the block kernel), else [`matmul`].
/// Same contract and the same determinism: an output depends only on its row and token.
pub fn linear(w: &Linear, x: &[f32], n_tok: usize, y: &mut [f32]) {
    linear_with(kernels(), w, x, n_tok, y)
}

/// [`linear`] with an explicit kernel table.
pub fn linear_with(k: &Kernels, w: &Linear, x: &[f32], n_tok: usize, y: &mut [f32]) {
    linears_with(k, &mut [(w, y)], x, n_tok)
}

/// Several [`linear`]s over the same input `x` (`n_tok` rows of `cols`): `outs[i].1 = W_i x`,
/// laid out `(n_tok, W_i.rows)` (q/k/v, gate/up). Where every matrix has a 16-row kernel, one
/// activation quantization and one parallel pass cover all their groups (one fork-join, not
/// one per matrix); otherwise each is a [`linear`]. Same bits either way.
pub fn linears(outs: &mut [(&Linear, &mut [f32])], x: &[f32], n_tok: usize) {
    linears_with(kernels(), outs, x, n_tok)
}

/// [`linears`] with an explicit kernel table.
pub fn linears_with(k: &Kernels, outs: &mut [(&Linear, &mut [f32])], x: &[f32], n_tok: usize) {
    const MAX: usize = 4;
    let outs_len = outs.len();
    let cols = outs.first().map_or(0, |(w, _)| w.cols);
    let fusable = |w: &Linear| w.cols == cols && group_dot(k, w, &[], &[]).is_some();
    if outs.len() > MAX || !outs.iter().all(|(w, _)| fusable(w)) {
        for (w, y) in outs.iter_mut() {
            if outs_len > 1 && fusable(w) {
                linears_with(k, &mut [(*w, &mut **y)], x, n_tok);
            } else {
                matmul_with(k, w, x, n_tok, y);
            }
        }
        return;
    }
    for (w, y) in outs.iter() {
        assert_eq!(x.len(), n_tok * w.cols, "linear: x is not n_tok x cols");
        assert_eq!(y.len(), n_tok * w.rows, "linear: y is not n_tok x rows");
    }
    if n_tok == 0 {
        return;
    }
    counted(outs.iter().map(|(w, _)| w.q.data.len()).sum());
    let any_quant = outs.iter().any(|(w, _)| groupable(k, w));
    let mut with_acts = |xq: &[BlockQ8A]| {
        let mut targets = [None; MAX];
        for (t, (w, y)) in targets.iter_mut().zip(outs.iter_mut()) {
            *t = group_dot(k, w, xq, x).map(|(p, dot)| GroupTarget {
                p,
                dot,
                out: OutPtr(y.as_mut_ptr()),
                rows: w.rows,
                n_tok,
            });
        }
        run_groups(&targets[..outs.len()]);
        for (w, y) in outs.iter_mut() {
            rest_rows(k, w, x, xq, n_tok, y);
        }
    };
    if any_quant {
        with_q8a(x, with_acts)
    } else {
        with_acts(&[])
    }
}

/// The interleaved copy of `w` and the kernel that reads it with its activations (`xq`
/// for a quantized type, `x` for a float one), where `k` has one.
fn group_dot<'w>(
    k: &Kernels,
    w: &'w Linear,
    xq: &'w [BlockQ8A],
    x: &'w [f32],
) -> Option<(&'w Interleaved, GroupDot<'w>)> {
    let dot = match (k.rows16(w.dtype), k.rows16_float(w.dtype), k.dot(w.dtype)) {
        (Some(f), _, Dot::Quant(_)) => GroupDot::Quant(f, xq),
        (_, Some(f), Dot::Float(_)) => GroupDot::Float(f, x),
        _ => return None,
    };
    Some((w.interleaved(k)?, dot))
}

/// Rows of `w` past its last full group (at most 15), serially, by the row kernels: `xq` is
/// `x` quantized where `w` is a quantized type.
fn rest_rows(k: &Kernels, w: &Linear, x: &[f32], xq: &[BlockQ8A], n_tok: usize, y: &mut [f32]) {
    let Some(p) = w.interleaved(k) else { return };
    let (cols, nb) = (w.cols, w.cols / QK);
    for r in p.groups * interleaved::ROWS..w.rows {
        for t in 0..n_tok {
            y[t * w.rows + r] = match k.dot(w.dtype) {
                Dot::Quant(one) => one(w.row(r), &xq[t * nb..(t + 1) * nb]),
                Dot::Float(one) => one(w.row(r), &x[t * cols..(t + 1) * cols]),
            };
        }
    }
}

/// A 16-row kernel of either kind with its `n_tok` activation rows: quantized (`cols / 32`
/// blocks each) or as they are (`cols` floats each).
#[derive(Clone, Copy)]
enum GroupDot<'a> {
    Quant(Rows16Dot, &'a [BlockQ8A]),
    Float(Rows16FloatDot, &'a [f32]),
}

/// One matrix of a [`run_groups`] pass on the 16-row kernels, with its own activations.
#[derive(Clone, Copy)]
struct GroupTarget<'p> {
    p: &'p Interleaved,
    dot: GroupDot<'p>,
    out: OutPtr,
    rows: usize,
    n_tok: usize,
}

/// One matrix product of a [`linears_each`] pass: `out = W x` over `n_tok` rows of activations
/// already quantized (`xq`, `n_tok * cols / 32` blocks); `out` is (n_tok, W.rows).
pub struct Job<'j> {
    pub w: &'j Linear<'j>,
    pub xq: &'j [BlockQ8A],
    pub n_tok: usize,
    pub out: &'j mut [f32],
}

/// Whether `w` can join a [`linears_each`] pass under `k`: a 16-row kernel for its
/// (quantized) type and its interleaved copy (packed here if not yet; `None` where the station
/// keeps it in the file).
pub fn groupable(k: &Kernels, w: &Linear) -> bool {
    matches!(group_dot(k, w, &[], &[]), Some((_, GroupDot::Quant(..))))
}

/// Every job's product in one parallel pass over all their 16-row groups: one fork-join for
/// many small matrices with different inputs (a mixture of experts' chosen experts), where a
/// [`linear`] each would fork and join per matrix. Every job must be [`groupable`]. Same bits as
/// a [`linear`] per job: an output still depends only on its weight row and activation row.
///
/// Panics when a job is not groupable or its lengths do not match its matrix.
pub fn linears_each(k: &Kernels, jobs: &mut [Job]) {
    let mut targets = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        let nb = j.w.cols / QK;
        assert_eq!(
            j.xq.len(),
            j.n_tok * nb,
            "linears_each: xq is not n_tok x blocks"
        );
        assert_eq!(
            j.out.len(),
            j.n_tok * j.w.rows,
            "linears_each: out is not n_tok x rows"
        );
        let (Some(p), Some(dot)) = (j.w.interleaved(k), k.rows16(j.w.dtype)) else {
            panic!(
                "linears_each: a {} matrix without a 16-row kernel",
                j.w.dtype
            );
        };
        targets.push(Some(GroupTarget {
            p,
            dot: GroupDot::Quant(dot, j.xq),
            out: OutPtr(j.out.as_mut_ptr()),
            rows: j.w.rows,
            n_tok: j.n_tok,
        }));
    }
    counted(
        jobs.iter()
            .filter(|j| j.n_tok > 0)
            .map(|j| j.w.q.data.len())
            .sum(),
    );
    run_groups(&targets);
    for j in jobs.iter_mut() {
        rest_rows(k, j.w, &[], j.xq, j.n_tok, j.out);
    }
}

/// Tokens per call of a float group kernel: the more, the fewer passes that stream the group
/// from DRAM (its first token's; the others read it from L2). At 8 a call the synthetic F16
/// Qwen-0.5B prefilled 104 tok/s at one thread, at 64 116 (kernel-bench, 64 tokens: F16 85
/// GB/s x tokens, against 73 at 8).
const FLOAT_TOKENS: usize = 64;

/// The 16-row groups of every target, as one parallel pass in equal chunks of groups; tokens
/// go to the kernel 8 at a time ([`FLOAT_TOKENS`] for the float kernels).
fn run_groups(targets: &[Option<GroupTarget>]) {
    use interleaved::ROWS;
    let total: usize = targets.iter().flatten().map(|t| t.p.groups).sum();
    if total == 0 {
        return;
    }
    let n_tok = targets.iter().flatten().map(|t| t.n_tok).max().unwrap_or(1);
    let chunk = chunk_rows(total * ROWS, n_tok).div_ceil(ROWS);
    let n_chunks = total.div_ceil(chunk);
    let body = |c: usize| {
        let mut res = [[0f32; ROWS]; 8];
        // Global group index -> (target, group): targets are laid end to end.
        let mut base = 0;
        let mut tgt = targets.iter().flatten();
        let mut cur = tgt.next();
        // The current target's first (up to) 8 activation rows: at decode every group of a
        // chunk takes the same ones, so they are sliced once per target, not once per group.
        let mut first: Option<[&[BlockQ8A]; 8]> = None;
        for gi in c * chunk..((c + 1) * chunk).min(total) {
            while let Some(t) = cur {
                if gi < base + t.p.groups {
                    break;
                }
                base += t.p.groups;
                cur = tgt.next();
                first = None;
            }
            let Some(t) = cur else { break };
            let g = gi - base;
            let nb = t.p.blocks;
            let tiles = t.p.group(g);
            let n_tok = t.n_tok;
            match t.dot {
                GroupDot::Quant(dot, xq) => {
                    let rows = |t0: usize| -> [&[BlockQ8A]; 8] {
                        std::array::from_fn(|i| {
                            xq.get((t0 + i) * nb..(t0 + i + 1) * nb).unwrap_or(&[])
                        })
                    };
                    for t0 in (0..n_tok).step_by(8) {
                        let n = (n_tok - t0).min(8);
                        let xs = match (t0, first) {
                            (0, Some(xs)) => xs,
                            (0, None) => *first.insert(rows(0)),
                            _ => rows(t0),
                        };
                        dot(tiles, &xs[..n], &mut res[..n]);
                        write_rows(t, g, t0, &res[..n]);
                    }
                }
                GroupDot::Float(dot, x) => {
                    let cols = nb * QK;
                    let mut res = [[0f32; ROWS]; FLOAT_TOKENS];
                    for t0 in (0..n_tok).step_by(FLOAT_TOKENS) {
                        let n = (n_tok - t0).min(FLOAT_TOKENS);
                        let xs: [&[f32]; FLOAT_TOKENS] = std::array::from_fn(|i| {
                            x.get((t0 + i) * cols..(t0 + i + 1) * cols).unwrap_or(&[])
                        });
                        dot(tiles, &xs[..n], &mut res[..n]);
                        write_rows(t, g, t0, &res[..n]);
                    }
                }
            }
        }
    };
    team::for_each_chunk(n_chunks, body);
}

/// Group `g`'s results for tokens `t0..t0 + res.len()` into `t`'s output.
#[inline(always)]
fn write_rows(t: &GroupTarget, g: usize, t0: usize, res: &[[f32; interleaved::ROWS]]) {
    use interleaved::ROWS;
    assert!(t0 + res.len() <= t.n_tok && (g + 1) * ROWS <= t.rows);
    for (i, v) in res.iter().enumerate() {
        // SAFETY: t0 + i < n_tok and g * ROWS + ROWS <= rows (asserted above), so the 16
        // floats are inside this target's y (n_tok x rows, asserted by the caller); group g
        // of its target belongs to one chunk, so no two tasks write them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                v.as_ptr(),
                t.out.0.add((t0 + i) * t.rows + g * ROWS),
                ROWS,
            )
        };
    }
}

/// `y` as a raw pointer that parallel tasks may share: each task writes a disjoint set of rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks only write disjoint indices (distinct output rows r), and the pointer is not
// used after `run_rows` returns, while the `&mut [f32]` it came from is still borrowed.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for OutPtr {}

/// For each row r (in parallel chunks), for each token t: `y[t * rows + r] = dot(row r, t)`.
fn run_rows<F>(w: &QMatrix, n_tok: usize, y: &mut [f32], dot: F)
where
    F: Fn(&[u8], usize) -> f32 + Sync,
{
    let rows = w.rows;
    let out = OutPtr(y.as_mut_ptr());
    let chunk = chunk_rows(rows, n_tok);
    let n_chunks = rows.div_ceil(chunk);
    let body = |c: usize| {
        // Capture the whole `OutPtr` (Send + Sync), not its raw-pointer field.
        #[allow(clippy::redundant_locals)]
        let out = out;
        for r in c * chunk..((c + 1) * chunk).min(rows) {
            let row = w.row(r);
            for t in 0..n_tok {
                let v = dot(row, t);
                // SAFETY: r < rows and t < n_tok, so the index is < y.len() (asserted by the
                // caller); row r belongs to exactly one chunk, so no two tasks write it.
                unsafe { *out.0.add(t * rows + r) = v };
            }
        }
    };
    team::for_each_chunk(n_chunks, body);
}

/// [`run_rows`] four rows at a time: `dot4(rows, t)` gives rows `r..r + 4` against token
/// `t`, the same values as four single-row dots (a chunk's last partial quad goes through
/// `dot4` with its last row repeated in place of the missing ones, whose outputs are dropped).
fn run_rows4<F>(w: &QMatrix, n_tok: usize, y: &mut [f32], dot4: F)
where
    F: Fn([&[u8]; 4], usize) -> [f32; 4] + Sync,
{
    let rows = w.rows;
    let out = OutPtr(y.as_mut_ptr());
    let chunk = chunk_rows(rows, n_tok).next_multiple_of(4);
    let n_chunks = rows.div_ceil(chunk);
    let body = |c: usize| {
        // Capture the whole `OutPtr` (Send + Sync), not its raw-pointer field.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let end = ((c + 1) * chunk).min(rows);
        for r in (c * chunk..end).step_by(4) {
            let quad: [&[u8]; 4] = std::array::from_fn(|i| w.row((r + i).min(end - 1)));
            for t in 0..n_tok {
                let v = dot4(quad, t);
                for (i, &vi) in v.iter().enumerate().take(end - r) {
                    // SAFETY: r + i < end <= rows and t < n_tok, so the index is < y.len()
                    // (asserted by the caller); row r + i belongs to exactly one chunk.
                    unsafe { *out.0.add(t * rows + r + i) = vi };
                }
            }
        }
    };
    team::for_each_chunk(n_chunks, body);
}

/// Rows per task: ~4 tasks per thread for balance, at least [`MIN_ROWS_PER_TASK`] rows (fewer
/// when each row serves many tokens).
fn chunk_rows(rows: usize, n_tok: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let min = (MIN_ROWS_PER_TASK / n_tok.max(1)).max(1);
    rows.div_ceil(threads * 4).max(min)
}

#[cfg(test)]
pub(crate) mod tests;
