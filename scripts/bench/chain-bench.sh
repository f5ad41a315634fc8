#!/usr/bin/env bash
# Decode, concurrency and prefill over simulated R1 nodes (scripts/r1-sim.sh: a namespace,
# memory cgroup and core per node, a delay per link) through `moonshine serve`.
#
#   scripts/bench/chain-bench.sh [--nodes N] [--link none|usb2|wifi] [--delay MS] [--rate RATE]
#                                [--hub RATE] [--cpus C] [--mem SIZE] [--streams LIST]
#                                [-n TOKENS] [--reps R] [--kv-dtype f32|f16]
#                                [--knot FILE]   (default: r1-sim.sh's, the real Qwen 0.5B)
#                                [--per-hop]     (the gateway drives every hop: the old path, to compare)
#                                [--split A-B,...] (r1-sim.sh's layer ranges, e.g. shard-knot plan's)
#                                [--ids-out FILE]  (first: 16 greedy ids over the chain into FILE)
#
# --link, --delay, --rate and --hub go to r1-sim.sh up as they are (its header has the
# profiles' figures: usb2 is the seed's shared USB 2.0 hub, wifi a 50 Mbit/s 802.11n link;
# --rate caps each link per direction, e.g. 20Mbit, --hub all links together); unset,
# r1-sim.sh's defaults (12 ms, no cap).
# Per rep and per number of concurrent streams S in LIST (default 1,2,3): S greedy streamed
# /v1/chat/completions at once (prose prompts, each unique so no cached prefix is reused), and
# reports each stream's decode tok/s ((tokens - 1) / time from first to last token), the
# aggregate (all tokens / wall time of the batch, prompt processing included) and the decode
# aggregate (all tokens after each stream's first / time from the earliest first token to the
# latest last one: what the chain sustains while the streams decode side by side; the
# "x 1 stream" column compares these). Then prefill: a ~400-token prompt, 1 token
# out, prompt tokens / time to first token. Prints median [min-max] over R reps, then each
# node's peak RSS (VmHWM) and cgroup memory peak (r1-sim.sh status). Measure on a quiet machine.
# The floor, measured in the same run on the same nodes: a bare loop of `POST /chain` to the
# entry with `X-Return: token` (greedy, one token per request, no gateway), decode tok/s as
# above; the 1-stream row says serve's decode as a fraction of it. Bytes per token: what
# crossed the gateway's links (r1-sim's proxy counts, connections the host opened, both
# directions) per generated token of the 1-stream runs (proxy links only; netem: n/a).
# --ids-out: before the measurements, `moonshine --mesh` generates 16 greedy tokens after
# "The capital of France is" (Qwen's ids) over the nodes and writes their ids, comma separated,
# to FILE (scripts/bench/moe-bench.sh compares them with one process).
# Needs what r1-sim.sh needs, plus target/release/moonshine.
# Exit codes: 0 measured (the table is not a gate); 1 a run failed; 2 bad usage or a missing
# binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MOON=${MOONSHINE_BIN:-$ROOT/target/release/moonshine}
nodes=2 cpus=1 mem=2.95G ntok=48 reps=3 streams=1,2,3 kv=f32 knot=() link=() serve_args=() ids_out=
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --link) link+=(--link "$2"); shift 2 ;;
    --delay) link+=(--delay "$2"); shift 2 ;;
    --rate) link+=(--rate "$2"); shift 2 ;;
    --hub) link+=(--hub "$2"); shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    -n) ntok=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --kv-dtype) kv=$2; shift 2 ;;
    --knot) knot=(--knot "$2"); shift 2 ;;
    --per-hop) serve_args+=(--per-hop); shift ;;
    --split) link+=(--split "$2"); shift 2 ;;
    --ids-out) ids_out=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
    *) echo "chain-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $streams =~ ^[1-9][0-9]?(,[1-9][0-9]?)*$ ]] || { echo "chain-bench: --streams like 1,2,3" >&2; exit 2; }
[ -x "$MOON" ] || { echo "chain-bench: no $MOON (cargo build --release -p moonshine)" >&2; exit 2; }
export R1SIM_STATE=${R1SIM_STATE:-/run/r1-sim-chain-bench}
export R1SIM_NAME=${R1SIM_NAME:-r1bench} R1SIM_NET=${R1SIM_NET:-10.78.0}
out=$(mktemp -d)
serve_pid=
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null
  "$ROOT/scripts/r1-sim.sh" down >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
"$ROOT/scripts/r1-sim.sh" up --nodes "$nodes" "${link[@]}" --cpus "$cpus" --mem "$mem" \
  --kv-dtype "$kv" "${knot[@]}" | tee "$out/up.log"
# The link as r1-sim.sh says it ("link wifi: 15 ms ... via proxy"), for the table.
shape=$(grep -o 'link [a-z0-9]*: [^;]* via [a-z]*' "$out/up.log" || echo "link ?")
if [ -n "$ids_out" ]; then
  "$MOON" --mesh "$R1SIM_STATE/mesh.json" --tokens 785,6722,315,9625,374 -n 16 --temperature 0 \
    --json >"$out/ids.json" 2>"$out/ids.err" || { cat "$out/ids.err" >&2; exit 1; }
  python3 -c 'import json, sys; print(",".join(map(str, json.loads(open(sys.argv[1]).readline())["tokens"])))' \
    "$out/ids.json" >"$ids_out"
  echo "chain-bench: greedy ids over the chain: $(cat "$ids_out")"
fi
"$MOON" serve --mesh "$R1SIM_STATE/mesh.json" --listen 127.0.0.1:0 --max-concurrent 8 ${serve_args[@]+"${serve_args[@]}"} \
  >"$out/serve.log" 2>&1 &
serve_pid=$!
url=
for _ in $(seq 1 100); do
  url=$(grep -o 'http://[0-9.:]*' "$out/serve.log" | head -1 || true)
  [ -n "$url" ] && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$out/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "chain-bench: moonshine serve did not start" >&2; exit 1; }

python3 - "$url" "$streams" "$ntok" "$reps" "$nodes" "$shape" "$cpus" "$kv" "$R1SIM_STATE" <<'EOF'
import json, os, statistics, sys, threading, time, urllib.error, urllib.request

url, streams, ntok, reps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
state = sys.argv[9]
hops = [h["url"] for h in json.load(open(os.path.join(state, "mesh.json")))["stations"]]
entry, route = hops[0], ",".join(hops[1:])


def host_bytes():
    """Bytes through every link on connections the host opened (None without proxy counts)."""
    path = os.path.join(state, "link-bytes.json")
    if not os.path.exists(path):
        return None
    time.sleep(0.5)  # the proxy rewrites the file every 0.2 s
    with open(path) as f:
        return sum(sum(v.get("host", [0, 0])) for v in json.load(f).values())


def post(path, body, headers, timeout=600):
    req = urllib.request.Request(entry + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"chain-bench: {path}: {e.code} {e.read()[:300]!r}")


def floor(rep):
    """A bare /chain loop: prefill a prompt, then ntok greedy tokens one request each;
    (tokens - 1) / time from the first token to the last."""
    prompt = f"Story {rep}. Write a long story about {topics[rep % len(topics)]}.\n\n"
    toks = post("/tokenize", {"text": prompt}, {})["tokens"]
    sid = f"chain-bench-floor-{os.getpid()}-{rep}"
    head = {"X-Session": sid, "X-Return": "token", **({"X-Route": route} if route else {})}
    tok = post("/chain", {"tokens": toks}, {**head, "X-Pos": "0"})["token"]
    pos, times = len(toks), [time.monotonic()]
    for _ in range(ntok - 1):
        tok = post("/chain", {"tokens": [tok]}, {**head, "X-Pos": str(pos)})["token"]
        pos += 1
        times.append(time.monotonic())
    return (len(times) - 1) / (times[-1] - times[0])

topics = ["a lighthouse keeper who finds a letter", "a baker who wakes before dawn",
          "a cartographer mapping a river", "a child who builds a radio",
          "an old ferry crossing a lake", "a beekeeper in a mountain village"]


def stream(prompt, max_tokens):
    """One streamed greedy completion: (tokens, seconds to first token, first->last seconds)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.monotonic()
    times = []
    try:
        r = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"chain-bench: {e.code} {e.read()[:300]!r}")
    with r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                times.append(time.monotonic())
    if not times:
        raise SystemExit("chain-bench: a stream produced no tokens")
    return len(times), times[0] - t0, times[-1] - times[0], times[0], times[-1]


def spread(xs):
    return f"{statistics.median(xs):7.2f} [{min(xs):.2f}-{max(xs):.2f}]"


with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
    model = json.load(r)["data"][0]["id"]
rows = {}
floors, per_token = [], []
for rep in range(reps):
    floors.append(floor(rep))
    for s in streams:
        before = host_bytes() if s == 1 else None
        results = [None] * s
        def one(i):
            prompt = f"Story {rep}.{s}.{i}. Write a long story about {topics[(rep + i) % len(topics)]}.\n\n"
            try:
                results[i] = stream(prompt, ntok)
            except (SystemExit, OSError, ValueError) as e:
                print(f"chain-bench: stream {i}: {e}", file=sys.stderr)
        t0 = time.monotonic()
        th = [threading.Thread(target=one, args=(i,)) for i in range(s)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.monotonic() - t0
        if any(r is None for r in results):
            raise SystemExit("chain-bench: a stream failed")
        per = [(n - 1) / d for n, _, d, _, _ in results if n > 1 and d > 0]
        agg = sum(r[0] for r in results) / wall
        span = max(r[4] for r in results) - min(r[3] for r in results)
        dec = sum(r[0] - 1 for r in results) / span if span > 0 else float("nan")
        rows.setdefault(s, {"per": [], "agg": [], "dec": []})
        rows[s]["per"].append(statistics.mean(per))
        rows[s]["agg"].append(agg)
        rows[s]["dec"].append(dec)
        if before is not None:
            per_token.append((host_bytes() - before) / sum(r[0] for r in results))

# Prefill: a long unique prompt, one token out.
filler = ("The committee met on the third floor to review the quarterly figures, the hiring "
          "plan and the state of the old server room, which had flooded twice in the spring. ")
pre = []
for rep in range(reps):
    prompt = f"Minutes {rep}.\n" + filler * 12 + "\nSummary:"
    n_prompt = None
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1,
            "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        j = json.load(r)
    dt = time.monotonic() - t0
    n_prompt = j["usage"]["prompt_tokens"]
    pre.append(n_prompt / dt)

print(f"\n{sys.argv[5]} nodes, {sys.argv[6]}, {sys.argv[7]} cpu each, kv {sys.argv[8]}; "
      f"{ntok} tokens per stream; median [min-max] of {reps}")
print(f"{'streams':>7} {'per-stream decode tok/s':>26} {'aggregate tok/s':>24} "
      f"{'decode aggregate tok/s':>24} {'x 1 stream':>10}")
base = statistics.median(rows[streams[0]]["dec"]) if streams[0] == 1 else None
for s in streams:
    dec = statistics.median(rows[s]["dec"])
    ratio = f"{dec / base:10.2f}" if base else f"{'-':>10}"
    print(f"{s:7} {spread(rows[s]['per']):>26} {spread(rows[s]['agg']):>24} {spread(rows[s]['dec']):>24} {ratio}")
fl = statistics.median(floors)
print(f"floor (bare POST /chain loop, X-Return: token): {spread(floors)} tok/s")
if 1 in rows:
    one = statistics.median(rows[1]["per"])
    print(f"serve, 1 stream: {one:.2f} tok/s = {one / fl:.3f} x the floor "
          f"({'within' if one >= 0.9 * fl else 'NOT within'} 10%)")
if per_token:
    print(f"bytes across the gateway's links per generated token (1 stream): {spread(per_token)}")
else:
    print("bytes per token: n/a (links shaped by netem; the proxy counts them)")
print(f"prefill ({n_prompt} prompt tokens, 1 out): {spread(pre)} tok/s (prompt tokens / time to answer)")
EOF
"$ROOT/scripts/r1-sim.sh" status | grep '^node' || true
