#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's H200 sections, in phases that each fit one call of a lent machine.
#   setup      install the carried wheels, build the CUDA package (with upstream's speculative-simple), write models
#   tests      the suite on CUDA (no real models: they cannot travel)
#   step       step cost, 7B-shape Q4_0 target + 0.5B-shape Q4_0 drafter: plain, fixed, adaptive, upstream
#   depth      the same at 4k and 16k context, synthetic acceptance
#   hybrid27   27B-shape hybrid target + DFlash2-shape drafter (ring rollback), synthetic acceptance, depths
# Models and the build live under /tmp (kept while the machine stays warm); results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/m
SITE=/tmp/site
PKG=/tmp/pls
export PYTHONPATH=$PKG:$SITE

phase_setup() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || return 1
    local t0=$SECONDS
    PYLLAMASPEC_BACKEND=cuda CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90 -DPYLLAMASPEC_BUILD_UPSTREAM_SPECULATIVE=ON" \
        CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps --target $PKG . \
        > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
    echo "build: $((SECONDS - t0)) s"
    python3 -P -m pyllamaspec.cli info
    t0=$SECONDS
    [ -f /tmp/m/t7b.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/t7b.gguf --preset qwen2.5-7b --type q4_0 --stddev 0.02 --seed 1
    [ -f /tmp/m/d05.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/d05.gguf --preset qwen2.5-0.5b --type q4_0 --stddev 0.02 --seed 2
    echo "synth 7B + 0.5B: $((SECONDS - t0)) s"
}

phase_tests() {
    timeout 300 python3 -P -m pytest -q -m "not realmodel" -p no:cacheprovider tests/test_sessions.py tests/test_streams.py \
        tests/test_model_drafters.py tests/test_threads.py tests/test_continuous.py tests/test_adaptive.py \
        tests/test_sampling.py tests/test_memory.py 2>&1 | tail -15
}

phase_diag() {
    timeout 200 python3 -P -m pytest -q -x --tb=short -p no:cacheprovider tests/test_streams.py -k "hybrid" 2>&1 | tail -40
}

phase_step() {
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms plain,n4,n8,adaptive,upstream-n4,upstream-n8 --depth 0 --synth 0 --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-natural.json"
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms plain,n4,n8,adaptive --depth 0 --synth 0.3,0.6,0.8,0.9 --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-synthetic.json"
}

phase_depth() {
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms plain,n4,n8,adaptive --depth 4096,16384 --synth 0.3,0.6,0.9 --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-depth.json"
}

phase_hybrid27() {
    local t0=$SECONDS
    [ -f /tmp/m/t27.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/t27.gguf --preset qwen3.8-27b --type q4_0 \
        --stddev 0.02 --seed 3 --drafter /tmp/m/d27.gguf
    echo "synth 27B + DFlash2: $((SECONDS - t0)) s"
    # a trained DFlash2 drafter's profile on a real 27B hybrid: about 64% of drafted tokens land, 3.6-5 tokens per step at n_max 7
    python3 -P benchmarks/step_cost.py -m /tmp/m/t27.gguf -md /tmp/m/d27.gguf \
        --arms plain,n7,adaptive7,upstream-n7 --depth 0,4096 --synth 0,0.8 --rounds 8 --n-predict 64 \
        --json "$OUT/h200-hybrid27.json"
}

for phase in "$@"; do
    echo "== $phase"
    "phase_$phase" || { echo "phase $phase failed"; exit 1; }
done
