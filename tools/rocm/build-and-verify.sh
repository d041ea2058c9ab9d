#!/usr/bin/env bash
# Build, repair and verify the ROCm (HIP) wheel of pyllamaspec. One script for every place that builds it:
# the local GPU-less driver (tools/rocm/build-gfx906-wheel.sh runs it inside a Debian sid chroot) and CI
# (.github/workflows/wheels.yml runs it inside rocm/dev-ubuntu-22.04). No GPU is needed.
#
#   tools/rocm/build-and-verify.sh [all|build|repair|verify]      (default: all)
#
# Environment (all optional):
#   GPU_TARGETS                 AMD targets, ';'-separated (default below: gfx906)
#   PYLLAMASPEC_SYSROOT         compile/link host code against this sysroot (tools/rocm/sysroot-toolchain.cmake)
#   PYLLAMASPEC_LLAMA_CPP_SOURCE  llama.cpp source/carrier for tools/vendor.py
#   PYLLAMASPEC_WORK            scratch dir (default /tmp/pyllamaspec-rocm): venvs, raw wheel, build tree
#   PYLLAMASPEC_DIST            where the repaired wheel goes (default <repo>/dist/rocm)
#   PYLLAMASPEC_SKIP_TESTS=1    skip the test suite in 'verify'
#   PYLLAMASPEC_HIDE_ROCM_TEST=1  in 'verify', move libamdhip64 aside for a moment to check the import-time
#                               message (only in a throwaway root environment: chroot, CI container)
#   PYTHON                      interpreter for the venvs (default python3)
#   CCACHE_DIR                  ccache directory (keep it between runs; keep the environment fixed)
set -euo pipefail

# --- what this script promises; tests/test_workflow_sync.py checks README and the workflow against these ---
DEFAULT_GPU_TARGETS="gfx906"
ROCM_LABEL="rocm6"          # local version label: 0.1.0+rocm6.gfx906
# ROCm runtime: never grafted into the wheel, the user's ROCm 6.x provides it (sonames of ROCm 6.x)
ROCM_EXCLUDES="libamdhip64.so.6 libhipblas.so.2 librocblas.so.4 libhsa-runtime64.so.1 libamd_comgr.so.* libroctx64.so.* librocprofiler-register.so.* libhiprtc.so.* libhipblaslt.so.*"
# NEEDED entries that may point outside the wheel: exactly the ROCm runtime, plus (a subset of) the manylinux
# base libraries; libdl/libpthread only appear when the build's glibc is older than 2.34 (bullseye sysroot)
ROCM_NEEDED="libamdhip64.so.6 libhipblas.so.2 librocblas.so.4"
SYSTEM_NEEDED_ALLOWED="ld-linux-x86-64.so.2 libc.so.6 libdl.so.2 libgcc_s.so.1 libm.so.6 libpthread.so.0 librt.so.1 libstdc++.so.6"

SRC=$(cd "$(dirname "$0")/../.." && pwd)
STEP=${1:-all}
GPU_TARGETS=${GPU_TARGETS:-$DEFAULT_GPU_TARGETS}
GPU_TARGETS=${GPU_TARGETS//,/;}
WORK=${PYLLAMASPEC_WORK:-/tmp/pyllamaspec-rocm}
DIST=${PYLLAMASPEC_DIST:-$SRC/dist/rocm}
PYTHON=${PYTHON:-python3}
BUILD_DIR=$WORK/build
TOOLS_VENV=$WORK/tools-venv
TEST_VENV=$WORK/test-venv
LABEL="$ROCM_LABEL.${GPU_TARGETS//;/.}"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

log() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$WORK" "$DIST"

tools_venv() {
    if [ ! -x "$TOOLS_VENV/bin/auditwheel" ]; then
        "$PYTHON" -m venv "$TOOLS_VENV"
        "$TOOLS_VENV/bin/pip" install -q --upgrade pip
        "$TOOLS_VENV/bin/pip" install -q "auditwheel>=6.1" wheel
    fi
}

# ------------------------------------------------------------------------------------------------------
build() {
    log "build: pip wheel . (scikit-build-core, PYLLAMASPEC_BACKEND=hip, GPU_TARGETS=$GPU_TARGETS)"
    tools_venv
    local cmake_args="-DHIP_PLATFORM=amd -DGGML_NATIVE=OFF"
    if [ -n "${PYLLAMASPEC_SYSROOT:-}" ]; then
        cmake_args="$cmake_args -DCMAKE_TOOLCHAIN_FILE=$SRC/tools/rocm/sysroot-toolchain.cmake -DPYLLAMASPEC_SYSROOT=$PYLLAMASPEC_SYSROOT"
    elif [ -z "${HIPCXX:-}" ]; then
        if command -v hipconfig >/dev/null 2>&1 && [ -x "$(hipconfig -l 2>/dev/null)/clang" ]; then
            HIPCXX="$(hipconfig -l)/clang"              # AMD's ROCm (/opt/rocm/lib/llvm/bin)
            HIP_PATH="${HIP_PATH:-$(hipconfig -R)}"
            export HIPCXX HIP_PATH
        elif [ -x /usr/lib/llvm-21/bin/clang ]; then
            export HIPCXX=/usr/lib/llvm-21/bin/clang    # Debian's ROCm
        fi
    fi
    rm -rf "$BUILD_DIR" "$WORK/raw"
    command -v ccache >/dev/null && ccache -z >/dev/null || true
    local t0=$SECONDS
    PYLLAMASPEC_BACKEND=hip GPU_TARGETS="$GPU_TARGETS" CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$TOOLS_VENV/bin/pip" wheel "$SRC" --no-deps -w "$WORK/raw" -C build-dir="$BUILD_DIR" -v \
        > "$WORK/build.log" 2>&1 || { tail -60 "$WORK/build.log"; die "pip wheel failed (full log: $WORK/build.log)"; }
    echo "pip wheel: $((SECONDS - t0)) s"
    command -v ccache >/dev/null && ccache -s | grep -iE 'hits|misses|cache size' || true
    # local version label: same distribution name as the CPU wheel, one variant per ROCm major and target set
    local raw; raw=$(ls "$WORK"/raw/pyllamaspec-*.whl)
    rm -rf "$WORK/unpacked" && mkdir -p "$WORK/unpacked"
    "$TOOLS_VENV/bin/python" -m wheel unpack -d "$WORK/unpacked" "$raw" >/dev/null
    local dir; dir=$(ls -d "$WORK"/unpacked/*/)
    local di; di=$(ls -d "$dir"*.dist-info)
    local ver; ver=$(sed -n 's/^Version: //p' "$di/METADATA")
    sed -i "s/^Version: .*/Version: ${ver%%+*}+$LABEL/" "$di/METADATA"
    mv "$di" "${dir}pyllamaspec-${ver%%+*}+$LABEL.dist-info"
    rm -f "$raw"
    "$TOOLS_VENV/bin/python" -m wheel pack -d "$WORK/raw" "$dir" >/dev/null
    ls -l "$WORK"/raw/*.whl
}

# ------------------------------------------------------------------------------------------------------
repair() {
    log "repair: auditwheel, ROCm runtime excluded"
    tools_venv
    local raw; raw=$(ls "$WORK"/raw/pyllamaspec-*.whl)
    local args=() x
    for x in $ROCM_EXCLUDES; do args+=(--exclude "$x"); done
    rm -rf "$WORK/repaired" && mkdir -p "$WORK/repaired"
    # With a sysroot, libraries that get grafted (libgomp) must come from the sysroot, not from the build
    # system's newer glibc world: AUDITWHEEL_LD_LIBRARY_PATH is searched first (and only by auditwheel).
    local ldpath=""
    if [ -n "${PYLLAMASPEC_SYSROOT:-}" ]; then
        ldpath="$PYLLAMASPEC_SYSROOT/usr/lib/x86_64-linux-gnu:$PYLLAMASPEC_SYSROOT/lib/x86_64-linux-gnu"
    fi
    AUDITWHEEL_LD_LIBRARY_PATH="$ldpath" "$TOOLS_VENV/bin/auditwheel" repair -w "$WORK/repaired" "${args[@]}" "$raw"
    local whl; whl=$(ls "$WORK"/repaired/*.whl)
    rm -f "$DIST"/pyllamaspec-*+"$ROCM_LABEL".*.whl
    cp "$whl" "$DIST/"
    ls -l "$DIST/$(basename "$whl")"
}

# ------------------------------------------------------------------------------------------------------
verify() {
    local whl; whl=$(ls -t "$DIST"/pyllamaspec-*+"$LABEL"-*.whl | head -1)
    [ -f "$whl" ] || die "no wheel with label +$LABEL in $DIST"
    log "verify: $(basename "$whl") ($(du -h "$whl" | cut -f1))"
    local x="$WORK/verify"; rm -rf "$x" && mkdir -p "$x" && (cd "$x" && "$PYTHON" -m zipfile -e "$whl" .)
    local libs="$x/pyllamaspec/lib" libsdir="$x/pyllamaspec.libs"

    # 1. code objects: every requested target, nothing else
    local hip="$libs/libggml-hip.so"; [ -f "$hip" ] || die "libggml-hip.so is not in the wheel"
    local t n found
    for t in ${GPU_TARGETS//;/ }; do
        n=$(grep -c -a "hipv4-amdgcn-amd-amdhsa--$t" "$hip" || true)
        echo "offload bundles for $t: $n"
        [ "$n" -ge 50 ] || die "libggml-hip.so has $n code objects for $t"
    done
    found=$(grep -a -o 'hipv4-amdgcn-amd-amdhsa--gfx[0-9a-f]*' "$hip" | sort -u | sed 's/.*--//' | tr '\n' ' ')
    echo "offload targets present: $found"
    for t in $found; do
        case ";$GPU_TARGETS;" in *";$t;"*) ;; *) die "unrequested target $t in libggml-hip.so" ;; esac
    done

    # 2. NEEDED: inside the wheel, or exactly the declared external set
    local f ext
    for f in "$libs"/*.so* "$libsdir"/*.so*; do [ -f "$f" ] && basename "$f"; done | sort -u > "$x/inwheel.txt"
    for f in "$libs"/*.so* "$libsdir"/*.so*; do
        [ -f "$f" ] && objdump -p "$f" | awk '/NEEDED/{print $2}'
    done | sort -u > "$x/needed.txt"
    ext=$(grep -vxF -f "$x/inwheel.txt" "$x/needed.txt" | tr '\n' ' ' | sed 's/ $//')
    echo "external NEEDED: $ext"
    local rocm_got="" n
    for n in $ext; do
        case " $ROCM_NEEDED " in *" $n "*) rocm_got="$rocm_got $n"; continue ;; esac
        case " $SYSTEM_NEEDED_ALLOWED " in *" $n "*) ;; *) die "NEEDED $n is neither in the wheel, the ROCm runtime nor the manylinux base" ;; esac
    done
    [ "${rocm_got# }" = "$ROCM_NEEDED" ] || die "ROCm NEEDED is '${rocm_got# }', declared '$ROCM_NEEDED'"
    # no build paths in RUNPATH
    for f in "$libs"/*.so*; do
        objdump -p "$f" | awk '/RUNPATH|RPATH/{print $2}' | grep -qv '^\$ORIGIN' && die "$(basename "$f") has a non-\$ORIGIN RUNPATH"
    done

    # 3. glibc floor, per library, against the wheel's platform tag
    local floor="2.0" v tag
    printf '%-40s %-12s %s\n' library "max GLIBC" "max GLIBCXX"
    for f in "$libs"/*.so* "$libsdir"/*.so*; do
        [ -f "$f" ] || continue
        v=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
        printf '%-40s %-12s %s\n' "$(basename "$f")" "$v" "$(objdump -T "$f" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)"
        floor=$(printf '%s\n%s\n' "$floor" "$v" | sort -V | tail -1)
    done
    tag=$(basename "$whl" | grep -o 'manylinux_2_[0-9]*' | head -1 || true)
    echo "glibc floor (max GLIBC_ symbol version over the wheel): $floor; platform tag: ${tag:-none}"
    [ -n "$tag" ] || die "wheel has no manylinux tag"
    [ "$(printf '%s\n%s\n' "${tag#manylinux_}" "${floor/./_}" | tr _ . | sort -V | tail -1)" = "$(echo "${tag#manylinux_}" | tr _ .)" ] \
        || die "platform tag $tag is below the glibc floor $floor"

    # 4. install into a fresh venv; `pyllamaspec info` on a machine without a GPU
    log "verify: install + pyllamaspec info"
    rm -rf "$TEST_VENV"; "$PYTHON" -m venv "$TEST_VENV"
    # the project's own test extra (pyproject.toml), not a list of our own: tests/test_test_environment.py keeps
    # the two from drifting apart (the suite imports scipy, the server stack, ...)
    "$TEST_VENV/bin/pip" install -q "$whl[test]"
    local py="$TEST_VENV/bin/python"
    (cd "$WORK" && "$TEST_VENV/bin/pyllamaspec" info --json > "$WORK/info.json") || die "pyllamaspec info failed"
    (cd "$WORK" && "$TEST_VENV/bin/pyllamaspec" info) || true
    GPU_TARGETS="$GPU_TARGETS" "$py" - "$WORK/info.json" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
want = [t for t in os.environ["GPU_TARGETS"].split(";") if t]
gpus = [x for x in d["devices"] if x["type"] != "cpu"]
print(f"backends={d['backends']} gpu_targets={d['gpu_targets']} registries={d['backend_registries']} "
      f"gpu devices={len(gpus)} library_dir={d['library_dir']}")
assert "hip" in d["backends"], d["backends"]
assert d["gpu_targets"] == want, (d["gpu_targets"], want)
assert any("ROCm" in r or "HIP" in r.upper() for r in map(str, d["backend_registries"])), d["backend_registries"]
assert "site-packages" in d["library_dir"], d["library_dir"]
if not os.path.exists("/dev/kfd"):
    assert not gpus, gpus
PY

    # 5. a missing ROCm runtime gives the clear message. The library is moved aside for a moment, so this
    #    only runs where that is harmless and asked for (the chroot, the CI container):
    #    PYLLAMASPEC_HIDE_ROCM_TEST=1.
    local real
    real=$(ldconfig -p | awk '/libamdhip64\.so\.6 /{print $NF; exit}')
    [ -n "$real" ] && real=$(readlink -f "$real")
    if [ "${PYLLAMASPEC_HIDE_ROCM_TEST:-0}" = 1 ] && [ -n "$real" ] && [ -w "$(dirname "$real")" ]; then
        local msg rc=0
        mv "$real" "$real.pyllamaspec-hidden"
        trap 'mv "'"$real"'.pyllamaspec-hidden" "'"$real"'" 2>/dev/null || true' EXIT
        msg=$(cd "$WORK" && "$TEST_VENV/bin/pyllamaspec" info 2>&1) || rc=$?
        mv "$real.pyllamaspec-hidden" "$real"; trap - EXIT
        echo "with $(basename "$real") hidden (exit $rc): $msg"
        [ "$rc" != 0 ] || die "info succeeded with libamdhip64 hidden"
        echo "$msg" | grep -q "missing ROCm runtime libraries: libamdhip64.so.6" || die "unclear message"
        echo "$msg" | grep -q "Traceback" && die "a traceback instead of a message"
    else
        echo "skipped the hidden-runtime check (set PYLLAMASPEC_HIDE_ROCM_TEST=1 in a throwaway root environment)"
    fi

    # 6. the CPU test suite against the installed wheel (not the source tree: run from outside it)
    if [ "${PYLLAMASPEC_SKIP_TESTS:-0}" != 1 ]; then
        log "verify: pytest -m 'not realmodel' against the installed wheel"
        (cd "$WORK" && PATH="$TEST_VENV/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider -c "$SRC/pyproject.toml" --rootdir "$SRC" \
            "$SRC/tests" -m "not realmodel") || die "test suite failed"
    fi
    log "verify: OK $(basename "$whl")"
}

case "$STEP" in
    all) build; repair; verify ;;
    build) build ;;
    repair) repair ;;
    verify) verify ;;
    *) die "unknown step $STEP (all|build|repair|verify)" ;;
esac
