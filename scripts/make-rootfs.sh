#!/usr/bin/env bash
# make-rootfs.sh DIR [--arch arm64] [--suite SUITE] [--mirror URL]
#
# Builds a real rootfs base for swerve from this machine's package manager, then prints a summary.
#
#   (default)     a small busybox-static + bash rootfs (a few MB, a few hundred paths) for fast
#                 tests: /bin/busybox with its applets symlinked into /bin, bash and the shared
#                 libraries ldd names, /etc/{os-release,hostname,passwd,group,hosts}, and the
#                 mount points swerve needs (/proc /sys /dev /tmp /mnt).
#   --arch arm64  a Debian minbase for arm64 via `debootstrap --foreign`; the second stage runs
#                 inside the tree through qemu-user-static binfmt (binfmt_misc is mounted and the
#                 qemu-aarch64 handler registered, with the F flag, if needed). This is the stand-in
#                 for the device's Arch Linux ARM. Suite and mirror default to this machine's apt
#                 configuration (/etc/os-release, /etc/apt/sources.list*).
#
# A real Arch Linux ARM rootfs works the same way: unpack ArchLinuxARM-aarch64-latest.tar.gz as
# root with `bsdtar -xpf ... -C DIR` (keeps owners and modes), make sure DIR has /proc /sys /dev
# /tmp directories (it does), then `swerve admit base:alarm --rootfs DIR` and
# `swerve cline base:alarm -- /usr/bin/uname -m` (needs the qemu-aarch64 binfmt handler on an
# x86_64 host; none on the device itself).
#
# The tree is built in DIR.partial.PID and renamed to DIR at the end, so DIR is either complete or
# absent. DIR must not exist (or be empty). Needs root (apt-get, chown, chroot).
# Exit codes: 0 built; 1 failed; 2 usage.
set -euo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "make-rootfs: $*" >&2; exit 1; }

DIR=""
ARCH=""
SUITE=""
MIRROR="${MIRROR:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) [ $# -ge 2 ] || usage; ARCH="$2"; shift 2 ;;
        --arch=*) ARCH="${1#--arch=}"; shift ;;
        --suite) [ $# -ge 2 ] || usage; SUITE="$2"; shift 2 ;;
        --mirror) [ $# -ge 2 ] || usage; MIRROR="$2"; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "make-rootfs: unknown option $1" >&2; usage ;;
        *) [ -z "$DIR" ] || usage; DIR="$1"; shift ;;
    esac
done
[ -n "$DIR" ] || usage
case "$ARCH" in ""|arm64|aarch64) ;; *) die "--arch: only arm64 is supported (default: this machine's)";; esac
[ "$(id -u)" = 0 ] || die "needs root (apt-get, chown, chroot)"
if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
    die "$DIR exists and is not empty"
fi
[ -d "$DIR" ] && rmdir "$DIR"

STAGE="$DIR.partial.$$"
cleanup() { [ -d "$STAGE" ] && rm -rf --one-file-system "$STAGE" || true; }
trap cleanup EXIT
START=$(date +%s.%N)

apt_install() {
    # apt_install PKG... : installs what is missing (apt-get update once, quietly).
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "make-rootfs: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    }
}

busybox_rootfs() {
    apt_install busybox-static
    local bb=/bin/busybox
    [ -x "$bb" ] || bb=$(command -v busybox) || die "busybox-static installed but no busybox binary"
    file_is_static "$bb" || die "$bb is not static (install busybox-static)"

    mkdir -p "$STAGE"
    cd "$STAGE"
    mkdir -p bin sbin usr/bin usr/sbin etc proc sys dev tmp mnt root home var/log run lib
    install -m 0755 "$bb" bin/busybox
    # Every applet as a symlink in /bin (sh, ls, cat, ps, mount, ip, uname, hostname, sleep, ...).
    local n=0
    for a in $("$bb" --list); do
        case "$a" in busybox|bash) continue ;; esac
        [ -e "bin/$a" ] || { ln -s busybox "bin/$a"; n=$((n + 1)); }
    done

    # bash and the shared libraries it needs (paths as ldd reports them, plus the loader).
    local bash_bin
    bash_bin=$(readlink -f "$(command -v bash)")
    install -m 0755 "$bash_bin" bin/bash
    ldd "$bash_bin" | awk '/=> \//{print $3} /^\t\//{print $1}' | sort -u | while read -r lib; do
        [ -e "$lib" ] || continue
        mkdir -p ".$(dirname "$lib")"
        cp -L "$lib" ".$lib"
        chmod 0755 ".$lib"
    done

    local bbver
    # awk reads all of busybox's output: `head -1` would SIGPIPE it and trip pipefail.
    bbver=$("$bb" 2>&1 | awk 'NR == 1 {print $2}')
    cat > etc/os-release <<EOF
NAME="aeon sliver"
ID=aeon-sliver
ID_LIKE=busybox
VERSION_ID="1"
PRETTY_NAME="aeon sliver (busybox $bbver + bash)"
BUSYBOX_VERSION="$bbver"
EOF
    echo sliver > etc/hostname
    cat > etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat > etc/group <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > etc/hosts
    chmod 0755 . bin sbin usr usr/bin usr/sbin etc proc sys dev mnt home var var/log run lib
    chmod 1777 tmp
    chmod 0700 root
    chown -R 0:0 .
    cd - >/dev/null
    echo "make-rootfs: busybox $bbver with $n applets, bash $(bash -c 'echo $BASH_VERSION')" >&2
}

file_is_static() {
    # Static binaries have no PT_INTERP; ldd says "not a dynamic executable".
    ! ldd "$1" >/dev/null 2>&1
}

apt_mirror() {
    # The first Debian mirror this machine's apt uses (one-line or deb822 sources).
    local m=""
    m=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -v security | awk '{print $2}' | head -1 || true)
    if [ -z "$m" ]; then
        m=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | grep -v security | awk '{print $2}' | head -1 || true)
    fi
    echo "$m"
}

ensure_binfmt_aarch64() {
    local bm=/proc/sys/fs/binfmt_misc
    if [ ! -e "$bm/status" ]; then
        mount -t binfmt_misc binfmt_misc "$bm" || die "cannot mount binfmt_misc at $bm"
    fi
    [ "$(cat "$bm/status")" = enabled ] || echo 1 > "$bm/status"
    if [ ! -e "$bm/qemu-aarch64" ]; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    fi
    if [ ! -e "$bm/qemu-aarch64" ]; then
        # Register by hand; F (fix binary) opens the interpreter now, so it works in any chroot.
        printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F' \
            > "$bm/register" || die "cannot register the qemu-aarch64 binfmt handler"
    fi
    grep -q enabled "$bm/qemu-aarch64" || die "qemu-aarch64 binfmt handler is disabled"
}

arm64_rootfs() {
    apt_install debootstrap qemu-user-static binfmt-support
    ensure_binfmt_aarch64
    [ -n "$SUITE" ] || SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$SUITE" ] || die "cannot tell the Debian suite; pass --suite"
    [ -n "$MIRROR" ] || MIRROR=$(apt_mirror)
    [ -n "$MIRROR" ] || die "cannot find a Debian mirror in /etc/apt; pass --mirror URL"
    echo "make-rootfs: debootstrap --arch=arm64 --foreign --variant=minbase $SUITE ($MIRROR)" >&2
    debootstrap --arch=arm64 --foreign --variant=minbase "$SUITE" "$STAGE" "$MIRROR" >&2 \
        || die "debootstrap first stage failed (see $STAGE/debootstrap/debootstrap.log)"
    # The F-flag handler needs no interpreter inside; keep a copy anyway for handlers without F.
    install -m 0755 /usr/bin/qemu-aarch64-static "$STAGE/usr/bin/qemu-aarch64-static"
    echo "make-rootfs: second stage inside the tree (aarch64 through qemu-user)" >&2
    chroot "$STAGE" /debootstrap/debootstrap --second-stage >&2 \
        || die "debootstrap second stage failed (see $STAGE/debootstrap/debootstrap.log)"
    echo sliver > "$STAGE/etc/hostname"
    mkdir -p "$STAGE/proc" "$STAGE/sys" "$STAGE/dev" "$STAGE/tmp" "$STAGE/mnt"
    # debootstrap leaves device nodes in /dev; swerve mounts its own tmpfs there.
    find "$STAGE/dev" -mindepth 1 -delete
    chmod 1777 "$STAGE/tmp"
    # Pin the apt caches empty so the certified tree is just the system.
    rm -rf "$STAGE/var/cache/apt/archives/"*.deb "$STAGE/var/lib/apt/lists/"* 2>/dev/null || true
}

if [ -z "$ARCH" ]; then
    busybox_rootfs
else
    arm64_rootfs
fi

mv -T "$STAGE" "$DIR"
trap - EXIT
END=$(date +%s.%N)
files=$(find "$DIR" | wc -l)
size=$(du -sh "$DIR" | cut -f1)
secs=$(awk -v a="$START" -v b="$END" 'BEGIN { printf "%.1f", b - a }')
echo "make-rootfs: $DIR: $files paths, $size, built in $secs s" >&2
