#!/usr/bin/env python3
"""Write the tokenizer golden files from an independent reference implementation.

Usage: make_golden.py [MODELS_DIR]

For each model, builds a Hugging Face `tokenizers` byte-level BPE from the GGUF's own vocabulary
and merges (read with dump_tokenizer_data.py, the same data the KNOT file carries), with the
pre-tokenizer the model's `tokenizer.ggml.pre` names and the control/user-defined tokens added
as whole-match special tokens. It encodes a fixed corpus and writes
fat-station/tests/golden/tokenizer/{qwen,smollm2}.json: {"model", "pre", "vocab_size",
"cases": [{"text", "ids", "round_trip"}]}: a fixed corpus, then 300 reproducible random strings
built from pieces that exercise the split patterns (round_trip is false where the reference
drops a byte the vocabulary has no token for). The Rust test `tokenizer_golden.rs` must reproduce every id.

The reference itself is checked first against ids known from the models' own tokenizers
(e.g. Qwen "The capital of France is" -> [785, 6722, 315, 9625, 374]); it refuses to write a
golden file that disagrees with them.

No normalizer is applied (Qwen's tokenizer.json has NFC; GGUF/llama.cpp does not, and the
engine follows GGUF so that decode(encode(s)) == s holds byte for byte).
"""

import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CORPUS, random_corpus  # noqa: E402
from dump_tokenizer_data import tokenizer_data  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(REPO, "fat-station", "tests", "golden", "tokenizer")

# The split patterns as the models' own tokenizer.json files write them.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

MODELS = [
    # (golden name, GGUF file, known facts: text -> ids, or text -> token strings)
    (
        "qwen",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        {
            "The capital of France is": [785, 6722, 315, 9625, 374],
            " Paris": [12095],
        },
        {"144": ["1", "4", "4"], "Romeo": ["R", "ome", "o"]},
    ),
    (
        "smollm2",
        "smollm2-135m-instruct-q4_1.gguf",
        {
            "The capital of France is": [504, 3575, 282, 4649, 314],
            " Paris": [7042],
        },
        {"Romeo": ["Rome", "o"], "144": ["1", "4", "4"]},
    ),
]

def build_reference(data):
    """An HF `tokenizers` BPE over the GGUF's own vocab and merges, with the model's split."""
    vocab = {}
    for i, tok in enumerate(data["tokens"]):
        vocab.setdefault(tok, i)
    merges = [tuple(m.split(" ", 1)) for m in data["merges"]]
    pre = data["pre"]
    ignore_merges = pre in ("llama-bpe", "llama3")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    if pre == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        raise SystemExit(f"make_golden.py: no reference pre-tokenizer for pre={pre!r}")
    tok.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(data["tokens"], data["token_types"])
        if ty in (3, 4)
    ]
    tok.add_special_tokens(specials)
    return tok


def check_facts(name, tok, ids_facts, piece_facts):
    for text, want in ids_facts.items():
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            raise SystemExit(f"{name}: reference gives {got} for {text!r}, known ids are {want}")
    for text, want in piece_facts.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        got = [tok.decode([i]) for i in ids]
        if got != want:
            raise SystemExit(f"{name}: reference splits {text!r} as {got}, expected {want}")


def main(argv):
    models_dir = (
        argv[1]
        if len(argv) > 1
        else os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))
    )
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, gguf_file, ids_facts, piece_facts in MODELS:
        data = tokenizer_data(os.path.join(models_dir, gguf_file))
        tok = build_reference(data)
        check_facts(name, tok, ids_facts, piece_facts)
        cases = []
        for i, text in enumerate(CORPUS + random_corpus(300)):
            ids = tok.encode(text, add_special_tokens=False).ids
            round_trip = tok.decode(ids, skip_special_tokens=False) == text
            # The hand-written corpus must round-trip; a random string may hold a byte the
            # vocabulary lacks (SmolLM2 has no token for 0x04), which both sides drop.
            if i < len(CORPUS) and not round_trip:
                raise SystemExit(f"{name}: reference does not round-trip {text!r}")
            cases.append({"text": text, "ids": ids, "round_trip": round_trip})
        out = {
            "model": gguf_file,
            "pre": data["pre"],
            "vocab_size": len(data["tokens"]),
            "cases": cases,
        }
        path = os.path.join(OUT_DIR, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print(f"{path}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
