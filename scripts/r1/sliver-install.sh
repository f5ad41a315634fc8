#!/usr/bin/env bash
# Puts the stack into a rootfs, the layout the seed report's sliver steps expect, so that
#   swerve cline base:NAME -- bash /opt/aeon/foothold.sh        (the capstone)
#   swerve cline base:NAME -- bash /opt/aeon/golden-star.sh     (steps 4 and 5 inside the sliver)
# find everything by themselves, with no --bind:
#   /opt/aeon/bin/     the release binaries and the seed's names for two of them
#                      (paris-probe-rknot, gnosis-foil-control), with the shared libraries
#                      they need at the loader's paths
#   /opt/aeon/specs/   the qspecs (specs/*.json)
#   /opt/aeon/foothold.sh, /opt/aeon/golden-star.sh
#   /models/           the Qwen model: a hard link into the model cache when on the same file
#                      system (no copy), a copy otherwise, so it is part of the certified
#                      rootfs; and the seed's name for it, `qwen05-dense.knot` (a symlink)
# Run it before `swerve admit` (the certificate covers what it installs).
#   scripts/r1/sliver-install.sh ROOTFS
# Env: AEON_BIN (default target/release), AEON_MODELS_DIR (default ~/.cache/aeon-shell/models).
# Exit codes: 0 installed; 1 a step failed; 2 usage or a missing binary/model.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
die() { echo "sliver-install: $*" >&2; exit "${2:-1}"; }
[ $# -eq 1 ] || die "usage: scripts/r1/sliver-install.sh ROOTFS" 2
rootfs=$1
[ -d "$rootfs" ] || die "$rootfs is not a directory (scripts/make-rootfs.sh makes one)" 2
bin=${AEON_BIN:-$root/target/release}
models=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
model=qwen2.5-coder-0.5b-instruct-q4_k_m.knot
bins=(fat-station paris-probe paris-probe-rknot monster-guard moonshine foil-control
      gnosis-foil-control swerve knot shard-knot parity-station-handoff)

[ -f "$models/$model" ] || die "model $models/$model missing (run scripts/fetch-model.sh)" 2
mkdir -p "$rootfs/opt/aeon/bin" "$rootfs/opt/aeon/specs" "$rootfs/models"
for b in "${bins[@]}"; do
  [ -x "$bin/$b" ] || die "$bin/$b missing (cargo build --release --workspace --bins)" 2
  install -m 0755 "$bin/$b" "$rootfs/opt/aeon/bin/$b"
  # Shared libraries the (glibc) binaries need, at the paths the loader expects.
  ldd "$bin/$b" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    [ -e "$rootfs$lib" ] || { mkdir -p "$rootfs$(dirname "$lib")"; cp -L "$lib" "$rootfs$lib"; }
  done
done
cp "$root"/specs/*.json "$rootfs/opt/aeon/specs/"
install -m 0755 "$root/scripts/r1/foothold.sh" "$rootfs/opt/aeon/foothold.sh"
install -m 0755 "$root/scripts/r1/golden-star.sh" "$rootfs/opt/aeon/golden-star.sh"
dst=$rootfs/models/$model
if ! [ "$dst" -ef "$models/$model" ] && ! { [ -f "$dst" ] && cmp -s "$models/$model" "$dst"; }; then
  rm -f "$dst.partial"
  ln "$models/$model" "$dst.partial" 2>/dev/null || cp "$models/$model" "$dst.partial"
  mv -f "$dst.partial" "$dst"
fi
ln -sfn "$model" "$rootfs/models/qwen05-dense.knot"
echo "sliver-install: $rootfs/opt/aeon (${#bins[@]} binaries, specs, foothold.sh, golden-star.sh), $rootfs/models"
