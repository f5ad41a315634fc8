//! Quantized compute kernels: dequantization and matrix-vector products on GGML blocks.
