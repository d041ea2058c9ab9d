#!/usr/bin/env bash
# The GPU runs behind BENCHMARKS.md's H200 sections, in phases that each fit one call of a lent machine.
# No CUDA build there at all: `benchmarks/gpu/build_here.sh` builds the CUDA package on a machine without a GPU (CUDA's
# compiler and cuBLAS, no driver) into .pkg/pls.tgz.*, which every call carries and unpacks. Or build once per machine
# session there and carry it afterwards:
#   build      the carried wheels and the CUDA package into /tmp/pls, with the system's g++ (GPU_CXX=... another;
#              UPSTREAM=1 adds upstream's speculative-simple and llama-bench); then `pack` it into $OUT (pieces of
#              15 MB) and copy the pieces into .pkg/ here
#   pack       /tmp/pls as $OUT/pls.tgz.aa, .ab, ... (~26 MB for sm_90's machine code; `tar cf - pls | xz -6` of it
#              is 22 MB, as .pkg/pls.txz.aa, ..., which unpack prefers)
#   unpack     the carried .pkg/pls.txz.* (or .tgz.*) into /tmp/pls, the checkout's Python over it (Python changes need no
#              rebuild), and .pkg/libs.tgz over its libraries when it was carried (libllama, libllama-common, libggml-base and the
#              shim, built on another x86-64 machine from this tree: `benchmarks/gpu/libs.sh`); needs
#              `carry: [".pkg", ".whl"]`
#   setup      build (the carried wheels, the CUDA package; UPSTREAM=1 adds upstream's speculative-simple),
#              synth05, synth7 (the models)
#   tests      the suite on CUDA (no real models: they cannot travel)
#   step       step cost, 7B-shape Q4_0 target + 0.5B-shape Q4_0 drafter: plain, fixed, adaptive, upstream
#              (NATURAL_ARMS= narrows the natural-acceptance cell)
#   depth4k, depth16k   the same at 4k and 16k context, synthetic acceptance (ARMS=, LEVELS= narrow them)
#   hybrid27   27B-shape hybrid target + DFlash2-shape drafter (ring rollback), synthetic acceptance, depths
#   llamaserver  upstream's llama-server from the pinned commit's source carried unpatched as .ups/ (the archive
#              tools/vendor.py verifies, without docs/, models/, tests/, examples/ and the ggml backends other than
#              cpu and cuda - about 36 MB; tools/, vendor/ and scripts/ui-assets.cmake are needed)
#   serve      `pyllamaspec serve` against llama-server, 7B-shape + 0.5B-shape, 1/4/8 clients: llama-server from the
#              llamaserver phase, or the one `benchmarks/gpu/server.sh` built on another machine against the package's
#              libraries (carried as .pkg/lsrv.tgz, put beside them by unpack)
#   g35graphs  35B-A3B: graphs kept by shape against llama's single graph (-g1 arms), sweep and adaptive, one run
#   gsched     kept graphs in schedulers of their own against one scheduler (-gs) and one graph (-g1); MODEL=27
#   gmem       the device memory kept graphs take, 27B and 35B-A3B, each arm in a process of its own
#   catchup    a feature-reading drafter's catch-up cost after 1..63 plain steps (27B + DFlash2, 35B-A3B + DFlash)
#   kernels    every kernel of our plain decode and llama-bench's (7B-shape), timed by Nsight Compute
#   tax        Nsight Systems' summaries of a plain and an adaptive session (35B-A3B + DFlash, natural acceptance):
#              what a step that drafts nothing pays with a feature-reading drafter attached
#   rpc        7B-shape + 0.5B-shape on the local GPU against the same GPU reached through `pyllamaspec rpc-server`
#              on this machine (loopback), plain, n4 and adaptive (R rounds, default 3); needs a package with the RPC
#              backend (the build phase from a tree that has it: a package carried from before has no rpc-server)
# Models and the build live under /tmp (kept while the machine stays warm); results go to $OUT. Each phase starts
# with an empty cost cache (PYLLAMASPEC_COST_CACHE), so adaptive arms learn their costs within the run.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/m
SITE=/tmp/site
PKG=${PKG:-/tmp/pls}  # another package folder (a build of another tree) for an A/B of two builds in one call
export PYTHONPATH=$PKG:$SITE

phase_setup() { phase_build && phase_synth05 && phase_synth7; }

phase_pack() {
    tar czf - -C /tmp pls | split -b 15M - "$OUT/pls.tgz." && ls -l "$OUT"/pls.tgz.*
}

phase_unpack() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || return 1
    if [ ! -d $PKG/pyllamaspec/lib ]; then
        # pieces of an xz archive (.pkg/pls.txz.*: 4 MB smaller than gzip's, where the carried tree nears 64 MiB)
        # or of the gzip one `pack` makes
        if compgen -G '.pkg/pls.txz.*' >/dev/null; then
            cat .pkg/pls.txz.* | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp')" || return 1
        else
            cat .pkg/pls.tgz.* | tar xz -C /tmp || return 1
        fi
    fi
    # this checkout's Python (and header) over the package's; lib/ and bin/ stay
    cp -r pyllamaspec/. $PKG/pyllamaspec/
    # libllama, libllama-common and the shim hold no backend code: built on any x86-64 machine from the same tree
    # (`benchmarks/gpu/libs.sh`), they replace the package's, whose ggml backends stay
    [ -f .pkg/libs.tgz ] && tar xzf .pkg/libs.tgz -C $PKG/pyllamaspec/lib
    # upstream's llama-server built against those libraries (`benchmarks/gpu/server.sh`), for the serve phase
    [ -f .pkg/lsrv.tgz ] && tar xzf .pkg/lsrv.tgz -C $PKG/pyllamaspec/lib
    python3 -P -m pyllamaspec.cli info | head -4
}

phase_synth27() {
    local t0=$SECONDS
    [ -f /tmp/m/t27.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/t27.gguf --preset qwen3.8-27b --type q4_0 \
        --stddev 0.02 --seed 3 --drafter /tmp/m/d27.gguf
    echo "synth 27B + DFlash2: $((SECONDS - t0)) s"
}

phase_synth35() {
    local t0=$SECONDS
    [ -f /tmp/m/t35.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/t35.gguf --preset qwen3.6-35b-a3b --type q4_0 \
        --stddev 0.02 --seed 4 --drafter /tmp/m/d35.gguf
    echo "synth 35B-A3B + DFlash: $((SECONDS - t0)) s"
}

# the grid of issue-sized cells, every step traced (pyllamaspec.bench.trace) for replay: R rounds (default 8);
# FRESH=1: every run in a session of its own (step_cost.py --fresh)
grid() {  # name model drafter arms depth levels [extra step_cost.py flags...]
    local name=$1 m=$2 d=$3 arms=$4 depth=$5 levels=$6 card; shift 6
    # records are named by the card that measured them (h200-..., h100-...), whatever the phase calls them
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'H100|H200|A100|L40S' | tr 'A-Z' 'a-z')
    name=${card:-gpu}-${name#h200-}
    mkdir -p "$OUT/res"
    # a run of the same name in this call (another level under the same TAG) keeps its record: this one gets a suffix
    local base=$name i=2
    while [ -e "$OUT/res/$name.json" ]; do name=$base-$i; i=$((i + 1)); done
    python3 -P benchmarks/step_cost.py -m "$m" -md "$d" --arms "$arms" --depth "$depth" --synth "$levels" \
        --rounds "${R:-8}" --n-predict "${N:-64}" --json "$OUT/res/$name.json" --trace "$OUT/res/$name-trace.json.gz" \
        ${FRESH:+--fresh} "$@"
}
phase_g27() { phase_synth27 && grid "h200-27b-d0${TAG:-}" /tmp/m/t27.gguf /tmp/m/d27.gguf "${ARMS:-plain,n3,n5,n7,adaptive7,sweep}" 0 "${LEVELS:-0,0.3,0.6,0.8,0.9}"; }
# a feature-reading drafter's catch-up after G plain steps (gapG arms, natural acceptance): 27B + DFlash2, 35B-A3B + DFlash
phase_catchup() {
    # CATCHUP_ROWS=N: rows per pass of the catch-up (default: the session's, 8 on a GPU)
    local arms=${ARMS:-n3,gap1,gap4,gap16,gap63} tag=${TAG:-} rows=(--catchup-rows "${CATCHUP_ROWS:-0}")
    phase_synth27 && grid "h200-27b-catchup$tag" /tmp/m/t27.gguf /tmp/m/d27.gguf "$arms" 0 0 --sweep-n-max 3 "${rows[@]}" \
        && phase_synth35 && grid "h200-35b-catchup$tag" /tmp/m/t35.gguf /tmp/m/d35.gguf "$arms" 0 0 --sweep-n-max 3 "${rows[@]}"
}
phase_g27deep() {  # DEPTHS (default "4096 16384"); ARMS_4K / ARMS_16K narrow one depth (a 16k prompt is processed once per generation)
    phase_synth27 || return 1
    local d arms
    for d in ${DEPTHS:-4096 16384}; do
        case $d in
            4096) arms=${ARMS_4K:-${ARMS:-plain,n3,n7,adaptive7}} ;;
            16384) arms=${ARMS_16K:-${ARMS:-plain,n3,n7,adaptive7}} ;;
            *) arms=${ARMS:-plain,n3,n7,adaptive7} ;;
        esac
        grid "h200-27b-d$d${TAG:-}" /tmp/m/t27.gguf /tmp/m/d27.gguf "$arms" "$d" "${LEVELS:-0,0.8}" --ubatch 2048 || return 1
    done
}
phase_g27d16k() { DEPTHS=16384 ARMS=${ARMS:-plain,n7,adaptive7} phase_g27deep; }  # depth 16384 alone (its prompts take most of a call)
phase_g35() {
    phase_synth35 && grid "h200-35b-d0${TAG:-}" /tmp/m/t35.gguf /tmp/m/d35.gguf "${ARMS:-plain,n3,n7,n15,adaptive15,sweep}" 0 "${LEVELS:-0,0.6,0.8,0.9}" \
        --sweep-n-max "${SWEEP_MAX:-15}"
}
# the cold cost of a batch size the step before did not run (35B-A3B MoE, sweep arm): as built, with llama's graph
# reuse off, and with CUDA graphs off - which of graph building, capture or eager launches a new size pays
phase_g35cold() {
    phase_synth35 || return 1
    local cfg
    for cfg in default LLAMA_GRAPH_REUSE_DISABLE=1 GGML_CUDA_DISABLE_GRAPHS=1; do
        ( [ "$cfg" = default ] || export "$cfg"
          grid "h200-35b-cold-${cfg%%=*}" /tmp/m/t35.gguf /tmp/m/d35.gguf plain,n3,sweep 0 0.6 --sweep-n-max 7 ) || return 1
    done
}
# graphs kept by shape (patch 0010) against llama's single graph (-g1 arms, LLAMA_GRAPH_CACHE=1), interleaved in one
# run: the sweep's cold cost of a batch size the step before did not run, and the adaptive arm beside the fixed ones
phase_g35graphs() {
    phase_synth35 && grid h200-35b-graphs /tmp/m/t35.gguf /tmp/m/d35.gguf \
        "${ARMS:-plain,n3,n7,adaptive15,adaptive15-g1,sweep,sweep-g1}" 0 "${LEVELS:-0,0.6,0.8,0.9}" --sweep-n-max 7
}
# kept graphs of small batches in schedulers of their own (the default) against kept graphs in the context's one
# scheduler (-gs arms, LLAMA_GRAPH_CACHE_SCHED=0) and one graph (-g1), interleaved in one run (MODEL=27 the 27B)
phase_gsched() {
    if [ "${MODEL:-35}" = 27 ]; then
        phase_synth27 && grid h200-27b-sched /tmp/m/t27.gguf /tmp/m/d27.gguf \
            "${ARMS:-plain,n3,n5,n7,adaptive7,adaptive7-gs,sweep,sweep-gs}" 0 "${LEVELS:-0,0.6,0.8,0.9}"
    else
        phase_synth35 && grid h200-35b-sched /tmp/m/t35.gguf /tmp/m/d35.gguf \
            "${ARMS:-plain,n3,n7,adaptive15,adaptive15-gs,sweep,sweep-gs,sweep-g1}" 0 "${LEVELS:-0,0.6,0.8,0.9}" --sweep-n-max 7
    fi
}
# device memory of the kept graphs (benchmarks/gpu/graph_memory.py), each arm in a process of its own
phase_gmem() {
    local arm m
    mkdir -p "$OUT/res"
    phase_synth27 && phase_synth35 || return 1
    for m in 27 35; do
        for arm in ${ARMS:-sweep sweep-gs sweep-g1}; do
            python3 -P benchmarks/gpu/graph_memory.py -m /tmp/m/t$m.gguf -md /tmp/m/d$m.gguf --arm "$arm" \
                | tee -a "$OUT/res/h200-graph-memory-$m.jsonl" || return 1
        done
    done
}
phase_g35cpu() {
    phase_synth35 && grid "h200-35b-cpumoe${TAG:-}" /tmp/m/t35.gguf /tmp/m/d35.gguf "${ARMS:-plain,n3,n7,adaptive15}" 0 "${LEVELS:-0.8}" --n-cpu-moe 41
}
phase_g7() {
    phase_synth05 && phase_synth7 && grid "h200-7b-d0${TAG:-}" /tmp/m/t7b.gguf /tmp/m/d05.gguf \
        "${ARMS:-plain,n2,n4,n8,adaptive,sweep,upstream-n4,upstream-plain}" 0 "${LEVELS:-0,0.3,0.6,0.8,0.9}"
}
phase_g7deep() {  # DEPTHS (default 16384)
    phase_synth05 && phase_synth7 || return 1
    local d
    for d in ${DEPTHS:-16384}; do
        grid "h200-7b-d$d${TAG:-}" /tmp/m/t7b.gguf /tmp/m/d05.gguf "${ARMS:-plain,n2,n4,adaptive}" "$d" "${LEVELS:-0,0.8}" --ubatch 2048 || return 1
    done
}
# what a session with a feature-reading drafter attached pays on a step that drafts nothing: Nsight Systems' summaries
# (device copies by size and time, API calls, kernels) of a plain and an adaptive session, 35B-A3B + DFlash at natural
# acceptance (the adaptive arm stays plain on ~99% of its steps), each in a process of its own
phase_tax() {
    phase_synth35 || return 1
    mkdir -p "$OUT/res"
    local nsys arm
    nsys=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
    [ -n "$nsys" ] || { echo "no nsys here"; return 1; }
    for arm in plain ${TAX_ARM:-adaptive15}; do
        timeout "${TAX_TIMEOUT:-60}" "$nsys" profile -t cuda -f true -o "/tmp/tax-$arm" python3 -P benchmarks/step_cost.py \
            -m /tmp/m/t35.gguf -md /tmp/m/d35.gguf --arms "$arm" --depth 0 --synth 0 --rounds 1 --n-predict "${N:-128}" \
            > "$OUT/res/tax-$arm.log" 2>&1 || { tail -5 "$OUT/res/tax-$arm.log"; return 1; }
        "$nsys" stats -r cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,cuda_api_sum,cuda_gpu_kern_sum -f csv \
            -o "$OUT/res/tax-$arm" "/tmp/tax-$arm.nsys-rep" > "$OUT/res/tax-$arm-stats.log" 2>&1 \
            || { echo "nsys stats failed for $arm:"; tail -5 "$OUT/res/tax-$arm-stats.log"; return 1; }
    done
    ls -l "$OUT/res"/tax-*
}
# the results of a call as one file (the files that come back from a call are few)
phase_collect() { [ -d "$OUT/res" ] && tar czf "$OUT/results-$(date -u +%H%M%S).tgz" -C "$OUT" res && rm -rf "$OUT/res"; ls -l "$OUT"; }

# the CUDA package; with UPSTREAM=1 also upstream's llama-speculative-simple (for the upstream-* arms)
phase_build() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || return 1
    local t0=$SECONDS extra=""
    [ "${UPSTREAM:-0}" = 1 ] && extra=" -DPYLLAMASPEC_BUILD_UPSTREAM_SPECULATIVE=ON"
    # verbose into $OUT: a call cut short still returns how far the build got. The system's g++ (GPU_CXX): the
    # machine's default CXX (/opt/gcc) links libstdc++ statically into every shared library, so each library gets its
    # own copy of its state, and C++ objects that cross libraries (ggml-rpc's futures) crash
    CXX=${GPU_CXX:-/usr/bin/g++} CUDAHOSTCXX=${GPU_CXX:-/usr/bin/g++} \
    PYLLAMASPEC_BACKEND=cuda CUDAARCHS=${CUDAARCHS:-90-real} CMAKE_ARGS="$extra" \
        CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -v --no-build-isolation --no-deps --target $PKG . \
        > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
    echo "build: $((SECONDS - t0)) s"
    python3 -P -m pyllamaspec.cli info | head -5
    # numpy (or torch) first, then the library: its libstdc++ must not be interposed by one of ours
    python3 -P -c "import numpy, pyllamaspec._native.loader as l; l.load(); print('loads after numpy')" || return 1
}

phase_synth05() {
    local t0=$SECONDS
    # the 7B shape's vocabulary (152064): upstream's server needs one vocabulary for the pair
    [ -f /tmp/m/d05.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/d05.gguf --preset qwen2.5-0.5b --type q4_0 --stddev 0.02 --seed 2 \
        --n-vocab 152064
    echo "synth 0.5B: $((SECONDS - t0)) s"
}

phase_synth7() {
    local t0=$SECONDS
    [ -f /tmp/m/t7b.gguf ] || python3 -P -m pyllamaspec.cli synth /tmp/m/t7b.gguf --preset qwen2.5-7b --type q4_0 --stddev 0.02 --seed 1
    echo "synth 7B: $((SECONDS - t0)) s"
}

phase_tests() {  # TESTS= names other test files
    timeout "${TESTS_TIMEOUT:-300}" python3 -P -m pytest -q -m "not realmodel" -p no:cacheprovider ${TESTS:-tests/test_sessions.py \
        tests/test_streams.py tests/test_model_drafters.py tests/test_threads.py tests/test_continuous.py \
        tests/test_adaptive.py tests/test_sampling.py tests/test_memory.py} 2>&1 | tail -15
}

phase_diag() {
    timeout 200 python3 -P -m pytest -q -x --tb=short -p no:cacheprovider tests/test_streams.py -k "hybrid" 2>&1 | tail -40
}

phase_step() {
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms "${NATURAL_ARMS:-plain,n4,n8,adaptive,upstream-n4,upstream-n8}" --depth 0 --synth 0 --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-natural.json"
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms plain,n2,n4,n8,adaptive --depth 0 --synth 0.3,0.6,0.8,0.9 --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-synthetic.json"
}

phase_llamaserver() {
    local t0=$SECONDS
    if [ ! -x /tmp/ups-build/bin/llama-server ]; then
        { cmake -S .ups -B /tmp/ups-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
              -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
          && ninja -C /tmp/ups-build -j16 llama-server; } > "$OUT/ups-build.log" 2>&1 || { tail -40 "$OUT/ups-build.log"; return 1; }
    fi
    echo "llama-server build: $((SECONDS - t0)) s"
}

phase_serve() {
    local server=/tmp/ups-build/bin/llama-server
    [ -x $PKG/pyllamaspec/lib/llama-server ] && server=$PKG/pyllamaspec/lib/llama-server
    phase_synth05 && phase_synth7 || return 1
    T=/tmp/m/t7b.gguf D=/tmp/m/d05.gguf LLAMA_SERVER=$server LCP_PYTHON=/nonexistent \
        PYTHON=python3 EXTRA="-ngl 99" NP=8 CTX=8192 THREADS=8 LEVELS=${LEVELS:-1,4,8} REQUESTS=${REQUESTS:-2} \
        MAX_TOKENS=${MAX_TOKENS:-128} ROUNDS=${ROUNDS:-5} OUT="$OUT/h200-serve-load.json" LOG_DIR="$OUT" \
        bash benchmarks/serve_load.sh
}

phase_rpc() {
    phase_synth05 && phase_synth7 || return 1
    [ -x $PKG/pyllamaspec/bin/ggml-rpc-server ] || { echo "no rpc-server in $PKG: run the build phase from this tree"; return 1; }
    mkdir -p "$OUT/res"
    local m="-m /tmp/m/t7b.gguf -ngl 99 --json --ignore-eos -n ${N:-256} -p 'Write quicksort in Python'" d="-md /tmp/m/d05.gguf"
    local arms=("plain|--spec-type none" "n4|$d --spec-adaptive off --spec-draft-n-max 4" "adaptive|$d")
    rpc_arms() {  # where extra-flags
        local where=$1 extra=$2 a name flags r
        for r in $(seq "${R:-3}"); do
            for a in "${arms[@]}"; do
                name=${a%%|*} flags=${a#*|}
                eval python3 -P -m pyllamaspec.cli generate $m $flags $extra > "$OUT/res/rpc-$where-$name-$r.json" \
                    2> "$OUT/res/rpc-$where-$name-$r.err" || { tail -5 "$OUT/res/rpc-$where-$name-$r.err"; return 1; }
                python3 -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['stats']; i=d['session']
print(sys.argv[2], sys.argv[3], f\"{s['tokens_per_second']:.1f} tok/s AL {s['mean_accepted_length']:.2f}\", i['target_head_device'], i['draft_device'])" \
                    "$OUT/res/rpc-$where-$name-$r.json" "$where" "$name"
            done
        done
    }
    rpc_arms local "" || return 1
    python3 -P -m pyllamaspec.cli rpc-server -p 50052 -d CUDA0 > "$OUT/res/rpc-server.log" 2>&1 &
    local srv=$! t=0
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', 50052), 1).close()" 2>/dev/null; do
        sleep 1; t=$((t + 1)); [ $t -lt 60 ] || { kill $srv; echo "rpc-server did not listen"; return 1; }
    done
    rpc_arms rpc "--rpc 127.0.0.1:50052 -dev RPC0"
    local rc=$?
    kill $srv
    return $rc
}

# every kernel of a plain decode, ours (step_cost.py's plain arm: a warm-up answer and one round of N tokens, default
# 8) against llama-bench's tg of the same file, each kernel timed alone by Nsight Compute (caches as the run left them,
# clocks untouched), for benchmarks/kernel_profile.py
phase_kernels() {
    phase_synth05 && phase_synth7 || return 1
    mkdir -p "$OUT/res"
    local ncu n=${N:-8}
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { echo "no ncu here"; return 1; }
    local prof=("$ncu" --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum)
    timeout "${KERNELS_TIMEOUT:-200}" "${prof[@]}" --log-file "$OUT/res/kernels-ours.csv" python3 -P benchmarks/step_cost.py \
        -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf --arms plain --depth 0 --synth 0 --rounds 1 --n-predict "$n" \
        > "$OUT/res/kernels-ours.log" 2>&1 || { tail -5 "$OUT/res/kernels-ours.log"; return 1; }
    timeout "${KERNELS_TIMEOUT:-200}" "${prof[@]}" --log-file "$OUT/res/kernels-llama-bench.csv" \
        $PKG/pyllamaspec/bin/llama-bench -m /tmp/m/t7b.gguf -p 0 -n "$n" -r 1 --no-warmup -ngl 99 \
        > "$OUT/res/kernels-llama-bench.log" 2>&1 || { tail -5 "$OUT/res/kernels-llama-bench.log"; return 1; }
    ls -l "$OUT/res"/kernels-*
}

# one depth per call: a long prompt is processed once per generation
depth_cell() {
    python3 -P benchmarks/step_cost.py -m /tmp/m/t7b.gguf -md /tmp/m/d05.gguf \
        --arms "${ARMS:-plain,n2,n4,n8,adaptive}" --depth "$1" --synth "$2" --rounds 8 --n-predict 128 \
        --json "$OUT/h200-step-depth$1.json"
}
phase_depth4k() { depth_cell 4096 "${LEVELS:-0.3,0.6,0.8,0.9}"; }
phase_depth16k() { depth_cell 16384 "${LEVELS:-0.3,0.6,0.8,0.9}"; }

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
    echo "== $phase ($(date -u +%T), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
    t_phase=$SECONDS
    # each phase starts with no kept costs: adaptive arms learn theirs in the run, as on a new machine
    PYLLAMASPEC_COST_CACHE=$(mktemp -d) "phase_$phase" || { echo "phase $phase failed"; exit 1; }
    echo "== $phase: $((SECONDS - t_phase)) s"
done
