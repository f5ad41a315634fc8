#!/usr/bin/env bash
# Simulated R1 devices on one machine: N fat-stations, each in its own network namespace
# (a veth to a host bridge), its own memory cgroup (the R1's 2.95 GB free RAM by default),
# CPU share (pinned to one core each with taskset, round robin over the host's cores, and a
# cfs quota of --cpus cores), with a delay (12 ms round trip by default, the seed's USB RTT)
# and optionally a bandwidth cap on each station's link. The layers are split evenly, or as
# --split gives them (one contiguous range per node from 0 to the last layer, e.g. the split
# `shard-knot plan` chose);
# moonshine drives them with --mesh FILE, and POST /chain runs them node to node (each node
# may forward to the next).
#
#   scripts/r1-sim.sh up [--nodes N] [--mem SIZE] [--cpus C] [--no-pin] [--link PROFILE]
#                        [--delay MS] [--jitter MS] [--rate RATE] [--hub RATE] [--knot FILE]
#                        [--delay-via auto|netem|proxy] [--kv-dtype f32|f16] [--split A-B,B-C,...]
#                        [-- STATION ARGS]
#   scripts/r1-sim.sh check         # one POST /chain through every node: prints the token
#   scripts/r1-sim.sh status        # the mesh file, the link, each node's peak RSS and memory
#   scripts/r1-sim.sh down          # stop the stations, remove namespaces, cgroups, links
#
# Topology: a star, as devices on a USB hub: host bridge r1sim-br (10.77.0.1/24), node i at
# 10.77.0.(10+i):8080 in namespace r1sim-i (names and subnet: R1SIM_NAME, R1SIM_NET).
# Traffic stays on that bridge: nothing is routed elsewhere. The delay is per link and per round trip:
#   netem (when the kernel has sch_netem): delay MS/2 on each end of node i's veth, so a
#     client on the host pays MS per request to a node (node to node: 2 x MS);
#   proxy (no sch_netem, e.g. Firecracker VMs): scripts/r1-sim/delay-proxy.py on the bridge
#     address 10.77.0.1:(17700+i) in front of node i, MS/2 each way; the mesh file and the
#     nodes' next hops (--route-to) name the proxies, so a request to a node pays MS from the
#     host and from the previous node alike. The proxy keeps the bytes each link carried in
#     $R1SIM_STATE/link-bytes.json (by who opened the connection, host or node; see its header).
#   auto (default): netem when `tc qdisc add ... netem` works, else proxy.
# moonshine's chain (--mesh) makes every call from the host (embed, forward per node,
# lm-head), so each chain trip pays (N + 2) x MS of link time; a POST /chain pays N x MS.
#
# Link profiles (--link; --delay, --jitter, --rate and --hub override its figures):
#   none (default)  12 ms round trip, no jitter, no bandwidth cap (the script's old behaviour).
#   usb2            the seed's links: devices on one USB 2.0 hub. 12 ms round trip (the seed
#                   measured ~11-12 ms per hop over USB networking), no jitter, and --hub
#                   35MB: 35 MB/s for the whole hub, shared by every link and direction.
#                   35 MB/s: USB 2.0 signals at 480 Mbit/s (60 MB/s) per host controller,
#                   shared by every device below it and half duplex; the bulk-transfer ceiling
#                   is 13 x 512-byte packets per 125 us microframe = 53 MB/s (USB 2.0 spec
#                   5.8.4, table 5-10), the USB-IF puts protocol overhead at 10-15% of the
#                   60 MB/s, and measured hi-speed disks sustain 25-30 MB/s written and 30-42
#                   MB/s read (CNet's tests, as quoted by Wikipedia's "USB" article; drive
#                   makers quote "mid-30s MB/s").
#   wifi            802.11n on 2.4 GHz, one AP: 15 ms round trip (a few ms over USB), jitter
#                   +-1.5 ms each way, 50 Mbit/s per link per direction (the figure issue 36
#                   reasons with: 600 KB of logits take ~100 ms on it; TCP over 802.11n gets
#                   roughly half to two thirds of the PHY rate, 65-144 Mbit/s for one or two
#                   streams at 20 MHz, so 50 is a middling link). Per link, not shared: an AP
#                   is one half-duplex medium, frames between two nodes cross it twice, so
#                   concurrent transfers are optimistic here; add --hub 50Mbit to share it.
# Rates: bits (20Mbit, 500kbit, 1Gbit: powers of 1000) or bytes as every size in this
#   workspace (35MB = 35e6 B/s, 4M = 4 MiB/s), an optional /s; `none` removes a cap.
#   --rate RATE caps each link, per direction; --hub RATE caps all links and both directions
#   together; --jitter MS varies each one-way delay by up to +-MS/2.
# How each mode shapes:
#   proxy: one delay-proxy.py for all links paces each direction of each link to --rate
#     (all its connections together) and every byte through the --hub bus, first come first
#     served (a USB host controller would interleave transfers; the total is the same). A
#     request from a node to the next node's link crosses the bus twice (up to the host and
#     down, as on USB); one from the host, once.
#   netem: `rate` on both ends of each veth, per link and per direction. There is no queue
#     all links share (the bridge's own qdisc sees only the host's traffic, not node to
#     node), so --hub becomes a 1/N share per link and direction: pessimistic for one stream
#     (one link busy at a time would get the whole hub), optimistic when every link carries
#     both directions at once (the bus would give each 1/2N).
#
# Memory: cgroup v2 (memory.max, cpu.max) or v1 (memory.limit_in_bytes, cpu.cfs_quota_us),
# whichever is mounted; `status` and `down` print each node's peak (memory.peak or
# memory.max_usage_in_bytes). Needs root, ip (iproute2), tc with sch_netem for netem, and
# python3 for the proxy.
# Env: FAT_STATION_BIN (default target/release/fat-station), KNOT_BIN (target/release/knot),
#      AEON_MODELS_DIR,
#      R1SIM_STATE (default /run/r1-sim: pids, logs, mesh.json), R1SIM_NAME (default r1sim:
#      the prefix of the bridge, namespaces, links and cgroups) and R1SIM_NET (default 10.77.0),
#      so two simulations (a test and a bench) can run side by side.
# Exit codes: 0 done; 1 a station did not come up or `check` got no answer; 2 bad usage, not
# root, or a missing tool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE=${R1SIM_STATE:-/run/r1-sim}
BIN=${FAT_STATION_BIN:-$ROOT/target/release/fat-station}
MODELS=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
NAME=${R1SIM_NAME:-r1sim}
[[ $NAME =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "r1-sim: R1SIM_NAME must be 1-8 of [a-z0-9]" >&2; exit 2; }
NET=${R1SIM_NET:-10.77.0}
[[ $NET =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "r1-sim: R1SIM_NET must be 10.X.Y" >&2; exit 2; }
BR=$NAME-br

die() { echo "r1-sim: $*" >&2; exit "${2:-2}"; }

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }

# Bytes of a size like 2.95G, 512M, 3Gi (decimal G = 1e9, Gi = 2^30).
bytes() {
  python3 - "$1" <<'EOF' || die "bad size $1"
import re, sys
m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?", sys.argv[1].strip(), re.I)
if not m:
    sys.exit(1)
n, unit, binary = float(m[1]), m[2].upper(), m[3]
base = 1024 if binary else 1000
print(int(n * base ** " KMGT".index(unit or " ")))
EOF
}

# Bytes per second of a rate like 20Mbit, 500kbit (bits, powers of 1000, as tc and network
# gear count), 35MB or 4M (bytes, the workspace's size rule: aeon_cli::size), optionally with
# /s; `none` prints 0 (no cap). Args: the rate, the flag it came from.
rate_bytes() {
  python3 - "$1" <<'EOF' || die "bad $2 $1 (e.g. 20Mbit, 500kbit, 35MB, none)"
import re, sys
s = sys.argv[1].strip()
if s.lower() == "none":
    print(0)
    sys.exit(0)
m = re.fullmatch(r"(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)(?:/s)?", s, re.I)
if not m:
    sys.exit(1)
n, unit = float(m[1]), m[2].lower()
bits = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
size = {"b": 1, "k": 2**10, "ki": 2**10, "kib": 2**10, "m": 2**20, "mi": 2**20, "mib": 2**20,
        "g": 2**30, "gi": 2**30, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9}
if unit in bits:
    r = n * bits[unit] / 8
elif unit in size:
    r = n * size[unit]
else:
    sys.exit(1)
if not 1 <= r <= 1e11:
    sys.exit(1)
print(int(round(r)))
EOF
}

# The cgroup directory of node i for a controller (v1: one hierarchy per controller).
cg_v2() { [ -f /sys/fs/cgroup/cgroup.controllers ]; }
cg_dir() { # controller i
  if cg_v2; then echo "/sys/fs/cgroup/$NAME-$2"; else echo "/sys/fs/cgroup/$1/$NAME-$2"; fi
}

peak_of() { # i -> "now peak" in MiB, or "? ?"
  local d; d=$(cg_dir memory "$1")
  local now peak
  if cg_v2; then
    now=$(cat "$d/memory.current" 2>/dev/null || echo 0); peak=$(cat "$d/memory.peak" 2>/dev/null || echo 0)
  else
    now=$(cat "$d/memory.usage_in_bytes" 2>/dev/null || echo 0)
    peak=$(cat "$d/memory.max_usage_in_bytes" 2>/dev/null || echo 0)
  fi
  echo "$((now >> 20)) $((peak >> 20))"
}

cmd_status() {
  [ -f "$STATE/nodes" ] || die "not up (no $STATE/nodes)" 1
  echo "mesh: $STATE/mesh.json"
  [ -f "$STATE/link" ] && cat "$STATE/link"
  cat "$STATE/mesh.json"; echo
  local n; n=$(cat "$STATE/nodes")
  for ((i = 0; i < n; i++)); do
    read -r now peak <<<"$(peak_of "$i")"
    local hwm="?"
    [ -f "$STATE/node$i.pid" ] \
      && hwm=$(awk '/^VmHWM/ { print int($2 / 1024) }' "/proc/$(cat "$STATE/node$i.pid")/status" 2>/dev/null)
    echo "node $i: peak RSS ${hwm:-?} MiB; cgroup memory ${now} MiB now, ${peak} MiB peak (limit $(cat "$STATE/mem"))"
  done
}

cmd_down() {
  local n=0
  [ -f "$STATE/nodes" ] && n=$(cat "$STATE/nodes")
  [ "$n" -gt 0 ] && cmd_status 2>/dev/null | grep '^node' || true
  local pids=()
  for p in "$STATE"/*.pid; do
    [ -f "$p" ] || continue
    pids+=("$(cat "$p")")
    rm -f "$p"
  done
  [ ${#pids[@]} -gt 0 ] && { kill "${pids[@]}" 2>/dev/null || true; }
  # Wait (up to 5 s) for them to go, so their cgroups can be removed; then SIGKILL.
  local alive
  for _ in $(seq 1 50); do
    alive=0
    for q in "${pids[@]}"; do kill -0 "$q" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for q in "${pids[@]}"; do kill -9 "$q" 2>/dev/null || true; done
  for ((i = 0; i < (n > 0 ? n : 8); i++)); do
    ip netns del "$NAME-$i" 2>/dev/null || true
    ip link del "$NAME-h$i" 2>/dev/null || true
    for c in memory cpu cpuset; do
      local d; d=$(cg_dir "$c" "$i")
      [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
    done
  done
  ip link del "$BR" 2>/dev/null || true
  rm -f "$STATE/nodes" "$STATE/link"
}

netem_works() {
  ip link add $NAME-probe type dummy 2>/dev/null || return 1
  local ok=1
  tc qdisc add dev $NAME-probe root netem delay 1ms 2>/dev/null && ok=0
  ip link del $NAME-probe 2>/dev/null || true
  return $ok
}

cmd_up() {
  local n=2 mem=2.95G cpus=1 pin=1 via=auto kv=f32 knot="" split=""
  # The link: a profile's figures, then any explicit --delay/--jitter/--rate over them.
  local link=none delay="" jitter="" rate="" hub=""
  while [[ $# -gt 0 ]]; do
    case $1 in --no-pin|--|-h|--help) ;; --*) [[ $# -ge 2 ]] || die "$1 needs a value" ;; esac
    case $1 in
      --nodes) n=$2; shift 2 ;;
      --mem) mem=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --no-pin) pin=0; shift ;;
      --link) link=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --jitter) jitter=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --hub) hub=$2; shift 2 ;;
      --delay-via) via=$2; shift 2 ;;
      --knot) knot=$2; shift 2 ;;
      --kv-dtype) kv=$2; shift 2 ;;
      --split) split=$2; shift 2 ;;
      --) shift; break ;;
      -h|--help) usage ;;
      *) die "unknown argument $1 (see --help)" ;;
    esac
  done
  local extra=("$@")
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "--nodes must be 1-99"
  # Profile figures (sources in the header).
  local p_delay p_jitter p_rate p_hub
  case $link in
    none) p_delay=12 p_jitter=0 p_rate=none p_hub=none ;;
    usb2) p_delay=12 p_jitter=0 p_rate=none p_hub=35MB ;;
    wifi) p_delay=15 p_jitter=3 p_rate=50Mbit p_hub=none ;;
    *) die "--link must be none, usb2 or wifi" ;;
  esac
  delay=${delay:-$p_delay} jitter=${jitter:-$p_jitter} rate=${rate:-$p_rate} hub=${hub:-$p_hub}
  [[ $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay must be milliseconds"
  [[ $jitter =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--jitter must be milliseconds"
  # Bytes per second per link and direction, and for the whole hub; 0 = no cap.
  local rate_bps hub_bps
  rate_bps=$(rate_bytes "$rate" --rate)
  hub_bps=$(rate_bytes "$hub" --hub)
  [[ $cpus =~ ^[0-9]+(\.[0-9]+)?$ ]] && python3 -c "import sys; sys.exit(not float('$cpus') > 0)" \
    || die "--cpus must be a positive number of cores"
  [ "$(id -u)" -eq 0 ] || die "needs root (namespaces, cgroups)"
  command -v ip >/dev/null || die "needs ip (iproute2)"
  command -v python3 >/dev/null || die "needs python3"
  [ "$pin" = 0 ] || command -v taskset >/dev/null || die "needs taskset (util-linux), or --no-pin"
  [ -x "$BIN" ] || die "no station binary at $BIN (cargo build --release -p fat-station)"
  knot=${knot:-$MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.knot}
  [ -f "$knot" ] || die "no model at $knot (scripts/fetch-model.sh)"
  local limit; limit=$(bytes "$mem")
  case $via in
    auto) if netem_works; then via=netem; else via=proxy; fi ;;
    netem) netem_works || die "this kernel has no sch_netem: use --delay-via proxy" ;;
    proxy) ;;
    *) die "--delay-via must be auto, netem or proxy" ;;
  esac
  # netem has no queue shared by all links: each gets the hub's 1/N share (header).
  local link_bps=$rate_bps
  if [ "$via" = netem ] && [ "$hub_bps" -gt 0 ]; then
    local share=$((hub_bps / n))
    [ "$link_bps" -eq 0 ] || [ "$share" -lt "$link_bps" ] && link_bps=$share
  fi
  [ -f "$STATE/nodes" ] && cmd_down >/dev/null 2>&1
  mkdir -p "$STATE"
  echo "$n" >"$STATE/nodes"
  echo "$mem" >"$STATE/mem"
  local knotbin=${KNOT_BIN:-$ROOT/target/release/knot} layers
  [ -x "$knotbin" ] || die "no knot binary at $knotbin (cargo build --release -p knot-format)"
  layers=$("$knotbin" inspect --json "$knot" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["arch"]["n_layers"])') \
    || die "could not read n_layers of $knot"
  [[ $layers =~ ^[0-9]+$ ]] || die "could not read n_layers of $knot"
  [ "$n" -le "$layers" ] || die "$n nodes for $layers layers"
  # Each node's first layer, then the end: even, or --split's ranges.
  local starts=()
  if [ -n "$split" ]; then
    starts=($(python3 -c '
import sys
spec, n, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    r = [tuple(int(x) for x in p.split("-")) for p in spec.split(",")]
except ValueError:
    sys.exit(1)
ok = len(r) == n and all(len(p) == 2 and p[0] < p[1] for p in r) and r[0][0] == 0 \
    and r[-1][1] == layers and all(r[i][1] == r[i + 1][0] for i in range(n - 1))
if not ok:
    sys.exit(1)
print(" ".join(str(p[0]) for p in r), layers)
' "$split" "$n" "$layers")) && [ ${#starts[@]} -eq $((n + 1)) ] \
      || die "--split must be $n contiguous ranges A-B from 0 to $layers"
  else
    for ((i = 0; i <= n; i++)); do starts+=($((i * layers / n))); done
  fi

  ip link add "$BR" type bridge
  ip addr add "$NET.1/24" dev "$BR"
  ip link set "$BR" up
  local threads; threads=$(python3 -c "import math; print(max(1, math.ceil(float('$cpus'))))")
  local ncores; ncores=$(nproc)
  local period=100000 quota; quota=$(python3 -c "print(int(float('$cpus') * 100000))")
  local hops=() urls=()
  for ((i = 0; i < n; i++)); do
    if [ "$via" = proxy ]; then urls+=("http://$NET.1:$((17700 + i))")
    else urls+=("http://$NET.$((10 + i)):8080"); fi
  done
  for ((i = 0; i < n; i++)); do
    local ns=$NAME-$i host=$NAME-h$i ip=$NET.$((10 + i))
    ip netns add "$ns"
    ip link add "$host" type veth peer name eth0 netns "$ns"
    ip link set "$host" master "$BR" up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    if [ "$via" = netem ]; then
      # Each end delays its egress by half the round trip (+- half the jitter) and serialises
      # it at the link's rate; a deeper queue than netem's 1000 packets, so a capped burst
      # waits instead of being dropped.
      local half jit shape=()
      half=$(python3 -c "print($delay / 2)"); jit=$(python3 -c "print($jitter / 2)")
      shape=(delay "${half}ms")
      python3 -c "import sys; sys.exit(not float('$jitter') > 0)" && shape+=("${jit}ms")
      [ "$link_bps" -gt 0 ] && shape+=(rate "$((link_bps * 8))bit" limit 10000)
      tc qdisc add dev "$host" root netem "${shape[@]}"
      ip netns exec "$ns" tc qdisc add dev eth0 root netem "${shape[@]}"
    fi
    # Memory and CPU: a cgroup per node, the station started inside it.
    local mdir cdir; mdir=$(cg_dir memory "$i"); cdir=$(cg_dir cpu "$i")
    if cg_v2; then
      grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control
      grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
      mkdir -p "$mdir"
      echo "$limit" >"$mdir/memory.max"
      echo "$quota $period" >"$mdir/cpu.max"
    else
      mkdir -p "$mdir" "$cdir"
      echo "$limit" >"$mdir/memory.limit_in_bytes"
      echo "$period" >"$cdir/cpu.cfs_period_us"
      echo "$quota" >"$cdir/cpu.cfs_quota_us"
    fi
    local a=${starts[$i]} b=${starts[$((i + 1))]} role=mid
    [ "$i" -eq 0 ] && role=entry
    [ "$i" -eq $((n - 1)) ] && role=exit
    [ "$n" -eq 1 ] && role=full
    local args=(--knot "$knot" --listen "$ip:8080" --threads "$threads" --kv-dtype "$kv")
    [ "$role" != full ] && args+=(--role "$role" --layers "$a..$b")
    [ "$i" -lt $((n - 1)) ] && args+=(--route-to "${urls[$((i + 1))]}")
    local pinned=()
    [ "$pin" = 1 ] && pinned=(taskset -c "$((i % ncores))")
    # The shell enters the cgroups, then execs the station (pinned) inside the namespace.
    ( if cg_v2; then echo $BASHPID >"$mdir/cgroup.procs"
      else echo $BASHPID >"$mdir/cgroup.procs"; echo $BASHPID >"$cdir/cgroup.procs"; fi
      exec "${pinned[@]}" ip netns exec "$ns" "$BIN" "${args[@]}" "${extra[@]}" ) \
      >"$STATE/node$i.log" 2>&1 &
    echo $! >"$STATE/node$i.pid"
    hops+=("{\"url\": \"${urls[$i]}\", \"layers\": \"$a-$b\"}")
  done
  if [ "$via" = proxy ]; then
    # One process for every link, so they can share the hub's bus.
    local half pairs=()
    half=$(python3 -c "print($delay / 2)")
    for ((i = 0; i < n; i++)); do pairs+=("$NET.1:$((17700 + i))=$NET.$((10 + i)):8080"); done
    python3 "$ROOT/scripts/r1-sim/delay-proxy.py" "$half" "${pairs[@]}" \
      --jitter "$jitter" --rate "$rate_bps" --bus "$hub_bps" --counts "$STATE/link-bytes.json" \
      >"$STATE/proxy.log" 2>&1 &
    echo $! >"$STATE/proxy.pid"
  fi
  local IFS=,
  echo "{\"model\": \"$(basename "$knot" .knot)\", \"stations\": [${hops[*]}]}" >"$STATE/mesh.json"
  unset IFS
  # Ready: every station answers /health (through its link).
  for ((i = 0; i < n; i++)); do
    local ok=0
    for _ in $(seq 1 300); do
      if python3 - "$STATE/mesh.json" "$i" <<'EOF' 2>/dev/null; then ok=1; break; fi
import json, sys, urllib.request
url = json.load(open(sys.argv[1]))["stations"][int(sys.argv[2])]["url"]
urllib.request.urlopen(url + "/health", timeout=2).read()
EOF
      sleep 0.2
    done
    [ "$ok" = 1 ] || { tail -5 "$STATE/node$i.log" >&2; die "node $i did not come up" 1; }
  done
  local pinning="pinned round robin over $ncores cores"
  [ "$pin" = 1 ] || pinning="not pinned"
  local shaped="${delay} ms"
  python3 -c "import sys; sys.exit(not float('$jitter') > 0)" \
    && shaped+=" +-$(python3 -c "print($jitter / 2)") ms each way"
  mbit() { python3 -c "print(f'{$1 * 8 / 1e6:g}')"; }
  [ "$link_bps" -gt 0 ] && shaped+=", $(mbit "$link_bps") Mbit/s each way"
  shaped+=" per link"
  if [ "$hub_bps" -gt 0 ]; then
    if [ "$via" = netem ]; then shaped+=" (the hub's $(mbit "$hub_bps") Mbit/s split)"
    else shaped+=", a $(mbit "$hub_bps") Mbit/s hub shared by all"; fi
  fi
  echo "link $link: $shaped via $via" >"$STATE/link"
  echo "r1-sim: $n nodes up ($mem, $cpus cpu each, $pinning, $(cat "$STATE/link")); mesh file:"
  echo "$STATE/mesh.json"
}

# One POST /chain with the tokens of "The capital of France is" (Qwen's ids) to the entry,
# X-Route naming the other nodes: every node runs its layers and forwards to the next itself.
cmd_check() {
  [ -f "$STATE/nodes" ] || die "not up (no $STATE/nodes)" 1
  python3 - "$STATE/mesh.json" <<'EOF' || die "no answer from the chain" 1
import json, sys, time, urllib.error, urllib.request
hops = json.load(open(sys.argv[1]))["stations"]
headers = {"X-Return": "token", "Content-Type": "application/json"}
if len(hops) > 1:
    headers["X-Route"] = ",".join(h["url"] for h in hops[1:])
req = urllib.request.Request(
    hops[0]["url"] + "/chain",
    data=json.dumps({"tokens": [785, 6722, 315, 9625, 374]}).encode(),
    headers=headers,
    method="POST",
)
t0 = time.monotonic()
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        body, trace = json.load(r), r.headers.get("X-Chain-Trace", "")
except urllib.error.HTTPError as e:
    sys.exit(f"r1-sim: /chain answered {e.code}: {e.read()[:300]!r}")
except OSError as e:
    sys.exit(f"r1-sim: /chain: {e}")
ms = (time.monotonic() - t0) * 1000
print(f"r1-sim: /chain through {len(hops)} nodes: token {body['token']} "
      f"(logit {body['logit']:.3f}) in {ms:.0f} ms; trace {trace}")
EOF
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  check) cmd_check ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) usage ;;
esac
