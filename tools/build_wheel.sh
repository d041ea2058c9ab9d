#!/usr/bin/env bash
# Build, repair and verify a CPU or CUDA wheel (the ROCm wheel: tools/rocm/build-and-verify.sh).
# Used by .github/workflows/wheels.yml; works the same on a developer machine.
#
#   tools/build_wheel.sh cpu|cuda
#
# Environment: PYTHON (default python3), PYLLAMASPEC_WORK (scratch, default /tmp/pyllamaspec-<variant>),
# CUDAARCHS (cuda; default below), PYLLAMASPEC_SKIP_TESTS=1, CCACHE_DIR.
set -euo pipefail
VARIANT=${1:?usage: tools/build_wheel.sh cpu|cuda}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WORK=${PYLLAMASPEC_WORK:-/tmp/pyllamaspec-$VARIANT}
DIST=$SRC/dist/$VARIANT
DEFAULT_CUDAARCHS="61;70;75;80;86;89;90"
# the CUDA runtime comes from the user's CUDA 12 install (or the nvidia-*-cu12 wheels), never grafted
CUDA_EXCLUDES="libcuda.so.1 libcudart.so.12 libcublas.so.12 libcublasLt.so.12"

log() { printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
rm -rf "$WORK" && mkdir -p "$WORK" "$DIST"
"$PYTHON" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --upgrade pip
"$WORK/tools/bin/pip" install -q "auditwheel>=6.1" wheel

env_args=(PYLLAMASPEC_BACKEND="$VARIANT" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)")
excl=()
case "$VARIANT" in
    cpu) ;;
    cuda)
        env_args+=(CUDAARCHS="${CUDAARCHS:-$DEFAULT_CUDAARCHS}")
        for x in $CUDA_EXCLUDES; do excl+=(--exclude "$x"); done ;;
    *) echo "variant must be cpu or cuda (ROCm: tools/rocm/build-and-verify.sh)" >&2; exit 2 ;;
esac

log "build: pip wheel . ($VARIANT)"
env "${env_args[@]}" "$WORK/tools/bin/pip" wheel "$SRC" --no-deps -w "$WORK/raw" -C build-dir="$WORK/build"
if [ "$VARIANT" = cuda ]; then  # local version label, as for ROCm: same distribution, one variant per CUDA major
    raw=$(ls "$WORK"/raw/*.whl); mkdir -p "$WORK/u"
    "$WORK/tools/bin/python" -m wheel unpack -d "$WORK/u" "$raw" >/dev/null
    d=$(ls -d "$WORK"/u/*/); di=$(ls -d "$d"*.dist-info); v=$(sed -n 's/^Version: //p' "$di/METADATA")
    sed -i "s/^Version: .*/Version: $v+cu12/" "$di/METADATA"; mv "$di" "${d}pyllamaspec-$v+cu12.dist-info"
    rm "$raw"; "$WORK/tools/bin/python" -m wheel pack -d "$WORK/raw" "$d" >/dev/null
fi

log "repair: auditwheel"
"$WORK/tools/bin/auditwheel" repair -w "$DIST" "${excl[@]}" "$WORK"/raw/*.whl
whl=$(ls -t "$DIST"/*.whl | head -1)

log "verify: install $(basename "$whl"), pyllamaspec info, tests"
"$PYTHON" -m venv "$WORK/test"
"$WORK/test/bin/pip" install -q "$whl" pytest
if [ "$VARIANT" = cuda ] && ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    # no driver on a hosted runner: the toolkit's stub answers "no device"
    mkdir -p "$WORK/stub" && ln -sf /usr/local/cuda/lib64/stubs/libcuda.so "$WORK/stub/libcuda.so.1"
    export LD_LIBRARY_PATH="$WORK/stub:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
(cd "$WORK" && "$WORK/test/bin/pyllamaspec" info --json > info.json && "$WORK/test/bin/python" - info.json "$VARIANT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); v = sys.argv[2]
print(f"backends={d['backends']} gpu_targets={d['gpu_targets']} devices={[x['name'] for x in d['devices']]}")
assert v in d["backends"], d["backends"]
assert "site-packages" in d["library_dir"], d["library_dir"]
PY
)
if [ "${PYLLAMASPEC_SKIP_TESTS:-0}" != 1 ]; then
    (cd "$WORK" && PATH="$WORK/test/bin:$PATH" "$WORK/test/bin/python" -m pytest -q -p no:cacheprovider -c "$SRC/pyproject.toml" \
        --rootdir "$SRC" "$SRC/tests" -m "not realmodel")
fi
log "OK $(basename "$whl")"
