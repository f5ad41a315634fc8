#!/usr/bin/env bash
# Plain vs prompt-lookup decoding (moonshine --lookup) over simulated R1 nodes
# (scripts/r1-sim.sh: namespaces, memory cgroups, CPU shares, a delay per link).
#
#   scripts/bench/lookup-bench.sh [--nodes N] [--delay MS] [--cpus C] [--mem SIZE] [-n TOKENS]
#                                 [--reps R] [--lookup-draft K] [--keep]
#                                 [--knot FILE]   (default: r1-sim.sh's, the real Qwen 0.5B)
#
# For each prompt (a code edit: repeat a function with one change, where drafts hit; and
# free prose) it runs greedy chat generation R times plain and R times with --lookup and
# prints decode tok/s (median), tokens per chain trip, drafts kept, and whether the token ids
# were identical; then each node's peak memory. Measure only on a quiet machine.
# Needs what r1-sim.sh needs, plus target/release/moonshine.
# Exit codes: 0 measured (the table is not a gate); 1 a run failed or lookup changed the
# output; 2 bad usage or a missing binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MOON=${MOONSHINE_BIN:-$ROOT/target/release/moonshine}
nodes=2 delay=12 cpus=1 mem=2.95G ntok=128 reps=3 draft=7 keep=0 knot=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --knot) knot=(--knot "$2"); shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    -n) ntok=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --lookup-draft) draft=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
    *) echo "lookup-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$MOON" ] || { echo "lookup-bench: no $MOON (cargo build --release -p moonshine)" >&2; exit 2; }
export R1SIM_STATE=${R1SIM_STATE:-/run/r1-sim-lookup-bench}
export R1SIM_NAME=${R1SIM_NAME:-r1look} R1SIM_NET=${R1SIM_NET:-10.76.0}
"$ROOT/scripts/r1-sim.sh" up --nodes "$nodes" --delay "$delay" --cpus "$cpus" --mem "$mem" "${knot[@]}"
mesh=$R1SIM_STATE/mesh.json
out=$(mktemp -d)
if [ "$keep" = 1 ]; then trap 'rm -rf "$out"' EXIT
else trap 'rm -rf "$out"; "$ROOT/scripts/r1-sim.sh" down' EXIT; fi

code='Repeat this Python function exactly, but rename `total` to `acc`. Reply with only the code.

```python
def summarize(orders, tax_rate):
    total = 0
    for order in orders:
        if order.status == "cancelled":
            continue
        subtotal = order.quantity * order.unit_price
        total += subtotal * (1 + tax_rate)
    return round(total, 2)
```'
prose='Write a short story about a lighthouse keeper who finds a letter.'

run() { # name prompt mode rep
  # --temperature 0: --chat samples by default (llama-server's 0.8); the comparison is greedy.
  local args=(--chat --temperature 0 -c "$2" -n "$ntok" --json --mesh "$mesh")
  [ "$3" = lookup ] && args+=(--lookup --lookup-draft "$draft")
  "$MOON" "${args[@]}" </dev/null >"$out/$1-$3-$4.json" 2>"$out/$1-$3-$4.err" \
    || { cat "$out/$1-$3-$4.err" >&2; exit 1; }
}

for name in code prose; do
  prompt=$code; [ "$name" = prose ] && prompt=$prose
  for ((r = 0; r < reps; r++)); do
    run "$name" "$prompt" plain "$r"
    run "$name" "$prompt" lookup "$r"
  done
done

rc=0
python3 - "$out" "$reps" "$nodes" "$delay" "$cpus" <<'EOF' || rc=$?
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print(f"\n{sys.argv[3]} nodes, {sys.argv[4]} ms per link, {sys.argv[5]} cpu each; median [min-max] of {reps}")
print(f"{'prompt':6} {'mode':6} {'tokens':>6} {'tok/s [min-max]':>19} {'trips':>5} {'tok/trip':>8} {'kept':>9} {'same ids':>8}")
bad = False
for name in ("code", "prose"):
    base = None
    rows = {}
    for mode in ("plain", "lookup"):
        runs = [json.loads(open(f"{out}/{name}-{mode}-{r}.json").readline()) for r in range(reps)]
        ids = runs[0]["tokens"]
        if mode == "plain":
            base = ids
        same = ids == base and all(r["tokens"] == ids for r in runs)
        bad |= not same
        n = len(ids)
        all_tps = [(len(r["tokens"]) - 1) / r["decode_s"] for r in runs]
        tps = statistics.median(all_tps)
        span = f"{tps:7.2f} [{min(all_tps):.2f}-{max(all_tps):.2f}]"
        rows[mode] = tps
        r0 = runs[0]
        print(f"{name:6} {mode:6} {n:6} {span:>19} {r0['trips']:5} {r0['tokens_per_trip']:8.2f} "
              f"{r0['accepted']:4}/{r0['drafted']:<4} {'yes' if same else 'NO':>8}")
    print(f"{name:6} lookup/plain decode tok/s: {rows['lookup'] / rows['plain']:.2f}x")
sys.exit(1 if bad else 0)
EOF
"$ROOT/scripts/r1-sim.sh" status | grep '^node' || true
exit $rc
