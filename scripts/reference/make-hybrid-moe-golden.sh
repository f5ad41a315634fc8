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
# The GGUF: scripts/make-synthetic-model.py --preset PRESET --type f16 --seed 0 (f16: no 8-bit
# activations either side), widened to f32 for llama.cpp (widen-gguf.py). Needs what make-moe-golden.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/hybrid_moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
llama=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}/$version
[ -f "$llama/build/src/libllama.a" ] || bash "$root/scripts/bench/build-llama-bench.sh" >/dev/null
[ -f "$llama/build/src/libllama.a" ] || { echo "make-hybrid-moe-golden: no llama.cpp build in $llama" >&2; exit 1; }
gcc -O2 -I"$llama/vendor/llama.cpp/include" -I"$llama/vendor/llama.cpp/ggml/include" \
  "$here/llamacpp-logits.c" "$llama/build/src/libllama.a" "$llama/build/ggml/src/libggml.a" \
  "$llama/build/ggml/src/libggml-cpu.a" "$llama/build/ggml/src/libggml-base.a" \
  -lstdc++ -fopenmp -lm -lpthread -o "$tmp/llamacpp-logits"
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
    --experts "$out/${stem}_seed0_experts.i32" "${prompt[@]}"
  "$tmp/llamacpp-logits" "$tmp/${preset}_f32.gguf" "$out/${stem}_seed0_llamacpp_tbt.f32" \
    --token-by-token --f32-cache "${prompt[@]}"
done
echo "make-hybrid-moe-golden: wrote $out (llama.cpp $version)" >&2
