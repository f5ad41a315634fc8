#!/usr/bin/env bash
# Issue 34's bench, from one command: the Qwen3-30B-A3B shape (qwen3moe, hidden 2048, 128
# experts, top-8, expert ffn 768, 32 / 4 heads of 128, vocab 151936) as a synthetic Q4_K_M GGUF,
# at --layers of its 48 (this machine's 24 GB are shared: 24 layers are 8.6 GB), then
#   1. shard-knot plan's split for R1 nodes (--node-free 2.95G, or --nodes N of them), the
#      nodes up under scripts/r1-sim.sh (2.95 GB memory cgroups, 12 ms links), greedy ids over
#      the chain against one process (a full fat-station), tokens/s for 1 and 3 streams and each
#      node's peak RSS (scripts/bench/chain-bench.sh --split --ids-out);
#   2. bytes of the model read per decoded token, measured (scripts/bench/moe_bytes.py: page
#      referenced bits of the mapped file) against the active parameters' bytes;
#   3. one process against native llama-bench on the same GGUF (scripts/bench.sh --model):
#      decode and prefill tok/s at 1 and 2 threads.
#
# Usage: scripts/bench/moe-bench.sh [--layers N] [--nodes N] [--reps R] [-n TOKENS]
#                                   [--random-blocks] [--no-chain] [--no-bytes] [--no-llama]
#                                   [--out DIR]
# --random-blocks: the file's Q4_K / Q6_K blocks drawn directly (make-synthetic-model.py
# --random-blocks, file stem ...-q4_k_m-rb): seconds to make where quantizing Gaussians with
# ggml's quantizer takes ~20 CPU-minutes for 24 layers (hours on a loaded box); the same type
# mix and weight scale, not llama-quantize's bytes.
# Files: ~/.cache/aeon-shell/synthetic/qwen3-30b-a3b-lN-q4_k_m.{gguf,knot} (made once, ~0.36 GB a
# layer each: make-synthetic-model.py quantizes each tensor as it makes it, no f16 file); DIR (default target/moe-bench) gets
# chain.txt, bytes.txt, ids-one.txt, ids-chain.txt and bench.sh's files.
# Memory: above 6 layers the whole run holds `flock /tmp/aeon-bigmem.lock` (one process maps
# the whole model; 4 layers are 1.9 GB, 24 are 8.6 GB).
# Needs: root (r1-sim.sh, clear_refs), python3 with gguf and numpy, the release binaries
# (fat-station, knot, shard-knot, moonshine, aeon-bench), llama.cpp's static ggml-base (the
# quantizer) and llama-bench (scripts/bench/build-llama-bench.sh --quantize).
# Exit: 0 measured (figures, not a gate) and the chain's ids equal one process's; 1 they differ
# or a step failed; 2 bad usage or a missing tool.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=$ROOT/target/release
layers=24 nodes="" reps=3 ntok=32 chain=1 bytes=1 llama=1 out=$ROOT/target/moe-bench rb=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --layers) layers=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -n) ntok=$2; shift 2 ;;
    --random-blocks) rb=1; shift ;;
    --no-chain) chain=0; shift ;;
    --no-bytes) bytes=0; shift ;;
    --no-llama) llama=0; shift ;;
    --out) out=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
    *) echo "moe-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $layers =~ ^[1-9][0-9]?$ ]] && [ "$layers" -le 48 ] || { echo "moe-bench: --layers 1-48" >&2; exit 2; }
[ -z "$nodes" ] || [[ $nodes =~ ^[1-9][0-9]?$ ]] || { echo "moe-bench: --nodes N" >&2; exit 2; }
for b in fat-station knot shard-knot moonshine aeon-bench; do
  [ -x "$BIN/$b" ] || { echo "moe-bench: no $BIN/$b (cargo build --release)" >&2; exit 2; }
done
syn=${AEON_SYNTHETIC_DIR:-$HOME/.cache/aeon-shell/synthetic}
stem=qwen3-30b-a3b-l$layers-q4_k_m${rb:+-rb}
gguf=$syn/$stem.gguf knot=$syn/$stem.knot
mkdir -p "$syn" "$out"
# Above 6 layers (2.5 GB of Q4_K_M, which one process maps whole) a run passes 4 GB: hold
# the machine's big-memory lock.
if [ "$layers" -gt 6 ]; then
  exec 9>/tmp/aeon-bigmem.lock
  flock 9
fi
if [ ! -f "$gguf" ]; then
  echo "moe-bench: making $gguf (Q4_K_M, each tensor quantized as it is made)..." >&2
  python3 "$ROOT/scripts/make-synthetic-model.py" "$gguf" --preset qwen3-30b-a3b \
    --layers "$layers" --type q4_k_m --seed 0 -q ${rb:+--random-blocks}
fi
[ -f "$knot" ] || "$BIN/knot" import "$gguf" -o "$knot" >&2
"$BIN/knot" inspect "$knot" | grep -E 'arch|experts|layers' | head -5 || true

prompt=785,6722,315,9625,374
if [ "$chain" = 1 ]; then
  # The planner's split for 2.95 GB nodes (or exactly --nodes of them).
  plan_args=(--node-free 2.95G)
  [ -n "$nodes" ] && plan_args+=(--nodes "$nodes")
  "$BIN/shard-knot" plan "$knot" "${plan_args[@]}" --disk-paged --json >"$out/plan.json"
  read -r n split why < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
ns = [x for x in p["nodes"] if x["chain"] == 0]
print(len(ns), ",".join("%d-%d" % (x["layers"]["start"], x["layers"]["end"]) for x in ns),
      p["why"].replace(" ", "_"))' "$out/plan.json")
  echo "moe-bench: plan: $n nodes, layers $split (${why//_/ })"
  # One process: a full station, 16 greedy tokens.
  st_log=$out/one-station.log
  "$BIN/fat-station" --knot "$knot" --listen 127.0.0.1:0 --threads 2 >"$st_log" 2>&1 &
  st=$!
  url=
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://[0-9.:]*' "$st_log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$st" 2>/dev/null || { cat "$st_log" >&2; exit 1; }
    sleep 0.2
  done
  [ -n "$url" ] || { kill "$st"; echo "moe-bench: the full station did not start" >&2; exit 1; }
  "$BIN/moonshine" --station "$url" --tokens "$prompt" -n 16 --temperature 0 --json \
    | head -1 | python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))' \
    >"$out/ids-one.txt"
  kill "$st"; wait "$st" 2>/dev/null || true
  echo "moe-bench: one process: $(cat "$out/ids-one.txt")"
  export R1SIM_NAME=${R1SIM_NAME:-moebench} R1SIM_NET=${R1SIM_NET:-10.79.0}
  export R1SIM_STATE=${R1SIM_STATE:-/run/r1-sim-moe-bench}
  "$ROOT/scripts/bench/chain-bench.sh" --nodes "$n" --split "$split" --knot "$knot" \
    --ids-out "$out/ids-chain.txt" --streams 1,3 -n "$ntok" --reps "$reps" | tee "$out/chain.txt"
  if [ "$(cat "$out/ids-chain.txt")" != "$(cat "$out/ids-one.txt")" ]; then
    echo "moe-bench: the chain's greedy ids differ from one process's" >&2
    exit 1
  fi
  echo "moe-bench: the chain's 16 greedy ids equal one process's"
fi
if [ "$bytes" = 1 ]; then
  python3 "$ROOT/scripts/bench/moe_bytes.py" "$knot" --tokens 16 --warm 60 | tee "$out/bytes.txt"
fi
if [ "$llama" = 1 ]; then
  AEON_MODELS_DIR=$syn "$ROOT/scripts/bench.sh" --model "$stem" --no-build --out "$out" \
    --llama-reps "$reps" -- --reps "$reps"
fi
