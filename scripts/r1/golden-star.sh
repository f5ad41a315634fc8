#!/usr/bin/env bash
# The golden star: the model is admitted only because it proves its quality, then the probe
# runs under the grant's lease.
#   scripts/r1/golden-star.sh [QSPEC]      (default specs/paris.json)
# Uses target/release binaries (AEON_BIN to override) and the cached model (AEON_MODELS_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${AEON_BIN:-$root/target/release}
qspec=${1:-$root/specs/paris.json}
export AEON_MODELS_DIR=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
export MONSTER_GUARD_HOME=${MONSTER_GUARD_HOME:-$(mktemp -d)/guard}
export PARIS_PROBE=$bin/paris-probe
knot=$AEON_MODELS_DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.knot

[ -f "$MONSTER_GUARD_HOME/node.key" ] || "$bin/monster-guard" init
"$bin/monster-guard" delegate paris net,fs --ttl 1h --qspec "$qspec"
"$bin/monster-guard" run --name paris --caps fs --lease 120 -- \
  "$bin/paris-probe" --dense "$knot" --dense-only --tokens 785,6722,315,9625,374 --expected 12095
