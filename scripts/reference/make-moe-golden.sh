#!/usr/bin/env bash
# Regenerates the golden of fat-station/tests/engine_moe.rs (llama.cpp on the tiny qwen3moe):
#   fat-station/tests/golden/moe/tiny_moe_seed0.sha256          the tiny-moe GGUF's sha256
#   fat-station/tests/golden/moe/tiny_moe_seed0_numpy.f32       NumPy f32 logits of the last
#                                                              position (ref_forward.py)
#   fat-station/tests/golden/moe/tiny_moe_seed0_llamacpp.f32    llama.cpp's logits of the last
#                                                              position, the prompt in one batch
#   fat-station/tests/golden/moe/tiny_moe_seed0_llamacpp_tbt.f32  the same fed token by token
#                                                              (llama.cpp's own batching noise)
#   fat-station/tests/golden/moe/tiny_moe_seed0_experts.i32     the experts llama.cpp chose, i32
#                                                              (block, token, k), batched run
#   fat-station/tests/golden/moe/tiny_moe_seed0_llamacpp_greedy.txt  llama.cpp's greedy run of 32
#                                                              tokens after the prompt: per
#                                                              line the id and its lead over
#                                                              the runner-up
# The GGUF: scripts/make-synthetic-model.py --preset tiny-moe --type q8_0 --seed 0. When the
# test's GGUF has another sha256 (another numpy or gguf), it does not compare with llama.cpp.
# Needs: pip install gguf numpy; the Qwen GGUF for the tokenizer (scripts/fetch-model.sh qwen);
# llama.cpp's static libraries from scripts/bench/build-llama-bench.sh; gcc with OpenMP.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
python3 "$root/scripts/make-synthetic-model.py" "$tmp/tiny-moe.gguf" --preset tiny-moe --type q8_0 --seed 0 -q
(cd "$tmp" && sha256sum tiny-moe.gguf | cut -d' ' -f1) > "$out/tiny_moe_seed0.sha256"
# The test's PROMPT ("The capital of France is Paris. The capital of Germany is").
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)
python3 "$here/ref_forward.py" "$tmp/tiny-moe.gguf" "${prompt[@]}" \
  --logits-out "$out/tiny_moe_seed0_numpy.f32" --top 5

. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-moe-golden
"$tmp/llamacpp-logits" "$tmp/tiny-moe.gguf" "$out/tiny_moe_seed0_llamacpp.f32" \
  --experts "$out/tiny_moe_seed0_experts.i32" \
  --greedy 32 "$out/tiny_moe_seed0_llamacpp_greedy.txt" "${prompt[@]}"
"$tmp/llamacpp-logits" "$tmp/tiny-moe.gguf" "$out/tiny_moe_seed0_llamacpp_tbt.f32" \
  --token-by-token "${prompt[@]}"
echo "make-moe-golden: wrote $out (llama.cpp $version)" >&2
