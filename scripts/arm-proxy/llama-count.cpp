// llama-count: llama.cpp's counterpart of `kernel-bench --forward`, for instruction counts under
// qemu-aarch64 (scripts/arm-proxy.sh). Loads a GGUF, prefills a PREFILL-token prompt in one
// batch (the same fixed ids as kernel-bench: "The capital of France is Paris. The" in Qwen2.5's
// vocabulary, repeated), then decodes DECODE greedy tokens one at a time, on one thread, and
// prints the greedy ids and their text.
//
// Why not llama-bench: it needs llama-common (a third of the build) and runs random tokens; this
// runs the same prompt as ours, so the greedy ids compare directly. No warmup and no sampler:
// the runs differ only in the tokens they process, so differences of counts are per token.
//
// Usage: llama-count MODEL.gguf PREFILL DECODE [REPACK]
//   REPACK 1 (default): ggml-cpu's extra buffer types (weight repacking) as llama.cpp defaults;
//   0: plain ggml-cpu buffers (llama-bench --repack 0).
// Prints `repack: ...` (the buffer types the weights went to, from llama.cpp's load log),
// `greedy ids: [...]`, `text: ...`. Exit codes: 0 ran; 1 a llama.cpp call failed; 2 bad usage.
// Built by scripts/arm-proxy/build-llama-aarch64.sh against the static llama/ggml libraries.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static const llama_token PROMPT[8] = {785, 6722, 315, 9625, 374, 12095, 13, 576};

// llama.cpp logs each weight buffer ("CPU_REPACK model buffer size = ..."): keep those lines,
// drop the rest (the load log is long and not what the counts are about).
static void log_cb(ggml_log_level, const char * text, void *) {
    if (strstr(text, "buffer size") != nullptr) {
        fprintf(stderr, "%s", text);
    }
}

static void set_tokens(llama_batch_ext * b, const llama_token * t, int32_t n, llama_pos pos0) {
    llama_batch_ext_clear(b);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(b, 0, t[i]);
        const llama_pos pos = pos0 + i;
        llama_batch_ext_set_pos(b, idx, &pos);
    }
    llama_batch_ext_set_output_logits(b, n - 1, true);
}

static llama_token argmax(const float * v, int32_t n) {
    llama_token best = 0;
    for (int32_t i = 1; i < n; ++i) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL.gguf PREFILL DECODE [REPACK]\n", argv[0]);
        return 2;
    }
    const int prefill = atoi(argv[2]);
    const int decode  = atoi(argv[3]);
    const bool repack = argc < 5 || atoi(argv[4]) != 0;
    if (prefill < 1 || decode < 0) {
        fprintf(stderr, "llama-count: PREFILL must be >= 1, DECODE >= 0\n");
        return 2;
    }
    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = 0;
    mp.use_extra_bufts    = repack;
    llama_model * model   = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        fprintf(stderr, "llama-count: cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab     = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx                = prefill + decode + 1;
    cp.n_batch              = prefill;
    cp.n_ubatch             = prefill;
    cp.n_seq_max            = 1;
    cp.n_threads            = 1;
    cp.n_threads_batch      = 1;
    cp.no_perf              = true;
    llama_context * ctx     = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        fprintf(stderr, "llama-count: cannot create the context\n");
        return 1;
    }

    std::vector<llama_token> prompt(prefill);
    for (int i = 0; i < prefill; ++i) {
        prompt[i] = PROMPT[i % 8];
    }
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    set_tokens(batch, prompt.data(), prefill, 0);
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
        fprintf(stderr, "llama-count: prefill failed\n");
        return 1;
    }
    std::vector<llama_token> ids;
    for (int i = 0; i <= decode; ++i) {
        const llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        ids.push_back(next);
        if (i < decode) {
            set_tokens(batch, &next, 1, prefill + i);
            if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
                fprintf(stderr, "llama-count: decode failed\n");
                return 1;
            }
        }
    }

    printf("repack: %s\n", repack ? "on" : "off");
    printf("greedy ids: [");
    for (size_t i = 0; i < ids.size(); ++i) {
        printf("%s%d", i ? ", " : "", ids[i]);
    }
    printf("]\ntext: ");
    for (llama_token t : ids) {
        char buf[128];
        const int n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, true);
        if (n > 0) {
            fwrite(buf, 1, (size_t) n, stdout);
        }
    }
    printf("\n");
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
