#!/usr/bin/env bash
# Push the aarch64 build, the model and the quality spec to an Android/R1 device over adb, and
# forward the station ports so host tools (moonshine, curl) reach the stations on the device.
#
# Usage: scripts/r1/push.sh [options]
#   --dry-run            print the adb commands instead of running them (no device needed)
#   -s, --serial SERIAL  adb device serial (default: $ANDROID_SERIAL, else the only device)
#   --bin-dir DIR        aarch64 binaries (default target/aarch64-unknown-linux-musl/release,
#                        as written by scripts/cross/build-aarch64.sh)
#   --bins "A B ..."     which binaries (default: fat-station paris-probe monster-guard moonshine
#                        foil-control swerve shard-knot parity-station-handoff knot)
#   --model PATH         model to push (default: $AEON_MODELS_DIR or ~/.cache/aeon-shell/models,
#                        qwen2.5-coder-0.5b-instruct-q4_k_m.knot); repeatable
#   --qspec PATH         quality spec (default specs/paris.json); repeatable
#   --dest DIR           directory on the device (default /data/local/tmp/aeon)
#   --forward L[:R]      adb forward tcp:L tcp:R (R defaults to L); repeatable.
#                        Default: 8080 (fat-station's default port)
#   --reverse-foil PORT  adb reverse tcp:PORT tcp:PORT, so a probe on the device can post to a
#                        foil-control collector on the host (GNOSIS_FOIL_CACHE_URL=http://127.0.0.1:PORT)
#   -h, --help           this text
#
# Layout on the device (DEST):
#   bin/       the binaries, mode 755
#   models/    the model files (set AEON_MODELS_DIR=DEST/models on the device: the qspec's
#              "${AEON_MODELS_DIR}/..." paths then resolve there)
#   specs/     the quality specs
#   env.sh     `. DEST/env.sh` sets PATH and AEON_MODELS_DIR
#
# Example, after `make aarch64`:
#   scripts/r1/push.sh --forward 8080 --forward 8081
#   adb shell '. /data/local/tmp/aeon/env.sh && fat-station --help'
#
# Exit codes: 0 done (or printed, with --dry-run); 1 an adb step failed; 2 bad usage or a
# missing local file.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODELS_DIR="${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}"
dry=0
serial="${ANDROID_SERIAL:-}"
bin_dir="$ROOT/target/aarch64-unknown-linux-musl/release"
bins="fat-station paris-probe monster-guard moonshine foil-control swerve shard-knot parity-station-handoff knot"
models=()
qspecs=()
dest=/data/local/tmp/aeon
forwards=()
reverse_foil=""

die() { printf 'push: %s\n' "$*" >&2; exit 2; }
need_arg() { [[ $2 -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) dry=1; shift ;;
        -s|--serial) need_arg "$1" $#; serial="$2"; shift 2 ;;
        --bin-dir) need_arg "$1" $#; bin_dir="$2"; shift 2 ;;
        --bins) need_arg "$1" $#; bins="$2"; shift 2 ;;
        --model) need_arg "$1" $#; models+=("$2"); shift 2 ;;
        --qspec) need_arg "$1" $#; qspecs+=("$2"); shift 2 ;;
        --dest) need_arg "$1" $#; dest="$2"; shift 2 ;;
        --forward) need_arg "$1" $#; forwards+=("$2"); shift 2 ;;
        --reverse-foil) need_arg "$1" $#; reverse_foil="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ ${#models[@]} -gt 0 ]] || models=("$MODELS_DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.knot")
[[ ${#qspecs[@]} -gt 0 ]] || qspecs=("$ROOT/specs/paris.json")
[[ ${#forwards[@]} -gt 0 ]] || forwards=(8080)
[[ "$dest" == /* ]] || die "--dest must be an absolute path on the device"

port_ok() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65535 )); }
for f in "${forwards[@]}"; do
    l="${f%%:*}"; r="${f#*:}"
    port_ok "$l" && port_ok "$r" || die "--forward $f: expected PORT or LOCAL:REMOTE"
done
[[ -z "$reverse_foil" ]] || port_ok "$reverse_foil" || die "--reverse-foil $reverse_foil: not a port"

# Check every local file before touching the device, so a push is all or nothing up front.
missing=()
for b in $bins; do [[ -f "$bin_dir/$b" ]] || missing+=("$bin_dir/$b"); done
for m in "${models[@]}" "${qspecs[@]}"; do [[ -f "$m" ]] || missing+=("$m"); done
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $dry -eq 1 ]]; then
        printf 'push: warning: missing locally (would fail without --dry-run): %s\n' "${missing[*]}" >&2
    else
        die "missing locally: ${missing[*]} (run 'make aarch64' / scripts/fetch-model.sh first)"
    fi
fi

adb_cmd=(adb)
[[ -z "$serial" ]] || adb_cmd+=(-s "$serial")
run() {
    if [[ $dry -eq 1 ]]; then
        printf '%q ' "$@"; printf '\n'
    else
        printf '+ %s\n' "$*" >&2
        "$@" || { printf 'push: step failed: %s\n' "$*" >&2; exit 1; }
    fi
}

if [[ $dry -eq 0 ]]; then
    command -v adb >/dev/null || die "adb not found (Debian: apt-get install adb)"
    state="$("${adb_cmd[@]}" get-state 2>&1 || true)"
    [[ "$state" == device ]] || { printf 'push: no usable device (%s)\n' "$state" >&2; exit 1; }
fi

# 1. directories
run "${adb_cmd[@]}" shell mkdir -p "$dest/bin" "$dest/models" "$dest/specs"
# 2. binaries (static aarch64-musl: nothing else to install on the device)
for b in $bins; do
    run "${adb_cmd[@]}" push "$bin_dir/$b" "$dest/bin/$b"
done
run "${adb_cmd[@]}" shell chmod 755 $(for b in $bins; do printf '%s ' "$dest/bin/$b"; done)
# 3. model(s) and spec(s)
for m in "${models[@]}"; do run "${adb_cmd[@]}" push "$m" "$dest/models/$(basename "$m")"; done
for q in "${qspecs[@]}"; do run "${adb_cmd[@]}" push "$q" "$dest/specs/$(basename "$q")"; done
# 4. environment file for adb shell sessions
envfile="$(mktemp -d)/env.sh"
trap 'rm -rf "$(dirname "$envfile")"' EXIT
printf 'export PATH=%s/bin:$PATH\nexport AEON_MODELS_DIR=%s/models\n' "$dest" "$dest" > "$envfile"
[[ $dry -eq 0 ]] || sed 's/^/#   env.sh: /' "$envfile"
run "${adb_cmd[@]}" push "$envfile" "$dest/env.sh"
# 5. port forwards: host tcp:L -> device tcp:R (stations); device -> host for the collector
for f in "${forwards[@]}"; do
    run "${adb_cmd[@]}" forward "tcp:${f%%:*}" "tcp:${f#*:}"
done
[[ -z "$reverse_foil" ]] || run "${adb_cmd[@]}" reverse "tcp:$reverse_foil" "tcp:$reverse_foil"
# 6. show what is there
run "${adb_cmd[@]}" shell ls -l "$dest/bin" "$dest/models" "$dest/specs"
[[ $dry -eq 1 ]] || printf 'push: done; on the device: . %s/env.sh\n' "$dest" >&2
