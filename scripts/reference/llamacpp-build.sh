# shellcheck shell=bash
# Sourced by scripts/reference/make-*-golden.sh: the one place that finds the pinned llama.cpp
# and compiles the C tools against it.
#
# build_llamacpp_tool SRC OUT WHO: finds llama.cpp's static build (building it with
# scripts/bench/build-llama-bench.sh when missing), sets `llama` to its directory and `version`
# to its llama-cpp-python version, and compiles scripts/reference/SRC against it into OUT.
# WHO names the calling script in errors.
build_llamacpp_tool() {
  local src=$1 out=$2 who=$3 ref
  ref=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
  llama=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}/$version
  [ -f "$llama/build/src/libllama.a" ] || bash "$ref/../bench/build-llama-bench.sh" >/dev/null
  [ -f "$llama/build/src/libllama.a" ] || { echo "$who: no llama.cpp build in $llama" >&2; exit 1; }
  gcc -O2 -I"$llama/vendor/llama.cpp/include" -I"$llama/vendor/llama.cpp/ggml/include" \
    "$ref/$src" "$llama/build/src/libllama.a" "$llama/build/ggml/src/libggml.a" \
    "$llama/build/ggml/src/libggml-cpu.a" "$llama/build/ggml/src/libggml-base.a" \
    -lstdc++ -fopenmp -lm -lpthread -o "$out"
}
