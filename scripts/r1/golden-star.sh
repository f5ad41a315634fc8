#!/usr/bin/env bash
# The golden star: the model is admitted only because it proves its quality, then the probe
# runs under the grant's lease (the seed report's steps 4 and 5).
#   scripts/r1/golden-star.sh [QSPEC]                      from a checkout (default specs/paris.json)
#   swerve cline base:scratch -- bash /opt/aeon/golden-star.sh   the same inside a sliver (step 6;
#                                                          scripts/r1/sliver-install.sh lays it out)
# Finds by itself, first hit wins:
#   binaries  $AEON_BIN, the checkout's target/release, bin/ beside this script (/opt/aeon/bin
#             in a sliver), PATH
#   qspec     $1, specs/paris.json of the checkout, specs/ beside this script
#   model     $AEON_MODELS_DIR, ~/.cache/aeon-shell/models, /models (the sliver's), holding the
#             Qwen .knot; exported as AEON_MODELS_DIR for the qspec's ${AEON_MODELS_DIR}
# MONSTER_GUARD_HOME defaults to a fresh temp dir (its node key is made on first use).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
model=qwen2.5-coder-0.5b-instruct-q4_k_m.knot
die() { echo "golden-star: $*" >&2; exit 2; }

bin=""
for d in "${AEON_BIN:-}" "$root/target/release" "$here/bin"; do
  if [ -n "$d" ] && [ -x "$d/monster-guard" ]; then bin=$d; break; fi
done
if [ -z "$bin" ]; then
  p=$(command -v monster-guard) || die "monster-guard not found (set AEON_BIN, or build: cargo build --release)"
  bin=$(dirname "$p")
fi
qspec=${1:-}
if [ -z "$qspec" ]; then
  for q in "$root/specs/paris.json" "$here/specs/paris.json"; do
    if [ -f "$q" ]; then qspec=$q; break; fi
  done
  [ -n "$qspec" ] || die "no specs/paris.json near $here: give the qspec as the first argument"
fi
models=""
for d in "${AEON_MODELS_DIR:-}" "${HOME:-/nonexistent}/.cache/aeon-shell/models" /models; do
  if [ -n "$d" ] && [ -f "$d/$model" ]; then models=$d; break; fi
done
[ -n "$models" ] || die "model $model not found in \$AEON_MODELS_DIR, ~/.cache/aeon-shell/models or /models (run scripts/fetch-model.sh)"
export AEON_MODELS_DIR=$models
export MONSTER_GUARD_HOME=${MONSTER_GUARD_HOME:-$(mktemp -d)/guard}
export PARIS_PROBE=$bin/paris-probe
knot=$AEON_MODELS_DIR/$model

[ -f "$MONSTER_GUARD_HOME/node.key" ] || "$bin/monster-guard" init
"$bin/monster-guard" delegate qwen-0.5b-agent net,fs --ttl 1h --qspec "$qspec"
"$bin/monster-guard" run --name qwen-0.5b-agent --caps fs --lease 120 -- \
  "$bin/paris-probe" --dense "$knot" --dense-only --tokens 785,6722,315,9625,374 --expected 12095
