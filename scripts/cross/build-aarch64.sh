#!/usr/bin/env bash
# Build the workspace's binaries for the device: aarch64-unknown-linux-musl, statically linked,
# size-tuned, with cargo-zigbuild (zig as the C compiler and linker; no sysroot needed).
#
# Usage: scripts/cross/build-aarch64.sh [options]
#   -p, --package PKG   build only this package's binaries (repeatable; default: every binary
#                       of the workspace)
#   --smoke             afterwards run each binary's --help under qemu-aarch64
#   --no-install        fail instead of installing missing tools
#   --fast-kernels=no   build fat-station at the size profile too (default: fat-station keeps
#                       opt-level 3 so its kernels stay fully optimised; the rest use "z")
#   -h, --help          this text
#
# Environment:
#   AEON_CROSS_TARGET_DIR  cargo target dir for the cross build (default target/cross; kept apart
#                          from target/ so the size profile never invalidates native builds)
#   AEON_ARM64_OUT         where the finished binaries are copied
#                          (default target/aarch64-unknown-linux-musl/release)
#   AEON_CROSS_JOBS        cargo -j (default: cargo's own)
#   AEON_CROSS_OPT_LEVEL   opt-level of the size profile (default z; s is ~5% larger)
#
# What it does, in order:
#   1. installs what is missing: rustup target aarch64-unknown-linux-musl; zig and cargo-zigbuild
#      from PyPI (ziglang, cargo-zigbuild; falls back to `cargo install cargo-zigbuild`);
#   2. cargo zigbuild --release --target aarch64-unknown-linux-musl --keep-going, with the size
#      profile below passed as --config (the root Cargo.toml profiles stay as they are);
#   3. copies each binary to $AEON_ARM64_OUT, checks with `file` that it is an aarch64 static
#      executable, and prints a size table against the reference build;
#   4. with --smoke, runs `qemu-aarch64 BIN --help` for each.
#
# Size profile: opt-level "z" (AEON_CROSS_OPT_LEVEL), fat LTO, one codegen unit, symbols stripped. panic stays
# "unwind" so a panicking connection task in a server does not abort the whole process.
#
# Exit codes: 0 every requested binary built, static and (with --smoke) ran; 1 a build, the
# static check or the smoke run failed (the table still shows what was built); 2 bad usage or
# a tool could not be installed.
set -euo pipefail

TARGET=aarch64-unknown-linux-musl
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TARGET_DIR="${AEON_CROSS_TARGET_DIR:-$ROOT/target/cross}"
OUT="${AEON_ARM64_OUT:-$ROOT/target/$TARGET/release}"

packages=()
smoke=0
install=1
fast_kernels=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        -p|--package) [[ $# -ge 2 ]] || { echo "build-aarch64: $1 needs a package name" >&2; exit 2; }
                      packages+=("$2"); shift 2 ;;
        --smoke) smoke=1; shift ;;
        --no-install) install=0; shift ;;
        --fast-kernels=no) fast_kernels=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-aarch64: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf 'build-aarch64: %s\n' "$*" >&2; }
need_install() {
    if [[ $install -eq 0 ]]; then say "missing: $1 (and --no-install given)"; exit 2; fi
    say "installing $1"
}

# --- 1. tools -------------------------------------------------------------------------------
command -v cargo >/dev/null || { say "cargo not found: install Rust (rustup) first"; exit 2; }
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    need_install "rust target $TARGET"
    rustup target add "$TARGET" || { say "rustup target add $TARGET failed"; exit 2; }
fi
PY="$(command -v python3 || command -v python || true)"
if ! command -v zig >/dev/null && ! { [[ -n "$PY" ]] && "$PY" -m ziglang version >/dev/null 2>&1; }; then
    [[ -n "$PY" ]] || { say "neither zig nor python3 found; install one of them"; exit 2; }
    need_install "zig (PyPI ziglang)"
    "$PY" -m pip install --quiet ziglang || { say "pip install ziglang failed"; exit 2; }
fi
# (`cargo zigbuild --version` is not a valid call; the executable answers --version itself.)
if ! cargo-zigbuild --version >/dev/null 2>&1; then
    need_install "cargo-zigbuild"
    { [[ -n "$PY" ]] && "$PY" -m pip install --quiet cargo-zigbuild && cargo-zigbuild --version >/dev/null 2>&1; } \
        || cargo install --locked cargo-zigbuild \
        || { say "cannot install cargo-zigbuild (PyPI and crates.io both failed)"; exit 2; }
fi
if [[ $smoke -eq 1 ]] && ! command -v qemu-aarch64 >/dev/null; then
    need_install "qemu-user (Debian package)"
    { apt-get install -y qemu-user >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y qemu-user >/dev/null; }; } \
        || { say "cannot install qemu-user; run without --smoke"; exit 2; }
fi
say "$(cargo-zigbuild --version), zig $(zig version 2>/dev/null || "$PY" -m ziglang version)"

# --- 2. build -------------------------------------------------------------------------------
# Binaries to build: name<TAB>package, from cargo metadata.
mapfile -t BINS < <(cargo metadata --no-deps --format-version 1 | "${PY:-python3}" -c '
import json, sys
want = set(sys.argv[1:])
for p in json.load(sys.stdin)["packages"]:
    if want and p["name"] not in want:
        continue
    for t in p["targets"]:
        if "bin" in t["kind"]:
            print(t["name"] + "\t" + p["name"])
' "${packages[@]}")
[[ ${#BINS[@]} -gt 0 ]] || { say "no binaries found for: ${packages[*]:-workspace}"; exit 2; }

pkg_args=()
for line in "${BINS[@]}"; do
    pkg="${line#*$'\t'}"
    [[ " ${pkg_args[*]} " == *" -p $pkg "* ]] || pkg_args+=(-p "$pkg")
done
config=(
    --config "profile.release.opt-level=\"${AEON_CROSS_OPT_LEVEL:-z}\""
    --config 'profile.release.lto="fat"'
    --config 'profile.release.codegen-units=1'
    --config 'profile.release.strip=true'
    --config 'profile.release.debug=false'
)
if [[ $fast_kernels -eq 1 ]]; then
    config+=(--config 'profile.release.package.fat-station.opt-level=3')
fi
jobs=()
[[ -n "${AEON_CROSS_JOBS:-}" ]] && jobs=(-j "$AEON_CROSS_JOBS")

say "building ${#BINS[@]} binaries (${pkg_args[*]}) into $TARGET_DIR"
start=$(date +%s)
build_rc=0
CARGO_TARGET_DIR="$TARGET_DIR" cargo zigbuild --release --target "$TARGET" --bins --keep-going \
    "${jobs[@]}" "${config[@]}" "${pkg_args[@]}" || build_rc=$?
say "cargo zigbuild finished in $(( $(date +%s) - start ))s (exit $build_rc)"

# --- 3. collect, check, size table ----------------------------------------------------------
declare -A REF=([fat-station]="3.1 MB" [paris-probe]="2.6 MB" [monster-guard]="0.8 MB")
mkdir -p "$OUT"
fail=0
printf '\n%-24s %10s %8s  %-8s %s\n' binary bytes MiB linkage "reference"
for line in "${BINS[@]}"; do
    bin="${line%%$'\t'*}"
    src="$TARGET_DIR/$TARGET/release/$bin"
    if [[ ! -f "$src" ]]; then
        printf '%-24s %10s %8s  %-8s %s\n' "$bin" - - MISSING "${REF[$bin]:-}"
        fail=1; continue
    fi
    # A binary left from an earlier run (its package failed to build this time) is still
    # copied and listed, but marked.
    # With its build time and cargo's list of the sources it was built from (BIN.d), so
    # that a test can tell a binary left from an earlier checkout (fat-station/tests/cross_isa.rs).
    cp -pf "$src" "$OUT/$bin"
    [[ -f "$src.d" ]] && cp -pf "$src.d" "$OUT/$bin.d"
    desc="$(file -b "$OUT/$bin")"
    if [[ "$desc" == *"ARM aarch64"* && ( "$desc" == *"statically linked"* || "$desc" == *"static-pie linked"* ) ]]; then
        link=static
    else
        link=NOT-STATIC; fail=1
        say "$bin: $desc"
    fi
    stale=""
    [[ $(stat -c %Y "$src") -lt $start ]] && stale=" (not rebuilt this run)"
    bytes=$(stat -c %s "$OUT/$bin")
    printf '%-24s %10d %8.2f  %-8s %s%s\n' "$bin" "$bytes" "$(awk -v b="$bytes" 'BEGIN { print b / 1048576 }')" "$link" "${REF[$bin]:-}" "$stale"
done
echo
say "binaries in $OUT"

# --- 4. smoke under qemu --------------------------------------------------------------------
if [[ $smoke -eq 1 ]]; then
    for line in "${BINS[@]}"; do
        bin="${line%%$'\t'*}"
        [[ -x "$OUT/$bin" ]] || continue
        if out=$(timeout 60 qemu-aarch64 "$OUT/$bin" --help 2>&1); then
            say "qemu-aarch64 $bin --help: ok ($(printf "%s\n" "$out" | sed -n 1p))"
        else
            say "qemu-aarch64 $bin --help: FAILED"; printf '%s\n' "$out" | tail -5 >&2; fail=1
        fi
    done
fi
[[ $build_rc -eq 0 && $fail -eq 0 ]] || exit 1
