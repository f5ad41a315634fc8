#!/usr/bin/env bash
# Regenerates the reference logits the engine tests compare against:
#   fat-station/tests/golden/qwen_paris_numpy.f32         (NumPy f32 forward over gguf's dequantizers)
#   fat-station/tests/golden/gemma/gemma_paris_numpy.f32  (the same for Gemma-3-270M, "<bos>The capital
#                                                          of France is"; several minutes)
# Needs: pip install gguf numpy; the cached GGUFs (scripts/fetch-model.sh all).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
gguf=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
gemma=$models/gemma-3-270m-q4_k_m.gguf
for f in "$gguf" "$gemma"; do
  [ -f "$f" ] || { echo "missing $f: run scripts/fetch-model.sh all" >&2; exit 2; }
done
# "The capital of France is" in Qwen's tokenizer.
python3 "$here/ref_forward.py" "$gguf" 785 6722 315 9625 374 \
  --logits-out "$root/fat-station/tests/golden/qwen_paris_numpy.f32" --top 10
mkdir -p "$root/fat-station/tests/golden/gemma"
python3 "$here/ref_forward.py" "$gemma" 2 818 5279 529 7001 563 \
  --logits-out "$root/fat-station/tests/golden/gemma/gemma_paris_numpy.f32" --top 10
