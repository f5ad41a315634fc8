// llama.cpp's token ids for a list of texts, from a GGUF's vocabulary alone:
//   llamacpp-tokenize MODEL.gguf IN.bin OUT.txt
// IN.bin: the texts, each a little-endian u32 byte length and its UTF-8 bytes. OUT.txt: three
// lines per text: the ids with special-token text parsed, the ids with it left as text (a
// user's text), then 1 or 0 for whether detokenizing the first ids gives the text back. Ids
// are space-separated; no bos or eos is added. Built by scripts/tokenizer/make_spm_golden.py
// against the static libraries of scripts/bench/build-llama-bench.sh (the benchmarks' llama.cpp).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int write_ids(FILE *out, const struct llama_vocab *vocab, const char *text, int32_t len,
                     int parse_special, llama_token *ids, int32_t cap, int32_t *n_out) {
    int32_t n = llama_tokenize(vocab, text, len, ids, cap, false, parse_special != 0);
    if (n < 0) {
        fprintf(stderr, "llamacpp-tokenize: a text needs %d ids, more than %d\n", -n, cap);
        return 1;
    }
    for (int32_t i = 0; i < n; i++) fprintf(out, i ? " %d" : "%d", ids[i]);
    fputc('\n', out);
    if (n_out) *n_out = n;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IN.bin OUT.txt\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp-tokenize: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    FILE *in = fopen(argv[2], "rb");
    FILE *out = fopen(argv[3], "w");
    if (!in || !out) {
        fprintf(stderr, "llamacpp-tokenize: cannot open %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    const int32_t cap = 1 << 20;
    llama_token *ids = malloc(sizeof *ids * (size_t)cap);
    char *back = malloc((size_t)cap * 8);
    if (!ids || !back) {
        fprintf(stderr, "llamacpp-tokenize: out of memory\n");
        return 1;
    }
    unsigned char hdr[4];
    while (fread(hdr, 1, 4, in) == 4) {
        uint32_t len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                       (uint32_t)hdr[3] << 24;
        if (len > (uint32_t)cap) {
            fprintf(stderr, "llamacpp-tokenize: a text of %u bytes is too long\n", len);
            return 1;
        }
        char *text = malloc(len + 1);
        if (!text || fread(text, 1, len, in) != len) {
            fprintf(stderr, "llamacpp-tokenize: %s ends inside a text\n", argv[2]);
            return 1;
        }
        text[len] = 0;
        int32_t n = 0;
        if (write_ids(out, vocab, text, (int32_t)len, 1, ids, cap, &n)) return 1;
        int32_t m = llama_detokenize(vocab, ids, n, back, cap * 8, false, true);
        int same = m == (int32_t)len && memcmp(back, text, len) == 0;
        if (write_ids(out, vocab, text, (int32_t)len, 0, ids, cap, NULL)) return 1;
        fprintf(out, "%d\n", same);
        free(text);
    }
    fclose(out);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
