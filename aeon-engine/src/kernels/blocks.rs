//! GGML block layouts as `#[repr(C)]` structs (`ggml-common.h`), plus the engine's own
//! activation block [`BlockQ8A`].
//!
//! Every weight block is built from byte arrays only, so its alignment is 1 and a slice of
//! blocks can be cast straight from unaligned mmapped bytes with `bytemuck::cast_slice`.
//! Half-precision scales are kept as `[u8; 2]` and read with [`f16_le`].
//!
//! In the formulas `q` is the stored quant, `d`/`dmin` the f16 super-scale and min, `sc`/`m`
//! the per-sub-block scale and min.

use bytemuck::{Pod, Zeroable};
use knot_format::dtype::{DType, QK, QK_K};
use std::mem::size_of;

/// Little-endian IEEE half to f32.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(b).to_f32()
}

/// Little-endian bfloat16 to f32 (the high half of an f32).
#[inline(always)]
pub fn bf16_le(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

/// `x = d * (q - 8)`, q 4-bit; element j in the low nibble of `qs[j]`, j+16 in the high.
/// 18 bytes / 32 weights = 4.5 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `x = d * q + m`, q 4-bit, nibble order as Q4_0. 20 bytes / 32 = 5.0 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// `x = d * (q - 16)`, q 5-bit: low 4 bits as Q4_0, bit 4 of element j is bit j of the
/// little-endian u32 `qh`. 22 bytes / 32 = 5.5 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `x = d * q + m`, q 5-bit laid out as Q5_0. 24 bytes / 32 = 6.0 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `x = d * q`, q signed 8-bit. 34 bytes / 32 = 8.5 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// 16 sub-blocks of 16: `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q 2-bit.
/// 84 bytes / 256 = 2.625 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// 16 sub-blocks of 16: `x = d * (sc - 32) * (q2 - 4 * !hbit)`, 6-bit scales packed in 12
/// bytes. 110 bytes / 256 = 3.4375 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

/// 8 sub-blocks of 32: `x = d * sc * q - dmin * m`, q 4-bit, 6-bit `sc`/`m` packed in 12
/// bytes (see [`scale_min_k4`]). 144 bytes / 256 = 4.5 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// As Q4_K with a fifth bit per weight in `qh`. 176 bytes / 256 = 5.5 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 16 sub-blocks of 16: `x = d * sc * (q - 32)`, q 6-bit (low 4 in `ql`, high 2 in `qh`),
/// `sc` signed 8-bit. 210 bytes / 256 = 6.5625 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// The 16 weights a 4-bit IQ4_NL / IQ4_XS index selects (ggml's `kvalues_iq4nl`): a
/// non-uniform grid, denser near zero where most weights lie.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `x = d * KVALUES_IQ4NL[q]`, q a 4-bit index, nibble order as Q4_0. 18 bytes / 32 = 4.5
/// bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// 8 sub-blocks of 32: `x = d * (ls - 32) * KVALUES_IQ4NL[q]`, the 6-bit `ls` of sub-block
/// ib = low nibble ib % 2 of `scales_l[ib / 2]` | bits 2ib..2ib+2 of the u16 `scales_h` << 4;
/// sub-block ib's indices in `qs[16ib..16ib + 16]`, nibble order as Q4_0.
/// 136 bytes / 256 = 4.25 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

impl BlockIQ4XS {
    /// The 6-bit scale of sub-block `ib` (0..8), not yet minus 32.
    #[inline(always)]
    pub fn scale(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let hi = (u16::from_le_bytes(self.scales_h) >> (2 * ib)) & 3;
        (lo as u16 | hi << 4) as i32
    }
}

/// The 16 values a 4-bit MXFP4 (e2m1) code stands for, doubled so they are integers (ggml's
/// `kvalues_mxfp4`: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2); the block scale is
/// halved to match ([`e8m0_half`]).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `x = e8m0_half(e) * KVALUES_MXFP4[q]`, q a 4-bit code, nibble order as Q4_0 (gpt-oss's
/// expert weights). 17 bytes / 32 = 4.25 bits/weight.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}

/// Half the e8m0 scale `2^(e - 127)`, i.e. `2^(e - 128)`, exactly as ggml's
/// `ggml_e8m0_to_fp32_half`: f32 bits `(e - 1) << 23` for e >= 2, the subnormals
/// `0x00200000 << e` below (e = 255 is 2^127, not NaN, as there).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// Byte offsets of the f16 scale fields in one block of `dtype` (none for the float types):
/// what a synthetic block must hold sane values in.
pub fn f16_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        // MXFP4's scale is one e8m0 byte (see `e8m0_half`), not an f16.
        DType::F32 | DType::F16 | DType::BF16 | DType::MXFP4 => &[],
    }
}

const _: () = assert!(size_of::<BlockQ4_0>() == DType::Q4_0.block_bytes());
const _: () = assert!(size_of::<BlockQ4_1>() == DType::Q4_1.block_bytes());
const _: () = assert!(size_of::<BlockQ5_0>() == DType::Q5_0.block_bytes());
const _: () = assert!(size_of::<BlockQ5_1>() == DType::Q5_1.block_bytes());
const _: () = assert!(size_of::<BlockQ8_0>() == DType::Q8_0.block_bytes());
const _: () = assert!(size_of::<BlockQ2K>() == DType::Q2_K.block_bytes());
const _: () = assert!(size_of::<BlockQ3K>() == DType::Q3_K.block_bytes());
const _: () = assert!(size_of::<BlockQ4K>() == DType::Q4_K.block_bytes());
const _: () = assert!(size_of::<BlockQ5K>() == DType::Q5_K.block_bytes());
const _: () = assert!(size_of::<BlockQ6K>() == DType::Q6_K.block_bytes());
const _: () = assert!(size_of::<BlockIQ4NL>() == DType::IQ4_NL.block_bytes());
const _: () = assert!(size_of::<BlockIQ4XS>() == DType::IQ4_XS.block_bytes());
const _: () = assert!(size_of::<BlockMXFP4>() == DType::MXFP4.block_bytes());

/// The activation block every quantized dot product consumes: 32 activations as
/// `x = d * q`, q signed 8-bit in [-127, 127], with `d = max|x| / 127` in full f32, plus the
/// sums of q over each half and `s = d * sum(q)` (for the min / offset terms of the weight
/// formats).
///
/// One scale per 32 activations (not llama.cpp's one per 256 for k-quants) keeps the small
/// activations next to an outlier (Qwen's first position reaches ~1000) representable.
/// 44 bytes / 32 = 11 bits per activation; it lives only in scratch.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8A {
    pub d: f32,
    pub s: f32,
    pub sums: [i16; 2],
    pub qs: [i8; QK],
}

const _: () = assert!(size_of::<BlockQ8A>() == 44);

/// Scale and min `j` (0..8) of a Q4_K / Q5_K block: 6 bits each, packed in 12 bytes
/// (`get_scale_min_k4` in ggml).
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed scales of a Q3_K block (each already minus 32), unpacked from 12 bytes.
#[inline(always)]
pub fn scales_q3k(packed: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = u32::from_le_bytes([packed[0], packed[1], packed[2], packed[3]]);
    let a1 = u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]);
    let tmp = u32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (k, b) in w.to_le_bytes().iter().enumerate() {
            out[i * 4 + k] = (*b as i8) - 32;
        }
    }
    out
}
