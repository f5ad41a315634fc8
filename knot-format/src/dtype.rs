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
    MXFP4,
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
    pub const ALL: [DType; 16] = [
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
        DType::MXFP4,
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
            DType::MXFP4 => 39,
            DType::BF16 => 30,
        }
    }

    /// The type for a `ggml_type` id, if KNOT supports it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// A `ggml_type` id KNOT does not store, named, with why (for the import's refusal):
    /// e.g. `IQ2_XXS (an importance-matrix codebook quantization below 4 bits: ...)`.
    pub fn unsupported_ggml_label(id: u32) -> String {
        let (name, why) = match id {
            9 => (
                "Q8_1",
                "an intermediate activation format, never a weight type in a file",
            ),
            15 => (
                "Q8_K",
                "an intermediate activation format, never a weight type in a file",
            ),
            16 | 17 | 22 => (
                match id {
                    16 => "IQ2_XXS",
                    17 => "IQ2_XS",
                    _ => "IQ2_S",
                },
                "a codebook (E8 lattice grid) quantization below 3 bits; the engine has no grid \
                 tables or kernels for it: requantize to Q2_K, Q3_K or IQ4_XS",
            ),
            18 | 21 => (
                if id == 18 { "IQ3_XXS" } else { "IQ3_S" },
                "a codebook (grid) quantization below 4 bits; the engine has no grid tables or \
                 kernels for it: requantize to Q3_K or IQ4_XS",
            ),
            19 | 29 => (
                if id == 19 { "IQ1_S" } else { "IQ1_M" },
                "a codebook quantization below 2 bits; the engine has no kernels for it: \
                 requantize to Q2_K",
            ),
            24..=28 => ("I8/I16/I32/I64/F64", "a non-weight element type"),
            34 | 35 => (
                if id == 34 { "TQ1_0" } else { "TQ2_0" },
                "a ternary format; the engine has no kernels for it",
            ),
            4 | 5 | 31..=33 | 36..=38 => (
                "a removed GGML type",
                "llama.cpp itself no longer reads it: requantize from the original weights",
            ),
            _ => ("unknown", "not a type this reader knows"),
        };
        format!("{name}: {why}")
    }

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::IQ4_NL
            | DType::MXFP4 => QK,
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
            // e8m0 scale (a power of two) + 16 bytes of 4-bit e2m1 values: 4.25 bits/weight
            DType::MXFP4 => 17,
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
            DType::MXFP4 => "mxfp4",
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
