#!/usr/bin/env bash
# Regenerates the golden of fat-station/tests/engine_dense.rs's llama4 test: llama.cpp on
# llama4-tiny (scripts/make-synthetic-model.py --preset llama4-tiny --seed 0 --type f16) over a
# prompt of 8204 positions: llama.cpp fixes llama4's attention chunk and its temperature floor
# at 8192 positions (no GGUF key), so only a prompt past 8192 shows them; its last 12
# positions lie in the second chunk. In fat-station/tests/golden/synthetic/:
#   llama4_tiny_seed0.sha256          the GGUF's sha256 (the test skips the comparison when its
#                                     own file differs: another numpy or gguf version)
#   llama4_tiny_seed0_long_llamacpp.f32     llama.cpp's logits of the last position, the prompt in
#                                     one batch (one thread; 512-row micro-batches)
#   llama4_tiny_seed0_long_llamacpp_tbt.f32 the same, token by token (llama.cpp's own noise)
# Both on the weights widened to f32 (widen-gguf.py) with --f32-cache (an f32 KV cache, no
# flash attention), as the other goldens: over 8204 positions the default CPU flash attention's
# f16 accumulation drifts from the exact sums (rms ~0.1 on these logits), alike in its batched
# and token-by-token runs. (The 12-token golden of the same file:
# make-dense-golden.sh llama4-tiny.)
# The prompt: id i = (7919 i + 785) mod 151643 for i in 0..8204 (the test makes the same).
# Needs what make-dense-golden.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/synthetic
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
mapfile -t prompt < <(awk 'BEGIN { for (i = 0; i < 8204; i++) print (7919 * i + 785) % 151643 }')
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-llama4-golden
python3 "$root/scripts/make-synthetic-model.py" "$tmp/llama4.gguf" --preset llama4-tiny --seed 0 --type f16 -q
(cd "$tmp" && sha256sum llama4.gguf | cut -d' ' -f1) > "$out/llama4_tiny_seed0.sha256"
python3 "$here/widen-gguf.py" "$tmp/llama4.gguf" "$tmp/llama4_f32.gguf"
"$tmp/llamacpp-logits" "$tmp/llama4_f32.gguf" "$out/llama4_tiny_seed0_long_llamacpp.f32" --f32-cache "${prompt[@]}"
"$tmp/llamacpp-logits" "$tmp/llama4_f32.gguf" "$out/llama4_tiny_seed0_long_llamacpp_tbt.f32" --token-by-token --f32-cache "${prompt[@]}"
echo "make-llama4-golden: wrote $out/llama4_tiny_seed0_* (llama.cpp $version)" >&2
