#!/usr/bin/env bash
# Builds llama.cpp's own `llama-bench`, natively (-DGGML_NATIVE=ON), from the llama.cpp tree
# vendored inside the llama-cpp-python source distribution on PyPI, and prints its path.
#
#   scripts/bench/build-llama-bench.sh            # prints .../llama-bench (cached after the first build)
#   scripts/bench/build-llama-bench.sh --quantize # also builds llama-quantize, prints its path
#   scripts/bench/build-llama-bench.sh --server   # llama-server from the same tree (its own
#                                                 # build folder), prints its path
#                                                 # (scripts/make-synthetic-model.py --type q4_k_m)
#
# Why not llama-cpp-python itself: its prebuilt/pip-built library decodes ~40% slower through
# Python on this machine (27-31 tok/s vs 48-51 at one thread), which made our ratio look twice
# as good as it is. llama-bench is what llama.cpp itself reports.
#
# Steps: `pip download --no-binary llama-cpp-python --no-deps llama-cpp-python[==VERSION]` (the
# sdist; `--no-binary :all:` would also force pip to build cmake itself from source just to read
# the sdist's metadata, ~30 min here), untar, cmake
# configure vendor/llama.cpp (Release, GGML_NATIVE=ON, LLAMA_CURL=OFF, no tests/examples/server),
# build the llama-bench target only (and llama-quantize with --quantize: a finished build gets
# the target added in place, reusing its compiled ggml and llama libraries). Cached under ~/.cache/aeon-shell/llama-bench/VERSION/
# (AEON_LLAMA_BENCH_DIR overrides); a finished build is reused. Needs cmake and a C++ compiler:
# installed with apt-get when missing and root.
# Env: LLAMA_CPP_PYTHON_VERSION (default: the newest on PyPI), PYTHON (python3), AEON_BUILD_JOBS.
# Exit codes: 0 built (path on stdout); 2 a tool is missing or a step failed (said on stderr).
set -euo pipefail
py=${PYTHON:-python3}
die() { echo "build-llama-bench: $*" >&2; exit 2; }
want=llama-bench
case "${1:-}" in
  --quantize) want=llama-quantize ;;
  --server) want=llama-server ;;
  "") ;;
  *) die "unknown argument $1 (--quantize, --server)" ;;
esac
if [ "$want" = llama-server ]; then
  # llama-server from the same tree, in its own build folder (the llama-bench build is
  # configured without the server; reconfiguring it would rebuild what others use).
  bench=$(bash "$0") || die "no llama-bench build to take the tree from"
  dir=$(dirname "$(dirname "$(dirname "$bench")")")
  srv=$dir/build-server
  if [ ! -x "$srv/bin/llama-server" ]; then
    echo "build-llama-bench: building llama-server in $srv" >&2
    cmake -S "$dir/vendor/llama.cpp" -B "$srv" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=ON >"$dir/cmake-server.log" 2>&1 \
      || { tail -n 20 "$dir/cmake-server.log" >&2; die "cmake configure (server) failed"; }
    cmake --build "$srv" --target llama-server -j "${AEON_BUILD_JOBS:-$(nproc)}" \
      >"$dir/build-server.log" 2>&1 \
      || { tail -n 20 "$dir/build-server.log" >&2; die "building llama-server failed"; }
  fi
  [ -x "$srv/bin/llama-server" ] || die "no $srv/bin/llama-server after the build"
  echo "$srv/bin/llama-server"
  exit 0
fi
targets=(llama-bench)
[ "$want" = llama-bench ] || targets+=("$want")

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "missing ${need[*]} (apt-get install ${need[*]})"
  echo "build-llama-bench: apt-get install ${need[*]}" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/dev/null \
    || die "apt-get install ${need[*]} failed"
fi

version=${LLAMA_CPP_PYTHON_VERSION:-}
cache=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}
mkdir -p "$cache"
if [ -z "$version" ]; then
  # The newest version a previous run built, when it is there: no network needed.
  for d in "$cache"/*/build/bin/llama-bench; do
    [ -x "$d" ] && version=$(basename "$(dirname "$(dirname "$(dirname "$d")")")")
  done
fi
if [ -n "$version" ] && [ -x "$cache/$version/build/bin/$want" ]; then
  echo "$cache/$version/build/bin/$want"
  exit 0
fi
if [ -n "$version" ] && [ -x "$cache/$version/build/bin/llama-bench" ]; then
  # A finished llama-bench build without $want: add the target in place. CMake refuses a build
  # tree that moved (its cache records the .partial path it was configured in), so the old
  # path is made a link to the finished tree for the build.
  dir=$cache/$version
  [ -e "$dir.partial" ] && die "$dir.partial exists (a build under way?); not building $want"
  ln -s "$dir" "$dir.partial"
  trap 'rm -f "$dir.partial"' EXIT
  echo "build-llama-bench: adding $want to $dir/build" >&2
  cmake --build "$dir.partial/build" --target "$want" -j "${AEON_BUILD_JOBS:-$(nproc)}" \
    >"$dir/build-$want.log" 2>&1 \
    || { tail -n 20 "$dir/build-$want.log" >&2; die "building $want failed"; }
  [ -x "$dir/build/bin/$want" ] || die "no build/bin/$want after the build"
  echo "$dir/build/bin/$want"
  exit 0
fi

tmp=$(mktemp -d "$cache/.dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
spec=llama-cpp-python${version:+==$version}
echo "build-llama-bench: pip download --no-binary llama-cpp-python --no-deps $spec" >&2
"$py" -m pip download --no-binary llama-cpp-python --no-deps --disable-pip-version-check -q -d "$tmp" "$spec" >&2 \
  || die "pip download $spec failed"
sdist=$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
[ -n "$sdist" ] || die "no llama_cpp_python-*.tar.gz in the download"
version=$(basename "$sdist" .tar.gz); version=${version#llama_cpp_python-}
dir=$cache/$version
if [ ! -x "$dir/build/bin/$want" ]; then
  src=$dir.partial/vendor/llama.cpp
  if [ -f "$dir.partial/build/CMakeCache.txt" ]; then
    # An interrupted build of this version: carry on where it stopped.
    echo "build-llama-bench: resuming the build in $dir.partial" >&2
  else
    rm -rf "$dir.partial" && mkdir -p "$dir.partial"
    tar -xzf "$sdist" -C "$dir.partial" --strip-components=1 || die "untar $sdist failed"
    [ -f "$src/CMakeLists.txt" ] || die "no vendored llama.cpp in $sdist"
    echo "build-llama-bench: cmake llama.cpp (llama-cpp-python $version), targets ${targets[*]}" >&2
    cmake -S "$src" -B "$dir.partial/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF >"$dir.partial/cmake.log" 2>&1 \
      || { tail -n 20 "$dir.partial/cmake.log" >&2; die "cmake configure failed"; }
  fi
  cmake --build "$dir.partial/build" --target "${targets[@]}" -j "${AEON_BUILD_JOBS:-$(nproc)}" \
    >"$dir.partial/build.log" 2>&1 \
    || { tail -n 20 "$dir.partial/build.log" >&2; die "building ${targets[*]} failed"; }
  for t in "${targets[@]}"; do
    [ -x "$dir.partial/build/bin/$t" ] || die "no build/bin/$t after the build"
  done
  rm -rf "$dir" && mv "$dir.partial" "$dir"
fi
echo "$dir/build/bin/$want"
