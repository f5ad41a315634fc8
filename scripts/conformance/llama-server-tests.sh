#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the llama.cpp tree that PyPI's
# llama-cpp-python sdist vendors) run against fat-station + `moonshine serve`: the tests run
# unchanged; only the server start/stop of their utils.py is replaced by our pytest plugin
# (scripts/conformance/aeon_llama_server.py), which maps the preset's fields to our flags and
# its models to our cached ones. Tests that need a llama-server-only feature or that exact
# model's text are deselected by scripts/conformance/llama-server-skip.txt, each with its reason.
#
#   scripts/conformance/llama-server-tests.sh                 # the default file set (make test's)
#   scripts/conformance/llama-server-tests.sh --all           # every file of the suite
#   scripts/conformance/llama-server-tests.sh unit/test_tokenize.py [pytest args...]
#
# Prints pytest's report and a per-file table (passed/failed/skipped); with
# AEON_CONFORMANCE_JSON=FILE also writes that table as JSON. Exit: pytest's status (0: every
# test that ran passed), 2 when the suite or a binary or a model is missing.
# Env: LLAMA_CPP_PYTHON_VERSION (0.3.36), AEON_BIN_DIR (target/release; or AEON_STATION_BIN and
# AEON_MOONSHINE_BIN, each binary's path), AEON_MODELS_DIR,
# AEON_LLAMA_BENCH_DIR (where build-llama-bench.sh unpacked the sdist), PYTHON (python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
die() { echo "llama-server-tests: $*" >&2; exit 2; }
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
cache=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}
# The llama.cpp tree's root: the tests read chat templates from its models/templates.
tree=$cache/$version/vendor/llama.cpp
if [ ! -f "$tree/tools/server/tests/utils.py" ] || [ ! -d "$tree/models/templates" ]; then
  # Our own copy of those two folders, beside the llama-bench build's (which unpacks the whole sdist).
  tree=$HOME/.cache/aeon-shell/llama-server-tests/$version
fi
if [ ! -f "$tree/tools/server/tests/utils.py" ] || [ ! -d "$tree/models/templates" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "llama-server-tests: pip download --no-binary llama-cpp-python --no-deps llama-cpp-python==$version" >&2
  "$py" -m pip download --no-binary llama-cpp-python --no-deps --disable-pip-version-check -q \
    -d "$tmp" "llama-cpp-python==$version" >&2 || die "pip download llama-cpp-python==$version failed"
  sdist=$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
  [ -n "$sdist" ] || die "no llama_cpp_python-*.tar.gz in the download"
  mkdir -p "$tmp/x"
  top=llama_cpp_python-$version/vendor/llama.cpp
  tar -xzf "$sdist" -C "$tmp/x" --strip-components=3 "$top/tools/server/tests" "$top/models/templates" \
    || die "no tools/server/tests or models/templates in $sdist"
  mkdir -p "$(dirname "$tree")" && rm -rf "$tree" && mv "$tmp/x" "$tree"
fi
"$py" -c "import pytest, requests, openai, wget, filelock" 2>/dev/null \
  || die "python3 needs pytest requests openai wget filelock (pip install pytest requests openai wget filelock)"

bin=${AEON_BIN_DIR:-$root/target/release}
export AEON_STATION_BIN=${AEON_STATION_BIN:-$bin/fat-station}
export AEON_MOONSHINE_BIN=${AEON_MOONSHINE_BIN:-$bin/moonshine}
for b in "$AEON_STATION_BIN" "$AEON_MOONSHINE_BIN"; do
  [ -x "$b" ] || die "no $b (cargo build --release -p fat-station -p moonshine)"
done
export AEON_BIN_DIR=$bin
export AEON_MODELS_DIR=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
# AEON_SKIP_LIST= (empty) runs the listed tests too, to check the list.
export AEON_SKIP_LIST=${AEON_SKIP_LIST-$root/scripts/conformance/llama-server-skip.txt}

top=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-tests.XXXXXX")
trap 'rm -rf "$top"' EXIT
# The tree's layout, so the tests' ../../../models/templates paths hold.
mkdir -p "$top/tools/server" "$top/models"
cp -a "$tree/tools/server/tests" "$top/tools/server/"
cp -a "$tree/models/templates" "$top/models/"
work=$top/tools/server/tests
mkdir -p "$work/tmp"
# The gateway's port: a free one (llama-server's tests default to 8080, which others may hold).
PORT=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PORT

files=()
args=()
case "${1:-}" in
  --all) shift; files=(unit) ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    unit/*) files+=("$1") ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ ${#files[@]} -eq 0 ]; then
  # make test's set: the files whose routes a user of ours calls.
  files=(unit/test_basic.py unit/test_tokenize.py unit/test_completion.py
         unit/test_chat_completion.py unit/test_infill.py unit/test_security.py
         unit/test_template.py unit/test_tool_call.py unit/test_ctx_shift.py
         unit/test_stream.py unit/test_ignore_eos.py unit/test_embedding.py
         unit/test_compat_anthropic.py unit/test_compat_oai_responses.py)
fi
cd "$work"
set +e
PYTHONPATH="$root/scripts/conformance${PYTHONPATH:+:$PYTHONPATH}" \
  "$py" -m pytest -p aeon_llama_server -q -rfEs --no-header -o cache_dir="$work/.pytest_cache" \
  "${files[@]}" ${args[@]+"${args[@]}"}
rc=$?
set -e
exit $rc
