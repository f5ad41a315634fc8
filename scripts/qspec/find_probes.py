#!/usr/bin/env python3
"""Measure candidate qspec probes on GGUF models with a NumPy reference forward pass.

Used to choose the factual suite in `specs/qwen-facts.json` (see `specs/qspec.md`): for each
candidate (prompt text, expected continuation text) and each model it prints the expected
token's rank, the argmax, and the margin (expected logit - best other logit); for each
passage the mean negative log-likelihood (nats/token over tokens 1..n, predicting each token
from its prefix). The maths is that of /work/shared/tools/ref_forward.py (f32 activations,
f64 norms), but weights are dequantized once per model so many prompts are cheap.

usage: find_probes.py MODEL.gguf [MODEL.gguf ...] [--json OUT.json] [--only a,b] [--damage-layer L]
needs: pip install gguf numpy tokenizers
"""
import argparse, json, os, sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES
from tokenizers import Tokenizer, Regex, models, pre_tokenizers

# (name, prompt, expected continuation). Expectations are text; the expected id is the first
# token of the expectation under the model's own tokenizer.
CANDIDATES = [
    ("paris", "The capital of France is", " Paris"),
    ("canberra", "The capital of Australia is", " Canberra"),
    ("ottawa", "The capital of Canada is", " Ottawa"),
    ("tokyo", "The capital of Japan is", " Tokyo"),
    ("berlin", "The capital of Germany is", " Berlin"),
    ("madrid", "The capital of Spain is", " Madrid"),
    ("gold", "The chemical symbol for gold is", " Au"),
    ("jupiter", "The largest planet in our solar system is", " Jupiter"),
    ("mars", "The planet known as the Red Planet is", " Mars"),
    ("shakespeare", "Romeo and Juliet was written by William", " Shakespeare"),
    ("armstrong", "The first person to walk on the moon was Neil", " Armstrong"),
    ("bell", "The telephone was invented by Alexander Graham", " Bell"),
    ("everest", "The tallest mountain in the world is Mount", " Everest"),
    ("relativity", "Albert Einstein is famous for the theory of", " relativity"),
    ("yen", "The currency of Japan is the", " yen"),
    ("css", "The language used to style web pages is", " CSS"),
    ("numpy", "import numpy as", " np"),
    ("pandas", "import pandas as", " pd"),
    ("def_kw", "In Python, the keyword used to define a function is", " def"),
    ("const_kw", "In JavaScript, the keyword used to declare a constant is", " const"),
    ("vec", "In Rust, the growable array type is called", " Vec"),
    ("return_sum", "def add(a, b):\n    return a", " +"),
    ("len", "def count(items):\n    return", " len"),
    ("self", "class Point:\n    def __init__(", "self"),
    ("main_guard", "if __name__ ==", " \"__"),
    ("fn_main", "fn main() {\n    println", "!"),
    ("printf", "#include <stdio.h>\n\nint main() {\n    printf", "(\""),
    ("append", "result = []\nfor x in data:\n    result.", "append"),
    ("except", "try:\n    value = int(text)\n", "except"),
    ("git", "To save your staged changes to the repository, run git", " commit"),
]

PASSAGES = {
    "fib": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "sum": "def total(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n",
    "rust": "fn main() {\n    let numbers = vec![1, 2, 3];\n    for n in numbers.iter() {\n        println!(\"{}\", n);\n    }\n}\n",
}

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer_from_gguf(r, arch):
    f = r.fields
    strs = lambda k: [bytes(f[k].parts[i]).decode("utf-8") for i in f[k].data]
    vocab = {t: i for i, t in enumerate(strs("tokenizer.ggml.tokens"))}
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab, merges))
    if arch == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:  # smollm: digits one by one, then GPT-2 byte-level regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok, strs("tokenizer.ggml.tokens")


class Model:
    def __init__(self, path, damage_layer=None):
        r = GGUFReader(path)
        field = lambda k: r.fields[k].parts[r.fields[k].data[0]]
        self.arch = arch = bytes(field("general.architecture")).decode()
        num = lambda k: field(f"{arch}.{k}").tolist()[0]
        self.L, self.D = num("block_count"), num("embedding_length")
        self.H, self.KVH = num("attention.head_count"), num("attention.head_count_kv")
        self.eps, self.base, self.hd = num("attention.layer_norm_rms_epsilon"), num("rope.freq_base"), self.D // self.H
        self.W = {}
        for t in r.tensors:
            data = t.data
            if damage_layer is not None and t.name.startswith(f"blk.{damage_layer}."):
                # The same damage as monster-guard's test helper: reverse the order of the
                # quantization blocks of every tensor of the layer (a valid model, scrambled).
                bsz = GGML_QUANT_SIZES[t.tensor_type][1]
                raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1, bsz)[::-1]
                data = np.ascontiguousarray(raw).reshape(-1).view(data.dtype).reshape(data.shape)
            self.W[t.name] = dequantize(data, t.tensor_type).astype(np.float32).reshape(
                [int(x) for x in reversed(t.shape)])
        self.head = self.W.get("output.weight", self.W["token_embd.weight"])
        self.tok, self.pieces = tokenizer_from_gguf(r, arch)

    def rmsnorm(self, x, w):
        x64 = x.astype(np.float64)
        return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.eps)).astype(np.float32) * w

    def logits(self, toks, all_positions=False):
        W, H, KVH, hd, D = self.W, self.H, self.KVH, self.hd, self.D
        n = len(toks)
        ang = np.outer(np.arange(n), self.base ** (-np.arange(0, hd, 2) / hd))
        cos, sin = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]

        def rope(x):
            if self.arch == "qwen2":
                x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
                return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
            x1, x2 = x[..., 0::2], x[..., 1::2]
            o = np.empty_like(x); o[..., 0::2] = x1 * cos - x2 * sin; o[..., 1::2] = x2 * cos + x1 * sin
            return o

        x = W["token_embd.weight"][toks].copy()
        mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = self.rmsnorm(x, W[p + "attn_norm.weight"])
            q, k, v = (h @ W[p + f"attn_{m}.weight"].T for m in "qkv")
            if p + "attn_q.bias" in W:
                q, k, v = q + W[p + "attn_q.bias"], k + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
            q, k, v = rope(q.reshape(n, H, hd)), rope(k.reshape(n, KVH, hd)), v.reshape(n, KVH, hd)
            out = np.empty((n, H, hd), np.float32)
            for hh in range(H):
                kk, vv = k[:, hh // (H // KVH)], v[:, hh // (H // KVH)]
                s = (q[:, hh] @ kk.T) / np.sqrt(hd) + mask
                e = np.exp(s - s.max(-1, keepdims=True)); out[:, hh] = (e / e.sum(-1, keepdims=True)) @ vv
            x = x + out.reshape(n, D) @ W[p + "attn_output.weight"].T
            h = self.rmsnorm(x, W[p + "ffn_norm.weight"])
            g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "ffn_down.weight"].T
        x = self.rmsnorm(x, W["output_norm.weight"])
        return x @ self.head.T if all_positions else (x[-1:] @ self.head.T)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+"); ap.add_argument("--json")
    ap.add_argument("--only", help="comma-separated candidate names")
    ap.add_argument("--damage-layer", type=int, help="reverse the block order of every tensor of this layer")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    report = {}
    for path in a.models:
        m = Model(path, a.damage_layer)
        name = os.path.basename(path)
        rows = report[name] = {"probes": {}, "passages": {}}
        print(f"== {name} ({m.arch}) paris ids {m.tok.encode('The capital of France is').ids}", flush=True)
        for cname, prompt, expect in CANDIDATES:
            if only and cname not in only:
                continue
            ids = m.tok.encode(prompt).ids
            exp = m.tok.encode(expect).ids[0]
            lg = m.logits(ids)
            order = np.argsort(-lg)
            best_other = lg[order[1]] if order[0] == exp else lg[order[0]]
            rank = int(np.where(order == exp)[0][0])
            margin = float(lg[exp] - best_other)
            rows["probes"][cname] = dict(prompt=prompt, expect=expect, tokens=ids, expected=int(exp),
                                         argmax=int(order[0]), argmax_text=m.pieces[order[0]], rank=rank,
                                         margin=margin, logit=float(lg[order[0]]),
                                         expected_logit=float(lg[exp]))
            print(f"  {cname:12} rank {rank:3d} margin {margin:+7.3f} argmax {m.pieces[order[0]]!r:16} "
                  f"expected {m.pieces[exp]!r}", flush=True)
        for pname, text in PASSAGES.items():
            if only and pname not in only:
                continue
            ids = m.tok.encode(text).ids
            lg = m.logits(ids, all_positions=True)[:-1].astype(np.float64)
            mx = lg.max(-1, keepdims=True)
            lse = (mx[:, 0] + np.log(np.exp(lg - mx).sum(-1)))
            nll = float((lse - lg[np.arange(len(ids) - 1), ids[1:]]).mean())
            rows["passages"][pname] = dict(text=text, n_tokens=len(ids), nll=nll)
            print(f"  passage {pname:8} tokens {len(ids):3d} mean NLL {nll:.3f} nats/token", flush=True)
        del m
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
