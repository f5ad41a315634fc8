#!/usr/bin/env bash
# Regenerates the golden of fat-station/tests/engine_qwen35.rs:
#   fat-station/tests/golden/synthetic/qwen35_tiny_seed0.sha256         the tiny Qwen3.5 GGUF's sha256
#                                                                      (f16 weights: no 8-bit
#                                                                      activations either side)
#   fat-station/tests/golden/synthetic/qwen35_tiny_seed0_llamacpp.f32     llama.cpp's logits of the
#                                                                      last position, the prompt
#                                                                      in one batch (one thread)
#   fat-station/tests/golden/synthetic/qwen35_tiny_seed0_llamacpp_tbt.f32 the same, token by token
#                                                                      (llama.cpp's own noise)
#   fat-station/tests/golden/synthetic/qwen35_tiny_seed0_llamacpp_greedy.txt llama.cpp's greedy
#                                                                      run of 16 tokens after the
#                                                                      batched prompt: per line
#                                                                      the id and its lead over
#                                                                      the runner-up
# The test makes the same GGUF (scripts/make-synthetic-model.py --preset qwen35-tiny --seed 0 --type f16); when
# its sha256 differs from the recorded one (another numpy or gguf version), it skips the
# comparison. Needs: pip install gguf numpy; the Qwen GGUF for the tokenizer
# (scripts/fetch-model.sh qwen); llama.cpp's static libraries from scripts/bench/build-llama-bench.sh
# (run when missing) and a C compiler with OpenMP (gcc).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/synthetic
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
python3 "$root/scripts/make-synthetic-model.py" "$tmp/qwen35.gguf" --preset qwen35-tiny --seed 0 --type f16 -q
(cd "$tmp" && sha256sum qwen35.gguf | cut -d' ' -f1) > "$out/qwen35_tiny_seed0.sha256"
# engine_qwen35.rs's PROMPT.
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)

. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-qwen35-golden
# The same weights as f32 and an f32 KV cache: llama.cpp then rounds nothing to f16
# (on the F16 file it rounds every matmul's activations and the cache), as our engine.
python3 "$here/widen-gguf.py" "$tmp/qwen35.gguf" "$tmp/qwen35_f32.gguf"
"$tmp/llamacpp-logits" "$tmp/qwen35_f32.gguf" "$out/qwen35_tiny_seed0_llamacpp.f32" --f32-cache \
  --greedy 16 "$out/qwen35_tiny_seed0_llamacpp_greedy.txt" "${prompt[@]}"
"$tmp/llamacpp-logits" "$tmp/qwen35_f32.gguf" "$out/qwen35_tiny_seed0_llamacpp_tbt.f32" --token-by-token --f32-cache "${prompt[@]}"
echo "make-qwen35-golden: wrote $out (llama.cpp $version)" >&2
