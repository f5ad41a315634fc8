#!/usr/bin/env bash
# Cross-builds llama.cpp for aarch64-linux-musl (static) with zig cc/c++ and links
# scripts/arm-proxy/llama-count.cpp against it; prints the llama-count binary's path.
#
#   scripts/arm-proxy/build-llama-aarch64.sh CPU    # CPU: zig's -mcpu, e.g. cortex_a53, cortex_a55
#
# llama.cpp's source: the tree vendored in the llama-cpp-python sdist (LLAMA_CPP_PYTHON_VERSION,
# default 0.3.36) that scripts/bench/build-llama-bench.sh or scripts/arm-proxy.sh unpacked
# under ~/.cache/aeon-shell/llama-bench (AEON_LLAMA_BENCH_DIR); AEON_LLAMA_SRC names another
# llama.cpp tree. Configure: Release, GGML_NATIVE=OFF (the -mcpu below decides the ISA: ggml's
# ARM feature checks read the compiler's __ARM_FEATURE_* macros), GGML_OPENMP=OFF (ggml's own
# threads; one is used), no curl/openssl/tools/examples/tests, -j1 niced: the box is shared.
# The baseline, cortex_a53 (ARMv8.0), builds the `llama` library target (ggml-base, ggml-cpu,
# ggml, llama); any other CPU builds only ggml-cpu (every kernel a token runs: the matmuls,
# attention, norms, repacking) and links it with the baseline's llama, ggml and ggml-base
# (graph building, model loading, the backend registry: ARMv8.0 code that runs on every core
# and is not on a token's hot path), which cuts its build from ~250 files to ~25.
# Cached under ~/.cache/aeon-shell/llama-aarch64/VERSION-CPU/ (AEON_LLAMA_AARCH64_DIR), built in
# a .partial directory renamed at the end; a finished build is reused, an interrupted one
# resumes. Needs cmake, make and zig (`zig` or `python3 -m ziglang`).
# Exit codes: 0 built (path on stdout); 2 bad usage, a missing tool or a failed step.
set -euo pipefail
die() { echo "build-llama-aarch64: $*" >&2; exit 2; }
[[ $# -eq 1 && "$1" != -* ]] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
cpu=$1
[[ "$cpu" =~ ^[a-z0-9_+]+$ ]] || die "odd -mcpu $cpu"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
src=${AEON_LLAMA_SRC:-${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}/$version/vendor/llama.cpp}
[[ -f "$src/CMakeLists.txt" ]] || die "no llama.cpp source at $src (scripts/arm-proxy.sh fetches it)"
cache=${AEON_LLAMA_AARCH64_DIR:-$HOME/.cache/aeon-shell/llama-aarch64}
dir=$cache/$version-$cpu
BASE_CPU=cortex_a53
base=$cache/$version-$BASE_CPU
# The driver is rebuilt when its source changed since the cached binary (cheap: one file).
if [[ -x "$dir/bin/llama-count" && "$dir/bin/llama-count" -nt "$HERE/llama-count.cpp" ]]; then
    echo "$dir/bin/llama-count"
    exit 0
fi
command -v cmake >/dev/null || die "missing cmake (apt-get install cmake)"
command -v make >/dev/null || die "missing make (apt-get install make)"
if command -v zig >/dev/null; then zig=(zig); else zig=(python3 -m ziglang); fi
"${zig[@]}" version >/dev/null 2>&1 || die "missing zig (scripts/cross/build-aarch64.sh installs it)"

if [[ "$cpu" != "$BASE_CPU" && ! -f "$base/lib/libllama.a" ]]; then
    echo "build-llama-aarch64: $cpu links the $BASE_CPU build's llama libraries: building those first" >&2
    "${BASH_SOURCE[0]}" "$BASE_CPU" >/dev/null
fi
if [[ "$cpu" == "$BASE_CPU" ]]; then
    target=llama
    libs=(src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a)
else
    target=ggml-cpu
    libs=(ggml/src/libggml-cpu.a)
fi
# A finished tree gets only the driver relinked; anything else builds in $dir.partial.
if [[ -f "$dir/lib/libggml-cpu.a" ]]; then
    work=$dir
else
    work=$dir.partial
fi
mkdir -p "$work/tc" "$work/bin" "$work/lib"
# Compiler wrappers: cmake wants one program per tool; zig's -mcpu fixes the ISA and tuning.
for t in cc c++; do
    printf '#!/bin/sh\nexec %s %s -target aarch64-linux-musl -mcpu=%s "$@"\n' "${zig[*]}" "$t" "$cpu" >"$work/tc/zig-$t"
done
for t in ar ranlib; do
    printf '#!/bin/sh\nexec %s %s "$@"\n' "${zig[*]}" "$t" >"$work/tc/zig-$t"
done
chmod +x "$work/tc/"*
if [[ "$work" == "$dir.partial" && ! -f "$work/lib/libggml-cpu.a" ]]; then
    if [[ ! -f "$work/build/CMakeCache.txt" ]]; then
        echo "build-llama-aarch64: cmake llama.cpp ($version) for aarch64-linux-musl -mcpu=$cpu" >&2
        cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
            -DCMAKE_C_COMPILER="$work/tc/zig-cc" -DCMAKE_CXX_COMPILER="$work/tc/zig-c++" \
            -DCMAKE_AR="$work/tc/zig-ar" -DCMAKE_RANLIB="$work/tc/zig-ranlib" \
            -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF \
            -DGGML_CPU_ALL_VARIANTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
            >"$work/cmake.log" 2>&1 || { tail -n 20 "$work/cmake.log" >&2; die "cmake configure failed"; }
    else
        echo "build-llama-aarch64: resuming the build in $work" >&2
    fi
    start=$(date +%s)
    nice -n 10 cmake --build "$work/build" --target "$target" -j "${AEON_BUILD_JOBS:-1}" \
        >>"$work/build.log" 2>&1 || { tail -n 20 "$work/build.log" >&2; die "building $target failed"; }
    echo "$target target built in $(( $(date +%s) - start )) s" >>"$work/build.log"
    for a in "${libs[@]}"; do
        [[ -f "$work/build/$a" ]] || die "no $a after the build"
        cp "$work/build/$a" "$work/lib/"
    done
fi
# The baseline's libraries (the baseline's own: still in $work on its first link), this CPU's
# ggml-cpu.
blib=$base/lib
[[ "$cpu" == "$BASE_CPU" ]] && blib=$work/lib
[[ -f "$work/inc/llama.h" ]] || { mkdir -p "$work/inc" && cp "$src/include/"*.h "$src/ggml/include/"*.h "$work/inc/"; }
nice -n 10 "$work/tc/zig-c++" -O2 -std=c++17 -static -I"$work/inc" "$HERE/llama-count.cpp" \
    "$blib/libllama.a" "$blib/libggml.a" "$work/lib/libggml-cpu.a" "$blib/libggml-base.a" \
    -lpthread -o "$work/bin/llama-count" 2>"$work/link.log" \
    || { tail -n 20 "$work/link.log" >&2; die "linking llama-count failed"; }
if [[ "$work" != "$dir" ]]; then
    # The build/ tree stays (its paths name .partial); only lib/, inc/ and bin/ are used later.
    rm -rf "$dir" && mv "$work" "$dir"
fi
echo "$dir/bin/llama-count"
