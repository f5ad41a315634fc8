#!/usr/bin/env python3
"""Measure candidate qspec probes with llama.cpp (PyPI llama-cpp-python) on GGUF models.

Used to choose `specs/gemma-facts.json` (see `specs/qspec.md`): for each candidate (prompt,
expected continuation) and each model it prints the expected token's rank, the argmax and the
margin (expected logit - best other logit), the way monster-guard scores a probe. Prompts are
tokenized as paris-probe does: the model's own tokenizer, control tokens in the text parsed
(`<start_of_turn>`), bos in front when the GGUF asks for it; the expectation is the first token
of its text without bos. `--damage-layer L` first writes a copy of each GGUF with the order of
the quantization blocks of every tensor of layer L reversed (what monster-guard's test helper
does to a KNOT) and measures that copy instead.

llama.cpp's weight repacking is off (it dies of SIGSEGV in 0.3.36 on AVX-512 build boxes).

usage: find_probes_llamacpp.py MODEL.gguf [...] [--suite gemma] [--damage-layer L] [--json OUT]
needs: pip install llama-cpp-python gguf numpy
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import llama_cpp

# (name, prompt, expected continuation).
SUITES = {
    # Gemma-3-270M-it is too small to answer questions in its turn format (it echoes them: "What
    # is the capital..."), so its suite is completions, led by bos as paris-probe sends them.
    "gemma": [
        ("paris", "The capital of France is", " Paris"),
        ("paris_france", "Paris is the capital of", " France"),
        ("count", "One, two, three, four,", " five"),
        ("months", "January, February, March,", " April"),
        ("fox", "The quick brown fox jumps over the lazy", " dog"),
        ("armstrong", "The first person to walk on the moon was Neil", " Armstrong"),
        ("vinci", "The Mona Lisa was painted by Leonardo", " da"),
        ("earth_sun", "The Earth revolves around the", " Sun"),
        ("twinkle", "Twinkle, twinkle, little", " star"),
        ("hamlet", "To be or not to be, that is the", " question"),
        ("birthday", "Happy birthday to", " you"),
        ("great_wall", "The Great Wall is in", " China"),
        ("east", "The sun rises in the", " east"),
        ("opposite", "The opposite of hot is", " cold"),
        ("doctype", "<!DOCTYPE", " html"),
        ("def", "def add(a, b):\n    return a", " +"),
        ("numpy", "import numpy as", " np"),
        ("pandas", "import pandas as", " pd"),
    ],
}

_default_params = llama_cpp.llama_model_default_params


def _params_without_repack():
    p = _default_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_cpp.llama_model_default_params = _params_without_repack
llama_cpp.llama_model_default_params = _params_without_repack


def damaged_copy(path, layer, out_dir):
    """A copy of the GGUF with every tensor of `layer` stored in reversed block order."""
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES

    out = os.path.join(out_dir, f"damaged-L{layer}-" + os.path.basename(path))
    shutil.copyfile(path, out)
    r = GGUFReader(path)
    mm = np.memmap(out, dtype=np.uint8, mode="r+")
    for t in r.tensors:
        if not t.name.startswith(f"blk.{layer}."):
            continue
        bsz = GGML_QUANT_SIZES[t.tensor_type][1]
        start, n = int(t.data_offset), int(t.n_bytes)
        blocks = mm[start:start + n].reshape(-1, bsz)
        mm[start:start + n] = np.ascontiguousarray(blocks[::-1]).reshape(-1)
    mm.flush()
    return out


def measure(path, candidates):
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, verbose=False, n_threads=1)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    rows = {}
    for name, prompt, expect in candidates:
        ids = llm.tokenize(prompt.encode(), add_bos=add_bos, special=True)
        exp = llm.tokenize(expect.encode(), add_bos=False, special=False)[0]
        llm.reset()
        llm.eval(ids)
        lg = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
        order = np.argsort(-lg)
        rank = int(np.where(order == exp)[0][0])
        best_other = lg[order[1]] if order[0] == exp else lg[order[0]]
        piece = lambda i: llm.detokenize([int(i)]).decode("utf-8", "replace")
        rows[name] = dict(prompt=prompt, expect=expect, tokens=[int(i) for i in ids], expected=int(exp),
                          rank=rank, margin=round(float(lg[exp] - best_other), 3),
                          argmax=int(order[0]), argmax_text=piece(order[0]),
                          top5=[piece(i) for i in order[:5]])
        print(f"  {name:18} rank {rank:5d} margin {rows[name]['margin']:+8.3f} top5 {rows[name]['top5']!r}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--suite", default="gemma", choices=sorted(SUITES))
    ap.add_argument("--damage-layer", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in a.models:
            label = os.path.basename(path)
            if a.damage_layer is not None:
                path = damaged_copy(path, a.damage_layer, tmp)
                label = f"{label} (layer {a.damage_layer} damaged)"
            print(f"== {label}", flush=True)
            report[label] = measure(path, SUITES[a.suite])
            if a.damage_layer is not None:
                os.remove(path)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"llama_cpp_python": llama_cpp.__version__, "models": report}, f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
