//! Row-interleaved k-quant tiles (Q2_K to Q6_K): 16 rows x one 256-element super-block.
//!
//! A tile holds exactly the bytes of the 16 source blocks, reordered so that one 512-bit
//! register holds 4 consecutive quant bytes of each of 16 rows (lane r = row r), and each
//! per-row scale byte sits in a *plane* (16 bytes, byte r = row r's copy), which
//! `vpmovzxbd` / `vpmovsxbd` turns into a row vector of i32.
//!
//! | type | bytes | layout                                                                    |
//! |------|-------|---------------------------------------------------------------------------|
//! | Q4_K | 2304  | `d[16]`, `dmin[16]` f16, 12 planes of `scales`, `qs[32][16][4]`: granule k lane r = `qs[4k..4k+4]` of row r |
//! | Q5_K | 2816  | as Q4_K, with 8 granules of `qh` (lane r = `qh[4k..4k+4]` of row r) before `qs` |
//! | Q3_K | 1760  | `d[16]`, 12 planes of packed `scales`, 8 granules of `hmask`, 16 of `qs` (chunk n = granules 8n..8n+8); on x86 instead of hmask and qs, per Q8A block 3 granules of 3-bit fields ([`k3_fields`]) |
//! | Q2_K | 1344  | `d[16]`, `dmin[16]`, 16 planes of `scales`, 16 granules of `qs` as Q3_K  |
//! | IQ4_XS | 2176 | `d[16]`, 2 planes of `scales_h`, 4 of `scales_l`, 32 granules of `qs` (sub-block ib = granules 4ib..4ib+4) |
//! | Q6_K | 3360  | `d[16]` f16, 16 planes of `scales` (i8), then per 128-element half n: ql granules 16n..16n+8, qh granules 8n..8n+8, ql granules 16n+8..16n+16 (granules as Q4_K) |
//!
//! Both orders are the kernels' order of first touch, so a tile streams front to back (the
//! Q6_K kernel reads qh between the two ql runs it pairs them with: with ql then qh in two
//! separate regions, the jumps defeated the hardware prefetcher and the kernel ran slower than
//! the single-row one).
//!
//! Q4_K: granules 8j..8j+8 hold qs bytes 32j..32j+32; their low nibbles are sub-block 2j
//! (elements 64j..64j+32), the high nibbles sub-block 2j+1. Per (row, sub-block s, token),
//! with `a` the token's Q8A block s of the super-block:
//! `isum = sum(q * a.qs)` (exact i32), `(sc, m) = scale_min_k4(s)`,
//! `acc = fma(d * sc, f32(isum) * a.d, acc)`, then `acc = fma(-(dmin * m), a.s, acc)`.
//! `d * sc` and `dmin * m` are exact in f32 (11-bit x 6-bit).
//!
//! Q5_K: as Q4_K, plus 16 where bit s of `qh[l]` is set (element l of sub-block s; qh granule
//! k matches qs granule 8j + k). Its f32 steps keep the per-row reference's expression (see
//! `q5k_ref`): per pair of sub-blocks `sd += x1 + x2`, `sm += y1 + y2`, then once per
//! super-block `acc = acc + (d * sd - dmin * sm)`.
//!
//! Q3_K and Q2_K: Q8A block g = 4n + j of a super-block takes bits 2j, 2j + 1 of qs chunk n
//! (and, Q3_K, bit g of `hmask` as bit 2 of `u`, weight `u - 4`); it spans two 16-element
//! scale groups. Their f32 steps keep the per-row reference's expression (`k16_ref`): per
//! block `sd += a.d * f32(isum)` (Q2_K also `sm += a.d * f32(msum)`), once per super-block
//! `acc = acc + d * sd` (Q2_K: `acc + (d * sd - dmin * sm)`).
//!
//! IQ4_XS: sub-block ib's weights are its indices' table values + 128 (`u`, OFF 128), one
//! scale `ls - 32` per sub-block; the canonical step per sub-block,
//! `acc = fma(d * (ls - 32), f32(isum) * a.d, acc)` (`d * (ls - 32)` exact).
//!
//! Q6_K: Q8A block `4n + k` of a super-block (elements `128n + 32k + l`, l in 0..32) takes
//! its low 4 bits from `ql[64n + 32(k & 1) + l]` (low nibble for k < 2, high for k >= 2) and
//! its high 2 bits from `qh[32n + l] >> 2k`; weight = `q - 32`. It spans two 16-element scale
//! groups `2(4n + k) + h`; per half h: `isum = sum(q * a.qs) - 32 * a.sums[h]` (exact), then
//! `acc = fma(d * sc, f32(isum) * a.d, acc)`, halves in order (`d * sc` exact: 11 x 8 bits).
//!
//! [`rows16_ref`] is that in scalar Rust; the SIMD kernels give its bits exactly.

use super::super::blocks::{
    f16_le, scale_min_k4, scales_q3k, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K,
    BlockQ8A, KVALUES_IQ4NL,
};
use super::ROWS;
use knot_format::dtype::{DType, QK, QK_K};

/// Q4_K tile offsets: super-scales, mins, 12 scale planes, 32 qs granules.
pub(super) const K4_D: usize = 0;
pub(super) const K4_DMIN: usize = 2 * ROWS;
pub(super) const K4_SC: usize = 4 * ROWS;
pub(super) const K4_QS: usize = K4_SC + 12 * ROWS;
pub(super) const K4_BYTES: usize = K4_QS + QK_K / 2 * ROWS;
const _: () = assert!(K4_BYTES == ROWS * DType::Q4_K.block_bytes());

/// Q5_K tile offsets: as Q4_K, with the 32 `qh` bytes of each row as 8 granules before `qs`.
pub(super) const K5_D: usize = 0;
pub(super) const K5_DMIN: usize = 2 * ROWS;
pub(super) const K5_SC: usize = 4 * ROWS;
pub(super) const K5_QH: usize = K5_SC + 12 * ROWS;
pub(super) const K5_QS: usize = K5_QH + QK_K / 8 * ROWS;
pub(super) const K5_BYTES: usize = K5_QS + QK_K / 2 * ROWS;
const _: () = assert!(K5_BYTES == ROWS * DType::Q5_K.block_bytes());
const _: () = assert!(K5_D == K4_D && K5_DMIN == K4_DMIN && K5_SC == K4_SC);

/// Q3_K tile offsets: super-scales, 12 planes of packed scales, 8 `hmask` granules, 16 `qs`
/// granules (qs chunk n, 32 bytes, is granules 8n..8n+8).
pub(super) const K3_D: usize = 0;
pub(super) const K3_SC: usize = 2 * ROWS;
pub(super) const K3_HM: usize = K3_SC + 12 * ROWS;
pub(super) const K3_QS: usize = K3_HM + QK_K / 8 * ROWS;
pub(super) const K3_BYTES: usize = K3_QS + QK_K / 4 * ROWS;
const _: () = assert!(K3_BYTES == ROWS * DType::Q3_K.block_bytes());
/// x86 Q3_K tiles: after the scale planes, per Q8A block g (0..8) 3 granules of 3-bit fields
/// (see [`k3_fields`]), `K3_BLOCK` bytes each.
pub(super) const K3_Q: usize = K3_HM;
pub(super) const K3_BLOCK: usize = 3 * 64;
const _: () = assert!(K3_Q + 8 * K3_BLOCK == K3_BYTES);
/// Whether Q3_K tiles hold the x86 3-bit fields (the x86 kernels read them) rather than the
/// source's hmask and qs planes (the NEON kernels'): the one place the layout is chosen.
const Q3K_FIELDS: bool = cfg!(target_arch = "x86_64");

/// Which granule c (0..3) of an x86 Q3_K block holds weight vector v (0..8), and how: the
/// (bit offset, bit count) of its low part, and for the two split ones the bit of granule 2
/// that holds their bit 2. Granule bytes: c0 = v0 | v1 << 3 | (v2 & 3) << 6,
/// c1 = v3 | v4 << 3 | (v5 & 3) << 6, c2 = v6 | v7 << 3 | (v2 >> 2) << 6 | (v5 >> 2) << 7.
/// Why: six of the eight vectors then take one mask (and at most one shift) each, the other
/// two four instructions, against two shifts, a mask and a merge each with the source's
/// separate 2-bit and 1-bit planes (the AVX-512 kernel ran at half the DRAM roofline, bound by
/// those instructions).
pub(super) const fn k3_fields(v: usize) -> (usize, u32, u32, Option<u32>) {
    match v {
        0 => (0, 0, 3, None),
        1 => (0, 3, 3, None),
        2 => (0, 6, 2, Some(6)),
        3 => (1, 0, 3, None),
        4 => (1, 3, 3, None),
        5 => (1, 6, 2, Some(7)),
        6 => (2, 0, 3, None),
        _ => (2, 3, 3, None),
    }
}

/// Q2_K tile offsets: super-scales, mins, 16 scale planes, 16 `qs` granules as Q3_K's.
pub(super) const K2_D: usize = 0;
pub(super) const K2_DMIN: usize = 2 * ROWS;
pub(super) const K2_SC: usize = 4 * ROWS;
pub(super) const K2_QS: usize = K2_SC + 16 * ROWS;
pub(super) const K2_BYTES: usize = K2_QS + QK_K / 4 * ROWS;
const _: () = assert!(K2_BYTES == ROWS * DType::Q2_K.block_bytes());

/// IQ4_XS tile offsets: super-scales, 2 planes of `scales_h`, 4 of `scales_l`, 32 `qs`
/// granules (sub-block ib's 16 bytes are granules 4ib..4ib+4, nibble order as Q4_0).
pub(super) const KX_D: usize = 0;
pub(super) const KX_SH: usize = 2 * ROWS;
pub(super) const KX_SL: usize = KX_SH + 2 * ROWS;
pub(super) const KX_QS: usize = KX_SL + 4 * ROWS;
pub(super) const KX_BYTES: usize = KX_QS + QK_K / 2 * ROWS;
const _: () = assert!(KX_BYTES == ROWS * DType::IQ4_XS.block_bytes());

/// Q6_K tile offsets: super-scales, 16 scale planes, then two 128-element halves of
/// `K6_HALF` bytes: ql granules (8 of them, 512 bytes), qh granules, ql granules.
pub(super) const K6_D: usize = 0;
pub(super) const K6_SC: usize = 2 * ROWS;
pub(super) const K6_Q: usize = K6_SC + 16 * ROWS;
pub(super) const K6_HALF: usize = 3 * 8 * 64;
pub(super) const K6_BYTES: usize = K6_Q + 2 * K6_HALF;
const _: () = assert!(K6_BYTES == ROWS * DType::Q6_K.block_bytes());

/// Where the 8 granules of 32-byte ql chunk `c` (0..4) of a Q6_K tile start.
#[inline(always)]
pub(super) const fn k6_ql(c: usize) -> usize {
    K6_Q + K6_HALF * (c / 2) + 2 * 512 * (c % 2)
}

/// Where the 8 granules of 32-byte qh chunk `c` (0..2) of a Q6_K tile start.
#[inline(always)]
pub(super) const fn k6_qh(c: usize) -> usize {
    K6_Q + K6_HALF * c + 512
}

/// Byte `i` (0..32) of a row's 32-byte chunk laid out as 8 granules at `at` (granule `i / 4`
/// holds 16 rows of 4 bytes).
#[inline(always)]
fn granule_byte(at: usize, r: usize, i: usize) -> usize {
    debug_assert!(i < 32);
    at + 64 * (i / 4) + 4 * r + i % 4
}

/// Copies `src` (one row's quant bytes) into granules at `at`, 4 bytes at a time.
#[inline(always)]
fn put_granules(tile: &mut [u8], at: usize, r: usize, src: &[u8]) {
    for (k, c) in src.chunks_exact(4).enumerate() {
        tile[at + 64 * k + 4 * r..][..4].copy_from_slice(c);
    }
}

/// One Q4_K or Q6_K tile from the same super-block of 16 rows.
pub(super) fn pack_tile(dtype: DType, src: &[&[u8]; ROWS], tile: &mut [u8]) {
    for (r, s) in src.iter().enumerate() {
        match dtype {
            DType::Q4_K => {
                let b: &BlockQ4K = bytemuck::from_bytes(s);
                tile[K4_D + 2 * r..][..2].copy_from_slice(&b.d);
                tile[K4_DMIN + 2 * r..][..2].copy_from_slice(&b.dmin);
                for (p, &v) in b.scales.iter().enumerate() {
                    tile[K4_SC + ROWS * p + r] = v;
                }
                put_granules(tile, K4_QS, r, &b.qs);
            }
            DType::Q5_K => {
                let b: &BlockQ5K = bytemuck::from_bytes(s);
                tile[K5_D + 2 * r..][..2].copy_from_slice(&b.d);
                tile[K5_DMIN + 2 * r..][..2].copy_from_slice(&b.dmin);
                for (p, &v) in b.scales.iter().enumerate() {
                    tile[K5_SC + ROWS * p + r] = v;
                }
                put_granules(tile, K5_QH, r, &b.qh);
                put_granules(tile, K5_QS, r, &b.qs);
            }
            DType::Q3_K => {
                let b: &BlockQ3K = bytemuck::from_bytes(s);
                tile[K3_D + 2 * r..][..2].copy_from_slice(&b.d);
                for (p, &v) in b.scales.iter().enumerate() {
                    tile[K3_SC + ROWS * p + r] = v;
                }
                if Q3K_FIELDS {
                    pack_q3k_fields(tile, r, b);
                } else {
                    put_granules(tile, K3_HM, r, &b.hmask);
                    put_granules(tile, K3_QS, r, &b.qs);
                }
            }
            DType::Q2_K => {
                let b: &BlockQ2K = bytemuck::from_bytes(s);
                tile[K2_D + 2 * r..][..2].copy_from_slice(&b.d);
                tile[K2_DMIN + 2 * r..][..2].copy_from_slice(&b.dmin);
                for (p, &v) in b.scales.iter().enumerate() {
                    tile[K2_SC + ROWS * p + r] = v;
                }
                put_granules(tile, K2_QS, r, &b.qs);
            }
            DType::IQ4_XS => {
                let b: &BlockIQ4XS = bytemuck::from_bytes(s);
                tile[KX_D + 2 * r..][..2].copy_from_slice(&b.d);
                for (p, &v) in b.scales_h.iter().enumerate() {
                    tile[KX_SH + ROWS * p + r] = v;
                }
                for (p, &v) in b.scales_l.iter().enumerate() {
                    tile[KX_SL + ROWS * p + r] = v;
                }
                put_granules(tile, KX_QS, r, &b.qs);
            }
            DType::Q6_K => {
                let b: &BlockQ6K = bytemuck::from_bytes(s);
                tile[K6_D + 2 * r..][..2].copy_from_slice(&b.d);
                for (p, &v) in b.scales.iter().enumerate() {
                    tile[K6_SC + ROWS * p + r] = v as u8;
                }
                for (c, chunk) in b.ql.chunks_exact(32).enumerate() {
                    put_granules(tile, k6_ql(c), r, chunk);
                }
                for (c, chunk) in b.qh.chunks_exact(32).enumerate() {
                    put_granules(tile, k6_qh(c), r, chunk);
                }
            }
            _ => unreachable!("kquants::pack_tile: {dtype} has no k-quant layout"),
        }
    }
}

/// Row `r`'s 3-bit quants into the x86 block granules ([`k3_fields`]), 8 quants per u64 (every
/// value and shift stays inside its byte): packing a Q3_K matrix ran at about 100 MB/s one
/// quant at a time, and a big MoE file's experts are packed at load.
fn pack_q3k_fields(tile: &mut [u8], r: usize, b: &BlockQ3K) {
    let word = |s: &[u8], at: usize| u64::from_le_bytes(std::array::from_fn(|i| s[at + i]));
    const LOW2: u64 = 0x0303_0303_0303_0303;
    const BIT0: u64 = 0x0101_0101_0101_0101;
    for g in 0..QK_K / QK {
        // Element 32g + l: bits 2j of qs[32n + l], bit g of hmask[l] (g = 4n + j).
        let (n, j) = (g / 4, g % 4);
        // u[k]: elements 8k..8k+8, one per byte; vector v is the dword at byte 4(v % 2) of u[v / 2].
        let u: [u64; 4] = std::array::from_fn(|k| {
            let q = word(&b.qs, 32 * n + 8 * k) >> (2 * j) & LOW2;
            let h = word(&b.hmask, 8 * k) >> g & BIT0;
            q | h << 2
        });
        let v: [u32; 8] = std::array::from_fn(|v| (u[v / 2] >> (32 * (v % 2))) as u32);
        const L2: u32 = 0x0303_0303;
        const B0: u32 = 0x0101_0101;
        let granules = [
            v[0] | v[1] << 3 | (v[2] & L2) << 6,
            v[3] | v[4] << 3 | (v[5] & L2) << 6,
            v[6] | v[7] << 3 | (v[2] >> 2 & B0) << 6 | (v[5] >> 2 & B0) << 7,
        ];
        for (c, w) in granules.iter().enumerate() {
            tile[K3_Q + K3_BLOCK * g + 64 * c + 4 * r..][..4].copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// Row `r`'s quant `u` (0..8) of element `e` in an x86 Q3_K tile ([`k3_fields`]).
fn q3k_field(tile: &[u8], r: usize, e: usize) -> u8 {
    let (g, v, i) = (e / QK, e % QK / 4, e % 4);
    let (c, shift, bits, hi) = k3_fields(v);
    let byte = |c: usize| tile[K3_Q + K3_BLOCK * g + 64 * c + 4 * r + i];
    let lo = byte(c) >> shift & ((1 << bits) - 1);
    match hi {
        Some(at) => lo | (byte(2) >> at & 1) << 2,
        None => lo,
    }
}

/// A k-quant tile read back per row: element e of row r is
/// `(d[r] * sc[r][e / 16]) * (u[r][e] - off) - dmin[r] * m[r][e / 16]`, off 0 (Q4_K) or 32
/// (Q6_K); Q6_K has no mins (`dmin` and `m` are 0).
pub struct KTile {
    /// Super-block scale per row.
    pub d: [f32; ROWS],
    /// Super-block min scale per row (Q4_K).
    pub dmin: [f32; ROWS],
    /// Scale per row and 16-element group (a Q4_K sub-block's scale appears twice).
    pub sc: [[i32; QK_K / 16]; ROWS],
    /// Min per row and 16-element group (Q4_K).
    pub m: [[i32; QK_K / 16]; ROWS],
    /// Unsigned quants per row.
    pub u: [[u8; QK_K]; ROWS],
    /// The unsigned-quant offset.
    pub off: i32,
}

/// Reads a tile back through the layout (independently of [`pack_tile`]).
pub fn unpack_tile_ref(dtype: DType, tile: &[u8]) -> Box<KTile> {
    let mut k = Box::new(KTile {
        d: [0.0; ROWS],
        dmin: [0.0; ROWS],
        sc: [[0; QK_K / 16]; ROWS],
        m: [[0; QK_K / 16]; ROWS],
        u: [[0; QK_K]; ROWS],
        off: 0,
    });
    for r in 0..ROWS {
        match dtype {
            DType::Q4_K | DType::Q5_K => {
                // Q5_K's scales sit where Q4_K's do; its qs follow the qh granules.
                k.d[r] = f16_le([tile[K4_D + 2 * r], tile[K4_D + 2 * r + 1]]);
                k.dmin[r] = f16_le([tile[K4_DMIN + 2 * r], tile[K4_DMIN + 2 * r + 1]]);
                let planes: [u8; 12] = std::array::from_fn(|p| tile[K4_SC + ROWS * p + r]);
                for s in 0..8 {
                    let (sc, m) = scale_min_k4(s, &planes);
                    k.sc[r][2 * s..2 * s + 2].fill(sc as i32);
                    k.m[r][2 * s..2 * s + 2].fill(m as i32);
                }
                let (qs, q5) = match dtype {
                    DType::Q5_K => (K5_QS, true),
                    _ => (K4_QS, false),
                };
                for (e, u) in k.u[r].iter_mut().enumerate() {
                    let (s, l) = (e / QK, e % QK);
                    let byte = tile[granule_byte(qs + 512 * (s / 2), r, l)];
                    let high = if q5 {
                        tile[granule_byte(K5_QH, r, l)] >> s & 1
                    } else {
                        0
                    };
                    *u = (if s % 2 == 0 { byte & 0xF } else { byte >> 4 }) | high << 4;
                }
            }
            DType::Q3_K => {
                k.off = 4;
                k.d[r] = f16_le([tile[K3_D + 2 * r], tile[K3_D + 2 * r + 1]]);
                let planes: [u8; 12] = std::array::from_fn(|p| tile[K3_SC + ROWS * p + r]);
                let sc = scales_q3k(&planes);
                for (g, v) in k.sc[r].iter_mut().enumerate() {
                    *v = sc[g] as i32;
                }
                for (e, u) in k.u[r].iter_mut().enumerate() {
                    if Q3K_FIELDS {
                        *u = q3k_field(tile, r, e);
                        continue;
                    }
                    // Element 128n + 32j + l: bits 2j of qs[32n + l], bit 4n + j of hmask[l].
                    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
                    let q = tile[granule_byte(K3_QS + 512 * n, r, l)] >> (2 * j) & 3;
                    let h = tile[granule_byte(K3_HM, r, l)] >> (4 * n + j) & 1;
                    *u = q | h << 2;
                }
            }
            DType::Q2_K => {
                k.d[r] = f16_le([tile[K2_D + 2 * r], tile[K2_D + 2 * r + 1]]);
                k.dmin[r] = f16_le([tile[K2_DMIN + 2 * r], tile[K2_DMIN + 2 * r + 1]]);
                for g in 0..QK_K / 16 {
                    let v = tile[K2_SC + ROWS * g + r];
                    (k.sc[r][g], k.m[r][g]) = ((v & 0xF) as i32, (v >> 4) as i32);
                }
                for (e, u) in k.u[r].iter_mut().enumerate() {
                    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
                    *u = tile[granule_byte(K2_QS + 512 * n, r, l)] >> (2 * j) & 3;
                }
            }
            DType::IQ4_XS => {
                k.off = 128;
                k.d[r] = f16_le([tile[KX_D + 2 * r], tile[KX_D + 2 * r + 1]]);
                let b = BlockIQ4XS {
                    d: [0; 2],
                    scales_h: [tile[KX_SH + r], tile[KX_SH + ROWS + r]],
                    scales_l: std::array::from_fn(|p| tile[KX_SL + ROWS * p + r]),
                    qs: [0; QK_K / 2],
                };
                for ib in 0..QK_K / QK {
                    k.sc[r][2 * ib..2 * ib + 2].fill(b.scale(ib) - 32);
                }
                for (e, u) in k.u[r].iter_mut().enumerate() {
                    let (ib, l) = (e / QK, e % QK);
                    let byte = tile[granule_byte(KX_QS + 256 * ib, r, l % 16)];
                    let nib = if l < 16 { byte & 0xF } else { byte >> 4 };
                    *u = (KVALUES_IQ4NL[nib as usize] as u8) ^ 0x80;
                }
            }
            DType::Q6_K => {
                k.off = 32;
                k.d[r] = f16_le([tile[K6_D + 2 * r], tile[K6_D + 2 * r + 1]]);
                for (g, sc) in k.sc[r].iter_mut().enumerate() {
                    *sc = tile[K6_SC + ROWS * g + r] as i8 as i32;
                }
                for (e, u) in k.u[r].iter_mut().enumerate() {
                    let (n, kk, l) = (e / 128, e % 128 / 32, e % 32);
                    // ql[64n + 32(kk & 1) + l], qh[32n + l].
                    let ql = tile[granule_byte(k6_ql(2 * n + (kk & 1)), r, l)];
                    let qh = tile[granule_byte(k6_qh(n), r, l)];
                    let lo = if kk < 2 { ql & 0xF } else { ql >> 4 };
                    *u = lo | ((qh >> (2 * kk)) & 3) << 4;
                }
            }
            _ => unreachable!("kquants::unpack_tile_ref: {dtype} has no k-quant layout"),
        }
    }
    k
}

/// The scalar specification of a Q4_K / Q6_K [`super::Rows16Dot`] for one activation row
/// (8 Q8A blocks per tile).
pub(super) fn rows16_ref(dtype: DType, tiles: &[u8], x: &[BlockQ8A]) -> [f32; ROWS] {
    let bytes = ROWS * dtype.block_bytes();
    let mut acc = [0f32; ROWS];
    for (t, xa) in tiles.chunks_exact(bytes).zip(x.chunks_exact(QK_K / QK)) {
        let k = unpack_tile_ref(dtype, t);
        match dtype {
            DType::Q5_K => {
                q5k_ref(&k, xa, &mut acc);
                continue;
            }
            DType::Q3_K | DType::Q2_K => {
                k16_ref(&k, xa, &mut acc);
                continue;
            }
            _ => {}
        }
        for (s, a) in xa.iter().enumerate() {
            for (r, acc) in acc.iter_mut().enumerate() {
                let u = &k.u[r][QK * s..QK * (s + 1)];
                let isum = |h: usize| -> i32 {
                    (16 * h..16 * h + 16)
                        .map(|l| u[l] as i32 * a.qs[l] as i32)
                        .sum()
                };
                if dtype == DType::IQ4_XS {
                    // One scale per sub-block, weights `u - 128`: the canonical block step.
                    let isum = isum(0) + isum(1) - k.off * (a.sums[0] as i32 + a.sums[1] as i32);
                    let tmp = isum as f32 * a.d;
                    *acc = (k.d[r] * k.sc[r][2 * s] as f32).mul_add(tmp, *acc);
                } else if dtype == DType::Q4_K {
                    let (sc, m) = (k.sc[r][2 * s], k.m[r][2 * s]);
                    let tmp = (isum(0) + isum(1)) as f32 * a.d;
                    *acc = (k.d[r] * sc as f32).mul_add(tmp, *acc);
                    *acc = (-(k.dmin[r] * m as f32)).mul_add(a.s, *acc);
                } else {
                    for h in 0..2 {
                        let sc = k.sc[r][2 * s + h];
                        let tmp = (isum(h) - k.off * a.sums[h] as i32) as f32 * a.d;
                        *acc = (k.d[r] * sc as f32).mul_add(tmp, *acc);
                    }
                }
            }
        }
    }
    acc
}

/// One Q5_K tile's step, the per-row reference's order: per pair j of sub-blocks (Q8A blocks
/// `a1 = 2j`, `a2 = 2j + 1`), `sd += a1.d * f32(sc1 * isum1) + a2.d * f32(sc2 * isum2)` and
/// `sm += a1.d * f32(m1 * sum(a1.qs)) + a2.d * f32(m2 * sum(a2.qs))`, then
/// `acc = acc + (d * sd - dmin * sm)` (each product rounded on its own, no fma).
fn q5k_ref(k: &KTile, xa: &[BlockQ8A], acc: &mut [f32; ROWS]) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let (mut sd, mut sm) = (0f32, 0f32);
        let term = |s: usize| -> (f32, f32) {
            let a = &xa[s];
            let isum: i32 = (0..QK)
                .map(|l| k.u[r][QK * s + l] as i32 * a.qs[l] as i32)
                .sum();
            let qsum = a.sums[0] as i32 + a.sums[1] as i32;
            let (sc, m) = (k.sc[r][2 * s], k.m[r][2 * s]);
            (a.d * (sc * isum) as f32, a.d * (m * qsum) as f32)
        };
        for j in 0..4 {
            let ((x1, y1), (x2, y2)) = (term(2 * j), term(2 * j + 1));
            sd += x1 + x2;
            sm += y1 + y2;
        }
        *acc += k.d[r] * sd - k.dmin[r] * sm;
    }
}

/// One Q3_K or Q2_K tile's step, the per-row reference's order: per Q8A block g and half h
/// (16 weights, scale `sc = sc[2g + h]`), `ih_h = sum(u * q_x) - off * a.sums[h]` (exact);
/// `sd += a.d * f32(sc_0 * ih_0 + sc_1 * ih_1)`, and for Q2_K
/// `sm += a.d * f32(m_0 * a.sums[0] + m_1 * a.sums[1])`; then
/// `acc = acc + (d * sd - dmin * sm)` (Q2_K) or `acc = acc + d * sd` (Q3_K), each product
/// rounded on its own.
fn k16_ref(k: &KTile, xa: &[BlockQ8A], acc: &mut [f32; ROWS]) {
    let q2 = k.off == 0;
    for (r, acc) in acc.iter_mut().enumerate() {
        let (mut sd, mut sm) = (0f32, 0f32);
        for (g, a) in xa.iter().enumerate() {
            let ih = |h: usize| -> i32 {
                let dot: i32 = (16 * h..16 * h + 16)
                    .map(|l| k.u[r][QK * g + l] as i32 * a.qs[l] as i32)
                    .sum();
                dot - k.off * a.sums[h] as i32
            };
            let isum = k.sc[r][2 * g] * ih(0) + k.sc[r][2 * g + 1] * ih(1);
            sd += a.d * isum as f32;
            let msum = k.m[r][2 * g] * a.sums[0] as i32 + k.m[r][2 * g + 1] * a.sums[1] as i32;
            sm += a.d * msum as f32;
        }
        *acc += if q2 {
            k.d[r] * sd - k.dmin[r] * sm
        } else {
            k.d[r] * sd
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::tests::flavours;
    use super::super::super::QMatrix;
    use super::super::Interleaved;
    use super::*;

    /// 16 rows of `n` super-blocks whose quants all sit at `top` (Q2_K 3, Q3_K 7, Q4_K 15,
    /// Q5_K 31, Q6_K 63, IQ4_XS index 15) or 0, with the largest scales and mins, or (Q6_K) scales alternating
    /// 127 / -128.
    fn extreme_rows(dtype: DType, n: usize, top: bool) -> Vec<u8> {
        let q = if top { 0xFF } else { 0 };
        let block = |r: usize| -> Vec<u8> {
            let d = half::f16::from_f32(0.01 * (r + 1) as f32).to_le_bytes();
            match dtype {
                DType::Q5_K => {
                    let dmin = half::f16::from_f32(0.003).to_le_bytes();
                    let b = BlockQ5K {
                        d,
                        dmin,
                        scales: [0xFF; 12],
                        qh: [q; QK_K / 8],
                        qs: [q; QK_K / 2],
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                DType::Q3_K => {
                    let b = BlockQ3K {
                        hmask: [q; QK_K / 8],
                        qs: [q; QK_K / 4],
                        scales: [0xFF; 12],
                        d,
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                DType::Q2_K => {
                    let b = BlockQ2K {
                        scales: [0xFF; QK_K / 16],
                        qs: [q; QK_K / 4],
                        d,
                        dmin: half::f16::from_f32(0.003).to_le_bytes(),
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                DType::IQ4_XS => {
                    // Indices 0xF / 0: table values 113 / -127; scales at their largest.
                    let b = BlockIQ4XS {
                        d,
                        scales_h: [0xFF; 2],
                        scales_l: [0xFF; 4],
                        qs: [q; QK_K / 2],
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                DType::Q4_K => {
                    let dmin = half::f16::from_f32(0.003).to_le_bytes();
                    let b = BlockQ4K {
                        d,
                        dmin,
                        scales: [0xFF; 12],
                        qs: [q; QK_K / 2],
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
                _ => {
                    let b = BlockQ6K {
                        ql: [q; QK_K / 2],
                        qh: [q; QK_K / 4],
                        scales: std::array::from_fn(|g| if g % 2 == 0 { 127 } else { -128 }),
                        d,
                    };
                    bytemuck::bytes_of(&b).to_vec()
                }
            }
        };
        (0..ROWS)
            .flat_map(|r| (0..n).flat_map(move |_| block(r)))
            .collect()
    }

    /// Activation blocks with every quant at `q` (+-127: the BlockQ8A bounds).
    fn extreme_x(blocks: usize, q: i8) -> Vec<BlockQ8A> {
        let d = 0.25f32;
        let sum = 16 * q as i16;
        (0..blocks)
            .map(|_| BlockQ8A {
                d,
                s: d * (2 * sum as i32) as f32,
                sums: [sum, sum],
                qs: [q; QK],
            })
            .collect()
    }

    /// Regression guard for the i16 accumulation of the plain NEON kernels: every weight quant
    /// at its top against activations at +-127 puts each i16 lane at its bound (Q4_K 15240,
    /// Q6_K 32004, IQ4_XS two products of -127 * -127: 32258); one product more per lane would
    /// wrap and change the bits. The one-token Q3_K / Q2_K kernels keep a row's sum in one i16
    /// lane, 4 times too large for some blocks: at u = 0 against +127 Q3_K's is 4 * -8128 =
    /// -32512, and at u = 7 it wraps (4 * 7 * 16 * 127 = 56896) before the offset brings it
    /// back. Every flavour
    /// with a 16-row k-quant kernel must give the specification's bits, at 1 and 8 tokens.
    #[test]
    fn kquant_kernels_at_the_quant_extremes_give_the_reference_bits() {
        let n = 2;
        for dtype in [
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::IQ4_XS,
        ] {
            for top in [true, false] {
                let data = extreme_rows(dtype, n, top);
                let w = QMatrix::new(dtype, ROWS, n * QK_K, &data).unwrap();
                let p = Interleaved::pack(&w).unwrap();
                for q in [127i8, -127] {
                    let x = extreme_x(n * QK_K / QK, q);
                    let want = rows16_ref(dtype, p.group(0), &x).map(f32::to_bits);
                    for k in flavours() {
                        let Some(dot) = k.rows16(dtype) else {
                            continue;
                        };
                        let isa = k.isa;
                        for toks in [1, 8] {
                            let xs = vec![&x[..]; toks];
                            let mut out = vec![[0f32; ROWS]; toks];
                            dot(p.group(0), &xs, &mut out);
                            for o in &out {
                                assert_eq!(
                                    o.map(f32::to_bits),
                                    want,
                                    "{dtype} {isa:?} top {top} x {q} tokens {toks}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
