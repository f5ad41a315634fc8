#!/usr/bin/env bash
# Regenerates the long-context golden of fat-station/tests/engine_dense.rs's Phi-3 LongRoPE
# test: llama.cpp on phi3-tiny (make-dense-golden.sh's file: --seed 0 --type f16) with a
# context of 8192, above the preset's original 4096, where llama.cpp rotates with
# rope_factors_long instead of rope_factors_short. In fat-station/tests/golden/synthetic/:
#   phi3_tiny_seed0_ctx8192_llamacpp.f32      logits of the last position, one batch
#   phi3_tiny_seed0_ctx8192_llamacpp_tbt.f32  the same, token by token (llama.cpp's own noise)
# (The short-context golden, n_ctx 28 padded to 256, is make-dense-golden.sh phi3-tiny's.)
# Needs what make-dense-golden.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/synthetic
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# engine_dense.rs's PROMPT.
prompt=(785 6722 315 9625 374 12095 13 576 6722 315 9856 374)
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-longrope-golden
python3 "$root/scripts/make-synthetic-model.py" "$tmp/phi3.gguf" --preset phi3-tiny --seed 0 --type f16 -q
want=$(cat "$out/phi3_tiny_seed0.sha256")
got=$(cd "$tmp" && sha256sum phi3.gguf | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "make-longrope-golden: phi3-tiny's sha256 $got is not the golden's $want (run make-dense-golden.sh phi3-tiny)" >&2; exit 1; }
# Widened to f32 with an f32 cache, as make-dense-golden.sh's goldens.
python3 "$here/widen-gguf.py" "$tmp/phi3.gguf" "$tmp/phi3_f32.gguf"
"$tmp/llamacpp-logits" "$tmp/phi3_f32.gguf" "$out/phi3_tiny_seed0_ctx8192_llamacpp.f32" --n-ctx 8192 --f32-cache "${prompt[@]}"
"$tmp/llamacpp-logits" "$tmp/phi3_f32.gguf" "$out/phi3_tiny_seed0_ctx8192_llamacpp_tbt.f32" --n-ctx 8192 --token-by-token --f32-cache "${prompt[@]}"
echo "make-longrope-golden: wrote $out/phi3_tiny_seed0_ctx8192_* (llama.cpp $version)" >&2
