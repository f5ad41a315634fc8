#!/usr/bin/env bash
# Regenerates the goldens of fat-station/tests/engine_deepseek2.rs (llama.cpp on the tiny
# deepseek2 files), for each PRESET in tiny-deepseek2 (V2-Lite's layout: attn_q, softmax
# routing) and tiny-deepseek3 (V3's: attn_q_a/q_b, sigmoid routing with a selection bias,
# expert groups, scaled weights) and tiny-deepseek2-split (tiny-deepseek2 with attn_k_b /
# attn_v_b instead of attn_kv_b):
#   fat-station/tests/golden/deepseek2/PRESET_seed0.sha256         the GGUF's sha256
#   fat-station/tests/golden/deepseek2/PRESET_seed0_numpy.f32      NumPy f32 logits of the last
#                                                                 position (ref_forward.py)
#   fat-station/tests/golden/deepseek2/PRESET_seed0_llamacpp.f32   llama.cpp's, prompt in one batch
#   fat-station/tests/golden/deepseek2/PRESET_seed0_llamacpp_tbt.f32  the same token by token
#   fat-station/tests/golden/deepseek2/PRESET_seed0_experts.i32    the experts llama.cpp chose,
#                                                                 i32 (block, token, k)
#   fat-station/tests/golden/deepseek2/PRESET_seed0_llamacpp_greedy.txt llama.cpp's greedy run of
#                                                                 16 tokens after the batched
#                                                                 prompt: per line the id and
#                                                                 its lead over the runner-up
# The GGUF: scripts/make-synthetic-model.py --preset PRESET --type q8_0 --seed 0.
# Needs what make-moe-golden.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/deepseek2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-deepseek2-golden
# The test's PROMPT ("The capital of France is Paris. The capital of Germany is").
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)
for preset in tiny-deepseek2 tiny-deepseek3 tiny-deepseek2-split; do
  g=$tmp/$preset.gguf
  python3 "$root/scripts/make-synthetic-model.py" "$g" --preset "$preset" --type q8_0 --seed 0 -q
  (cd "$tmp" && sha256sum "$preset.gguf" | cut -d' ' -f1) > "$out/${preset}_seed0.sha256"
  python3 "$here/ref_forward.py" "$g" "${prompt[@]}" --logits-out "$out/${preset}_seed0_numpy.f32" --top 5
  "$tmp/llamacpp-logits" "$g" "$out/${preset}_seed0_llamacpp.f32" \
    --experts "$out/${preset}_seed0_experts.i32" \
    --greedy 16 "$out/${preset}_seed0_llamacpp_greedy.txt" "${prompt[@]}"
  "$tmp/llamacpp-logits" "$g" "$out/${preset}_seed0_llamacpp_tbt.f32" --token-by-token "${prompt[@]}"
done
echo "make-deepseek2-golden: wrote $out (llama.cpp $version)" >&2
