#!/usr/bin/env bash
# Hybrids against llama.cpp on the same synthetic GGUFs (issue 35): prefill and decode at 1 and
# 2 threads (aeon-bench vs llama-bench), and, when llama-server is built
# (scripts/bench/build-llama-bench.sh --server), a 5-turn chat (each turn asks 200 tokens)
# through our gateway (moonshine serve over one station, OpenAI /v1/chat/completions,
# streamed) and llama-server's on the same file: per turn the time to the first token and to
# the last, and how many prompt positions each re-processed (llama-server's timings.prompt_n;
# ours, the station's embedded rows less the generated tokens), then median [min-max].
#
#   scripts/bench/hybrid-bench.sh [OUT_DIR]
# Env: PRESETS (default "lfm2-1.2b qwen3.5-2b"), LAYERS (default: the preset's; fewer makes
# a shallower file of the real widths), TYPE (make-synthetic-model.py --type, default q8_0),
# PROMPT_LEN (64), DECODE (32), TURNS (5), TURN_TOKENS (200), CHAT_ONLY=1 (skip the
# prefill/decode part), NO_CHAT=1 (skip the chat: e.g. PRESETS="gemma2-2b phi3-mini" for the
# dense shapes), THREADS (2: both servers' threads).
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
  if [ -z "${CHAT_ONLY:-}" ]; then
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
  fi
  [ -z "${NO_CHAT:-}" ] || continue
  # Without llama-server (scripts/bench/build-llama-bench.sh --server) the chat runs on ours only.
  lp=""
  [ -x "$server" ] || echo "hybrid-bench: no $server: the chat runs on ours only (build-llama-bench.sh --server)" >&2
  # The chat: the same 5 user turns through each server, greedy, max 200 tokens per turn.
  sp=$(free_port); gp=$(free_port)
  "$bin/fat-station" --knot "$k" --listen "127.0.0.1:$sp" -t "${THREADS:-2}" >"$out/station.log" 2>&1 & st=$!
  ls=""
  if [ -x "$server" ]; then
    lp=$(free_port)
    "$server" -m "$g" --port "$lp" -t "${THREADS:-2}" -c 4096 -np 1 >"$out/llama-server.log" 2>&1 & ls=$!
  fi
  trap 'kill $st ${ls:-} ${gw:-} 2>/dev/null || true' EXIT
  wait_up "http://127.0.0.1:$sp" || die "station did not start"
  "$bin/moonshine" serve --station "http://127.0.0.1:$sp" --listen "127.0.0.1:$gp" >"$out/gateway.log" 2>&1 & gw=$!
  wait_up "http://127.0.0.1:$gp" || die "gateway did not start"
  [ -z "$lp" ] || wait_up "http://127.0.0.1:$lp" || die "llama-server did not start"
  python3 - "$preset" "$gp" "$lp" "$sp" "$turns" "$per_turn" "$out" <<'PY'
import json, statistics, sys, time, urllib.error, urllib.request
preset, gp, lp, sp = sys.argv[1:5]
turns, n, out = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
asks = ["Tell me about the history of Paris.", "And of Berlin?", "Compare the two.",
        "Which has more museums?", "Summarise everything so far."]

def station_rows():
    # Positions our station embedded so far (its /metrics), to count what each turn processed.
    # /embed rows (the per-hop client) plus /chain rows (the chain client); one of them moves.
    text = urllib.request.urlopen(f"http://127.0.0.1:{sp}/metrics", timeout=10).read().decode()
    got = [int(float(l.split()[1])) for l in text.splitlines()
           if l.startswith(("fat_station_tokens_total ", "fat_station_chain_rows_total "))]
    return sum(got) if got else None

def turn(port, msgs):
    """One streamed chat turn: (time to first token, total, reply, usage, llama timings)."""
    ask = {"messages": msgs, "max_tokens": n, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}}
    if port == lp:
        # llama-server's own fields (our gateway refuses what it does not honour): keep the
        # prompt cache on and run every turn to max_tokens.
        ask.update({"ignore_eos": True, "cache_prompt": True})
    body = json.dumps(ask).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.time(); ttft = None; text = []; usage = {}; timings = None
    try:
        r = urllib.request.urlopen(req, timeout=900)
    except urllib.error.HTTPError as e:
        sys.exit(f"hybrid-bench: {port}: {e.code} {e.read()[:300]!r}")
    with r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            for c in ev.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.time() - t0
                    text.append(piece)
            usage = ev.get("usage") or usage
            timings = ev.get("timings") or timings
    return ttft, time.time() - t0, "".join(text), usage, timings

rows = {}
for name, port in (("aeon", gp), ("llama-server", lp)):
    if not port:
        continue
    msgs = []
    for t in range(turns):
        msgs.append({"role": "user", "content": asks[t % len(asks)]})
        before = station_rows() if name == "aeon" else None
        ttft, total, reply, u, tm = turn(port, msgs)
        msgs.append({"role": "assistant", "content": reply})
        # Prompt positions processed this turn: llama-server's timings.prompt_n; ours, the
        # station's embedded rows less the generated tokens (each is embedded once).
        if name == "aeon":
            after = station_rows()
            prompt_n = (after - before - (u.get("completion_tokens") or 0)
                        if None not in (before, after) else None)
        else:
            prompt_n = (tm or {}).get("prompt_n")
        r = {"preset": preset, "engine": name, "turn": t + 1,
             "ttft_s": round(ttft, 3) if ttft is not None else None, "total_s": round(total, 3),
             "prompt_tokens": u.get("prompt_tokens"), "prompt_processed": prompt_n,
             "completion_tokens": u.get("completion_tokens")}
        rows.setdefault(name, []).append(r)
        print(json.dumps(r), flush=True)

def summary(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "n/a"
    return f"{statistics.median(vals):.3f} [{min(vals):.3f}-{max(vals):.3f}]"
for name, rs in rows.items():
    later = rs[1:]  # turns 2.. (the first turn has no earlier context to reuse)
    print(json.dumps({"preset": preset, "engine": name, "turns": len(rs),
                      "ttft_s_median_min_max": summary([r["ttft_s"] for r in rs]),
                      "total_s_median_min_max": summary([r["total_s"] for r in rs]),
                      "later_turns_ttft_s": summary([r["ttft_s"] for r in later]),
                      "prompt_processed": [r["prompt_processed"] for r in rs],
                      "prompt_tokens": [r["prompt_tokens"] for r in rs]}), flush=True)
PY
  kill $st ${ls:-} $gw 2>/dev/null || true; wait 2>/dev/null || true
done
