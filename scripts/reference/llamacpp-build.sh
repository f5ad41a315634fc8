# shellcheck shell=bash
# Sourced by scripts/reference/make-*-golden.sh: the one place that finds the pinned llama.cpp
# and compiles the C tools against it.
#
# build_llamacpp_tool SRC OUT WHO: finds llama.cpp's static build (building it with
# scripts/bench/build-llama-bench.sh when missing), sets `llama` to its directory and `version`
# to its llama-cpp-python version, and compiles scripts/reference/SRC against it into OUT.
# WHO names the calling script in errors. With LLAMACPP_EXACT_GELU=1 the tool links ggml-cpu
# built without its f16 GELU table (see exact_gelu_ggml_cpu).
build_llamacpp_tool() {
  local src=$1 out=$2 who=$3 ref cpu
  ref=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
  llama=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}/$version
  [ -f "$llama/build/src/libllama.a" ] || bash "$ref/../bench/build-llama-bench.sh" >/dev/null
  [ -f "$llama/build/src/libllama.a" ] || { echo "$who: no llama.cpp build in $llama" >&2; exit 1; }
  cpu=$llama/build/ggml/src/libggml-cpu.a
  [ -z "${LLAMACPP_EXACT_GELU:-}" ] || cpu=$(exact_gelu_ggml_cpu "$who") || exit 1
  gcc -O2 -I"$llama/vendor/llama.cpp/include" -I"$llama/vendor/llama.cpp/ggml/include" \
    "$ref/$src" "$llama/build/src/libllama.a" "$llama/build/ggml/src/libggml.a" \
    "$cpu" "$llama/build/ggml/src/libggml-base.a" \
    -lstdc++ -fopenmp -lm -lpthread -o "$out"
}

# exact_gelu_ggml_cpu WHO: prints the path of a libggml-cpu.a built from the same llama.cpp
# tree with one line removed, `#define GGML_GELU_FP16` (ggml-cpu/vec.h), building it once into
# $llama/build-exact-gelu. With that define (no flag turns it off) ggml's CPU GELU and GeGLU
# round their input to f16 and read an f16 table: 1e-3 of the logits on gemma2 and starcoder2,
# where the rest of an f32 run is exact to 1e-6. Without it they compute the same tanh formula
# in f32. Needs `llama` set (build_llamacpp_tool's first lines) and cmake.
exact_gelu_ggml_cpu() {
  local who=$1 src=$llama/exact-gelu-src b=$llama/build-exact-gelu
  if [ ! -f "$b/ggml/src/libggml-cpu.a" ]; then
    echo "$who: building ggml-cpu without GGML_GELU_FP16 in $b (once)" >&2
    rm -rf "$src" && cp -a "$llama/vendor/llama.cpp" "$src"
    grep -q '^#define GGML_GELU_FP16$' "$src/ggml/src/ggml-cpu/vec.h" \
      || { echo "$who: no GGML_GELU_FP16 define in this llama.cpp's vec.h" >&2; return 1; }
    sed -i '/^#define GGML_GELU_FP16$/d' "$src/ggml/src/ggml-cpu/vec.h"
    cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF >"$llama/cmake-exact-gelu.log" 2>&1 \
      && cmake --build "$b" --target ggml-cpu -j "${AEON_BUILD_JOBS:-$(nproc)}" \
        >"$llama/build-exact-gelu.log" 2>&1 \
      || { echo "$who: building ggml-cpu without GGML_GELU_FP16 failed ($llama/build-exact-gelu.log)" >&2; return 1; }
  fi
  echo "$b/ggml/src/libggml-cpu.a"
}
