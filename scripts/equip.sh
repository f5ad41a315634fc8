#!/usr/bin/env bash
# Equip one mesh node: push the station binary, the node's shard and manifest (and the mesh
# key, when given) to the node, and install a boot service that starts the station from its
# manifest. See specs/mesh.md.
#
#   scripts/equip.sh --manifest plan/n1.json --to dir:/srv/aeon/n1 [--key mesh.key] [--beacon 255.255.255.255:7979]
#   scripts/equip.sh --manifest plan/n1.json --to adb:SERIAL        [--key mesh.key] [--ram 2.4G]
#
# --ram SIZE  the RAM budget the station announces in its beacons (fat-station --ram), which
#             `moonshine mesh form --assign` splits the layers by.
# dir:PATH   a local simulated node: copies into PATH and writes PATH/aeon-station.service
#            (systemd unit; `systemctl link PATH/aeon-station.service` to install) and
#            PATH/run.sh (what the unit and an init script run).
# adb:SERIAL pushes to /data/local/tmp/aeon on an Android device and installs an init .rc
#            fragment (needs a rooted/userdebug device to be started at boot; otherwise run
#            /data/local/tmp/aeon/run.sh from `adb shell`).
# Exit codes: 0 equipped, 2 bad arguments or a failed copy.
set -euo pipefail

die() { echo "equip.sh: $*" >&2; exit 2; }
manifest= to= key= beacon= ram= bin="${AEON_STATION_BIN:-target/release/fat-station}"
while [ $# -gt 0 ]; do
  case "$1" in
    --manifest) manifest="$2"; shift 2 ;;
    --to) to="$2"; shift 2 ;;
    --key) key="$2"; shift 2 ;;
    --beacon) beacon="$2"; shift 2 ;;
    --ram) ram="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$manifest" ] && [ -n "$to" ] || die "need --manifest FILE and --to dir:PATH|adb:SERIAL"
[ -f "$manifest" ] || die "no manifest $manifest"
[ -x "$bin" ] || die "no station binary $bin (cargo build --release -p fat-station, or --bin)"
shard=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shard"])' "$manifest")
node=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["node_id"])' "$manifest")
case "$shard" in /*) shard_path="$shard" ;; *) shard_path="$(dirname "$manifest")/$shard" ;; esac
[ -f "$shard_path" ] || die "manifest names shard $shard_path, which does not exist"

# The manifest on the node names its shard by file name, next to it.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$manifest" "$(basename "$shard_path")" > "$tmp/node.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["shard"] = sys.argv[2]; print(json.dumps(m, indent=2))
PY

flags=(--manifest node.json)
[ -n "$key" ] && { [ -f "$key" ] || die "no key $key"; flags+=(--mesh-key mesh.key); }
[ -n "$beacon" ] && flags+=(--beacon "$beacon")
if [ -n "$ram" ]; then
  # The size rule of knot_format::size: K/M/G/T binary, KB/MB/GB/TB decimal, a unit required.
  [[ "$ram" =~ ^[0-9]*\.?[0-9]+([KMGTkmgt]([iI]?[Bb]?)|[Bb])$ ]] || die "--ram $ram: expected a size with a unit, e.g. 2.4G, 512M or 2400MB"
  flags+=(--ram "$ram")
fi

write_run() { # $1 = directory the files live in on the node
  printf '#!/bin/sh\n# Starts mesh node %s from its manifest.\ncd %s && exec ./fat-station %s\n' "$node" "$1" "${flags[*]}" > "$tmp/run.sh"
  chmod +x "$tmp/run.sh"
}

case "$to" in
  dir:*)
    dest="${to#dir:}"
    mkdir -p "$dest"
    dest=$(cd "$dest" && pwd)
    write_run "$dest"
    cp "$bin" "$dest/fat-station.tmp" && mv "$dest/fat-station.tmp" "$dest/fat-station"
    cp "$shard_path" "$dest/.shard.tmp" && mv "$dest/.shard.tmp" "$dest/$(basename "$shard_path")"
    cp "$tmp/node.json" "$dest/node.json"
    cp "$tmp/run.sh" "$dest/run.sh"
    [ -n "$key" ] && install -m 0600 "$key" "$dest/mesh.key"
    cat > "$dest/aeon-station.service" <<UNIT
[Unit]
Description=aeon-shell mesh node $node
After=network-online.target
Wants=network-online.target

[Service]
WorkingDirectory=$dest
ExecStart=$dest/run.sh
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
    echo "equipped $node in $dest (start: $dest/run.sh; boot: systemctl link $dest/aeon-station.service && systemctl enable --now aeon-station)"
    ;;
  adb:*)
    serial="${to#adb:}"; d=/data/local/tmp/aeon
    command -v adb >/dev/null || die "adb not found"
    write_run "$d"
    adb -s "$serial" shell mkdir -p "$d"
    adb -s "$serial" push "$bin" "$d/fat-station"
    adb -s "$serial" push "$shard_path" "$d/$(basename "$shard_path")"
    adb -s "$serial" push "$tmp/node.json" "$d/node.json"
    adb -s "$serial" push "$tmp/run.sh" "$d/run.sh"
    [ -n "$key" ] && adb -s "$serial" push "$key" "$d/mesh.key" && adb -s "$serial" shell chmod 600 "$d/mesh.key"
    printf 'service aeon_station %s/run.sh\n    class late_start\n    user shell\n    oneshot\n\non property:sys.boot_completed=1\n    start aeon_station\n' "$d" > "$tmp/aeon-station.rc"
    adb -s "$serial" push "$tmp/aeon-station.rc" "$d/aeon-station.rc"
    adb -s "$serial" shell chmod 755 "$d/fat-station" "$d/run.sh"
    echo "equipped $node on $serial:$d (init fragment $d/aeon-station.rc: copy to /system/etc/init on a rooted device)"
    ;;
  *) die "--to must be dir:PATH or adb:SERIAL" ;;
esac
