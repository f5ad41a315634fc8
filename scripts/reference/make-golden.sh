#!/usr/bin/env bash
# Regenerates the reference logits the engine tests compare against:
#   fat-station/tests/golden/qwen_paris_numpy.f32  (NumPy f32 forward over gguf's dequantizers)
# Needs: pip install gguf numpy; the cached GGUF (scripts/fetch-model.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
gguf=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
[ -f "$gguf" ] || { echo "missing $gguf: run scripts/fetch-model.sh" >&2; exit 2; }
# "The capital of France is" in Qwen's tokenizer.
python3 "$here/ref_forward.py" "$gguf" 785 6722 315 9625 374 \
  --logits-out "$root/fat-station/tests/golden/qwen_paris_numpy.f32" --top 10
