// llama.cpp's sentence embeddings of lines of text, as llama-server --embeddings --pooling
// POOLING answers /v1/embeddings: each line tokenized with the model's special tokens
// (llama_tokenize add_special=1, parse_special=1), decoded alone in a fresh sequence with
// embeddings on and the pooling given, then L2-normalised. Writes, per line, its token count
// to COUNTS.txt (one a line) and its vector to OUT.f32 (little-endian f32, n_embd each):
//   llamacpp-embed MODEL.gguf mean|last|cls TEXTS.txt OUT.f32 COUNTS.txt
// Built by scripts/reference/make-embeddings-golden.sh against the static libraries of
// scripts/bench/build-llama-bench.sh (the same llama.cpp as llamacpp-logits.c). One thread,
// no weight repacking (as llamacpp-logits.c, for the same reason).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.gguf mean|last|cls TEXTS.txt OUT.f32 COUNTS.txt\n", argv[0]);
        return 2;
    }
    enum llama_pooling_type pooling;
    if (strcmp(argv[2], "mean") == 0) pooling = LLAMA_POOLING_TYPE_MEAN;
    else if (strcmp(argv[2], "last") == 0) pooling = LLAMA_POOLING_TYPE_LAST;
    else if (strcmp(argv[2], "cls") == 0) pooling = LLAMA_POOLING_TYPE_CLS;
    else {
        fprintf(stderr, "llamacpp-embed: pooling must be mean, last or cls\n");
        return 2;
    }
    FILE *in = fopen(argv[3], "r");
    FILE *out = fopen(argv[4], "wb");
    FILE *counts = fopen(argv[5], "w");
    if (!in || !out || !counts) {
        fprintf(stderr, "llamacpp-embed: cannot open the files\n");
        return 1;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp-embed: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_embd = llama_model_n_embd(model);
    enum { MAX_TOKENS = 2048 };
    llama_token *ids = calloc(MAX_TOKENS, sizeof *ids);
    float *v = calloc((size_t)n_embd, sizeof *v);
    char line[16384];
    if (!ids || !v) {
        fprintf(stderr, "llamacpp-embed: out of memory\n");
        return 1;
    }
    while (fgets(line, sizeof line, in)) {
        size_t len = strcspn(line, "\n");
        line[len] = 0;
        int n = llama_tokenize(vocab, line, (int32_t)len, ids, MAX_TOKENS, true, true);
        if (n <= 0) {
            fprintf(stderr, "llamacpp-embed: cannot tokenize %s\n", line);
            return 1;
        }
        // A fresh context per text: nothing of the one before is in its cache.
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)(n + 16);
        cp.n_batch = (uint32_t)(n + 16);
        cp.n_ubatch = (uint32_t)(n + 16);
        cp.n_threads = 1;
        cp.n_threads_batch = 1;
        cp.embeddings = true;
        cp.pooling_type = pooling;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx || llama_decode(ctx, llama_batch_get_one(ids, n)) != 0) {
            fprintf(stderr, "llamacpp-embed: decoding failed\n");
            return 1;
        }
        const float *e = llama_get_embeddings_seq(ctx, 0);
        if (!e) {
            fprintf(stderr, "llamacpp-embed: no pooled embedding\n");
            return 1;
        }
        double norm = 0;
        for (int i = 0; i < n_embd; i++) norm += (double)e[i] * e[i];
        norm = sqrt(norm);
        for (int i = 0; i < n_embd; i++) v[i] = norm > 0 ? (float)(e[i] / norm) : 0.0f;
        if (fwrite(v, sizeof(float), (size_t)n_embd, out) != (size_t)n_embd) {
            fprintf(stderr, "llamacpp-embed: cannot write %s\n", argv[4]);
            return 1;
        }
        fprintf(counts, "%d\n", n);
        llama_free(ctx);
    }
    if (fclose(out) != 0 || fclose(counts) != 0) {
        fprintf(stderr, "llamacpp-embed: cannot write the output\n");
        return 1;
    }
    fclose(in);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    free(v);
    return 0;
}
