#!/usr/bin/env bash
# Regenerates the golden of one dense synthetic architecture's test (fat-station/tests/engine_dense.rs):
#   make-dense-golden.sh PRESET [PRESET...]     e.g. gemma2-tiny
# For each PRESET (a scripts/make-synthetic-model.py preset, made with --seed 0 --type f16), in
# fat-station/tests/golden/synthetic/ (NAME = the preset with '-' as '_'):
#   NAME_seed0.sha256          the GGUF's sha256 (the test skips the comparison when its own
#                              file differs: another numpy or gguf version)
#   NAME_seed0_llamacpp.f32     llama.cpp's logits of the last position, the prompt in one
#                              batch (one thread)
#   NAME_seed0_llamacpp_tbt.f32 the same, token by token (llama.cpp's own noise)
#   NAME_seed0_llamacpp_greedy.txt llama.cpp's greedy run of 16 tokens after the batched
#                              prompt: per line the id and its lead over the runner-up
# f16 weights: neither side quantizes activations to 8 bits, so a difference in the layer's
# definition shows above the rounding. llama.cpp runs the same weights widened to f32
# (widen-gguf.py) with an f32 KV cache and no flash attention (llamacpp-logits --f32-cache):
# on the f16 file it rounds each matmul's activations, the cache and K/V to f16 (rms 0.002 on
# the logits, 2-4x its own batched-vs-token noise), where our engine keeps f32; and it links
# ggml-cpu built without GGML_GELU_FP16 (llamacpp-build.sh's exact_gelu_ggml_cpu). Needs: pip install gguf numpy; the Qwen GGUF for the
# tokenizer (scripts/fetch-model.sh qwen); llama.cpp's static libraries from
# scripts/bench/build-llama-bench.sh (run when missing) and a C compiler with OpenMP (gcc).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: make-dense-golden.sh PRESET..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/synthetic
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# engine_dense.rs's PROMPT (Qwen's tokenizer: "The capital of France is ..."); 12 positions,
# longer than the tiny presets' sliding windows.
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)

. "$here/llamacpp-build.sh"
# ggml-cpu without its f16 GELU table (gemma2's GeGLU, starcoder2's MLP; the other presets
# call no GELU, so their goldens are the same either way).
export LLAMACPP_EXACT_GELU=1
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-dense-golden
for preset in "$@"; do
  name=${preset//-/_}
  # The Mistral presets' SentencePiece vocabulary: Llama 2's tokenizer.json, as the test's.
  case $preset in
    mistral*) export AEON_LLAMA2_TOKENIZER_JSON=${AEON_LLAMA2_TOKENIZER_JSON:-$(bash "$root/scripts/fetch-tokenizers.sh")} ;;
  esac
  python3 "$root/scripts/make-synthetic-model.py" "$tmp/$name.gguf" --preset "$preset" --seed 0 --type f16 -q
  (cd "$tmp" && sha256sum "$name.gguf" | cut -d' ' -f1) > "$out/${name}_seed0.sha256"
  # The same weights as f32 and an f32 KV cache: llama.cpp then rounds nothing to f16
  # (on the F16 file it rounds every matmul's activations and the cache), as our engine.
  python3 "$here/widen-gguf.py" "$tmp/$name.gguf" "$tmp/${name}_f32.gguf"
  "$tmp/llamacpp-logits" "$tmp/${name}_f32.gguf" "$out/${name}_seed0_llamacpp.f32" --f32-cache \
    --greedy 16 "$out/${name}_seed0_llamacpp_greedy.txt" "${prompt[@]}"
  "$tmp/llamacpp-logits" "$tmp/${name}_f32.gguf" "$out/${name}_seed0_llamacpp_tbt.f32" --token-by-token --f32-cache "${prompt[@]}"
  rm -f "$tmp/$name.gguf" "$tmp/${name}_f32.gguf"
  echo "make-dense-golden: $preset -> $out/${name}_seed0_* (llama.cpp $version)" >&2
done
