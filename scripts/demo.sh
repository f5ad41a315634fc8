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
bins=(fat-station paris-probe monster-guard moonshine foil-control swerve knot)

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
  # The stack goes into the rootfs before admission, so the certificate covers it.
  mkdir -p "$sliver/opt/aeon/bin" "$sliver/opt/aeon/specs" "$sliver/models"
  for b in "${bins[@]}"; do
    install -m 0755 "$bin/$b" "$sliver/opt/aeon/bin/$b"
    # Shared libraries the (glibc) binaries need, at the paths the loader expects.
    ldd "$bin/$b" | grep -o '/[^ ]*' | while read -r lib; do
      [ -e "$sliver$lib" ] || { mkdir -p "$sliver$(dirname "$lib")"; cp -L "$lib" "$sliver$lib"; }
    done
  done
  cp specs/*.json "$sliver/opt/aeon/specs/"
  install -m 0755 scripts/r1/foothold.sh "$sliver/opt/aeon/foothold.sh"
  echo "== admit base:scratch"
  "$bin/swerve" admit base:scratch --rootfs "$sliver"
  echo "== foothold inside the sliver"
  exec "$bin/swerve" cline base:scratch --rootfs "$sliver" --hostname r1-sliver \
    --bind "$AEON_MODELS_DIR:/models:ro" -- env AEON_MODELS_DIR=/models bash /opt/aeon/foothold.sh
else
  echo "== not root (or no namespaces here): running the foothold OUTSIDE a sliver"
  AEON_BIN=$bin AEON_SPECS=$root/specs exec bash scripts/r1/foothold.sh
fi
