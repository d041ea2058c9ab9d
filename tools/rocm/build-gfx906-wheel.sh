#!/usr/bin/env bash
# Build and verify the ROCm (HIP) wheel of pyllamaspec on a Debian machine without a GPU.
#
#   sudo tools/rocm/build-gfx906-wheel.sh [--targets "gfx906;gfx908"] [--sysroot-suite bookworm|bullseye]
#                                         [--no-sysroot] [--setup-only] [--shell]
#
# What it does (everything outside the repo, under $PYLLAMASPEC_ROCM_CACHE, default /var/cache/pyllamaspec-rocm):
#   1. creates (once) a Debian sid chroot with Debian's ROCm 6.4 toolchain (hipcc, clang-21, hipBLAS, rocBLAS),
#      and a Debian bullseye sysroot (glibc 2.31, gcc-10 libstdc++) inside it, so the host code links against
#      an old glibc and libstdc++ (default; --sysroot-suite bookworm: glibc 2.36 + gcc 12, manylinux_2_35);
#   2. copies the repo's working tree (tracked + untracked, not ignored) and the llama.cpp carrier into it;
#   3. runs tools/rocm/build-and-verify.sh there under a fixed `env -i` environment (stable ccache keys):
#      `pip wheel .` (scikit-build-core, PYLLAMASPEC_BACKEND=hip), auditwheel repair excluding the ROCm
#      runtime, then verification (offload bundles, NEEDED, glibc floor, install + `pyllamaspec info` + tests);
#   4. copies the repaired wheel to dist/rocm/ in the repo.
# apt's archive, pip's cache and ccache live in $PYLLAMASPEC_ROCM_CACHE and are bind-mounted into the chroot.
# Needs root (debootstrap, chroot, mount; debootstrap is apt-installed on the host if missing) and a Debian
# mirror (read from the host's apt sources; override with PYLLAMASPEC_DEBIAN_MIRROR). PyPI must be reachable
# (build dependencies); the host's local CA certificates are copied in for a TLS-inspecting proxy.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PYLLAMASPEC_ROCM_CACHE:-/var/cache/pyllamaspec-rocm}
ROOTFS=$CACHE/sid
TARGETS=gfx906
SYSROOT_MODE=1
SETUP_ONLY=0
SHELL_ONLY=0
SUITE=sid
SYSROOT_SUITE=bullseye   # glibc 2.31 + libstdc++ 10: the wheel is manylinux_2_31

while [ $# -gt 0 ]; do
    case "$1" in
        --targets) TARGETS=$2; shift 2 ;;
        --targets=*) TARGETS=${1#*=}; shift ;;
        --no-sysroot) SYSROOT_MODE=0; shift ;;
        --sysroot-suite) SYSROOT_SUITE=$2; shift 2 ;;
        --sysroot-suite=*) SYSROOT_SUITE=${1#*=}; shift ;;
        --setup-only) SETUP_ONLY=1; shift ;;
        --shell) SHELL_ONLY=1; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap/chroot/mount)" >&2; exit 1; }
case "$SYSROOT_SUITE" in          # the gcc whose libstdc++ each suite ships
    bookworm) SYSROOT_GCC=12 ;;   # glibc 2.36, GLIBCXX_3.4.30
    bullseye) SYSROOT_GCC=10 ;;   # glibc 2.31, GLIBCXX_3.4.28
    *) echo "--sysroot-suite: bookworm or bullseye" >&2; exit 2 ;;
esac
SYSROOT_IN=/opt/sysroot-$SYSROOT_SUITE

log() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
T0=$(date +%s)

# --- Debian mirror: the host's (deb822 or one-line sources), unless given -------------------------------
mirror() {
    if [ -n "${PYLLAMASPEC_DEBIAN_MIRROR:-}" ]; then echo "$PYLLAMASPEC_DEBIAN_MIRROR"; return; fi
    local m
    m=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
    [ -n "$m" ] || m=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
    echo "${m:-http://deb.debian.org/debian}"
}
MIRROR=$(mirror)

in_chroot() {  # fixed, minimal environment: identical ccache keys from run to run
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

mounted=()
cleanup() {
    local i
    for ((i=${#mounted[@]}-1; i>=0; i--)); do umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true; done
}
trap cleanup EXIT
bind() {  # bind <host dir> <path inside chroot>
    mkdir -p "$1" "$ROOTFS$2"
    if ! mountpoint -q "$ROOTFS$2"; then mount --bind "$1" "$ROOTFS$2"; mounted+=("$ROOTFS$2"); fi
}

# --- 1. the chroot (kept between runs) -------------------------------------------------------------------
mkdir -p "$CACHE"
if [ ! -x "$ROOTFS/usr/bin/apt-get" ] || [ ! -e "$ROOTFS/.pyllamaspec-debootstrap-ok" ]; then
    log "debootstrap $SUITE from $MIRROR into $ROOTFS"
    if ! command -v debootstrap >/dev/null; then   # the only change this script makes to the host
        command -v apt-get >/dev/null || { echo "needs debootstrap (a Debian host)" >&2; exit 1; }
        apt-get install -y -q debootstrap || { apt-get update -q && apt-get install -y -q debootstrap; }
    fi
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR"
    touch "$ROOTFS/.pyllamaspec-debootstrap-ok"
fi
# The registry may serve a frozen snapshot whose Release has expired; Tensile kernel data (2.9 GB) is not
# needed to compile or link against rocBLAS.
cat > "$ROOTFS/etc/apt/apt.conf.d/99pyllamaspec" <<CONF
Acquire::Check-Valid-Until "false";
Acquire::Check-Date "false";
APT::Install-Recommends "false";
Binary::apt::APT::Keep-Downloaded-Packages "true";
CONF
echo 'path-exclude=/usr/lib/x86_64-linux-gnu/rocblas/*' > "$ROOTFS/etc/dpkg/dpkg.cfg.d/99pyllamaspec-no-tensile"
echo "deb $MIRROR $SUITE main" > "$ROOTFS/etc/apt/sources.list"
cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
# the host's local CAs (e.g. a TLS-inspecting egress proxy in front of PyPI) are trusted inside too
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    [ -x "$ROOTFS/usr/sbin/update-ca-certificates" ] && in_chroot update-ca-certificates >/dev/null 2>&1 || true
fi
bind "$CACHE/apt-archives" /var/cache/apt/archives
bind "$CACHE/ccache" /ccache
bind "$CACHE/pip" /root/.cache/pip
# /proc: not needed to build (HIP_PLATFORM=amd is passed), but the test suite looks at the process table
if ! mountpoint -q "$ROOTFS/proc"; then mount -t proc proc "$ROOTFS/proc"; mounted+=("$ROOTFS/proc"); fi

PKGS="hipcc libamdhip64-dev libhipblas-dev librocblas-dev rocm-cmake cmake ninja-build g++ ccache git python3 python3-pip python3-venv python3-dev patchelf binutils file ca-certificates"
STAMP="$ROOTFS/.pyllamaspec-toolchain"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$PKGS" ]; then
    log "toolchain: apt-get install (Debian ROCm 6.4, clang-21)"
    in_chroot apt-get update -q
    # shellcheck disable=SC2086
    in_chroot apt-get install -y -q -o Dpkg::Use-Pty=0 $PKGS
    echo "$PKGS" > "$STAMP"
fi

# --- the sysroot (default bullseye: glibc 2.31 + libstdc++ 10) for the host-side code ----------------------
SYSROOT_PKGS="libc6 libc6-dev linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1 libgcc-$SYSROOT_GCC-dev libstdc++6 libstdc++-$SYSROOT_GCC-dev libgomp1 gcc-$SYSROOT_GCC-base"
SYSROOT="$ROOTFS$SYSROOT_IN"
if [ "$SYSROOT_MODE" = 1 ] && [ "$(cat "$SYSROOT/.pyllamaspec-sysroot" 2>/dev/null)" != "$SYSROOT_PKGS" ]; then
    log "sysroot: $SYSROOT_SUITE packages unpacked into $SYSROOT_IN"
    mkdir -p "$ROOTFS/etc/apt/$SYSROOT_SUITE" "$ROOTFS/var/lib/apt-$SYSROOT_SUITE/lists/partial" \
             "$ROOTFS/var/cache/apt-$SYSROOT_SUITE/archives/partial"
    echo "deb $MIRROR $SYSROOT_SUITE main" > "$ROOTFS/etc/apt/$SYSROOT_SUITE/sources.list"
    APT_SR=(-o "Dir::Etc::SourceList=/etc/apt/$SYSROOT_SUITE/sources.list" -o "Dir::Etc::SourceParts=-"
            -o "Dir::State=/var/lib/apt-$SYSROOT_SUITE" -o "Dir::State::status=/var/lib/apt-$SYSROOT_SUITE/status"
            -o "Dir::Cache=/var/cache/apt-$SYSROOT_SUITE")
    touch "$ROOTFS/var/lib/apt-$SYSROOT_SUITE/status"
    in_chroot apt-get "${APT_SR[@]}" update -q
    rm -rf "$SYSROOT" "$ROOTFS/tmp/sysroot-debs"; mkdir -p "$SYSROOT" "$ROOTFS/tmp/sysroot-debs"
    # shellcheck disable=SC2086
    in_chroot sh -c "cd /tmp/sysroot-debs && apt-get $(printf "'%s' " "${APT_SR[@]}") download $SYSROOT_PKGS"
    for deb in "$ROOTFS"/tmp/sysroot-debs/*.deb; do dpkg-deb -x "$deb" "$SYSROOT"; done
    rm -rf "$ROOTFS/tmp/sysroot-debs"
    # absolute symlinks (libgcc_s.so -> /lib/...) must point into the sysroot, not at sid's libraries
    find "$SYSROOT" -type l | while read -r l; do
        t=$(readlink "$l"); case "$t" in /*) ln -sfn "$SYSROOT_IN$t" "$l" ;; esac
    done
    # gcc's omp.h, for clang's -fopenmp=libgomp (clang's resource dir has no omp.h)
    mkdir -p "$SYSROOT/usr/local/include"
    cp "$SYSROOT/usr/lib/gcc/x86_64-linux-gnu/$SYSROOT_GCC/include/omp.h" "$SYSROOT/usr/local/include/omp.h"
    echo "$SYSROOT_PKGS" > "$SYSROOT/.pyllamaspec-sysroot"
fi
log "chroot ready ($(( $(date +%s) - T0 )) s)"
[ "$SETUP_ONLY" = 1 ] && exit 0
if [ "$SHELL_ONLY" = 1 ]; then chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TERM="${TERM:-xterm}" bash; exit; fi

# --- 2. the working tree and the llama.cpp carrier, copied in ----------------------------------------------
log "copy the working tree into $ROOTFS/src"
rm -rf "$ROOTFS/src" && mkdir -p "$ROOTFS/src"
(cd "$REPO" && git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) \
    | tar -xf - -C "$ROOTFS/src"
CARRIER_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/pyllamaspec/carrier
mkdir -p "$ROOTFS/root/.cache/pyllamaspec/carrier"
SOURCE_ENV=()
if ls "$CARRIER_DIR"/*.tar.gz >/dev/null 2>&1; then
    cp -u "$CARRIER_DIR"/*.tar.gz "$ROOTFS/root/.cache/pyllamaspec/carrier/"
    c=$(ls "$ROOTFS"/root/.cache/pyllamaspec/carrier/*.tar.gz | head -1)
    SOURCE_ENV=(PYLLAMASPEC_LLAMA_CPP_SOURCE="/root/.cache/pyllamaspec/carrier/$(basename "$c")")
fi  # else tools/vendor.py downloads the carrier from PyPI inside the chroot

# --- 3. build, repair, verify: the shared script, in a fixed environment --------------------------------------
SR_ENV=()
[ "$SYSROOT_MODE" = 1 ] && SR_ENV=(PYLLAMASPEC_SYSROOT="$SYSROOT_IN")
log "build-and-verify.sh in the chroot (GPU_TARGETS=$TARGETS, sysroot: $([ "$SYSROOT_MODE" = 1 ] && echo "$SYSROOT_IN" || echo none))"
rm -rf "$ROOTFS/dist" && mkdir -p "$ROOTFS/dist"
T1=$(date +%s)
in_chroot CCACHE_DIR=/ccache GPU_TARGETS="$TARGETS" PYLLAMASPEC_WORK=/work-rocm PYLLAMASPEC_DIST=/dist PYLLAMASPEC_HIDE_ROCM_TEST=1 \
    "${SR_ENV[@]}" "${SOURCE_ENV[@]}" nice -n "${PYLLAMASPEC_NICE:-10}" bash /src/tools/rocm/build-and-verify.sh all
T2=$(date +%s)

# --- 4. the wheel, out -------------------------------------------------------------------------------------
mkdir -p "$REPO/dist/rocm"
rm -f "$REPO"/dist/rocm/pyllamaspec-*+rocm6."${TARGETS//;/.}"-*.whl   # the previous build of this variant
cp "$ROOTFS"/dist/*.whl "$REPO/dist/rocm/"
log "done: build+verify $((T2 - T1)) s, total $((T2 - T0)) s"
ls -l "$REPO"/dist/rocm/*.whl
