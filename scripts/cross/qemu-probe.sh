#!/usr/bin/env bash
# Run the aarch64 build under qemu-aarch64 on the real model: the device path, emulated.
#
#   1. paris-probe --dense (in-process engine)                       -> PASS (exit 0)
#   2. fat-station (aarch64, under qemu) + paris-probe --station      -> PASS
#   3. foil-control (aarch64, under qemu): the probe of step 1 posts its residue
#      (GNOSIS_FOIL_CACHE_URL); a lookup of MODEL:dense:TOKENS      -> cache_hit true, argmax 12095
#   4. monster-guard run (aarch64, under qemu) contains a leased command's whole tree, a
#      setsid'd grandchild included, although qemu-user's clone takes no namespace flags
#      (the reaper unshares instead; the host's monster-guard mints the grant) -> exit 0, none left
#
# Usage: scripts/cross/qemu-probe.sh [--model FILE.knot]
# Binaries come from $AEON_ARM64_OUT (default target/aarch64-unknown-linux-musl/release; build
# them with scripts/cross/build-aarch64.sh). The model defaults to
# ${AEON_MODELS_DIR:-~/.cache/aeon-shell/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.knot; when it
# is missing the run is skipped (exit 0) unless AEON_REQUIRE_MODELS=1 (then exit 1).
# Prompt: "The capital of France is" = 785,6722,315,9625,374; expected " Paris" = 12095.
#
# Ends with a line `N passed, M failed`. Exit codes: 0 all passed (or skipped), 1 a step
# failed, 2 bad usage or missing tools/binaries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${AEON_ARM64_OUT:-$ROOT/target/aarch64-unknown-linux-musl/release}"
MODEL="${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.knot"
TOKENS=785,6722,315,9625,374
EXPECTED=12095
STEP_TIMEOUT="${AEON_QEMU_TIMEOUT:-900}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) [[ $# -ge 2 ]] || { echo "qemu-probe: --model needs a file" >&2; exit 2; }; MODEL="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "qemu-probe: unknown argument $1" >&2; exit 2 ;;
    esac
done

say() { printf 'qemu-probe: %s\n' "$*" >&2; }
# qemu-user's qemu-aarch64, or qemu-user-static's qemu-aarch64-static (scripts/test.sh installs one).
QEMU="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
[[ -n "$QEMU" ]] || { say "qemu-aarch64 not found (Debian: apt-get install qemu-user)"; exit 2; }
for b in paris-probe fat-station foil-control monster-guard; do
    [[ -x "$BIN/$b" ]] || { say "missing $BIN/$b: run scripts/cross/build-aarch64.sh"; exit 2; }
done
if [[ ! -f "$MODEL" ]]; then
    if [[ "${AEON_REQUIRE_MODELS:-}" == 1 ]]; then say "model $MODEL missing and AEON_REQUIRE_MODELS=1"; exit 1; fi
    say "SKIP: model $MODEL not found (scripts/fetch-model.sh makes it)"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi

WORK="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a server under qemu in the background; waits for its "http://ADDR" line on stdout.
# Sets URL. $1 = name (for log files); the rest = the command.
start_server() {
    local name="$1"; shift
    "$QEMU" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    pids+=($!)
    local pid=$! t=0
    URL=""
    while [[ -z "$URL" ]]; do
        URL="$(grep -o 'http://[0-9.:]*' "$WORK/$name.out" | head -1 || true)"
        [[ -n "$URL" ]] && break
        kill -0 "$pid" 2>/dev/null || { say "$name exited early:"; tail -5 "$WORK/$name.err" >&2; return 1; }
        (( t++ < STEP_TIMEOUT * 10 )) || { say "$name not ready after ${STEP_TIMEOUT}s"; return 1; }
        sleep 0.1
    done
}

passed=0; failed=0
check() { # $1 = name, $2 = status (0 ok)
    if [[ "$2" -eq 0 ]]; then passed=$((passed + 1)); say "PASS $1"; else failed=$((failed + 1)); say "FAIL $1"; fi
}

# 3 (setup first, so step 1 can post to it): the collector.
start_server foil "$BIN/foil-control" --port 0 --data-dir "$WORK/foil" || exit 1
FOIL="$URL"
say "foil-control (aarch64) on $FOIL"

# 1. In-process probe.
t0=$(date +%s)
rc=0
GNOSIS_FOIL_CACHE_URL="$FOIL" timeout "$STEP_TIMEOUT" "$QEMU" "$BIN/paris-probe" \
    --dense "$MODEL" --tokens "$TOKENS" --expected "$EXPECTED" >"$WORK/probe.out" 2>"$WORK/probe.err" || rc=$?
cat "$WORK/probe.out"; grep -h 'foil-cache-admit' "$WORK/probe.err" || true
say "paris-probe --dense under qemu: exit $rc in $(( $(date +%s) - t0 ))s"
[[ $rc -eq 0 ]] || tail -5 "$WORK/probe.err" >&2
check "aarch64 paris-probe --dense" "$rc"

# 2. Station + probe over HTTP.
t0=$(date +%s)
rc=0
if start_server station "$BIN/fat-station" --knot "$MODEL" --listen 127.0.0.1:0; then
    say "fat-station (aarch64) on $URL after $(( $(date +%s) - t0 ))s"
    timeout "$STEP_TIMEOUT" "$QEMU" "$BIN/paris-probe" --station "$URL" --tokens "$TOKENS" \
        --expected "$EXPECTED" >"$WORK/sprobe.out" 2>"$WORK/sprobe.err" || rc=$?
    cat "$WORK/sprobe.out"
    [[ $rc -eq 0 ]] || tail -5 "$WORK/sprobe.err" >&2
else
    rc=1
fi
say "fat-station + paris-probe --station under qemu: exit $rc in $(( $(date +%s) - t0 ))s"
check "aarch64 fat-station + paris-probe --station" "$rc"

# 3. The residue is in the collector.
# The key runs to the end of the line (model ids may contain spaces).
KEY="$(grep -h 'foil-cache-admit: status=200 key=' "$WORK/probe.err" | head -1 | sed 's/.* key=//' || true)"
rc=1
if [[ -n "$KEY" ]]; then
    answer="$(curl -s --max-time 30 -G "$FOIL/.aeon/model-forward-cache" --data-urlencode "key=$KEY" || true)"
    python3 - "$answer" "$EXPECTED" <<'PY' && rc=0 || true
import json, sys
a = json.loads(sys.argv[1])
ok = a.get("cache_hit") is True and a.get("argmax") == int(sys.argv[2])
print(f"cache_hit:{str(a.get('cache_hit')).lower()} argmax {a.get('argmax')} logit {a.get('logit')}")
sys.exit(0 if ok else 1)
PY
else
    say "the probe logged no foil-cache-admit key"
fi
check "foil-control (aarch64) holds the probe's residue" "$rc"

# 4. A lease under qemu: the tree ends with the command.
rc=1
HOST_GUARD="$ROOT/target/release/monster-guard"
SMOL="$(dirname "$MODEL")/smollm2-135m-instruct-q4_1.knot"
[[ -f "$SMOL" ]] || SMOL="$MODEL"
if [[ -x "$HOST_GUARD" ]]; then
    export MONSTER_GUARD_HOME="$WORK/guard"
    # The smallest model (the lease re-hashes it under qemu) and a probe it passes.
    printf '{"knot": "%s", "prompt": "The capital of France is", "expect": " Paris"}\n' "$SMOL" >"$WORK/lease-check.json"
    PARIS_PROBE="$ROOT/target/release/paris-probe" "$HOST_GUARD" delegate lease-check net,fs --ttl 600 \
        --qspec "$WORK/lease-check.json" >"$WORK/delegate.out" 2>&1 || tail -5 "$WORK/delegate.out" >&2
    marker=$((3000 + RANDOM % 1000))
    # qemu-user refuses seccomp filters (they would bind qemu itself): --allow-no-seccomp.
    if timeout "$STEP_TIMEOUT" "$QEMU" "$BIN/monster-guard" run --name lease-check --caps net,fs --lease 120 --allow-no-seccomp -- \
        /bin/sh -c "setsid sleep $marker & sleep 0.5; echo tree started" >"$WORK/lease.out" 2>"$WORK/lease.err"; then
        sleep 0.5
        if pgrep -f "sleep $marker" >/dev/null; then
            say "a setsid'd grandchild outlived its lease under qemu"; pkill -f "sleep $marker" || true
        else
            rc=0
        fi
    else
        tail -5 "$WORK/lease.err" >&2
    fi
    unset MONSTER_GUARD_HOME
else
    say "missing $HOST_GUARD (cargo build --release -p monster-guard)"
fi
check "monster-guard (aarch64) lease contains its tree under qemu" "$rc"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
