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
echo "== foothold inside the arm64 sliver ($(file -b "$arm/fat-station" | cut -d, -f1-2))"
exec target/release/swerve cline base:arm64 --rootfs "$sliver" --hostname r1-arm64 \
  --bind "$AEON_MODELS_DIR:/models:ro" -- env AEON_MODELS_DIR=/models bash -c 'uname -m; bash /opt/aeon/foothold.sh'
