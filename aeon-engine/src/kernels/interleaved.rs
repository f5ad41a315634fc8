//! Row-interleaved weights: 16 rows regrouped per 32-element block so that one 512-bit
//! register holds 4 consecutive weights of each of 16 rows (one i32 lane per row).
//!
//! Why: the block-at-a-time kernels spend most of their instructions on per-block scalar work
//! (two f16 scales, one product, a broadcast, a horizontal sum per row). With 16 rows in the
//! lanes, one `vpdpbusd` against a broadcast dword of the activation block adds 4 products
//! into each of 16 rows, and the block's scale step (`d_w * d_x * isum`) is one vector FMA
//! for 16 rows. The 16 outputs of a group land in one register: no horizontal sums.
//!
//! Each tile (16 rows x one block) holds exactly the bytes of the 16 source blocks, reordered:
//!
//! | type | bytes | layout                                                                   |
//! |------|-------|--------------------------------------------------------------------------|
//! | Q4_0 | 288   | `d[16]` f16, `qs[4][16][4]`: chunk k lane r = bytes 4k..4k+4 of row r's qs |
//! | Q5_0 | 352   | `d[16]`, `hm[8]` u64 (bit 4r+i of mask g = row r's 5th bit of element 4g+i), `qs` as Q4_0 |
//! | Q8_0 | 544   | `d[16]`, `u[8][16][4]`: chunk g lane r = row r's quants 4g..4g+4, XOR 0x80 |
//! | IQ4_NL | 288 | as Q4_0 (4-bit table indices)                                            |
//! | Q4_1 | 320   | `d[16]`, `m[16]` f16, `qs` as Q4_0                                        |
//! | Q5_1 | 384   | `d[16]`, `m[16]`, `hm` and `qs` as Q5_0                                   |
//! | MXFP4 | 272  | `e[16]` e8m0 bytes, then `qs` as Q4_0 (4-bit e2m1 codes)                  |
//!
//! On aarch64 three types store their bytes for the NEON kernels (same sizes, same offsets):
//! Q8_0 keeps the signed quants (no XOR: `sdot` and `smull` are signed x signed), and Q5_0's
//! and Q5_1's 64 mask bytes are transposed and inverted: byte 4r+i, bit g = NOT row r's 5th bit of element
//! 4g+i (so byte lane l of the 16 bytes from 16j is lane l of weight vector g's rows 4j..4j+4,
//! and one `cmtst` marks the weights whose 5th bit is clear; see [`neon`]).
//! [`unpack_tile_ref`] reads either layout back to the same `u`.
//!
//! Unpacked, every type is 8 vectors of unsigned bytes `u` (vector g: elements 4g..4g+4 of
//! each row) with weight `u - OFF` (OFF = 8, 16, 128). MXFP4's `d_w` is its e8m0 byte's
//! `e8m0_half`, an exact f32. Per (row, block, token):
//! `isum = sum(u * q_x) - OFF * sum(q_x)` (exact i32), then
//! `acc = fma(d_w, f32(isum) * d_x, acc)`, blocks in order. Q4_1 and Q5_1 (weight `d * u + m`,
//! OFF 0) keep the per-row reference's expression instead:
//! `acc = acc + (d_w * d_x * f32(isum) + m_w * d_x * f32(sum(q_x)))`. [`rows16_ref`] is that in scalar
//! Rust; the SIMD kernels must give its bits exactly, and every token of a multi-token call
//! gets the bits of a one-token call (prefill == token by token). This order is also the
//! per-row reference's ([`super::reference`]), so every other flavour (scalar, AVX2, NEON)
//! gives the same bits row by row: the cross-ISA identity of a mixed mesh.
//!
//! x86 CPUs with AVX2 but no AVX-512 ([`avx2`]) read the same tiles as two 256-bit halves
//! (rows 0..8, 8..16): per 4-byte activation group one `maddubs` per half against the broadcast
//! dword, the i16 pair sums added in i16 only as far as they cannot saturate, then `madd` with
//! ones to i32; Q8_0 takes the sign trick on its signed quants. Where the CPU has AVX-VNNI
//! (`Isa::AvxVnni`) one 256-bit `vpdpbusd` replaces each such step. Same integers, same f32 steps,
//! so the same bits as AVX-512 and NEON.
//!
//! The k-quants (Q2_K to Q6_K) use the same design with one tile per 256-element super-block and per-row
//! scales in byte planes; their layouts and specification are in [`kquants`].
//!
//! Packing reads the mmapped blocks once and writes an owned copy (the same number of bytes);
//! [`super::Linear`] does it on first use, so loading a model stays a few milliseconds.

/// An x86 module's `kernels()` (or another `$name`): the [`Rows16Dot`] of each listed type, its [`Kernel`] run
/// through [`rows16_any`] inside a function compiled for the target features `$feat`.
#[cfg(target_arch = "x86_64")]
macro_rules! rows16_kernels {
    ($name:ident, $feat:literal, $isa:ident, $($dtype:ident => $kernel:ty,)*) => {
        /// The 16-row kernels by type (callers must have checked that
        #[doc = concat!("`Isa::", stringify!($isa), ".available()`).")]
        pub(in super::super) fn $name() -> Vec<(DType, Rows16Dot)> {
            vec![$((DType::$dtype, {
                #[target_feature(enable = $feat)]
                fn imp(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
                    // SAFETY: `entry`'s reasons, with `$feat` enabled here.
                    unsafe { rows16_any::<$kernel>(tiles, x, out) }
                }
                fn entry(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
                    // SAFETY: only reachable through `kernels`, which the kernel table calls
                    // after `Isa::available()` confirmed the features `$feat` names; the
                    // kernels assert the activation rows cover the tile count (8 blocks per
                    // tile for the k-quants) and read only whole tiles.
                    unsafe { imp(tiles, x, out) }
                }
                entry as Rows16Dot
            })),*]
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;
pub mod floats;
pub mod kquants;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon_kquants;

use super::blocks::f16_le;
use super::blocks::{
    e8m0_half, BlockIQ4NL, BlockMXFP4, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8A,
    BlockQ8_0, KVALUES_IQ4NL, KVALUES_MXFP4,
};
use super::QMatrix;
use knot_format::dtype::{DType, QK, QK_K};
use rayon::prelude::*;

/// Rows per interleaved group.
pub const ROWS: usize = 16;

/// 16 rows of one weight matrix against up to 8 activation rows: `out[t][r]` = dot(row r of
/// the group whose tiles are `tiles`, `x[t]`). `x.len() == out.len() <= 8`.
pub type Rows16Dot = fn(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]);

/// 16 rows of a float matrix's group ([`floats`]) against f32 activation rows:
/// `out[t][r]` = dot(row r of the group, `x[t]`). `x.len() == out.len()`.
pub type Rows16FloatDot = fn(group: &[u8], x: &[&[f32]], out: &mut [[f32; ROWS]]);

/// One type's 16-row kernel on one x86 instruction set, for `T` activation rows at once.
#[cfg(target_arch = "x86_64")]
trait Kernel {
    /// SAFETY (callers): the instruction set the implementing module is for is enabled
    /// (`avx2`: AVX2, FMA and F16C; `avx512`: those and AVX-512 F/BW/VL/DQ/VNNI).
    unsafe fn run<const T: usize>(tiles: &[u8], x: [&[BlockQ8A]; T]) -> [[f32; ROWS]; T];
}

/// A [`Rows16Dot`] from a [`Kernel`]: tokens in chunks of 8, then 4, then 1 (each token's
/// bits are independent of the chunk).
///
/// SAFETY (callers): as [`Kernel::run`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows16_any<K: Kernel>(tiles: &[u8], x: &[&[BlockQ8A]], out: &mut [[f32; ROWS]]) {
    assert_eq!(x.len(), out.len(), "rows16: one output per activation row");
    let mut t = 0;
    while t + 8 <= x.len() {
        // SAFETY: this function's callers keep `K::run`'s contract.
        let o = unsafe { K::run::<8>(tiles, std::array::from_fn(|i| x[t + i])) };
        out[t..t + 8].copy_from_slice(&o);
        t += 8;
    }
    while t + 4 <= x.len() {
        // SAFETY: as above.
        let o = unsafe { K::run::<4>(tiles, std::array::from_fn(|i| x[t + i])) };
        out[t..t + 4].copy_from_slice(&o);
        t += 4;
    }
    while t < x.len() {
        // SAFETY: as above.
        out[t] = unsafe { K::run::<1>(tiles, [x[t]]) }[0];
        t += 1;
    }
}

/// Byte offsets inside a tile (see the module table).
pub(super) const D_BYTES: usize = 2 * ROWS;
pub(super) const Q5_HM: usize = D_BYTES;
pub(super) const Q5_QS: usize = D_BYTES + 8 * 8;
/// Q4_1 / Q5_1 tiles: the mins follow the scales, then the fields of Q4_0 / Q5_0.
pub(super) const MIN_AT: usize = D_BYTES;
pub(super) const Q41_QS: usize = 2 * D_BYTES;
pub(super) const Q51_HM: usize = 2 * D_BYTES;
pub(super) const Q51_QS: usize = 2 * D_BYTES + 8 * 8;

/// IQ4_NL's table as unsigned bytes (value + 128), the weights `u` of its tiles.
#[allow(dead_code)] // used by the x86 kernels
pub(super) const IQ4NL_U: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as u8) ^ 0x80;
        i += 1;
    }
    t
};

/// MXFP4's table as unsigned bytes (value + 128), the weights `u` of its tiles.
#[allow(dead_code)] // used by the x86 kernels
pub(super) const MXFP4_U: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_MXFP4[i] as u8) ^ 0x80;
        i += 1;
    }
    t
};

/// MXFP4 tiles: the codes follow the 16 e8m0 scale bytes.
pub(super) const MX_QS: usize = ROWS;

/// Where the fields of a 32-element type's tile sit (the f16 scales are at 0).
#[derive(Clone, Copy)]
struct Layout {
    /// The f16 mins (`x = d * q + m`: Q4_1, Q5_1).
    min: Option<usize>,
    /// The 5th-bit masks (Q5_0, Q5_1).
    hm: Option<usize>,
    /// The quant chunks.
    qs: usize,
}

fn layout(dtype: DType) -> Layout {
    let (min, hm, qs) = match dtype {
        DType::Q5_0 => (None, Some(Q5_HM), Q5_QS),
        DType::Q4_1 => (Some(MIN_AT), None, Q41_QS),
        DType::Q5_1 => (Some(MIN_AT), Some(Q51_HM), Q51_QS),
        DType::MXFP4 => (None, None, MX_QS),
        _ => (None, None, D_BYTES),
    };
    Layout { min, hm, qs }
}

/// What packing XORs into each Q8_0 quant: 0x80 on x86 (unsigned bytes for `vpdpbusd`),
/// nothing on aarch64 (signed bytes for `sdot` / `smull`). `u = stored ^ Q8_STORED_XOR ^ 0x80`.
pub(super) const Q8_STORED_XOR: u8 = if cfg!(target_arch = "aarch64") {
    0
} else {
    0x80
};

/// Whether row `r`'s element `4g + i` of a Q5_0 / Q5_1 tile (masks at `hm`) has its 5th bit
/// set (the mask layout of this architecture, see the module doc).
fn q5_high(tile: &[u8], hm: usize, r: usize, i: usize, g: usize) -> bool {
    if cfg!(target_arch = "aarch64") {
        tile[hm + 4 * r + i] >> g & 1 == 0
    } else {
        let bit = 4 * r + i;
        tile[hm + 8 * g + bit / 8] >> (bit % 8) & 1 == 1
    }
}

/// Bytes of one tile (16 rows x one block; a super-block for the k-quants; 32 elements for
/// the float types) of `dtype`, for the types with a layout.
pub fn tile_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_0
        | DType::IQ4_NL
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5_1
        | DType::Q8_0
        | DType::Q2_K
        | DType::Q3_K
        | DType::Q4_K
        | DType::Q5_K
        | DType::Q6_K
        | DType::IQ4_XS
        | DType::MXFP4 => Some(ROWS * dtype.block_bytes()),
        DType::F32 | DType::F16 | DType::BF16 => Some(ROWS * floats::CHUNK * dtype.block_bytes()),
    }
}

/// Whether [`Interleaved::pack`] makes a copy of `w`: a layout for its type, at least one
/// full group, whole tiles per row.
pub fn packable(w: &QMatrix) -> bool {
    tile_bytes(w.dtype).is_some() && w.rows >= ROWS && w.cols.is_multiple_of(tile_elems(w.dtype))
}

/// Elements per row in one tile of `dtype`.
fn tile_elems(dtype: DType) -> usize {
    if floats::is_float(dtype) {
        floats::CHUNK
    } else {
        dtype.block_elems()
    }
}

/// The unsigned-weight offset of `dtype`'s unpacked bytes (weight = u - OFF).
pub(super) fn offset(dtype: DType) -> i32 {
    match dtype {
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        DType::Q4_1 | DType::Q5_1 => 0,
        // Table values + 128.
        _ => 128,
    }
}

/// A matrix's full 16-row groups in the interleaved layout (rows past the last full group
/// stay with the block kernels). Float types ([`floats`]) use their own group layout, in
/// tiles of 16 rows x 32 elements' bytes.
pub struct Interleaved {
    /// Element type of the source blocks.
    pub dtype: DType,
    /// Full groups of [`ROWS`] rows.
    pub groups: usize,
    /// 32-element blocks per row (the activation blocks a kernel call takes per token).
    pub blocks: usize,
    /// Tiles per group: `blocks` for the 32-element and float types, `blocks / 8` for the
    /// k-quants.
    tiles: usize,
    tile: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for Interleaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interleaved")
            .field("dtype", &self.dtype)
            .field("groups", &self.groups)
            .field("blocks", &self.blocks)
            .finish()
    }
}

impl Interleaved {
    /// Regroups `w`'s full 16-row groups (in parallel); `None` when `dtype` has no layout,
    /// `w` has fewer than 16 rows, or (floats) its columns are not a multiple of 32.
    pub fn pack(w: &QMatrix) -> Option<Interleaved> {
        Self::pack_releasing(w, &|_| {})
    }

    /// [`Interleaved::pack`], handing each batch of source rows to `done` once it is copied
    /// (so a caller can drop the source pages as it goes: the peak holds one batch twice, not
    /// the whole matrix).
    pub fn pack_releasing(w: &QMatrix, done: &(dyn Fn(&[u8]) + Sync)) -> Option<Interleaved> {
        /// Groups per batch: 1024 rows.
        const BATCH: usize = 64;
        if !packable(w) {
            return None;
        }
        let tile = tile_bytes(w.dtype)?;
        let (groups, blocks) = (w.rows / ROWS, w.cols / QK);
        let tiles = w.cols / tile_elems(w.dtype);
        let bb = w.dtype.block_bytes();
        let mut data = vec![0u8; groups * tiles * tile];
        for (i, batch) in data.chunks_mut(BATCH * tiles * tile).enumerate() {
            batch
                .par_chunks_mut(tiles * tile)
                .enumerate()
                .for_each(|(j, out)| {
                    let g = i * BATCH + j;
                    let rows: [&[u8]; ROWS] = std::array::from_fn(|r| w.row(g * ROWS + r));
                    if floats::is_float(w.dtype) {
                        return floats::pack_group(w.dtype, &rows, out);
                    }
                    for (b, t) in out.chunks_exact_mut(tile).enumerate() {
                        let src: [&[u8]; ROWS] = std::array::from_fn(|r| &rows[r][b * bb..][..bb]);
                        pack_tile(w.dtype, &src, t);
                    }
                });
            let rows = i * BATCH * ROWS..(i * BATCH * ROWS + batch.len() / (tiles * tile) * ROWS);
            done(&w.data[rows.start * w.row_bytes()..rows.end * w.row_bytes()]);
        }
        Some(Interleaved {
            dtype: w.dtype,
            groups,
            blocks,
            tiles,
            tile,
            data,
        })
    }

    /// The tiles of group `g` (all blocks, in order).
    pub fn group(&self, g: usize) -> &[u8] {
        let n = self.tiles * self.tile;
        &self.data[g * n..(g + 1) * n]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Every group's tiles, end to end (what a matmul over this copy streams).
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }
}

/// One tile from the same block of 16 rows (whole 4-byte chunks and 4-bit mask nibbles at a
/// time: packing runs once per matrix, on the first token).
fn pack_tile(dtype: DType, src: &[&[u8]; ROWS], tile: &mut [u8]) {
    if dtype.block_elems() == QK_K {
        return kquants::pack_tile(dtype, src, tile);
    }
    let lay = layout(dtype);
    let mut masks = [0u64; 8];
    for (r, s) in src.iter().enumerate() {
        if dtype == DType::MXFP4 {
            let b: &BlockMXFP4 = bytemuck::from_bytes(s);
            tile[r] = b.e;
            for (k, c) in b.qs.chunks_exact(4).enumerate() {
                tile[lay.qs + 64 * k + 4 * r..][..4].copy_from_slice(c);
            }
            continue;
        }
        let (d, m, chunks, qh): (_, _, &[u8], u32) = match dtype {
            DType::Q8_0 => {
                let b: &BlockQ8_0 = bytemuck::from_bytes(s);
                (b.d, None, bytemuck::cast_slice(&b.qs), 0)
            }
            DType::Q5_0 => {
                let b: &BlockQ5_0 = bytemuck::from_bytes(s);
                (b.d, None, &b.qs[..], u32::from_le_bytes(b.qh))
            }
            DType::Q4_0 => {
                let b: &BlockQ4_0 = bytemuck::from_bytes(s);
                (b.d, None, &b.qs[..], 0)
            }
            DType::IQ4_NL => {
                let b: &BlockIQ4NL = bytemuck::from_bytes(s);
                (b.d, None, &b.qs[..], 0)
            }
            DType::Q4_1 => {
                let b: &BlockQ4_1 = bytemuck::from_bytes(s);
                (b.d, Some(b.m), &b.qs[..], 0)
            }
            DType::Q5_1 => {
                let b: &BlockQ5_1 = bytemuck::from_bytes(s);
                (b.d, Some(b.m), &b.qs[..], u32::from_le_bytes(b.qh))
            }
            _ => unreachable!("pack_tile: {dtype} has no interleaved layout"),
        };
        tile[2 * r..2 * r + 2].copy_from_slice(&d);
        if let (Some(at), Some(m)) = (lay.min, m) {
            tile[at + 2 * r..at + 2 * r + 2].copy_from_slice(&m);
        }
        for (k, c) in chunks.chunks_exact(4).enumerate() {
            let dst = &mut tile[lay.qs + 64 * k + 4 * r..][..4];
            dst.copy_from_slice(c);
            if dtype == DType::Q8_0 {
                dst.iter_mut().for_each(|v| *v ^= Q8_STORED_XOR);
            }
        }
        let Some(hm) = lay.hm else { continue };
        if cfg!(target_arch = "aarch64") {
            for i in 0..4 {
                let bits = (0..8).fold(0u8, |v, g| v | ((qh >> (4 * g + i) & 1) as u8) << g);
                tile[hm + 4 * r + i] = !bits;
            }
            continue;
        }
        for (g, m) in masks.iter_mut().enumerate() {
            *m |= (((qh >> (4 * g)) & 0xF) as u64) << (4 * r);
        }
    }
    if let (Some(hm), false) = (lay.hm, cfg!(target_arch = "aarch64")) {
        for (g, m) in masks.iter().enumerate() {
            tile[hm + 8 * g..][..8].copy_from_slice(&m.to_le_bytes());
        }
    }
}

/// A tile back to per-row scales and unsigned bytes (`u[r][e]`, weight = `u - offset`).
pub fn unpack_tile_ref(dtype: DType, tile: &[u8]) -> ([f32; ROWS], [[u8; QK]; ROWS]) {
    let d = std::array::from_fn(|r| match dtype {
        DType::MXFP4 => e8m0_half(tile[r]),
        _ => f16_le([tile[2 * r], tile[2 * r + 1]]),
    });
    let mut u = [[0u8; QK]; ROWS];
    for (r, ur) in u.iter_mut().enumerate() {
        for (e, v) in ur.iter_mut().enumerate() {
            let (g, i) = (e / 4, e % 4);
            *v = match dtype {
                DType::Q8_0 => tile[D_BYTES + 64 * g + 4 * r + i] ^ Q8_STORED_XOR ^ 0x80,
                DType::IQ4_NL => {
                    let byte = tile[D_BYTES + 64 * (g % 4) + 4 * r + i];
                    let nib = if g < 4 { byte & 0xF } else { byte >> 4 };
                    (KVALUES_IQ4NL[nib as usize] as u8) ^ 0x80
                }
                DType::MXFP4 => {
                    let byte = tile[MX_QS + 64 * (g % 4) + 4 * r + i];
                    let nib = if g < 4 { byte & 0xF } else { byte >> 4 };
                    MXFP4_U[nib as usize]
                }
                DType::Q4_0 | DType::Q5_0 | DType::Q4_1 | DType::Q5_1 => {
                    let lay = layout(dtype);
                    let byte = tile[lay.qs + 64 * (g % 4) + 4 * r + i];
                    let nib = if g < 4 { byte & 0xF } else { byte >> 4 };
                    let high = lay.hm.is_some_and(|hm| q5_high(tile, hm, r, i, g));
                    nib | (high as u8) << 4
                }
                _ => unreachable!("unpack_tile_ref: {dtype} has no interleaved layout"),
            };
        }
    }
    (d, u)
}

/// The per-row f16 mins of a Q4_1 / Q5_1 tile (`None` for the other types).
pub fn tile_mins_ref(dtype: DType, tile: &[u8]) -> Option<[f32; ROWS]> {
    let at = layout(dtype).min?;
    Some(std::array::from_fn(|r| {
        f16_le([tile[at + 2 * r], tile[at + 2 * r + 1]])
    }))
}

/// The scalar specification of [`Rows16Dot`] for one activation row.
pub fn rows16_ref(dtype: DType, tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let tile = tile_bytes(dtype).expect("rows16_ref: a type with a layout");
    if dtype.block_elems() == QK_K {
        return kquants::rows16_ref(dtype, tiles, x);
    }
    let off = offset(dtype);
    let mut acc = [0f32; ROWS];
    for (t, a) in tiles.chunks_exact(tile).zip(x) {
        let (d, u) = unpack_tile_ref(dtype, t);
        let qsum = a.sums[0] as i32 + a.sums[1] as i32;
        let mins = tile_mins_ref(dtype, t);
        for r in 0..ROWS {
            let isum: i32 = u[r]
                .iter()
                .zip(&a.qs)
                .map(|(&w, &q)| w as i32 * q as i32)
                .sum();
            acc[r] = match mins {
                // The reference's expression for the formats with a min.
                Some(m) => acc[r] + (d[r] * a.d * isum as f32 + m[r] * a.d * qsum as f32),
                None => d[r].mul_add((isum - off * qsum) as f32 * a.d, acc[r]),
            };
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::super::tests::{flavours, random_row, random_x, Rng};
    use super::super::*;
    use super::*;

    fn matrix(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        (0..rows)
            .flat_map(|_| random_row(dtype, cols, rng))
            .collect()
    }

    fn quantized(cols: usize, rng: &mut Rng) -> Vec<BlockQ8A> {
        let mut xq = Vec::new();
        quantize_q8a(&random_x(cols, rng), &mut xq);
        xq
    }

    /// The types with a layout, each with the column counts its tests use (Qwen2.5-0.5B's
    /// ffn_down has 4864 columns: 19 super-blocks).
    const TYPES: [(DType, [usize; 3]); 13] = [
        (DType::Q4_0, [32, 96, 896]),
        (DType::Q4_1, [32, 96, 896]),
        (DType::Q5_1, [32, 96, 896]),
        (DType::Q5_0, [32, 96, 896]),
        (DType::Q8_0, [32, 96, 896]),
        (DType::IQ4_NL, [32, 96, 896]),
        (DType::MXFP4, [32, 96, 896]),
        (DType::Q2_K, [256, 512, 4864]),
        (DType::Q3_K, [256, 512, 4864]),
        (DType::Q4_K, [256, 512, 4864]),
        (DType::Q5_K, [256, 512, 4864]),
        (DType::Q6_K, [256, 512, 4864]),
        (DType::IQ4_XS, [256, 512, 4864]),
    ];

    /// A tile's weights per row, read back through [`unpack_tile_ref`] or
    /// [`kquants::unpack_tile_ref`] and dequantized as the source format does.
    fn tile_values(dtype: DType, tile: &[u8]) -> Vec<Vec<f32>> {
        if dtype.block_elems() == QK_K {
            let k = kquants::unpack_tile_ref(dtype, tile);
            return (0..ROWS)
                .map(|r| {
                    (0..k.u[r].len())
                        .map(|e| {
                            let (sc, m) = (k.sc[r][e / 16], k.m[r][e / 16]);
                            (k.d[r] * sc as f32) * (k.u[r][e] as i32 - k.off) as f32
                                - k.dmin[r] * m as f32
                        })
                        .collect()
                })
                .collect();
        }
        let off = offset(dtype) as f32;
        let (d, u) = unpack_tile_ref(dtype, tile);
        let m = tile_mins_ref(dtype, tile);
        (0..ROWS)
            .map(|r| {
                u[r].iter()
                    .map(|&v| match m {
                        Some(m) => v as f32 * d[r] + m[r],
                        None => d[r] * (v as f32 - off),
                    })
                    .collect()
            })
            .collect()
    }

    /// Packing keeps every weight: the unpacked tiles dequantize to the source rows' values.
    #[test]
    fn tiles_hold_the_source_weights() {
        let mut rng = Rng::new(5);
        for (dtype, cols) in TYPES {
            let (rows, cols) = (40, cols[1]);
            let data = matrix(dtype, rows, cols, &mut rng);
            let w = QMatrix::new(dtype, rows, cols, &data).unwrap();
            let p = Interleaved::pack(&w).unwrap();
            assert_eq!((p.groups, p.blocks), (2, cols / QK));
            assert_eq!(
                p.bytes(),
                32 * w.row_bytes(),
                "{dtype}: same bytes as 32 rows"
            );
            let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
            assert_eq!(p.group(0).len(), cols / be * p.tile);
            for g in 0..p.groups {
                for (b, tile) in p.group(g).chunks_exact(p.tile).enumerate() {
                    let got = tile_values(dtype, tile);
                    for (r, got) in got.iter().enumerate() {
                        let mut want = vec![0f32; be];
                        dequantize_row(dtype, &w.row(g * ROWS + r)[b * bb..][..bb], &mut want);
                        assert_eq!(got, &want, "{dtype} group {g} block {b} row {r}");
                    }
                }
            }
        }
    }

    /// The specification is the per-row reference dot, bit for bit: the reference follows
    /// the 16-row order for every type with a layout (cross-ISA identity rests on this).
    #[test]
    fn rows16_ref_matches_the_block_reference() {
        let mut rng = Rng::new(9);
        let scalar = Kernels::for_isa(Isa::Scalar).unwrap();
        for (dtype, cols) in TYPES {
            for cols in cols {
                let data = matrix(dtype, ROWS, cols, &mut rng);
                let w = QMatrix::new(dtype, ROWS, cols, &data).unwrap();
                let p = Interleaved::pack(&w).unwrap();
                let x = quantized(cols, &mut rng);
                let got = rows16_ref(dtype, p.group(0), &x);
                let Dot::Quant(one) = scalar.dot(dtype) else {
                    panic!("{dtype}: not quantized")
                };
                for (r, g) in got.iter().enumerate() {
                    let want = one(w.row(r), &x);
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{dtype} cols {cols} row {r}: {g} vs {want}"
                    );
                }
            }
        }
    }

    /// `dot` gives the specification's bits for each of 1..=8 (and 11: more than one call's
    /// worth) tokens per call.
    fn assert_rows16_bits(
        k: &Kernels,
        dtype: DType,
        dot: Rows16Dot,
        p: &Interleaved,
        xs: &[Vec<BlockQ8A>],
    ) {
        for n in (1..=8).chain([xs.len()]) {
            let x: Vec<&[BlockQ8A]> = xs[..n].iter().map(|v| &v[..]).collect();
            let mut out = vec![[0f32; ROWS]; n];
            dot(p.group(0), &x, &mut out);
            for t in 0..n {
                let want = rows16_ref(dtype, p.group(0), &xs[t]);
                assert_eq!(
                    out[t].map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{:?} {dtype} cols {} n {n} token {t}",
                    k.isa,
                    p.blocks * QK
                );
            }
        }
    }

    /// Every flavour's SIMD kernels give the specification's bits, for 1..=8 tokens per call.
    #[test]
    fn simd_kernels_match_the_specification_bit_for_bit() {
        let mut rng = Rng::new(21);
        for k in flavours() {
            for (dtype, cols) in TYPES {
                let Some(dot) = k.rows16(dtype) else {
                    eprintln!("{dtype}: no 16-row kernel on {:?}: skipped", k.isa);
                    continue;
                };
                for cols in cols {
                    let data = matrix(dtype, ROWS, cols, &mut rng);
                    let w = QMatrix::new(dtype, ROWS, cols, &data).unwrap();
                    let p = Interleaved::pack(&w).unwrap();
                    let xs: Vec<Vec<BlockQ8A>> =
                        (0..11).map(|_| quantized(cols, &mut rng)).collect();
                    assert_rows16_bits(&k, dtype, dot, &p, &xs);
                }
            }
        }
    }

    /// The integer sums at their extremes: every weight at its type's lowest or highest value,
    /// every activation at +-127 (the kernels that add products in i16 lanes rely on these
    /// bounds; an overflow would wrap and change the bits).
    #[test]
    fn simd_kernels_are_exact_at_the_extremes() {
        let one = half::f16::from_f32(1.0).to_le_bytes();
        // (quant byte pattern, qh) giving the lowest / highest weight of each type.
        let block = |dtype: DType, high: bool| -> Vec<u8> {
            let mut b = vec![0u8; dtype.block_bytes()];
            b[..2].copy_from_slice(&one);
            match dtype {
                // e = 128: a scale of 1; codes 7 (+12) or 15 (-12).
                DType::MXFP4 => {
                    b[0] = 128;
                    b[1..].fill(if high { 0x77 } else { 0xFF })
                }
                DType::Q4_0 | DType::Q5_0 | DType::IQ4_NL => {
                    b[2..].fill(if high { 0xFF } else { 0 })
                }
                DType::Q4_1 | DType::Q5_1 => {
                    b[2..4].copy_from_slice(&one);
                    b[4..].fill(if high { 0xFF } else { 0 })
                }
                DType::Q8_0 => b[2..].fill(if high { 0x7F } else { 0x80 }),
                _ => unreachable!(),
            }
            b
        };
        let act = |q: i8| BlockQ8A {
            d: 1.0,
            s: 32.0 * q as f32,
            sums: [16 * q as i16; 2],
            qs: [q; QK],
        };
        for k in flavours() {
            for dtype in [
                DType::Q4_0,
                DType::Q4_1,
                DType::Q5_0,
                DType::Q5_1,
                DType::Q8_0,
                DType::IQ4_NL,
                DType::MXFP4,
            ] {
                let Some(dot) = k.rows16(dtype) else { continue };
                for (pattern, cols) in [(0usize, 64), (1, 64), (2, 96)] {
                    // Rows all low, all high, or alternating (by row and by block).
                    let data: Vec<u8> = (0..ROWS)
                        .flat_map(|r| {
                            (0..cols / QK).flat_map(move |b| {
                                block(
                                    dtype,
                                    match pattern {
                                        0 => false,
                                        1 => true,
                                        _ => (r + b) % 2 == 1,
                                    },
                                )
                            })
                        })
                        .collect();
                    let w = QMatrix::new(dtype, ROWS, cols, &data).unwrap();
                    let p = Interleaved::pack(&w).unwrap();
                    let xs: Vec<Vec<BlockQ8A>> = (0..11)
                        .map(|t| vec![act(if t % 2 == 0 { 127 } else { -127 }); cols / QK])
                        .collect();
                    assert_rows16_bits(&k, dtype, dot, &p, &xs);
                }
            }
        }
    }

    /// Weight-streaming GB/s of each 16-row kernel at 1 and 8 tokens over 96 MiB matrices
    /// of 4864 columns (larger than the last-level cache, so decode-like):
    /// `cargo test --release -p fat-station --lib rows16_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn rows16_throughput() {
        let k = kernels();
        let mut rng = Rng::new(3);
        let cols = 4864;
        let xs: Vec<Vec<BlockQ8A>> = (0..8).map(|_| quantized(cols, &mut rng)).collect();
        for (dtype, _) in TYPES {
            let Some(dot) = k.rows16(dtype) else { continue };
            let row: Vec<u8> = random_row(dtype, cols, &mut rng);
            let mib: usize = std::env::var("ROWS16_MIB").map_or(96, |v| v.parse().unwrap());
            let rows = (mib << 20) / row.len() / ROWS * ROWS;
            let data: Vec<u8> = (0..rows).flat_map(|_| row.iter().copied()).collect();
            let w = QMatrix::new(dtype, rows, cols, &data).unwrap();
            let p = Interleaved::pack(&w).unwrap();
            let read = |touch| {
                let best = (0..5).fold(f64::MAX, |best, _| {
                    let t0 = std::time::Instant::now();
                    std::hint::black_box(stream_read(&p.data, touch));
                    best.min(t0.elapsed().as_secs_f64())
                });
                p.bytes() as f64 / best / 1e9
            };
            eprintln!(
                "{dtype} plain read: {:.1} GB/s, touching pages ahead {:.1} (the ceilings)",
                read(false),
                read(true)
            );
            for n in [1usize, 8] {
                let x: Vec<&[BlockQ8A]> = xs[..n].iter().map(|v| &v[..]).collect();
                let mut out = vec![[0f32; ROWS]; n];
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = std::time::Instant::now();
                    for g in 0..p.groups {
                        dot(p.group(g), &x, &mut out);
                    }
                    best = best.min(t0.elapsed().as_secs_f64());
                    std::hint::black_box(&out);
                }
                eprintln!(
                    "{dtype} tokens {n}: {:.1} GB/s of weights",
                    p.bytes() as f64 / best / 1e9
                );
            }
        }
    }

    /// XOR of every 64-byte line of `buf` (the tail past whole lines ignored): a plain
    /// streaming read, the ceiling for a kernel over the same bytes; with `touch`, touching
    /// pages ahead as the AVX-512 kernels do.
    fn stream_read(buf: &[u8], touch: bool) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512 F (checked just above).
            return unsafe { stream_read_avx512(buf, touch) };
        }
        let _ = touch; // no page touch without AVX-512
        buf.iter().fold(0, |a, &b| a ^ b as u64)
    }

    /// [`stream_read`] with 4 independent 512-bit chains (target_feature, so the intrinsics
    /// are inlined).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn stream_read_avx512(buf: &[u8], touch: bool) -> u64 {
        // SAFETY: the loads read whole 256-byte chunks of `buf`; the prefetch address may pass
        // its end, which a prefetch tolerates; AVX-512F is enabled here and checked by the caller.
        unsafe {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_setzero_si512(); 4];
            for c in buf.chunks_exact(256) {
                if touch {
                    super::super::roofline::touch_page(c.as_ptr(), 0);
                }
                for (k, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_xor_si512(
                        *a,
                        _mm512_loadu_si512(c.as_ptr().add(64 * k) as *const _),
                    );
                }
            }
            let v = _mm512_xor_si512(
                _mm512_xor_si512(acc[0], acc[1]),
                _mm512_xor_si512(acc[2], acc[3]),
            );
            _mm512_reduce_or_epi64(v) as u64
        }
    }
}
