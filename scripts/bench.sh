#!/usr/bin/env bash
# The benchmark, in ONE run on this machine:
#   - builds fat-station (release) and runs aeon-bench on the Qwen KNOT: streaming read
#     bandwidth, roofline tok/s, prefill (64-token prompt) and decode (64 greedy tokens)
#     tok/s at 1 and 2 threads, station hop cost, start-to-ready, peak RSS;
#   - builds llama.cpp's own llama-bench natively (scripts/bench/build-llama-bench.sh: the
#     llama.cpp tree inside the llama-cpp-python sdist, -DGGML_NATIVE=ON, cached under
#     ~/.cache/aeon-shell/llama-bench) and runs it on the same GGUF: pp64, and tg64 at depth 64,
#     same thread counts (scripts/bench/llama_bench_run.py);
#   - prints the table with ours/llama.cpp and ours/roofline ratios, and the spreads of both
#     (every repetition: this is a shared 2-core VM whose bandwidth moves minute to minute).
#
# Usage: scripts/bench.sh [--model STEM] [--no-build] [--no-llama] [--llama-reps N] [--out DIR]
#                         [-- aeon-bench args]
#   --model STEM   another cached model: STEM.knot and STEM.gguf in the model cache (default
#                  qwen2.5-coder-0.5b-instruct-q4_k_m; e.g. gemma-3-270m-q4_k_m,
#                  smollm2-135m-instruct-q4_1 after scripts/fetch-model.sh all)
# Env:   AEON_MODELS_DIR (model cache, default ~/.cache/aeon-shell/models), PYTHON (python3),
#        LLAMA_BENCH (a llama-bench binary to use instead of building one).
# Files: DIR (default target/bench) gets aeon.json, llama.json and table.txt.
# Exit:  0 when the measurements ran (the table reports PASS/FAIL; it is not a gate),
#        2 on a missing model or a failed build/measurement of ours.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
stem=qwen2.5-coder-0.5b-instruct-q4_k_m
py=${PYTHON:-python3}
out=$root/target/bench
build=1
llama=1
llama_reps=5
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) stem=$2; shift ;;
    --no-build) build=0 ;;
    --no-llama) llama=0 ;;
    --llama-reps) llama_reps=$2; shift ;;
    --out) out=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
knot=$models/$stem.knot
gguf=$models/$stem.gguf
[ -f "$knot" ] || { echo "bench.sh: missing $knot: run scripts/fetch-model.sh" >&2; exit 2; }
mkdir -p "$out"

if [ "$build" = 1 ]; then
  echo "bench.sh: building fat-station (release)..." >&2
  (cd "$root" && cargo build --release -p fat-station --bins >&2) || { echo "bench.sh: build failed" >&2; exit 2; }
fi
bin=$root/target/release
echo "bench.sh: aeon-bench (bandwidth, engine at 1 and 2 threads, station)..." >&2
"$bin/aeon-bench" --knot "$knot" --station-bin "$bin/fat-station" --json "${extra[@]}" > "$out/aeon.json.tmp" \
  || { echo "bench.sh: aeon-bench failed" >&2; exit 2; }
mv "$out/aeon.json.tmp" "$out/aeon.json"

peer=()
rm -f "$out/llama.json"
if [ "$llama" = 0 ]; then
  echo "bench.sh: llama.cpp skipped (--no-llama)" >&2
elif [ ! -f "$gguf" ]; then
  echo "bench.sh: NOTE: $gguf missing; llama.cpp side skipped" >&2
else
  lb=${LLAMA_BENCH:-}
  if [ -z "$lb" ]; then
    echo "bench.sh: llama-bench (built once from the llama-cpp-python sdist, cached)..." >&2
    lb=$(bash "$here/bench/build-llama-bench.sh") || lb=""
  fi
  if [ -z "$lb" ] || [ ! -x "$lb" ]; then
    echo "bench.sh: NOTE: no llama-bench (see above); comparing with the roofline only" >&2
  else
    echo "bench.sh: $lb on the same GGUF, prompt length and threads..." >&2
    if "$py" "$here/bench/llama_bench_run.py" "$lb" "$gguf" --aeon-json "$out/aeon.json" \
        --reps "$llama_reps" > "$out/llama.json.tmp"; then
      mv "$out/llama.json.tmp" "$out/llama.json"
      peer=("$out/llama.json")
    else
      echo "bench.sh: llama-bench failed; comparing with the roofline only" >&2
      rm -f "$out/llama.json.tmp"
    fi
  fi
fi
"$py" "$here/bench/table.py" "$out/aeon.json" "${peer[@]}" | tee "$out/table.txt"
