// ggml's reference quantizer as a filter, so scripts/make-synthetic-model.py can write K-quant
// GGUFs without the f16 intermediate file llama-quantize needs (a 24-layer Qwen3-30B-A3B is
// ~31 GB of f16):
//   ggml-quantize-rows TYPE N_PER_ROW < rows.f16 > rows.quantized
// TYPE is ggml's type number (e.g. 12 Q4_K, 14 Q6_K, 8 Q8_0); stdin holds whole rows of
// N_PER_ROW little-endian f16 values. Each row is widened to f32 and quantized with
// ggml_quantize_chunk and no importance matrix: the call and the input llama-quantize makes for
// an f16 tensor, so the bytes equal llama-quantize's.
// Built by make-synthetic-model.py against the static ggml-base of
// scripts/bench/build-llama-bench.sh's native build. Exit: 0 done; 1 a bad argument, a short
// read (not whole rows) or a write error.
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ggml-quantize-rows TYPE N_PER_ROW < f16 rows > quantized rows\n");
        return 1;
    }
    char *end;
    long type = strtol(argv[1], &end, 10);
    if (*end || type < 0 || type >= GGML_TYPE_COUNT) {
        fprintf(stderr, "ggml-quantize-rows: bad type %s\n", argv[1]);
        return 1;
    }
    long n = strtol(argv[2], &end, 10);
    if (*end || n <= 0 || n % ggml_blck_size((enum ggml_type)type) != 0) {
        fprintf(stderr, "ggml-quantize-rows: bad row length %s for %s\n", argv[2],
                ggml_type_name((enum ggml_type)type));
        return 1;
    }
    // Rows per read: ~4 MB of f16 at a time.
    const long rows = n >= (1 << 21) ? 1 : (1 << 21) / n;
    ggml_fp16_t *in = malloc(sizeof(ggml_fp16_t) * n * rows);
    float *f32 = malloc(sizeof(float) * n * rows);
    void *out = malloc(ggml_row_size((enum ggml_type)type, n) * rows);
    if (!in || !f32 || !out) {
        fprintf(stderr, "ggml-quantize-rows: out of memory\n");
        return 1;
    }
    ggml_quantize_init((enum ggml_type)type);
    const size_t row_bytes = sizeof(ggml_fp16_t) * (size_t)n;
    for (;;) {
        size_t got = fread(in, 1, row_bytes * (size_t)rows, stdin);
        if (got % row_bytes != 0) {
            fprintf(stderr, "ggml-quantize-rows: input ends inside a row\n");
            return 1;
        }
        if (got == 0) break;
        const int64_t nrows = (int64_t)(got / row_bytes);
        ggml_fp16_to_fp32_row(in, f32, nrows * n);
        size_t size = ggml_quantize_chunk((enum ggml_type)type, f32, out, 0, nrows, n, NULL);
        if (fwrite(out, 1, size, stdout) != size) {
            fprintf(stderr, "ggml-quantize-rows: write failed\n");
            return 1;
        }
        if (got < row_bytes * (size_t)rows) break;
    }
    if (ferror(stdin)) {
        fprintf(stderr, "ggml-quantize-rows: read failed\n");
        return 1;
    }
    if (fflush(stdout) != 0) return 1;
    return 0;
}
