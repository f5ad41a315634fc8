#!/usr/bin/env bash
# deepseek2's bench row (issue 34): one process against native llama-bench on a
# DeepSeek-V2-Lite-shaped synthetic file (scripts/make-synthetic-model.py --preset
# deepseek-v2-lite: the real widths, 64 experts top-6 + 2 shared, kv_lora_rank 512), made once
# and cached with its KNOT in $AEON_SYNTH_DIR; then ours again with MLA's latent cache
# (aeon-bench --mla-latent-cache: kv_lora_rank + rope floats per position instead of every
# head's key and value). Each run holds /tmp/aeon-bigmem.lock (the file is a few GB).
#
# Usage: scripts/bench/deepseek2.sh [--layers N] [--type q8_0|q4_k_m] [--out DIR] [--no-build]
#                                   [-- aeon-bench args]
#   --layers N   blocks of the file (default 4: block 0 dense, 3 MoE; all 27 are ~16 GB at q8_0)
#   --type T     default q8_0 (NumPy-made; q4_k_m goes through llama-quantize's f16 file)
#   --out DIR    default target/bench/deepseek2 (DIR/decompressed, DIR/latent: bench.sh's files)
# Env: AEON_SYNTH_DIR (default ~/.cache/aeon-shell/synthetic), AEON_MODELS_DIR (the Qwen
#      tokenizer's GGUF), PYTHON.
# Exit: 0 when both runs measured; 2 when the file could not be made or a run failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
synth=${AEON_SYNTH_DIR:-$HOME/.cache/aeon-shell/synthetic}
layers=4
type=q8_0
out=$root/target/bench/deepseek2
build=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers=$2; shift ;;
    --type) type=$2; shift ;;
    --out) out=$2; shift ;;
    --no-build) build=0 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "deepseek2.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out" "$synth"
if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p fat-station -p knot-format --bins >&2) \
    || { echo "deepseek2.sh: build failed" >&2; exit 2; }
fi
stem=deepseek-v2-lite-l$layers-$type
if [ ! -f "$synth/$stem.gguf" ]; then
  echo "deepseek2.sh: making $stem..." >&2
  "$py" "$root/scripts/make-synthetic-model.py" "$synth/$stem.gguf" --preset deepseek-v2-lite \
    --layers "$layers" --type "$type" --seed 0 -q \
    --tokenizer "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
    || { echo "deepseek2.sh: could not make $stem" >&2; exit 2; }
fi
if [ ! -f "$synth/$stem.knot" ]; then
  "$root/target/release/knot" -q import "$synth/$stem.gguf" -o "$synth/$stem.knot" \
    || { echo "deepseek2.sh: could not import $stem" >&2; exit 2; }
fi
export AEON_MODELS_DIR=$synth
flock /tmp/aeon-bigmem.lock bash "$root/scripts/bench.sh" --model "$stem" --no-build \
  --out "$out/decompressed" -- --no-station "${extra[@]}" || exit 2
flock /tmp/aeon-bigmem.lock bash "$root/scripts/bench.sh" --model "$stem" --no-build --no-llama \
  --out "$out/latent" -- --no-station --mla-latent-cache "${extra[@]}" || exit 2
echo "deepseek2.sh: decompressed cache + llama.cpp: $out/decompressed/table.txt" >&2
cat "$out/decompressed/table.txt"
echo "deepseek2.sh: latent cache: $out/latent/table.txt" >&2
cat "$out/latent/table.txt"
