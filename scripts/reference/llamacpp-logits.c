// llama.cpp's logits of the last position for given token ids, one thread, as little-endian f32:
//   llamacpp-logits MODEL.gguf OUT.f32 [--n-ctx N] [--token-by-token] [--f32-cache]
//                   [--experts OUT.i32]
//                   [--greedy N OUT.txt] ID...
// Built by scripts/reference/make-synthetic-golden.sh against the static libraries of
// scripts/bench/build-llama-bench.sh's native build (the same llama.cpp as the benchmarks).
// Weight repacking (extra CPU buffer types) is off: in llama.cpp 0.3.36 it sometimes dies of
// SIGSEGV on this AVX-512 box; the plain ggml kernels compute the same model.
// --f32-cache keeps the KV cache in f32 and turns flash attention off: llama.cpp's default
// cache is f16, and its flash attention casts K and V to f16 even from an f32 cache and
// rounds queries to f16; our engine keeps all of it in f32. Over thousands of positions that
// f16 accumulation drifts from the exact result, alike in batched and token-by-token runs (so
// their difference does not show it).
// --token-by-token feeds one id per llama_decode (llama.cpp quantizes activations per batch
// shape, so the two differ a little: that difference is llama.cpp's own noise).
// --experts (mixture-of-experts models) writes the experts each token chose in every block, in
// llama.cpp's top-k order, as little-endian i32 (block, token, k), read from the graph's
// `ffn_moe_topk-N` tensors through the eval callback.
// --n-ctx sets the context size (default: the ids, the greedy steps and 16); it decides, e.g.,
// Phi-3's long or short RoPE factors (long when above the original context).
// --greedy then continues N tokens greedily, one llama_decode per token, and writes one line
// per step: the chosen id and its logit's lead over the runner-up (a small lead is a near-tie
// another implementation may break the other way).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "llama.h"

static FILE *experts_out;

// Eval callback: asks for the `ffn_moe_topk-N` tensors and appends their rows (k ids each).
static bool topk_cb(struct ggml_tensor *t, bool ask, void *user) {
    (void)user;
    if (!experts_out || strncmp(t->name, "ffn_moe_topk-", 13) != 0) return ask ? false : true;
    if (ask) return true;
    if (t->type != GGML_TYPE_I32) return true;
    for (int64_t r = 0; r < t->ne[1]; r++) {
        const char *row = (const char *)t->data + r * t->nb[1];
        fwrite(row, sizeof(int32_t), (size_t)t->ne[0], experts_out);
    }
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 [--token-by-token] ID...\n", argv[0]);
        return 2;
    }
    int first = 3, one_by_one = 0;
    long n_ctx = 0;
    if (first + 1 < argc && strcmp(argv[first], "--n-ctx") == 0) {
        n_ctx = atol(argv[first + 1]);
        if (n_ctx <= 0 || n_ctx > (1L << 20)) {
            fprintf(stderr, "llamacpp-logits: --n-ctx wants 1 to 1048576\n");
            return 2;
        }
        first += 2;
    }
    if (first < argc && strcmp(argv[first], "--token-by-token") == 0) {
        one_by_one = 1;
        first++;
    }
    int f32_cache = 0;
    if (first < argc && strcmp(argv[first], "--f32-cache") == 0) {
        f32_cache = 1;
        first++;
    }
    if (first + 1 < argc && strcmp(argv[first], "--experts") == 0) {
        experts_out = fopen(argv[first + 1], "wb");
        if (!experts_out) {
            fprintf(stderr, "llamacpp-logits: cannot write %s\n", argv[first + 1]);
            return 1;
        }
        first += 2;
    }
    int greedy = 0;
    FILE *greedy_out = NULL;
    if (first + 2 < argc && strcmp(argv[first], "--greedy") == 0) {
        greedy = atoi(argv[first + 1]);
        greedy_out = fopen(argv[first + 2], "w");
        if (greedy <= 0 || greedy > 4096 || !greedy_out) {
            fprintf(stderr, "llamacpp-logits: --greedy wants 1 to 4096 and a writable file\n");
            return 2;
        }
        first += 3;
    }
    int n = argc - first;
    if (n <= 0 || n > 65536) {
        fprintf(stderr, "llamacpp-logits: give 1 to 65536 token ids\n");
        return 2;
    }
    llama_token *ids = calloc((size_t)n, sizeof *ids);
    if (!ids) {
        fprintf(stderr, "llamacpp-logits: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(argv[first + i], &end, 10);
        if (*end || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "llamacpp-logits: bad token id %s\n", argv[first + i]);
            return 2;
        }
        ids[i] = (llama_token)v;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp-logits: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + greedy + 16);
    if (n_ctx > 0) {
        if (n_ctx < n + greedy + 1) {
            fprintf(stderr, "llamacpp-logits: --n-ctx %ld is below the ids and greedy steps\n", n_ctx);
            return 2;
        }
        cp.n_ctx = (uint32_t)n_ctx;
    }
    cp.n_batch = (uint32_t)(n + 16);
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    if (f32_cache) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        // Flash attention casts an f32 K and V to f16 (llama-graph.cpp's build_attn_mha).
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    if (experts_out) {
        cp.cb_eval = topk_cb;
        cp.cb_eval_user_data = NULL;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp-logits: cannot make a context\n");
        return 1;
    }
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int i = 0; i < n; i += one_by_one ? 1 : n) {
        int len = one_by_one ? 1 : n;
        if (llama_decode(ctx, llama_batch_get_one(ids + i, len)) != 0) {
            fprintf(stderr, "llamacpp-logits: llama_decode failed\n");
            return 1;
        }
    }
    const float *logits = llama_get_logits_ith(ctx, -1);
    if (!logits) {
        fprintf(stderr, "llamacpp-logits: no logits\n");
        return 1;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)vocab, f) != (size_t)vocab || fclose(f) != 0) {
        fprintf(stderr, "llamacpp-logits: cannot write %s\n", argv[2]);
        return 1;
    }
    if (experts_out && fclose(experts_out) != 0) {
        fprintf(stderr, "llamacpp-logits: cannot write the experts\n");
        return 1;
    }
    // The prompt's choice only: the greedy steps below route too.
    experts_out = NULL;
    for (int step = 0; step < greedy; step++) {
        const float *row = llama_get_logits_ith(ctx, -1);
        if (!row) {
            fprintf(stderr, "llamacpp-logits: no logits\n");
            return 1;
        }
        llama_token best = 0;
        for (int v = 1; v < vocab; v++) {
            if (row[v] > row[best]) best = v;
        }
        float second = -INFINITY;
        for (int v = 0; v < vocab; v++) {
            if (v != best && row[v] > second) second = row[v];
        }
        fprintf(greedy_out, "%d %.6f\n", best, row[best] - second);
        if (llama_decode(ctx, llama_batch_get_one(&best, 1)) != 0) {
            fprintf(stderr, "llamacpp-logits: llama_decode failed\n");
            return 1;
        }
    }
    if (greedy_out && fclose(greedy_out) != 0) {
        fprintf(stderr, "llamacpp-logits: cannot write the greedy run\n");
        return 1;
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
