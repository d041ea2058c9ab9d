#!/usr/bin/env bash
# Start the servers that benchmarks/serve_load.py compares, on one machine, with the same model, context, slots
# and threads, run the load, and stop them. Idle servers wait on their sockets, so running them side by side does
# not disturb the one under load.
#   T, D            target and drafter GGUF
#   LLAMA_SERVER    upstream's llama-server built from the pinned commit (unset: skipped)
#   OUT             the JSON to write
#   LCP_PYTHON      a Python whose `import llama_cpp.server` works (default: python; skipped when it fails)
#   NP, CTX, THREADS, LEVELS, REQUESTS, MAX_TOKENS, ROUNDS: slots, context, threads and the load (defaults below)
#   EXTRA           more flags for every server of ours and llama-server (e.g. "-ngl 99")
#   PYTHON          the Python that runs our server and the load (default: python)
#   UPSTREAM_SPEC   0: no llama-server with the draft model
#   LOG_DIR         where the servers' logs are copied at the end (default: not kept)
#   ONLY            a comma list of the servers to start (default: all of ours-plain, ours-adaptive, ours-n4,
#                   upstream-plain, upstream-n4, llama-cpp-python that can run)
#   SETTLE          seconds of quiet before each phase (default 1)
#   BEFORE          a directory holding another installed copy of the package (pip install --target): its servers run
#                   beside ours as before-plain and before-adaptive, in the same load - two versions in one run
set -euo pipefail
: "${T:?target GGUF}" "${D:?drafter GGUF}" "${OUT:?output JSON}"
NP=${NP:-8}; CTX=${CTX:-8192}; THREADS=${THREADS:-2}
T=$(realpath "$T"); D=$(realpath "$D")
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=$(mktemp -d)
PIDS=()
SERVERS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
    [ -z "${LOG_DIR:-}" ] || cp "$LOGS"/*.log "$LOG_DIR"/ 2>/dev/null || true
}
trap cleanup EXIT

start() {  # name port command...
    local name=$1 port=$2; shift 2
    [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$name,"* ]] || return 0
    # from the log directory: `python -m` in a source checkout's root would import the source tree
    (cd "$LOGS" && exec "$@") > "$LOGS/$name.log" 2>&1 &
    PIDS+=($!)
    SERVERS+=(--server "$name=http://127.0.0.1:$port")
}

PYTHON=${PYTHON:-python}
read -r -a extra <<< "${EXTRA:-}"
common=(-c "$CTX" -np "$NP" -t "$THREADS" "${extra[@]}")
start ours-plain 8101 "$PYTHON" -m pyllamaspec.cli serve -m "$T" "${common[@]}" --port 8101
start ours-adaptive 8102 "$PYTHON" -m pyllamaspec.cli serve -m "$T" -md "$D" --spec-type draft-simple "${common[@]}" --port 8102
start ours-n4 8103 "$PYTHON" -m pyllamaspec.cli serve -m "$T" -md "$D" --spec-type draft-simple --spec-draft-n-max 4 \
    --spec-adaptive off "${common[@]}" --port 8103
if [ -n "${BEFORE:-}" ]; then
    start before-plain 8111 env PYTHONPATH="$BEFORE" "$PYTHON" -m pyllamaspec.cli serve -m "$T" "${common[@]}" --port 8111
    start before-adaptive 8112 env PYTHONPATH="$BEFORE" "$PYTHON" -m pyllamaspec.cli serve -m "$T" -md "$D" \
        --spec-type draft-simple "${common[@]}" --port 8112
fi
if [ -n "${LLAMA_SERVER:-}" ]; then
    LLAMA_SERVER=$(realpath "$LLAMA_SERVER")
    start upstream-plain 8104 "$LLAMA_SERVER" -m "$T" "${common[@]}" --port 8104
    [ "${UPSTREAM_SPEC:-1}" = 0 ] || start upstream-n4 8105 "$LLAMA_SERVER" -m "$T" -md "$D" --spec-type draft-simple \
        --spec-draft-n-max 4 "${common[@]}" --port 8105
fi
LCP_PYTHON=${LCP_PYTHON:-python}
# llama-cpp-python serves one request at a time; by default a new request interrupts the one running
if "$LCP_PYTHON" -c "import llama_cpp.server" 2>/dev/null; then
    start llama-cpp-python 8106 "$LCP_PYTHON" -m llama_cpp.server --model "$T" --n_ctx "$CTX" --n_threads "$THREADS" \
        --interrupt_requests False \
        --port 8106
fi

for s in "${SERVERS[@]}"; do
    [ "$s" = --server ] && continue
    url=${s#*=}
    for _ in $(seq 600); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        curl -sf "$url/v1/models" >/dev/null 2>&1 && break
        sleep 0.5
    done
done
"$PYTHON" "$HERE/serve_load.py" "${SERVERS[@]}" --concurrency "${LEVELS:-1,4,8}" --requests "${REQUESTS:-2}" \
    --max-tokens "${MAX_TOKENS:-64}" --rounds "${ROUNDS:-3}" --settle "${SETTLE:-1}" --json "$OUT"
