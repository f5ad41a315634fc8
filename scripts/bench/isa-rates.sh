#!/usr/bin/env bash
# The vector instruction rates behind the kernels' ceilings, measured on this CPU
# (scripts/bench/isa-rates.c: each instruction alone, then beside the kernels' multiply, and
# the load rates). Compiled with the host's C compiler for -march=native (the AVX-512 set where
# the CPU has it), and with --avx2 for -march=haswell (the AVX2 kernels' set) as well.
#
# Usage: scripts/bench/isa-rates.sh [--avx2]
# Needs: a C compiler (cc or gcc). Exit codes: 0 printed; 1 build or run failed; 2 bad usage or
# no compiler. One thread, ~1 minute; run it on a quiet machine (figures are wall-clock rates).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
avx2=0
case "${1:-}" in
    "") ;;
    --avx2) avx2=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "isa-rates: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
cc="$(command -v cc || command -v gcc || true)"
[[ -n "$cc" ]] || { echo "isa-rates: no C compiler (Debian: apt-get install gcc)" >&2; exit 2; }
[[ "$(uname -m)" == x86_64 ]] || { echo "isa-rates: x86_64 only (the NEON kernels: scripts/arm-proxy.sh)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
run() { # march
    "$cc" -O2 -march="$1" -o "$tmp/isa-rates-$1" "$here/isa-rates.c" || exit 1
    echo "== -march=$1 =="
    "$tmp/isa-rates-$1" || exit 1
}
run native
if [[ $avx2 -eq 1 ]]; then run haswell; fi
