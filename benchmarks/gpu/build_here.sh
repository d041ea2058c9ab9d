#!/usr/bin/env bash
# The CUDA package built on this machine - no GPU needed, only CUDA's compiler and cuBLAS - and packed as
# .pkg/pls.txz.* for `run.sh unpack` on the GPU machine, so that no call there spends its time compiling CUDA. On two
# cores the build took 23 minutes the first time (ccache makes a rebuild after a change outside ggml-cuda a matter of
# minutes).
#   CUDA_HOME   the toolkit with nvcc (default /usr/local/cuda; CUDA 13 for the H200 machine's driver)
#   CUDAARCHS   the GPU architectures (default 90-real: Hopper's machine code alone, which is all the GPU machine's
#               cards run; plain 90 adds PTX for later cards, twice the device code in libggml-cuda: packed, 42 MB
#               against 22 MB, in a call that carries it within 64 MiB)
#   UPSTREAM=1  (the default) also upstream's llama-speculative-simple and llama-bench, for the upstream-* arms
# The toolkit needs cuBLAS: where it lacks it, NVIDIA's wheel from PyPI (nvidia-cublas, CUBLAS_VERSION: the CUDA
# major's first release, which the GPU machine's libcublas is not older than) is put into it. ggml-cuda links the
# driver library (libcuda.so.1), which only a machine with an NVIDIA driver has: the build links against a stand-in
# with the symbols ggml-cuda calls (under the toolkit's lib/stubs, where CMake looks for it), and the GPU machine's
# own driver library is what loads.
set -euo pipefail
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
pkg=${PKG:-/tmp/pls}
[ -x "$cuda/bin/nvcc" ] || { echo "no nvcc under $cuda: set CUDA_HOME to a CUDA toolkit"; exit 1; }
lib=$cuda/lib64
[ -d "$lib" ] || lib=$cuda/lib
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$cuda/include/cublas_v2.h" ] || ! ls "$lib"/libcublas.so* >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cublas==${CUBLAS_VERSION:-13.0.0.19}"
    (cd "$tmp" && unzip -q ./*.whl)
    cp -n "$tmp"/nvidia/cu*/include/* "$cuda/include/"
    cp -n "$tmp"/nvidia/cu*/lib/* "$lib/"
    for f in "$tmp"/nvidia/cu*/lib/libcublas*.so.*; do  # the link-time names (libcublas.so -> libcublas.so.13)
        f=$(basename "$f")
        ln -sf "$f" "$lib/${f%%.so.*}.so"
    done
fi

if [ ! -e "$lib/stubs/libcuda.so" ] && ! ls "$lib"/libcuda.so* >/dev/null 2>&1; then
    python3 tools/vendor.py populate >/dev/null  # the pinned source with the patch series (a no-op when it is there)
    # every driver call ggml-cuda makes (cuMemCreate, cuDeviceGet, ...): a stand-in that only satisfies the linker
    syms=$(grep -rhoE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' vendor/llama.cpp/ggml/src/ggml-cuda \
        | sed -E 's/[[:space:]]*\($//' | sort -u | grep -vE '^cu(BLAS|da|blas)' || true)
    [ -n "$syms" ] || { echo "no driver calls found in vendor/llama.cpp/ggml/src/ggml-cuda"; exit 1; }
    for s in $syms; do echo "int $s(void) { return 999; }"; done > "$tmp/cuda_stub.c"
    mkdir -p "$lib/stubs"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/stubs/libcuda.so" "$tmp/cuda_stub.c"
fi

extra=""
[ "${UPSTREAM:-1}" = 1 ] && extra="-DPYLLAMASPEC_BUILD_UPSTREAM_SPECULATIVE=ON"
rm -rf "$pkg"
mkdir -p "$(dirname "${BUILD_LOG:-build/cuda-build.log}")"
t0=$SECONDS
# the system's g++, as on the GPU machine (run.sh build says why); a build tree of its own beside the CPU build's
PATH=$cuda/bin:$PATH CXX=${GPU_CXX:-/usr/bin/g++} CUDAHOSTCXX=${GPU_CXX:-/usr/bin/g++} PYLLAMASPEC_BACKEND=cuda \
    CUDAARCHS=${CUDAARCHS:-90-real} CMAKE_ARGS="$extra" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    python3 -m pip install --no-build-isolation --no-deps --no-compile --target "$pkg" -C build-dir=build/cuda . \
    > "${BUILD_LOG:-build/cuda-build.log}" 2>&1 || { tail -40 "${BUILD_LOG:-build/cuda-build.log}"; exit 1; }
echo "CUDA build: $((SECONDS - t0)) s"
mkdir -p .pkg
rm -f .pkg/pls.tgz.* .pkg/pls.txz.*
# as pls/, where `run.sh unpack` looks for it, whatever PKG was here; xz (`unpack` takes either kind of pieces)
tar cf - -C "$(dirname "$pkg")" --transform "s,^$(basename "$pkg"),pls," "$(basename "$pkg")" | xz -6 -T0 \
    | split -b 15M - .pkg/pls.txz.
ls -l .pkg/pls.txz.*
