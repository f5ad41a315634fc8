#!/usr/bin/env bash
# Disk-paged mode, measured (issue 23): a station whose memory limit is below the size of the
# weights it serves still answers; the kernel pages the mmapped weights in from the file on
# every token. For each limit this prints decode tok/s, the bytes read from storage per token
# (/proc/PID/io read_bytes: real device reads, not page-cache hits) and the cgroup's peak.
#
#   scripts/bench/paged-bench.sh [--knot FILE] [--limits "none 400M 300M 200M"] [-n TOKENS]
#
# Each run: drop the page cache (so the weights come from the disk, as on a device after
# boot), start fat-station in a fresh memory cgroup (v2 memory.max, or v1
# memory.limit_in_bytes, swap off for it), prefill a prompt, then decode TOKENS greedy tokens
# with moonshine and read the station's counters around the decode only. Needs root (cgroups,
# drop_caches). The station's --pack-weights auto (the default) sees the cgroup limit: below
# the weights it keeps them in the mapped file (block kernels, pageable) instead of packing
# them into 16-row copies, which are anonymous memory that nothing can page back in, so a
# packed station under such a limit would be OOM-killed; it also pins (mlock) as many matrices
# as fit in the limit less 128 MiB, so a token re-reads only the rest. Pages of the file that
# another process keeps mapped are neither dropped nor charged here: pass a private copy
# (--knot) when anything else is using the model. Env: FAT_STATION_BIN, MOONSHINE_BIN (default target/release/...),
# AEON_MODELS_DIR. Exit: 0 table printed; 1 a run failed; 2 bad usage, not root, no model.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
knot=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.knot
limits="none 400M 300M 200M"
tokens=32
die() { echo "paged-bench: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --knot) knot=$2; shift 2 ;;
    --limits) limits=$2; shift 2 ;;
    -n) tokens=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$tokens" in ''|*[!0-9]*|0) die "-n takes a positive whole number" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (memory cgroups, drop_caches)"
[ -f "$knot" ] || die "no model at $knot (scripts/fetch-model.sh)"
station=${FAT_STATION_BIN:-$root/target/release/fat-station}
moon=${MOONSHINE_BIN:-$root/target/release/moonshine}
[ -x "$station" ] && [ -x "$moon" ] || die "build first: cargo build --release -p fat-station -p moonshine"

if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg_root=/sys/fs/cgroup; v=2
elif [ -d /sys/fs/cgroup/memory ]; then
  cg_root=/sys/fs/cgroup/memory; v=1
else
  die "no memory cgroup (v2 /sys/fs/cgroup or v1 /sys/fs/cgroup/memory)"
fi
cg=$cg_root/aeon-paged-$$
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT

bytes() { numfmt --from=iec "${1%B}"; }
read_bytes() { awk '/^read_bytes/ {print $2}' "/proc/$1/io"; }
peak() {
  if [ $v = 2 ]; then cat "$cg/memory.peak" 2>/dev/null || echo 0
  else cat "$cg/memory.max_usage_in_bytes"; fi
}

size=$(stat -c %s "$knot")
printf '# %s, %s, %d greedy tokens after a 5-token prompt, page cache dropped before each run\n' \
  "$(basename "$knot")" "$(numfmt --to=iec "$size")" "$tokens"
printf '%-6s | %9s | %10s | %14s | %9s\n' limit "tok/s" "load ms" "read MiB/token" "peak MiB"
for lim in $limits; do
  mkdir "$cg"
  if [ "$lim" != none ]; then
    b=$(bytes "$lim")
    if [ $v = 2 ]; then
      echo "$b" > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
    else
      echo "$b" > "$cg/memory.limit_in_bytes"
      echo "$b" > "$cg/memory.memsw.limit_in_bytes" 2>/dev/null || true
    fi
  fi
  sync; echo 3 > /proc/sys/vm/drop_caches
  log=$(mktemp)
  # The station joins the cgroup before exec, so its first page fault is charged there.
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
    "$station" --knot "$knot" --listen 127.0.0.1:0 --threads 1 > "$log" 2>&1 &
  pid=$!
  url=""
  for _ in $(seq 300); do
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "paged-bench: the station died (limit $lim)" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$url" ] || { echo "paged-bench: no ready line (limit $lim)" >&2; exit 1; }
  t0=$(date +%s%N)
  "$moon" -q --station "$url" --tokens 785,6722,315,9625,374 -n 1 > /dev/null
  load_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  r0=$(read_bytes "$pid")
  out=$("$moon" --station "$url" --tokens 785,6722,315,9625,374 -n "$((tokens + 1))" 2>&1 >/dev/null | tail -1)
  r1=$(read_bytes "$pid")
  # moonshine's last line: "N tokens in S s (X tok/s)"; this run also re-does the prefill.
  tps=$(sed -n 's/.*(\([0-9.]*\) tok\/s).*/\1/p' <<< "$out")
  per=$(awk -v a="$r0" -v b="$r1" -v n="$((tokens + 1))" 'BEGIN { printf "%.1f", (b - a) / n / 1048576 }')
  printf '%-6s | %9s | %10d | %14s | %9d\n' "$lim" "${tps:-?}" "$load_ms" "$per" "$(( $(peak) / 1048576 ))"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rmdir "$cg"
  rm -f "$log"
done
