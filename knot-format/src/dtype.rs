//! Tensor element types and their GGML block layouts.
//!
//! KNOT keeps GGUF's quantized blocks bit-for-bit, so the numeric ids are GGML's
//! (`ggml_type`) and the layouts are `ggml-common.h`'s. This module knows sizes and
//! layouts only; the kernels that compute on the blocks live in the engine.

use serde::{Deserialize, Serialize};

/// Element type of a tensor, numbered as GGML numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Elements per block of the legacy quants (Q4_0 .. Q8_0).
pub const QK: usize = 32;

// `ALL` lists the types in declaration order, so `index` is a position in it.
const _: () = {
    let mut i = 0;
    while i < DType::COUNT {
        assert!(DType::ALL[i].index() == i);
        i += 1;
    }
};

impl DType {
    /// Every type KNOT stores.
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// How many types KNOT stores (the length of per-type tables).
    pub const COUNT: usize = DType::ALL.len();

    /// This type's position in [`DType::ALL`]: the index of its row in a per-type table (the
    /// engine's kernel table), so a table never re-lists the types.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The `ggml_type` id GGUF uses for this type.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::BF16 => 30,
        }
    }

    /// The type for a `ggml_type` id, if KNOT supports it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::IQ4_NL => {
                QK
            }
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
                QK_K
            }
        }
    }

    /// Bytes per block (`ggml_type_size`).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            // d f16 + 16 nibble bytes: 4.5 bits/weight
            DType::Q4_0 => 18,
            // d, m f16 + 16 nibble bytes: 5.0 bits/weight
            DType::Q4_1 => 20,
            // d f16 + qh u32 + 16 nibble bytes: 5.5 bits/weight
            DType::Q5_0 => 22,
            // d, m f16 + qh u32 + 16 bytes: 6.0 bits/weight
            DType::Q5_1 => 24,
            // d f16 + 32 i8: 8.5 bits/weight
            DType::Q8_0 => 34,
            // scales[16] + qs[64] + d + dmin: 2.625 bits/weight
            DType::Q2_K => 84,
            // hmask[32] + qs[64] + scales[12] + d: 3.4375 bits/weight
            DType::Q3_K => 110,
            // d + dmin + scales[12] + qs[128]: 4.5 bits/weight
            DType::Q4_K => 144,
            // d + dmin + scales[12] + qh[32] + qs[128]: 5.5 bits/weight
            DType::Q5_K => 176,
            // ql[128] + qh[64] + scales[16] i8 + d: 6.5625 bits/weight
            DType::Q6_K => 210,
            // d f16 + 16 bytes of 4-bit indices into a 16-value table: 4.5 bits/weight
            DType::IQ4_NL => 18,
            // d + scales_h u16 + scales_l[4] + qs[128]: 4.25 bits/weight
            DType::IQ4_XS => 136,
        }
    }

    /// Bytes needed for `n` elements, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }

    /// GGML's name for the type (`"q4_K"`), as `gguf` and llama.cpp print it.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_K",
            DType::Q3_K => "q3_K",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(DType::from_ggml_id(4), None, "Q4_2 was removed from GGML");
    }

    #[test]
    fn sizes_need_whole_blocks() {
        assert_eq!(DType::Q4_K.bytes_for(896 * 256), Some(896 * 144));
        assert_eq!(DType::Q4_K.bytes_for(100), None);
        assert_eq!(DType::F32.bytes_for(3), Some(12));
    }
}
