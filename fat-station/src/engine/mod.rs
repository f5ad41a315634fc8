//! The inference engine: kernels, transformer forward pass, KV cache, tokenizer.
//!
//! No I/O beyond the mmap: `forward(tokens or residual, layer range, session)`.

pub mod kernels;
pub mod tokenizer;
