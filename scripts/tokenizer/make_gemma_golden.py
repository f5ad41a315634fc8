#!/usr/bin/env python3
"""Write fat-station/tests/golden/tokenizer/gemma.json: llama.cpp's ids for Gemma 3's
SentencePiece tokenizer (tokenizer.ggml.model = "llama") on the shared corpus (corpus.py), a
Gemma-specific corpus (its control tokens, whitespace runs, byte fallback) and 300 random
strings.

Each case: {"text", "ids" (special-token text parsed, as tokenize(special=True)),
"ids_plain" (only when it differs: special parsing off, as for a user's text), "round_trip"
(llama.cpp's detokenize of ids gives the text back)}. No bos: the test adds it itself.

The reference is llama.cpp itself (PyPI llama-cpp-python, vocab only), so the golden file is
the behaviour the engine must reproduce. It first checks known ids ("The capital of France
is" -> 818, 5279, 529, 7001, 563) and refuses to write a file that disagrees.

Needs: pip install llama-cpp-python; the GGUF from scripts/fetch-model.sh gemma.
usage: make_gemma_golden.py [MODELS_DIR]
"""

import json
import os
import sys

import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CORPUS, RANDOM_PIECES, random_corpus  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO, "fat-station", "tests", "golden", "tokenizer", "gemma.json")

KNOWN = {"The capital of France is": [818, 5279, 529, 7001, 563]}

GEMMA_CORPUS = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi<end_of_turn>",
    "<eos>",
    "text<eos>more",
    "<pad><unk><mask>",
    "<start_of_image>",
    "<start_of_turn partial <end_of_turn and >",
    "[multimodal]",
    "▁ literal marker ▁▁ twice",
    "▁",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    " " * 31,
    " " * 32,
    " " * 40,
    "\t" * 10,
    "\n" * 31,
    "a" + " " * 17 + "b",
    "\r\n\r\n",
    "\u00a0\u00a0",
    "\x01\x02\x03 control bytes \x1b[0m",
    "\x00",
    "\x7f\x80",
    "ꙮ rare ꙮ characters 𓀀 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "🫠🫡🫢",
    "<h1>Title</h1>\n<div><span>x</span></div>",
    "<table><tr><td>1</td></tr></table>",
    "**bold** _italic_ `code` ~~strike~~",
    "```python\nprint('hi')\n```",
    "    def f(self):\n        return {'a': [1, 2]}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "Ελληνικά, Русский, العربية, हिन्दी, 日本語, 한국어, ไทย",
    "中华人民共和国成立于1949年。",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "1234567890123456789012345678901234567890",
    "3.141592653589793",
    "Don't stop—it's “fine”…",
]

GEMMA_PIECES = RANDOM_PIECES + [
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "▁", "▁▁", " " * 5, "\t\t", "\n\n\n",
    "<h1>", "</div>", "🫠", "ꙮ", "𝔘",
]


def main(argv):
    models_dir = (
        argv[1]
        if len(argv) > 1
        else os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))
    )
    gguf = os.path.join(models_dir, "gemma-3-270m-q4_k_m.gguf")
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
    tok = lambda text, special: llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)  # noqa: E731
    for text, want in KNOWN.items():
        got = tok(text, True)
        if got != want:
            raise SystemExit(f"gemma: llama.cpp gives {got} for {text!r}, known ids are {want}")
    cases = []
    texts = CORPUS + GEMMA_CORPUS + random_corpus(300, seed=19, pieces=GEMMA_PIECES)
    for text in texts:
        ids = tok(text, True)
        plain = tok(text, False)
        back = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        case = {"text": text, "ids": ids, "round_trip": back == text}
        if plain != ids:
            case["ids_plain"] = plain
        cases.append(case)
    out = {
        "model": os.path.basename(gguf),
        "reference": "llama-cpp-python " + llama_cpp.__version__,
        "vocab_size": llm.n_vocab(),
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
    sys.exit(main(sys.argv))
