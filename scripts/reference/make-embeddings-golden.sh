#!/usr/bin/env bash
# Regenerates the golden of moonshine/tests/embeddings.rs: llama.cpp's sentence embeddings
# (scripts/reference/llamacpp-embed.c: embeddings on, mean pooling, L2-normalised, as
# llama-server --embeddings --pooling mean answers /v1/embeddings) of the 20 lines of
#   moonshine/tests/golden/embeddings/texts.txt
# on the real Qwen2.5-Coder-0.5B GGUF, into
#   moonshine/tests/golden/embeddings/qwen_mean.f32      20 x 896 little-endian f32
#   moonshine/tests/golden/embeddings/qwen_tokens.txt    each line's token count
# Needs: the Qwen GGUF (scripts/fetch-model.sh qwen); llama.cpp's static libraries from
# scripts/bench/build-llama-bench.sh (run when missing) and a C compiler with OpenMP (gcc).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/moonshine/tests/golden/embeddings
gguf=${AEON_QWEN_GGUF:-$HOME/.cache/aeon-shell/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
[ -f "$gguf" ] || { echo "make-embeddings-golden: no $gguf (scripts/fetch-model.sh qwen)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-embed.c "$tmp/llamacpp-embed" make-embeddings-golden
"$tmp/llamacpp-embed" "$gguf" mean "$out/texts.txt" "$out/qwen_mean.f32" "$out/qwen_tokens.txt"
echo "make-embeddings-golden: wrote $out (llama.cpp $version, mean pooling)" >&2
