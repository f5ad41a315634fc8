#!/usr/bin/env python3
"""Writes llama.cpp's view of Gemma-3-270M (Q4_K_M) for fat-station/tests/engine_gemma.rs.

For each prompt (bos + llama.cpp's own ids), on the same GGUF, one thread (ggml spin-waits: two
threads on a loaded 2-core box crawl):
- the logits of the last position after a batched prefill, and again after feeding the
  prompt one token per decode call ("token by token"): their difference is llama.cpp's own
  noise (it quantizes activations per batch shape), the yardstick our distance is held to;
- the greedy continuation of 16 tokens and, at each step, the gap between llama.cpp's best
  and second-best logit (a divergence is only excused at a near-tie).

Full logits are 262144 floats a prompt, so the JSON keeps llama.cpp's top TOP ids with both
logit vectors there, and llama.cpp's own full-vocabulary rms; the Paris prompt's full
batched logits go to gemma_paris_llamacpp.f32 (1 MB) for a full-vocabulary comparison.

llama.cpp's weight repacking (its extra CPU buffer types) is switched off: in 0.3.36 that path
dies of SIGSEGV in llama_decode on this AVX-512 build box (llama-bench --repack 1 too). The
plain ggml kernels compute the same model; the repacked ones only regroup the weights.

Needs: pip install llama-cpp-python numpy; the GGUF from scripts/fetch-model.sh gemma.
usage: make-gemma-llamacpp-golden.py [GGUF] [OUT_DIR]
"""
import json
import os
import sys

import numpy as np
import llama_cpp

TOP = 256
GREEDY = 16
PROMPTS = [
    "The capital of France is",
    "The quick brown fox jumps over the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The largest planet in the solar system is",
    "Les pommes sont",
    "東京は日本の",
    "1, 2, 3, 4, 5,",
    "The chemical symbol for gold is",
    "Once upon a time, in a small village,",
]

models = os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))
here = os.path.dirname(os.path.abspath(__file__))
gguf = sys.argv[1] if len(sys.argv) > 1 else os.path.join(models, "gemma-3-270m-q4_k_m.gguf")
out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "../../fat-station/tests/golden/gemma")

_default_params = llama_cpp.llama_model_default_params


def _params_without_repack():
    p = _default_params()
    p.use_extra_bufts = False
    return p


# The high-level Llama reads the defaults through the module's binding.
llama_cpp.llama_cpp.llama_model_default_params = _params_without_repack
llama_cpp.llama_model_default_params = _params_without_repack
os.makedirs(out_dir, exist_ok=True)
llm = llama_cpp.Llama(model_path=gguf, n_ctx=256, n_batch=256, logits_all=True, verbose=False, n_threads=1)


def last_logits(n):
    return np.array(llm.scores[n - 1], dtype=np.float32)


def batched(ids):
    llm.reset()
    llm.eval(ids)
    return last_logits(len(ids))


def token_by_token(ids):
    llm.reset()
    for t in ids:
        llm.eval([t])
    return last_logits(len(ids))


def greedy(ids):
    llm.reset()
    llm.eval(ids)
    n = len(ids)
    out, gaps = [], []
    for _ in range(GREEDY):
        logits = last_logits(n)
        top2 = np.argsort(-logits)[:2]
        out.append(int(top2[0]))
        gaps.append(round(float(logits[top2[0]] - logits[top2[1]]), 5))
        llm.eval([int(top2[0])])
        n += 1
    return out, gaps


def rms(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


cases = []
for i, text in enumerate(PROMPTS):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    b = batched(ids)
    t = token_by_token(ids)
    top = np.argsort(-b)[:TOP]
    g, gaps = greedy(ids)
    cases.append(
        {
            "text": text,
            "ids": [int(x) for x in ids],
            "top_ids": [int(x) for x in top],
            "top_batched": [round(float(b[j]), 5) for j in top],
            "top_token_by_token": [round(float(t[j]), 5) for j in top],
            "rms_self_full": round(rms(b, t), 6),
            "rms_self_top": round(rms(b[top], t[top]), 6),
            "greedy": g,
            "greedy_gaps": gaps,
        }
    )
    if i == 0:
        b.astype("<f4").tofile(os.path.join(out_dir, "gemma_paris_llamacpp.f32"))
    print(
        repr(text), ids, "top-5", [(int(j), round(float(b[j]), 3)) for j in top[:5]],
        "self rms full %.4f top %.4f" % (cases[-1]["rms_self_full"], cases[-1]["rms_self_top"]),
    )

with open(os.path.join(out_dir, "llamacpp.json"), "w", encoding="utf-8") as f:
    json.dump({"llama_cpp_python": llama_cpp.__version__, "top": TOP, "cases": cases}, f, ensure_ascii=False)
    f.write("\n")
print("wrote", out_dir, "llama-cpp-python", llama_cpp.__version__)
