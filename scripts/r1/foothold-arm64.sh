#!/usr/bin/env bash
# The full nest as on the device: aarch64-musl binaries inside an arm64 rootfs sliver
# (Debian minbase via debootstrap, executed through qemu-user binfmt), running the foothold.
#   scripts/r1/foothold-arm64.sh            (what `make foothold-arm64` runs; needs root)
# Env: AEON_ARM64_SLIVER (rootfs dir, default ~/.cache/aeon-shell/slivers/arm64; point it at a
#      real Arch Linux ARM rootfs to use that instead), AEON_MODELS_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export AEON_MODELS_DIR=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
sliver=${AEON_ARM64_SLIVER:-$HOME/.cache/aeon-shell/slivers/arm64}
arm=${AEON_ARM64_OUT:-$root/target/aarch64-unknown-linux-musl/release}
bins=(fat-station paris-probe monster-guard moonshine foil-control)

[ "$(id -u)" -eq 0 ] || { echo "foothold-arm64: needs root (namespaces, debootstrap)" >&2; exit 2; }
scripts/fetch-model.sh qwen
echo "== aarch64 binaries"
pkgs=(); for b in "${bins[@]}"; do pkgs+=(-p "$b"); done
scripts/cross/build-aarch64.sh "${pkgs[@]}"
cargo build --release -p swerve
echo "== arm64 rootfs: $sliver"
[ -x "$sliver/bin/bash" ] || scripts/make-rootfs.sh "$sliver" --arch arm64
mkdir -p "$sliver/opt/aeon/bin" "$sliver/opt/aeon/specs" "$sliver/models"
for b in "${bins[@]}"; do install -m 0755 "$arm/$b" "$sliver/opt/aeon/bin/$b"; done
cp specs/*.json "$sliver/opt/aeon/specs/"
install -m 0755 scripts/r1/foothold.sh "$sliver/opt/aeon/foothold.sh"
echo "== admit base:arm64"
target/release/swerve admit base:arm64 --rootfs "$sliver"
# Emulated, monster-guard cannot contain a lease without CAP_SYS_ADMIN in the sliver: qemu-user
# refuses namespace flags to clone(), cannot unshare a user namespace (qemu runs threads of its
# own) and has no PR_SET_CHILD_SUBREAPER, so the lease would fail closed. The emulated sliver
# keeps CAP_SYS_ADMIN for the reaper's unshare(NEWPID|NEWNS); on an aarch64 kernel it does not.
caps=()
if [ "$(uname -m)" != aarch64 ]; then
  caps=(--cap CAP_SYS_ADMIN)
  echo "== emulated aarch64: the sliver keeps CAP_SYS_ADMIN (qemu-user makes no namespaces without it)"
fi
echo "== foothold inside the arm64 sliver ($(file -b "$arm/fat-station" | cut -d, -f1-2))"
exec target/release/swerve cline base:arm64 --rootfs "$sliver" --hostname r1-arm64 "${caps[@]}" \
  --bind "$AEON_MODELS_DIR:/models:ro" --setenv AEON_MODELS_DIR=/models \
  -- bash -c 'uname -m; bash /opt/aeon/foothold.sh'
