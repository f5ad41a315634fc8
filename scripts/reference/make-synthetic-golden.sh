#!/usr/bin/env bash
# Regenerates the golden of fat-station/tests/engine_synthetic.rs:
#   fat-station/tests/golden/synthetic/tiny_seed0.sha256       the tiny synthetic GGUF's sha256
#   fat-station/tests/golden/synthetic/tiny_seed0_numpy.f32    NumPy f32 logits of its last position
#                                                              for PROMPT (ref_forward.py)
#   fat-station/tests/golden/synthetic/tiny_seed0_llamacpp.f32 llama.cpp's (scripts/reference/
#                                                              llamacpp-logits.c, one thread)
# The test makes the same GGUF (scripts/make-synthetic-model.py --preset tiny --seed 0); when its
# sha256 differs from the recorded one (another numpy or gguf version), it runs ref_forward.py
# itself instead of reading the golden logits.
# Needs: pip install gguf numpy; the Qwen GGUF for the tokenizer (scripts/fetch-model.sh qwen);
# llama.cpp's static libraries from scripts/bench/build-llama-bench.sh (run when missing) and a
# C compiler with OpenMP (gcc).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/synthetic
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
python3 "$root/scripts/make-synthetic-model.py" "$tmp/tiny.gguf" --preset tiny --seed 0 -q
(cd "$tmp" && sha256sum tiny.gguf | cut -d' ' -f1) > "$out/tiny_seed0.sha256"
# "The capital of France is" in Qwen's tokenizer (the prompt of the real-model golden).
prompt=(785 6722 315 9625 374)
python3 "$here/ref_forward.py" "$tmp/tiny.gguf" "${prompt[@]}" \
  --logits-out "$out/tiny_seed0_numpy.f32" --top 5

. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-synthetic-golden
"$tmp/llamacpp-logits" "$tmp/tiny.gguf" "$out/tiny_seed0_llamacpp.f32" "${prompt[@]}"
echo "make-synthetic-golden: wrote $out (llama.cpp $version)" >&2
