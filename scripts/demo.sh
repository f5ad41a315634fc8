#!/usr/bin/env bash
# The main job end to end: fetch + verify + import the model, build, make a rootfs, admit it,
# and run the foothold capstone inside a sliver (swerve). Without root (or without namespace
# support) it runs the same stack outside the sliver and says so.
#   scripts/demo.sh            (what `make demo` runs)
# Env: AEON_MODELS_DIR (model cache), AEON_SLIVER_DIR (rootfs, default ~/.cache/aeon-shell/slivers/scratch),
#      SWERVE_HOME / MONSTER_GUARD_HOME as the tools document.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export AEON_MODELS_DIR=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}

echo "== fetch: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (cached in $AEON_MODELS_DIR)"
scripts/fetch-model.sh qwen
echo "== build (release)"
cargo build --release --workspace --bins 2>&1 | tail -n 3
bin=$root/target/release
"$bin/knot" verify "$AEON_MODELS_DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.knot"

if [ "$(id -u)" -eq 0 ] && unshare --mount --net --pid --fork true 2>/dev/null; then
  sliver=${AEON_SLIVER_DIR:-$HOME/.cache/aeon-shell/slivers/scratch}
  echo "== rootfs: $sliver"
  [ -x "$sliver/bin/bash" ] || scripts/make-rootfs.sh "$sliver"
  # The stack and the model go into the rootfs before admission, so the certificate covers them.
  scripts/r1/sliver-install.sh "$sliver"
  echo "== admit base:scratch"
  "$bin/swerve" admit base:scratch --rootfs "$sliver"
  echo "== foothold inside the sliver: swerve cline base:scratch -- bash /opt/aeon/foothold.sh"
  # swerve passes no host environment into the sliver: only the foothold's knobs that mean the
  # same inside (ports, wait) go in, if set; its paths default to the sliver's layout.
  exec "$bin/swerve" cline base:scratch --hostname r1-sliver \
    --keep-env AEON_PORT --keep-env AEON_FOIL_PORT --keep-env AEON_WAIT_S \
    -- bash /opt/aeon/foothold.sh
else
  echo "== not root (or no namespaces here): running the foothold OUTSIDE a sliver"
  AEON_BIN=$bin AEON_SPECS=$root/specs exec bash scripts/r1/foothold.sh
fi
