//! AVX2 + FMA + F16C kernels (x86_64). Placeholder until the SIMD variants land.

use super::Dot;

/// Replace the reference entries of `table` with the AVX2 kernels available so far.
pub fn install(_table: &mut [Dot; 13]) {}
