#!/usr/bin/env bash
# The aarch64 kernels' spec tests, under qemu-aarch64: aeon-engine's `kernels::` unit tests
# (every NEON kernel bit for bit against the scalar reference on random blocks, the i16 lane
# extremes, the dispatch) cross-built for aarch64-unknown-linux-musl and run twice:
#
#   -cpu cortex-a53   ARMv8.0, no dotprod: the plain NEON flavour (the R1's cores)
#   -cpu max          every extension qemu has: the dotprod (`sdot`) flavour as well
#
# Usage: scripts/cross/qemu-kernels.sh [FILTER]   (default filter: kernels::)
# Env: AEON_CROSS_DEV_DIR (cargo target dir, default target/cross-test, shared with
# scripts/arm-proxy.sh). Tools as scripts/cross/build-aarch64.sh installs them (rust target,
# zig, cargo-zigbuild) and qemu-aarch64 (Debian qemu-user; scripts/test.sh installs it).
# Ends with `N passed, M failed` (a run in which the filter matched no test counts as failed:
# the kernels once moved crate and this script silently ran nothing). Exit codes: 0 both runs passed; 1 a test failed or the build
# failed; 2 a tool is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TARGET=aarch64-unknown-linux-musl
DEV="${AEON_CROSS_DEV_DIR:-$ROOT/target/cross-test}"
FILTER="${1:-kernels::}"
say() { printf 'qemu-kernels: %s\n' "$*" >&2; }

QEMU="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
[[ -n "$QEMU" ]] || { say "qemu-aarch64 not found (Debian: apt-get install qemu-user)"; exit 2; }
if ! command -v cargo-zigbuild >/dev/null || ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    say "installing the cross tools (scripts/cross/build-aarch64.sh)"
    bash scripts/cross/build-aarch64.sh -p knot-format >/dev/null || { say "cross tools missing"; exit 2; }
fi

say "building aeon-engine's unit tests for $TARGET (release profile, $DEV)"
json="$(mktemp)"
trap 'rm -f "$json"' EXIT
if ! CARGO_TARGET_DIR="$DEV" cargo-zigbuild test --release --target "$TARGET" -p aeon-engine --lib \
    --no-run --message-format=json >"$json" 2>"$json.err"; then
    tail -20 "$json.err" >&2; rm -f "$json.err"; exit 1
fi
rm -f "$json.err"
BIN="$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "aeon_engine":
        print(m["executable"])
' "$json" | tail -1)"
[[ -x "$BIN" ]] || { say "no test executable in cargo's output"; exit 1; }

passed=0; failed=0
for cpu in cortex-a53 max; do
    say "$BIN under qemu-aarch64 -cpu $cpu ($FILTER)"
    if out="$(timeout 900 "$QEMU" -cpu "$cpu" "$BIN" "$FILTER" --test-threads 2 2>&1)" \
        && ! printf '%s\n' "$out" | grep -q '^test result: ok\. 0 passed'; then
        passed=$((passed + 1)); say "PASS -cpu $cpu: $(printf '%s\n' "$out" | grep '^test result' | tail -1)"
    else
        failed=$((failed + 1)); printf '%s\n' "$out" | tail -30 >&2; say "FAIL -cpu $cpu"
    fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
