#!/usr/bin/env bash
# The foothold: the whole stack in one invocation, as it runs on the device inside a sliver:
#   swerve cline base:scratch -- bash /opt/aeon/foothold.sh
# (scripts/r1/sliver-install.sh puts the binaries, specs and the model into the rootfs before
# admission; no --bind is needed.) It prints the seed report's header
#   === aeon-shell foothold inside a swerve sliver: x86_64 / "Debian GNU/Linux 12 (bookworm)" ===
# (machine from uname -m, OS from the rootfs's /etc/os-release) and the three verdict lines:
#   1) monster-guard: quality spec passed -> delegated
#   2) The capital of France is ->  Paris          (a station + moonshine)
#   3) cache_hit:true argmax 12095 logit <L>       (the foil collector holds the residue)
#
# Environment (defaults are the sliver layout that scripts/demo.sh builds):
#   AEON_BIN         directory of the binaries          (/opt/aeon/bin)
#   AEON_SPECS       directory of the qspecs            (/opt/aeon/specs)
#   AEON_MODELS_DIR  directory holding the Qwen .knot   (first of $AEON_MODELS_DIR, /models,
#                                                        ~/.cache/aeon-shell/models that holds it)
#   AEON_STATE       scratch state (grants, logs, data) (${TMPDIR:-/tmp}/aeon-foothold)
#   AEON_PORT, AEON_FOIL_PORT   station and collector ports (8080, 8886)
#   AEON_WAIT_S      seconds to wait for the station and the collector to answer (120)
set -euo pipefail

bin=${AEON_BIN:-/opt/aeon/bin}
specs=${AEON_SPECS:-/opt/aeon/specs}
state=${AEON_STATE:-${TMPDIR:-/tmp}/aeon-foothold}
port=${AEON_PORT:-8080}
foil_port=${AEON_FOIL_PORT:-8886}
model=qwen2.5-coder-0.5b-instruct-q4_k_m.knot
prompt="The capital of France is"

die() { echo "foothold: $*" >&2; exit 1; }
[ -x "$bin/fat-station" ] || die "no binaries in $bin (set AEON_BIN)"
# The model: swerve passes no host environment into a sliver (--setenv AEON_MODELS_DIR=... does),
# and a directory named outside may not exist inside.
models=""
for d in "${AEON_MODELS_DIR:-}" /models "${HOME:-/nonexistent}/.cache/aeon-shell/models"; do
  if [ -n "$d" ] && [ -f "$d/$model" ]; then models=$d; break; fi
done
[ -n "$models" ] || die "model $model not in \$AEON_MODELS_DIR, /models or ~/.cache/aeon-shell/models (run scripts/fetch-model.sh, then scripts/r1/sliver-install.sh ROOTFS)"
export AEON_MODELS_DIR=$models
knot=$AEON_MODELS_DIR/$model

# The seed report's header: where this runs. Inside swerve, PID 1 is swerve's own init.
os=$( (. /etc/os-release 2>/dev/null && printf '%s' "${PRETTY_NAME:-${NAME:-unknown}}") || echo unknown)
if [ "$(cat /proc/1/comm 2>/dev/null)" = swerve ]; then where="inside a swerve sliver"; else where="OUTSIDE a sliver"; fi
echo "=== aeon-shell foothold $where: $(uname -m) / \"$os\" ==="
rm -rf "$state" && mkdir -p "$state"
export MONSTER_GUARD_HOME=$state/guard PARIS_PROBE=$bin/paris-probe

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# A plain HTTP GET with bash's /dev/tcp, so the sliver needs no curl or wget: prints the body
# of a 200 response, fails otherwise.
http_get() {
  local host=$1 port=$2 path=$3 resp
  { exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$host" >&3
  resp=$(cat <&3) || true
  exec 3>&-
  [[ $resp == "HTTP/1."?" 200"* ]] || return 1
  printf '%s' "${resp#*$'\r\n\r\n'}"
}

# Waits until an HTTP endpoint answers, or the server ($3, a pid) has died.
# AEON_WAIT_S (default 120): an emulated aarch64 station on a busy host needs well over 20 s.
wait_http() {
  local deadline=$((SECONDS + ${AEON_WAIT_S:-120}))
  while [ $SECONDS -lt $deadline ]; do
    if http_get 127.0.0.1 "$1" "$2" >/dev/null; then return 0; fi
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      tail -n 5 "$state"/*.log >&2 2>/dev/null || true
      die "the server for 127.0.0.1:$1 exited before answering $2 (logs in $state)"
    fi
    sleep 0.1
  done
  tail -n 5 "$state"/*.log >&2 2>/dev/null || true
  die "127.0.0.1:$1$2 did not come up in ${AEON_WAIT_S:-120} s (logs in $state)"
}

# 1) The gate: the model earns its grant by passing the quality spec.
"$bin/monster-guard" init >/dev/null
out=$("$bin/monster-guard" delegate paris net,fs --ttl 1h --qspec "$specs/paris.json" 2>&1) || { echo "$out" >&2; die "the quality spec refused the model"; }
grep -q "quality spec passed -> delegated" <<<"$out" || { echo "$out" >&2; die "unexpected delegate output"; }
echo "1) monster-guard: quality spec passed -> delegated"

# 2) A station serving the admitted model under the grant's lease, and moonshine asking it.
"$bin/foil-control" --host 127.0.0.1 --port "$foil_port" --data-dir "$state/foil" >"$state/foil.log" 2>&1 &
pids+=($!)
"$bin/monster-guard" run --name paris --caps net,fs --lease 600 -- \
  "$bin/fat-station" --knot "$knot" --listen "127.0.0.1:$port" >"$state/station.log" 2>&1 &
pids+=($!)
wait_http "$port" /health $!
answer=$("$bin/moonshine" --oneoff -c "$prompt" --station "http://127.0.0.1:$port")
echo "2) $answer"

# 3) The probe posts its residue to the collector; the collector hands it back.
wait_http "$foil_port" /.aeon/health "${pids[0]}"
GNOSIS_FOIL_CACHE_URL="http://127.0.0.1:$foil_port" \
  "$bin/paris-probe" --station "http://127.0.0.1:$port" --tokens 785,6722,315,9625,374 --expected 12095 \
  >"$state/probe.out" 2>"$state/probe.err" || { cat "$state/probe.out" "$state/probe.err" >&2; die "probe failed"; }
key=$(sed -n 's/^foil-cache-admit: status=200 key=//p' "$state/probe.err")
[ -n "$key" ] || { cat "$state/probe.err" >&2; die "the probe did not admit its residue"; }
rec=$(http_get 127.0.0.1 "$foil_port" "/.aeon/model-forward-cache?key=$key") || die "collector lookup failed"
hit=$(grep -o '"cache_hit": *[a-z]*' <<<"$rec" | sed 's/.*: *//')
argmax=$(grep -o '"argmax": *[0-9]*' <<<"$rec" | sed 's/.*: *//')
logit=$(grep -o '"logit": *[-0-9.e]*' <<<"$rec" | head -1 | sed 's/.*: *//')
echo "3) cache_hit:$hit argmax $argmax logit $logit"
[ "$hit" = true ] && [ "$argmax" = 12095 ]
