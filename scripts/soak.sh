#!/usr/bin/env bash
# Soak: a station and a `moonshine serve` gateway under ordinary and hostile clients at once,
# on loopback, for a bounded time (issue 17). Prints station and gateway RSS before, during
# (peak) and after, /health p50/p99 during, and statuses/errors by kind; checks the targets:
# /health p99 < 100 ms, RSS back within 10% of its start, zero 5xx on well-formed requests,
# zero panics. Exit 0 when every target holds, 1 otherwise, 2 on a setup failure.
#
#   scripts/soak.sh [--duration SECONDS] [--model FILE.knot] [--keep-logs]
#
# Load for the whole duration: wrk at 64 connections (48 on /forward, one row through every
# layer; 16 on /health), 20 slowloris clients, 10 clients withholding the end of a 64 MiB body,
# 100 session churners, 40 concurrent streamed chat completions on the gateway of which half
# disconnect after their first chunk (scripts/soak-clients.py). Installs wrk with apt-get when
# it is missing (root). Default model: SmolLM2-135M from the model cache.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

duration=60
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
model="$models/smollm2-135m-instruct-q4_1.knot"
keep_logs=0
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$duration" in ''|*[!0-9]*) echo "soak.sh: --duration takes whole seconds" >&2; exit 2 ;; esac
[ -f "$model" ] || { echo "soak.sh: no model at $model (scripts/fetch-model.sh)" >&2; exit 2; }

if ! command -v wrk >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "== apt-get install wrk"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk) >/dev/null
  fi
  command -v wrk >/dev/null || { echo "soak.sh: wrk is missing (apt-get install wrk)" >&2; exit 2; }
fi
bin=target/release
if [ ! -x $bin/fat-station ] || [ ! -x $bin/moonshine ]; then
  echo "== cargo build --release -p fat-station -p moonshine"
  cargo build --release -p fat-station -p moonshine
fi

work=$(mktemp -d /tmp/aeon-soak.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$keep_logs" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Waits for a ready line with a URL on FILE; prints the URL.
url_of() {
  for _ in $(seq 1 300); do
    u=$(grep -o 'http://[0-9.:]*' "$1" 2>/dev/null | head -1 || true)
    [ -n "$u" ] && { echo "$u"; return 0; }
    sleep 0.1
  done
  echo "soak.sh: no ready line in $1" >&2; cat "${1%.out}.err" >&2 || true; exit 2
}

# The station: enough session slots for the churners and the gateway's streams.
# Sessions idle 20 s expire (the default keeps them 600 s for reuse), so the run also shows
# the memory of 160 abandoned sessions coming back.
idle_s=20
$bin/fat-station --knot "$model" --listen 127.0.0.1:0 --max-sessions 160 --session-idle-s $idle_s \
  >"$work/station.out" 2>"$work/station.err" &
pids+=($!); station_pid=$!
station=$(url_of "$work/station.out")
$bin/moonshine serve --station "$station" --listen 127.0.0.1:0 --max-concurrent 4 \
  --max-queue 64 >"$work/gateway.out" 2>"$work/gateway.err" &
pids+=($!); gateway_pid=$!
gateway=$(url_of "$work/gateway.out")

health=$(curl -sf "$station/health" || python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]+'/health').read().decode())" "$station")
hidden=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["hidden"])' "$health")
n_layers=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["n_layers"])' "$health")
layers="0-$n_layers"

# wrk's /forward request: one row of `hidden` f32 through every layer (no session).
python3 - "$hidden" "$layers" >"$work/forward.lua" <<'EOF'
import sys
hidden, layers = int(sys.argv[1]), sys.argv[2]
row = "\\000\\000\\128\\063" * hidden   # 1.0f little-endian
print('wrk.method = "POST"')
print(f'wrk.headers["x-layer-range"] = "{layers}"')
print('wrk.headers["content-type"] = "application/octet-stream"')
print(f'wrk.body = "{row}"')
EOF

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# The heap part of RSS (file-backed pages are the mapped model and the binary's own code).
anon() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# Warm-up: touch the weights, the tokenizer and the gateway once, then take the start RSS.
echo "== warm-up"
wrk -t2 -c4 -d3s -s "$work/forward.lua" "$station/forward" >/dev/null
# The gateway's start RSS is ~8 MiB, a tenth of it the code pages of paths first run during the
# soak: so the warm-up runs them too (plain, streamed, and a stream left after its first chunk).
python3 - "$gateway" <<'EOF'
import json, sys, urllib.request
def ask(stream, leave=False):
    req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=json.dumps({
        "model": "m", "max_tokens": 8, "stream": stream,
        "messages": [{"role": "user", "content": "Hi"}]}).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        r.readline() if leave else r.read()
for _ in range(3):
    ask(False); ask(True); ask(True, leave=True)
EOF
sleep 1
st_before=$(rss $station_pid); gw_before=$(rss $gateway_pid)
st_anon_before=$(anon $station_pid); gw_anon_before=$(anon $gateway_pid)

echo "== soak: ${duration}s on $station (gateway $gateway)"
wrk -t2 -c48 -d"${duration}s" --timeout 10s -s "$work/forward.lua" "$station/forward" \
  >"$work/wrk-forward.txt" 2>&1 &
wrk_f=$!; pids+=($wrk_f)
wrk -t1 -c16 -d"${duration}s" --timeout 10s "$station/health" >"$work/wrk-health.txt" 2>&1 &
wrk_h=$!; pids+=($wrk_h)
timeout $((duration + 60)) python3 scripts/soak-clients.py --station "$station" \
  --gateway "$gateway" --hidden "$hidden" --layers "$layers" \
  --pids "$station_pid,$gateway_pid" --duration "$duration" --out "$work/clients.json"
wait $wrk_f $wrk_h || true

# After: the clients are gone; give the servers a moment to drop what they held.
sleep 5
st_after=$(rss $station_pid); gw_after=$(rss $gateway_pid)
held=$(curl -sf "$station/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["sessions"], h.get("session_bytes", 0))')
echo "== clients gone; waiting for the idle sessions to expire (${idle_s}s; the gateway's idle threads exit meanwhile)"
sleep $((idle_s + 5))
st_expired=$(rss $station_pid); gw_late=$(rss $gateway_pid)
anons="$st_anon_before $(anon $station_pid) $gw_anon_before $(anon $gateway_pid)"

python3 - "$work" "$st_before" "$st_after" "$gw_before" "$gw_after" "$st_expired" $held $anons "$gw_late" "$idle_s" <<'EOF'
import json, re, sys
idle_s = int(sys.argv.pop())
work, sb, sa, gb, ga, se, n_held, kv_held, sab, saa, gab, gaa, gl = sys.argv[1], *map(int, sys.argv[2:])
c = json.load(open(f"{work}/clients.json"))
def wrk(name):
    t = open(f"{work}/wrk-{name}.txt").read()
    req = re.search(r"(\d+) requests in", t)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    lat = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", t)
    return (int(req.group(1)) if req else 0, int(non2xx.group(1)) if non2xx else 0,
            sock.group(1) if sock else "none", lat.group(1) if lat else "?")
panics = {}
for who in ("station", "gateway"):
    panics[who] = sum("panicked" in l for l in open(f"{work}/{who}.err", errors="replace"))
sp, gp = c["rss_peak_kib"]
mib = lambda k: f"{k / 1024:.0f} MiB"
print(f"station RSS: before {mib(sb)}, peak during {mib(sp)}, after {mib(sa)} ({(sa - sb) / sb * 100:+.1f}%; "
      f"{n_held} idle sessions held, KV {kv_held / 2**20:.1f} MiB), after they expired {mib(se)} "
      f"({(se - sb) / sb * 100:+.1f}%)")
print(f"gateway RSS: before {mib(gb)}, peak during {mib(gp)}, after {mib(ga)} ({(ga - gb) / gb * 100:+.1f}%), "
      f"{idle_s + 5} s later {mib(gl)} ({(gl - gb) / gb * 100:+.1f}%)")
print(f"heap (RssAnon) before -> after: station {mib(sab)} -> {mib(saa)}, gateway {gab / 1024:.1f} -> {gaa / 1024:.1f} MiB")
print(f"/health probe (fresh connection every 50 ms): n={c['health_n']} p50 {c['health_p50_ms']:.1f} ms, "
      f"p99 {c['health_p99_ms']:.1f} ms, max {c['health_max_ms']:.1f} ms")
fn, f5, fs, fl = wrk("forward"); hn, h5, hs, hl = wrk("health")
print(f"wrk /forward (48 conns): {fn} requests, mean latency {fl}, non-2xx {f5}, socket errors: {fs}")
print(f"wrk /health (16 conns): {hn} requests, mean latency {hl}, non-2xx {h5}, socket errors: {hs}")
print("clients by kind:")
for k, v in sorted(c["counts"].items()):
    print(f"  {k}: {v}")
print(f"panics: station {panics['station']}, gateway {panics['gateway']}")
# Well-formed requests: wrk's, the probe's, the churners' and the streams'. A 503 is counted
# as a failure too (the station is sized for this load), a 429 from the gateway's queue is not.
bad5 = f5 + h5 + sum(v for k, v in c["counts"].items()
                     if re.match(r"(health|churner|stream) 5\d\d", k))
checks = [
    ("/health p99 < 100 ms", c["health_p99_ms"] < 100),
    ("station RSS back within 10% once idle sessions expired", se <= sb * 1.10),
    ("gateway RSS back within 10% (at the same moment)", gl <= gb * 1.10),
    ("zero 5xx on well-formed requests", bad5 == 0),
    ("zero panics", panics["station"] + panics["gateway"] == 0),
]
ok = True
for name, good in checks:
    print(f"{'PASS' if good else 'FAIL'}  {name}")
    ok &= good
sys.exit(0 if ok else 1)
EOF
