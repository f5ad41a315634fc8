#!/usr/bin/env bash
# Hybrids against llama.cpp on the same synthetic GGUFs (issue 35): prefill and decode at 1 and
# 2 threads (aeon-bench vs llama-bench), and, when llama-server is built
# (scripts/bench/build-llama-bench.sh --server), a 5-turn chat (each turn asks 200 tokens)
# through our gateway (moonshine serve over one station) and llama-server on the same file:
# the latency of each turn.
#
#   scripts/bench/hybrid-bench.sh [OUT_DIR]
# Env: PRESETS (default "lfm2-1.2b qwen3.5-2b"), LAYERS (default: the preset's; fewer makes
# a shallower file of the real widths), TYPE (make-synthetic-model.py --type, default q8_0),
# PROMPT_LEN (64), DECODE (32), TURNS (5), TURN_TOKENS (200).
# Needs: cargo build --release -p fat-station -p moonshine -p knot-format; python3 with gguf,
# numpy; llama-bench (scripts/bench/build-llama-bench.sh). Prints one JSON line per measurement
# on stdout; exit 2 when a step fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
bin=$root/target/release
die() { echo "hybrid-bench: $*" >&2; exit 2; }
for b in knot aeon-bench fat-station moonshine; do
  [ -x "$bin/$b" ] || die "no $bin/$b (cargo build --release -p fat-station -p moonshine -p knot-format)"
done
llama_bench=$(bash "$here/build-llama-bench.sh") || die "no llama-bench"
llama_dir=$(dirname "$(dirname "$(dirname "$llama_bench")")")
server=$llama_dir/build-server/bin/llama-server
P=${PROMPT_LEN:-64}; N=${DECODE:-32}; turns=${TURNS:-5}; per_turn=${TURN_TOKENS:-200}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 1 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }

for preset in ${PRESETS:-lfm2-1.2b qwen3.5-2b}; do
  g=$out/$preset.gguf; k=$out/$preset.knot
  if [ ! -f "$k" ]; then
    python3 "$root/scripts/make-synthetic-model.py" "$g" --preset "$preset" -q \
      --type "${TYPE:-q8_0}" ${LAYERS:+--layers "$LAYERS"} || die "make-synthetic-model $preset"
    "$bin/knot" -q import "$g" -o "$k" || die "knot import $g"
  fi
  # Prefill and decode, 1 and 2 threads: ours, then llama.cpp's.
  "$bin/aeon-bench" -q --knot "$k" --prompt-len "$P" --decode "$N" --threads 1,2 --reps 2 \
    --no-station --bw-mib 256 --bw-reps 1 --json > "$out/$preset.aeon.json" || die "aeon-bench $preset"
  "$llama_bench" -m "$g" -p "$P" -n "$N" -t 1,2 -r 2 -o json > "$out/$preset.llama.json" 2>/dev/null \
    || die "llama-bench $preset"
  python3 - "$preset" "$out/$preset.aeon.json" "$out/$preset.llama.json" <<'PY'
import json, sys
preset, aeon, llama = sys.argv[1:]
a = json.load(open(aeon)); l = json.load(open(llama))
for r in l:
    kind = "prefill" if r.get("n_prompt", 0) > 0 else "decode"
    print(json.dumps({"preset": preset, "engine": "llama.cpp", "kind": kind,
                      "threads": r["n_threads"], "tok_s": round(r["avg_ts"], 2)}))
for r in a["runs"]:
    for kind in ("prefill", "decode"):
        print(json.dumps({"preset": preset, "engine": "aeon", "kind": kind,
                          "threads": r["threads"], "tok_s": round(r[kind + "_tok_s"], 2)}))
print(json.dumps({"preset": preset, "loadavg": a.get("loadavg")}))
PY
  [ -x "$server" ] || { echo "hybrid-bench: no $server: chat turns skipped (build-llama-bench.sh --server)" >&2; continue; }
  # The chat: the same 5 user turns through each server, greedy, max 200 tokens per turn.
  sp=$(free_port); gp=$(free_port); lp=$(free_port)
  "$bin/fat-station" --knot "$k" --listen "127.0.0.1:$sp" -t 2 >"$out/station.log" 2>&1 & st=$!
  "$llama_dir/build-server/bin/llama-server" -m "$g" --port "$lp" -t 2 -c 4096 -np 1 >"$out/llama-server.log" 2>&1 & ls=$!
  trap 'kill $st $ls ${gw:-} 2>/dev/null || true' EXIT
  wait_up "http://127.0.0.1:$sp" || die "station did not start"
  "$bin/moonshine" serve --station "http://127.0.0.1:$sp" --listen "127.0.0.1:$gp" >"$out/gateway.log" 2>&1 & gw=$!
  wait_up "http://127.0.0.1:$gp" || die "gateway did not start"
  wait_up "http://127.0.0.1:$lp" || die "llama-server did not start"
  python3 - "$preset" "$gp" "$lp" "$turns" "$per_turn" <<'PY'
import json, sys, time, urllib.request
preset, gp, lp, turns, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
asks = ["Tell me about the history of Paris.", "And of Berlin?", "Compare the two.",
        "Which has more museums?", "Summarise everything so far."]
for name, port in (("aeon", gp), ("llama-server", lp)):
    msgs = []
    for t in range(turns):
        msgs.append({"role": "user", "content": asks[t % len(asks)]})
        body = json.dumps({"messages": msgs, "max_tokens": n, "temperature": 0,
                           "ignore_eos": True, "cache_prompt": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        t0 = time.time()
        r = json.load(urllib.request.urlopen(req, timeout=600))
        dt = time.time() - t0
        msg = r["choices"][0]["message"]
        msgs.append({"role": "assistant", "content": msg.get("content") or ""})
        u = r.get("usage", {})
        print(json.dumps({"preset": preset, "engine": name, "turn": t + 1, "s": round(dt, 3),
                          "prompt_tokens": u.get("prompt_tokens"),
                          "completion_tokens": u.get("completion_tokens")}))
PY
  kill $st $ls $gw 2>/dev/null || true; wait 2>/dev/null || true
done
