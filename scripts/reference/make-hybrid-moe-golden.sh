#!/usr/bin/env bash
# Regenerates the goldens of fat-station/tests/engine_hybrid_moe.rs (llama.cpp on the tiny
# hybrid MoE files), for each PRESET in lfm2moe-tiny and qwen35moe-tiny (STEM: the preset with
# '_' for '-'):
#   fat-station/tests/golden/hybrid_moe/STEM_seed0.sha256             the GGUF's sha256
#   fat-station/tests/golden/hybrid_moe/STEM_seed0_llamacpp.f32       llama.cpp's logits of the
#                                                                     last position, one batch
#   fat-station/tests/golden/hybrid_moe/STEM_seed0_llamacpp_tbt.f32   the same token by token
#   fat-station/tests/golden/hybrid_moe/STEM_seed0_experts.i32        the experts llama.cpp chose,
#                                                                     i32 (block, token, k)
#   fat-station/tests/golden/hybrid_moe/STEM_seed0_llamacpp_greedy.txt llama.cpp's greedy run of
#                                                                     16 tokens after the batched
#                                                                     prompt: per line the id and
#                                                                     its lead over the runner-up
# The GGUF: scripts/make-synthetic-model.py --preset PRESET --type f16 --seed 0 (f16: no 8-bit
# activations either side), widened to f32 for llama.cpp (widen-gguf.py). Needs what make-moe-golden.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/hybrid_moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-hybrid-moe-golden
# The test's PROMPT ("The capital of France is Paris. The capital of Germany is").
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)
for preset in ${PRESETS:-lfm2moe-tiny qwen35moe-tiny}; do
  stem=${preset//-/_}
  g=$tmp/$preset.gguf
  python3 "$root/scripts/make-synthetic-model.py" "$g" --preset "$preset" --type f16 --seed 0 -q
  (cd "$tmp" && sha256sum "$preset.gguf" | cut -d' ' -f1) > "$out/${stem}_seed0.sha256"
  # The same weights as f32 and an f32 KV cache: llama.cpp then rounds nothing to f16 (on the
  # F16 file it rounds every matmul's activations and the cache), as our engine.
  python3 "$here/widen-gguf.py" "$g" "$tmp/${preset}_f32.gguf"
  "$tmp/llamacpp-logits" "$tmp/${preset}_f32.gguf" "$out/${stem}_seed0_llamacpp.f32" --f32-cache \
    --experts "$out/${stem}_seed0_experts.i32" \
    --greedy 16 "$out/${stem}_seed0_llamacpp_greedy.txt" "${prompt[@]}"
  "$tmp/llamacpp-logits" "$tmp/${preset}_f32.gguf" "$out/${stem}_seed0_llamacpp_tbt.f32" \
    --token-by-token --f32-cache "${prompt[@]}"
done
echo "make-hybrid-moe-golden: wrote $out (llama.cpp $version)" >&2
