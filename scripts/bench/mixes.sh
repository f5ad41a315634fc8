#!/usr/bin/env bash
# The popular quantization mixes against native llama-bench, one row per mix (issue 40):
# scripts/bench.sh (aeon-bench and llama-bench on the same GGUF, same prompt and threads) on
#   - the real SmolLM2-135M Q4_1 (the model cache's smollm2-135m-instruct-q4_1, when fetched),
#   - synthetic files of Qwen2.5-0.5B's shape in llama-quantize's Q5_K_M, Q3_K_M, Q2_K and
#     IQ4_XS mixes (scripts/make-synthetic-model.py --preset qwen2.5-0.5b --type MIX, made once
#     and cached with their KNOT in $AEON_SYNTH_DIR),
# then one table: per mix and thread count, prefill and decode tok/s of both, ours/llama.cpp,
# and decode as % of the bandwidth roofline (ours, llama.cpp's). Each mix's full table is in
# OUT/MIX/table.txt.
#
# Usage: scripts/bench/mixes.sh [--mix LIST] [--out DIR] [--llama-reps N] [--no-build]
#                               [-- aeon-bench args]
#   --mix LIST   comma separated, default q4_1,q5_k_m,q3_k_m,q2_k,iq4_xs (q4_1: SmolLM2's real file)
#   --out DIR    default target/bench/mixes
#   --no-build   use target/release's binaries as they are
# Needs: python3 with pip (gguf and numpy are installed when missing), cmake and a C++ compiler
#        for llama-bench / llama-quantize (scripts/bench/build-llama-bench.sh).
# Env: AEON_SYNTH_DIR (default ~/.cache/aeon-shell/synthetic), AEON_MODELS_DIR, LLAMA_QUANTIZE
#      (else scripts/bench/build-llama-bench.sh --quantize builds it), PYTHON.
# Exit: 0 when every mix was measured; 2 when one could not be made or measured.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
synth=${AEON_SYNTH_DIR:-$HOME/.cache/aeon-shell/synthetic}
out=$root/target/bench/mixes
mixes=q4_1,q5_k_m,q3_k_m,q2_k,iq4_xs
llama_reps=3
extra=()
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --mix) mixes=$2; shift ;;
    --out) out=$2; shift ;;
    --llama-reps) llama_reps=$2; shift ;;
    --no-build) build=0 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "mixes.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out" "$synth"
# The synthetic files are written with PyPI gguf + numpy.
. "$root/scripts/lib/pip.sh"
pip_ensure "$py" "gguf, numpy" gguf numpy \
  || { echo "mixes.sh: could not install gguf and numpy for $py" >&2; exit 2; }
if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p fat-station -p knot-format --bins >&2) \
    || { echo "mixes.sh: build failed" >&2; exit 2; }
fi
rows=()
for mix in ${mixes//,/ }; do
  if [ "$mix" = q4_1 ]; then
    dir=$models stem=smollm2-135m-instruct-q4_1
  else
    dir=$synth stem=synthetic-qwen2.5-0.5b-$mix
    if [ ! -f "$dir/$stem.knot" ]; then
      echo "mixes.sh: making $stem (f16, then llama-quantize)..." >&2
      "$py" "$root/scripts/make-synthetic-model.py" "$dir/$stem.gguf" --preset qwen2.5-0.5b \
        --seed 0 --type "$mix" -q --tokenizer "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
        && "$root/target/release/knot" -q import "$dir/$stem.gguf" -o "$dir/$stem.knot" \
        || { echo "mixes.sh: could not make $stem" >&2; exit 2; }
    fi
  fi
  [ -f "$dir/$stem.knot" ] || { echo "mixes.sh: missing $dir/$stem.knot (scripts/fetch-model.sh all)" >&2; exit 2; }
  echo "mixes.sh: $mix: scripts/bench.sh --model $stem" >&2
  AEON_MODELS_DIR=$dir bash "$root/scripts/bench.sh" --model "$stem" --no-build \
    --llama-reps "$llama_reps" --out "$out/$mix" -- --no-station "${extra[@]}" >/dev/null \
    || { echo "mixes.sh: bench.sh failed on $mix" >&2; exit 2; }
  rows+=("$mix=$out/$mix")
done
"$py" - "${rows[@]}" <<'PY' | tee "$out/table.txt"
import json, os, sys
print(f"{'mix':<8} {'thr':>3} | {'prefill':>8} {'llama':>7} {'ratio':>6} | {'decode':>7} {'llama':>7} {'ratio':>6} | {'of roof':>7} {'llama%':>6}")
for arg in sys.argv[1:]:
    mix, d = arg.split("=", 1)
    ours = json.load(open(os.path.join(d, "aeon.json")))
    peer = {}
    p = os.path.join(d, "llama.json")
    if os.path.exists(p):
        peer = {r["threads"]: r for r in json.load(open(p)).get("runs", [])}
    for r in ours["runs"]:
        l = peer.get(r["threads"], {})
        lp, ld = l.get("prefill_tok_s"), l.get("decode_tok_s")
        f = lambda v, s=".1f": "-" if v is None else format(v, s)
        rat = lambda a, b: None if a is None or not b else a / b
        lroof = rat(ld, r["roofline_tok_s"])
        print(f"{mix:<8} {r['threads']:>3} | {r['prefill_tok_s']:>8.1f} {f(lp):>7} {f(rat(r['prefill_tok_s'], lp), '.2f'):>6} | "
              f"{r['decode_tok_s']:>7.1f} {f(ld):>7} {f(rat(r['decode_tok_s'], ld), '.2f'):>6} | "
              f"{100 * r['decode_vs_roofline']:>6.0f}% {f(None if lroof is None else 100 * lroof, '.0f'):>5}%")
PY
