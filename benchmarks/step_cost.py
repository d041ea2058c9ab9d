"""Speculative step cost on one machine: our loop (fixed lengths, adaptive) against plain decoding and upstream's
llama-speculative-simple, at natural or synthetic acceptance and several context depths.

Arms run interleaved, round after round, after one discarded warm-up round per arm; each figure is the median
of the rounds with min and max. The arms' order turns by one place every round (round r starts with arm r), so no arm
always follows the same one: what one arm leaves behind on the device (its heat, its clocks) falls on every arm in
turn. Each run records its place in the round, the arm before it and, where nvidia-smi or rocm-smi answers, the
GPU's temperature, SM clock and power right after it. Every round has its own prompt (random filler at the cell's
depth), the same for every arm of the round; synthetic acceptance is drawn by position in the text, so the arms of a
round face the same acceptance (they differ by their choices, not their luck). Per-step profile from the session's
native counters (draft, verify, device wait, sampling, process, rollback, graph captures). Models stay loaded (upstream's binaries
load per run, so their figures are their own decode speeds, which exclude loading).

Arms: plain; nK (fixed draft length K); nNkK (ceiling N, every draft K long: a session of n_max N drafting as nK's
does); adaptiveK (the controller, ceiling K; adaptive = 8); zeroK (ceiling K, never
drafting: a speculative session's plain step, with its snapshot ring and drafter); sweep (every length
0..n_max three steps in a row, round and round: each batch size's steady and cold cost, for replay); gapG
(G plain steps, then one draft at the sweep ceiling, round and round: a feature-reading drafter's catch-up after G
plain steps; G < 64); any of these with -host (plain-host, n4-host, adaptive-host): every row sampled on the host from
its logits, where the default samples greedy rows on a GPU that holds the target's output layer; and with -hf
(zero15-hf, adaptive7-hf): a feature-reading drafter's features copied to the host after every batch, where the
default keeps them on the target's device until the drafter processes them; and with -ringN
(plain-ring7, zero7-ring0): a snapshot ring of N states per sequence on a hybrid target (0: none); and with -g1
(sweep-g1, adaptive-g1): llama's contexts keep only the graph they ran last (LLAMA_GRAPH_CACHE=1), not one per shape;
and with -gs (sweep-gs): graphs kept by shape, all in the context's one scheduler (LLAMA_GRAPH_CACHE_SCHED=0);
and with -kvN (plain-kv256, adaptive7-kv1024): the KV cache's view grows in steps of N cells (kv_window);
and with -b, -c, -d or -e (plain-b beside plain): another session of the same arm, how far sessions of one
configuration differ within one run;
upstream-nK (llama-speculative-simple, depth 0, natural acceptance); upstream-plain (llama-bench tg, depth 0).
Each arm keeps one session for a cell, all opened first in the arms' order; --fresh gives every run a session of its
own instead, opened right before it and closed after it (one session alive at a time).
--trace FILE keeps every measured step of every arm (pyllamaspec.bench.trace; replayed by pyllamaspec.bench.replay),
and each arm's warm-up steps apart (what an adaptive arm's controller learnt before the measured rounds).

    python benchmarks/step_cost.py -m target.gguf -md drafter.gguf --arms plain,n4,n8,adaptive,upstream-n4 \\
        --depth 0,4096 --synth 0,0.6,0.9 --rounds 8 --n-predict 128 --json out.json --trace out-trace.json.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyllamaspec import Model, ModelConfig, SessionConfig, SpecSession
from pyllamaspec.bench import trace as tracefile
from pyllamaspec.bench.cotenant import GpuTelemetry
from pyllamaspec.bench.external import packaged_speculative_simple, parse_speculative_simple_output


def gpu_names() -> list[str]:
    """The GPUs the library sees, by their description (the card: CUDA's or ROCm's name for it), so that a record
    says which card measured it."""
    from pyllamaspec.buildinfo import info
    return [d["description"] for d in info()["devices"] if d.get("type") in ("gpu", "igpu")]


def synth_rates(level: float, n_max: int) -> list[float] | None:
    """Unconditional acceptance of position i = level ** (i + 1): each drafted token lands with probability level."""
    if level <= 0:
        return None
    return [level ** (i + 1) for i in range(n_max)]


def prompt_tokens(model: Model, depth: int, seed: int) -> list[int]:
    """depth filler tokens (random ids of the vocabulary, fixed by seed) and a short task."""
    rng = random.Random(seed)
    n_vocab = model.info.n_vocab
    body = [rng.randrange(100, n_vocab - 100) for _ in range(depth + 32)]
    return body


HOST = "-host"  # arm suffix: sampling on the host
HOST_FEATURES = "-hf"  # arm suffix: a feature-reading drafter's features copied to the host after every batch
TWIN = re.compile(r"(.+)-([b-e])")  # arm suffix: another session of the same arm (plain-b, plain-c beside plain)
ONE_GRAPH = "-g1"  # arm suffix: llama's contexts keep one graph (LLAMA_GRAPH_CACHE=1), not one per batch shape
SHARED_SCHED = "-gs"  # arm suffix: graphs kept by shape, all in the context's scheduler (LLAMA_GRAPH_CACHE_SCHED=0)
GRAPH_ENV = {ONE_GRAPH: {"LLAMA_GRAPH_CACHE": "1"}, SHARED_SCHED: {"LLAMA_GRAPH_CACHE_SCHED": "0"}}


def graph_suffix(arm: str) -> str | None:
    """The arm's graph suffix (-g1, -gs), a twin's (n5-gs-b) included."""
    twin = TWIN.fullmatch(arm)
    name = twin.group(1) if twin else arm
    return next((sfx for sfx in GRAPH_ENV if name.endswith(sfx)), None)


def sweep_schedule(n_max: int) -> list[int]:
    """Every draft length 0..n_max three steps in a row: each batch size once cold, then steady."""
    return [k for k in range(n_max + 1) for _ in range(3)]


def arm_config(arm: str, n_ctx: int, level: float, spec_type: str | None, n_max_sweep: int, ubatch: int,
               trace_steps: int, catchup_rows: int = 0, ignore_eos: bool = False) -> SessionConfig | None:
    def base(name: str) -> SessionConfig | None:  # the arm a suffix modifies
        return arm_config(name, n_ctx, level, spec_type, n_max_sweep, ubatch, trace_steps, catchup_rows, ignore_eos)

    twin = TWIN.fullmatch(arm)
    if twin:
        # another session of the same arm: how far sessions of one configuration differ in one run
        return base(twin.group(1))
    sfx = graph_suffix(arm)
    if sfx:
        # the same arm, its contexts made with GRAPH_ENV[sfx] set (open_session sets it)
        return base(arm[:-len(sfx)])
    if arm.endswith(HOST):
        # the same arm with every row sampled on the host from its logits (no backend sampling)
        cfg = base(arm[:-len(HOST)])
        return None if cfg is None else dataclasses.replace(cfg, backend_sampling=False)
    if arm.endswith(HOST_FEATURES):
        # the same arm with the drafter's features copied to the host after every batch, not kept on the device
        # (an arm without a drafter has no features: plain-hf, plain-ring7-hf are not arms)
        cfg = base(arm[:-len(HOST_FEATURES)])
        plain = cfg is not None and cfg.spec_types is not None and not cfg.spec_types
        return None if cfg is None or plain else dataclasses.replace(cfg, host_features=True)
    kv = re.fullmatch(r"(.+)-kv(\d+)", arm)
    if kv:
        # the same arm with the KV cache's view growing in steps of N cells (a GPU's default is 1024, llama's 256)
        cfg = base(kv.group(1))
        return None if cfg is None else dataclasses.replace(cfg, kv_window=int(kv.group(2)))
    ring = re.fullmatch(r"(.+)-ring(\d+)", arm)
    if ring:
        # the same arm with a snapshot ring of N states per sequence (a hybrid target; 0: none, rollback by checkpoint)
        cfg = base(ring.group(1))
        return None if cfg is None else dataclasses.replace(cfg, n_rs_seq=int(ring.group(2)))
    types = [spec_type] if spec_type else None  # None: detected from the drafter GGUF
    common = dict(n_ctx=n_ctx, n_batch=max(2048, ubatch), n_ubatch=ubatch, trace_steps=trace_steps)
    if ignore_eos:
        common["ignore_eos"] = True
    if catchup_rows and arm != "plain":
        common["catchup_rows"] = catchup_rows
    if arm == "plain":
        return SessionConfig(spec_types=[], **common)
    capped = re.fullmatch(r"n(\d+)k(\d+)", arm)
    if capped:
        n, k = int(capped.group(1)), int(capped.group(2))
        if not 0 < k <= n:
            raise ValueError(f"{arm}: the draft length must be 1..{n}")
        return SessionConfig(adaptive=False, spec_types=types, n_max=n, draft_schedule=[k],
                             synth_rates=synth_rates(level, n), **common)
    if arm.startswith("n"):
        n = int(arm[1:])
        return SessionConfig(adaptive=False, spec_types=types, n_max=n, synth_rates=synth_rates(level, n), **common)
    if arm.startswith("zero"):
        # a speculative session that never drafts (ceiling N): what a plain step costs with its ring and drafter
        n = int(arm[4:] or 8)
        return SessionConfig(adaptive=False, spec_types=types, n_max=n, draft_schedule=[0], **common)
    if arm == "sweep":
        n = n_max_sweep
        return SessionConfig(adaptive=False, spec_types=types, n_max=n, draft_schedule=sweep_schedule(n),
                             synth_rates=synth_rates(level, n), **common)
    if arm.startswith("gap") and arm[3:].isdigit():
        # G plain steps, then a draft of the sweep ceiling: what a drafter's catch-up after G plain steps costs
        n, g = n_max_sweep, int(arm[3:])
        return SessionConfig(adaptive=False, spec_types=types, n_max=n, draft_schedule=[0] * g + [n],
                             synth_rates=synth_rates(level, n), **common)
    if arm.startswith("adaptive"):
        n = int(arm[len("adaptive"):] or 8)
        return SessionConfig(spec_types=types, n_max=n, synth_rates=synth_rates(level, n), **common)
    return None


def known_arm(arm: str) -> bool:
    if arm == "upstream-plain" or re.fullmatch(r"upstream-n\d+", arm):
        return True
    try:
        return arm_config(arm, 256, 0.0, None, 8, 512, 0) is not None
    except ValueError:  # a length that is not a number (adaptivex, nfour)
        return False


def open_session(arm: str, target, drafter, cfg: SessionConfig) -> SpecSession:
    """An arm's session; an arm ending in -g1 has its contexts keep one graph, one ending in -gs keeps its graphs in
    the context's scheduler (llama reads GRAPH_ENV's variables when it makes a context, so the setting holds for that
    session's life and no other's)."""
    sfx = graph_suffix(arm)
    if not sfx:
        return SpecSession(target, drafter, cfg)
    before = {k: os.environ.get(k) for k in GRAPH_ENV[sfx]}
    os.environ.update(GRAPH_ENV[sfx])
    try:
        return SpecSession(target, drafter, cfg)
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def run_llama_bench(binary: Path, target: Path, n_predict: int, n_cpu_moe: int) -> dict:
    """upstream's llama-bench, token generation only (tg), every layer on the GPU: its mean tok/s."""
    cmd = [str(binary), "-m", str(target), "-p", "0", "-n", str(n_predict), "-r", "3", "-ngl", "99", "-o", "json"]
    if n_cpu_moe:
        cmd += ["--n-cpu-moe", str(n_cpu_moe)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("llama-bench failed: " + (out.stdout + out.stderr)[-2000:])
    rows = json.loads(out.stdout)
    return {"tok_s": rows[0]["avg_ts"], "acceptance": None}


def run_upstream(binary: Path, target: Path, drafter: Path, n: int, tokens_text: str, n_predict: int,
                 n_ctx: int, spec_type: str, ignore_eos: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        pf = Path(d) / "prompt.txt"
        pf.write_text(tokens_text + "\n")
        cmd = [str(binary), "-m", str(target), "-md", str(drafter), "-f", str(pf), "-n", str(n_predict), "-c", str(n_ctx),
               "-b", str(n_ctx), "--temp", "0", "--seed", "0", "-ngl", "all", "-ngld", "all",
               "--spec-type", spec_type, "--spec-draft-n-max", str(n)] + (["--ignore-eos"] if ignore_eos else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("upstream failed: " + (out.stdout + out.stderr)[-2000:])
    return parse_speculative_simple_output(out.stdout + "\n" + out.stderr)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", required=True)
    ap.add_argument("--arms", default="plain,n4,n8,adaptive,upstream-n4,upstream-n8")
    ap.add_argument("--depth", default="0")
    ap.add_argument("--synth", default="0", help="acceptance levels (0: natural acceptance of the pair)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--spec-type", default=None, help="default: detected from the drafter")
    ap.add_argument("--n-cpu-moe", type=int, default=0, help="keep the experts of the first N layers on the CPU")
    ap.add_argument("--ubatch", type=int, default=512, help="n_ubatch (a larger one processes deep prompts faster)")
    ap.add_argument("--sweep-n-max", type=int, default=0, help="the sweep arm's ceiling (default: the largest nK arm)")
    ap.add_argument("--catchup-rows", type=int, default=0,
                    help="rows per pass of a feature-reading drafter's catch-up (0: the session's default)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="never sample an end-of-generation token, so that every round decodes --n-predict tokens "
                         "(a real model may end its answer to random filler after a few tokens); upstream's "
                         "speculative-simple is given it too, and llama-bench always decodes its tokens")
    ap.add_argument("--fresh", action="store_true",
                    help="every run in a session of its own, opened right before it and closed after it, so that one "
                         "session is alive at a time and each is made in the same memory (by default each arm keeps "
                         "one session for the cell, all opened first in the arms' order); an adaptive arm keeps what "
                         "it learnt of costs through the cost cache, as a new process would")
    ap.add_argument("--trace", type=Path, help="keep every measured step of every arm here (.json or .json.gz)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    arms = args.arms.split(",")
    unknown = [a for a in arms if not known_arm(a)]
    if unknown or len(set(arms)) != len(arms):
        ap.error(f"--arms: {', '.join(unknown) or 'an arm named twice'} (arms: plain, nK, adaptiveK, zeroK, sweep, "
                 "gapG, upstream-nK, upstream-plain, with -host, -hf, -ringN, -g1, -gs, -kvN or -b)")
    depths = [int(x) for x in args.depth.split(",")]
    levels = [float(x) for x in args.synth.split(",")]
    upstream = packaged_speculative_simple()
    telemetry = GpuTelemetry()
    bench_bin = upstream.parent / "llama-bench" if upstream else None
    target_path, drafter_path = Path(args.model), Path(args.model_draft)
    target = Model(target_path, ModelConfig(n_cpu_moe=args.n_cpu_moe)) if args.n_cpu_moe else Model(target_path)
    drafter = Model(drafter_path)
    fixed = [int(a[1:]) for a in arms if a.startswith("n") and a[1:].isdigit()]
    n_max_sweep = args.sweep_n_max or max(fixed or [8])
    trace_steps = 65536 if args.trace else 0
    traces: list[dict] = []
    from pyllamaspec.ggufinfo import detect_spec_types, read_summary
    spec_name = args.spec_type or detect_spec_types(read_summary(drafter_path))[0]
    record = {"spec_type": spec_name, "target": str(target_path), "drafter": str(drafter_path), "n_predict": args.n_predict,
              "rounds": args.rounds, "cells": [], "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "gpus": gpu_names()}
    for depth in depths:
        n_ctx = depth + 32 + args.n_predict + 128
        n_ctx = ((n_ctx + 255) // 256) * 256
        for level in levels:
            t_cell = time.monotonic()
            configs = {arm: cfg for arm in arms if (cfg := arm_config(arm, n_ctx, level, args.spec_type, n_max_sweep,
                                                                      args.ubatch, trace_steps, args.catchup_rows,
                                                                      args.ignore_eos)) is not None}

            def open_arm(arm: str) -> SpecSession:
                cfg = configs[arm]
                no_drafter = cfg.spec_types is not None and len(cfg.spec_types) == 0  # plain
                return open_session(arm, target, None if no_drafter else drafter, cfg)

            # every arm's session for the whole cell, opened in the arms' order; with --fresh one per run instead
            sessions = {} if args.fresh else {arm: open_arm(arm) for arm in configs}
            runs = {arm: [] for arm in arms}
            previous = None
            arm_steps = {arm: [] for arm in configs}
            warm_steps: dict = {}
            kept: dict = {}  # per arm: what its (last) session was and learnt, read before it closes
            for rnd in range(args.rounds + 1):  # round 0 is the warm-up, discarded
                # the round's prompt, the same for every arm of the round
                prompt = prompt_tokens(target, depth, seed=1000 * depth + rnd + 1)
                prompt_text = " ".join(f"tok_{t}" for t in prompt)
                turn = rnd % len(arms)
                place = 0
                for arm in arms[turn:] + arms[:turn]:
                    if arm == "upstream-plain":
                        if level > 0 or bench_bin is None or not bench_bin.exists() or depth > 0:
                            continue
                        row = run_llama_bench(bench_bin, target_path, args.n_predict, args.n_cpu_moe)
                    elif arm.startswith("upstream"):
                        if level > 0 or upstream is None or depth > 0:
                            continue  # upstream's example has no synthetic acceptance; its prompt is text
                        fig = run_upstream(upstream, target_path, drafter_path, int(arm.split("-n")[1]), prompt_text,
                                           args.n_predict, n_ctx, spec_name, args.ignore_eos)
                        row = {"tok_s": fig["tokens_per_second"], "acceptance":
                               (fig["n_accept"] / fig["n_drafted"]) if fig.get("n_drafted") else None}
                    else:
                        if args.fresh:
                            sessions[arm] = open_arm(arm)
                        r = sessions[arm].generate(prompt, args.n_predict)
                        st = r.stats
                        steps = max(1, st.n_steps)
                        row = {"tok_s": st.tokens_per_second, "acceptance": st.acceptance,
                               "al": st.mean_accepted_length, "steps": st.n_steps,
                               "ms_per_step": st.t_decode_ms / steps, "prefill_ms": st.t_prefill_ms,
                               "profile_ms_per_step": {k: getattr(st, k) / steps for k in (
                                   "t_draft_ms", "t_verify_ms", "t_sync_ms", "t_sample_ms", "t_process_ms",
                                   "t_rollback_ms")},
                               "graph_captures": st.n_graph_captures, "graph_resets": st.n_graph_resets,
                               "graph_reused": st.n_graph_reused,
                               "k_histogram": st.k_histogram, "est_plain_tok_s": st.estimated_plain_tokens_per_second}
                    # where the run stood: its place in the round and the run before it (the last round's last)
                    row["place"], row["after"] = place, previous
                    place, previous = place + 1, arm
                    gpu = telemetry.sample()
                    if gpu:
                        row["gpu_after"] = [g.to_dict() for g in gpu]
                    if trace_steps and arm in sessions:
                        taken = tracefile.compact(sessions[arm].take_trace())
                        if rnd > 0:
                            arm_steps[arm].append(taken)
                        else:
                            warm_steps[arm] = taken  # where an adaptive arm's controller stood when round 1 began
                    if rnd > 0:
                        runs[arm].append(row)
                    elif arm in sessions:
                        sessions[arm].reset_stats()
                    if arm in sessions and (args.fresh or rnd == args.rounds):
                        s = sessions[arm]
                        kept[arm] = {"n_max": s.config.n_max, "adaptive": s.config.adaptive, "kv_window": s.info.kv_window}
                        if arm.startswith("adaptive"):
                            # what the controller learnt (costs by table, depth bucket and size; its view at the end)
                            kept[arm]["learnt"] = {"costs": s.learnt_costs(), "info": dataclasses.asdict(s.adaptive_info())}
                        if args.fresh:
                            sessions.pop(arm).close()
            learnt = {arm: k["learnt"] for arm, k in kept.items() if "learnt" in k}
            for arm, rounds in arm_steps.items():
                traces.append({"arm": arm, "setup": {"target": str(target_path), "drafter": str(drafter_path),
                                                      "spec_type": spec_name, "depth": depth, "synthetic_acceptance": level or None,
                                                      "n_max": kept[arm]["n_max"], "adaptive": kept[arm]["adaptive"],
                                                      "n_cpu_moe": args.n_cpu_moe, "dflash_block": "draft",
                                                      "kv_window": kept[arm]["kv_window"], "fresh": args.fresh},
                               "rounds": rounds, "warmup": warm_steps.get(arm, [])})
            for s in sessions.values():
                s.close()
            cell = {"depth": depth, "synthetic_acceptance": level or None, "arms": {}}
            plain_runs = [r["tok_s"] for r in runs.get("plain", [])]
            for arm, rows in runs.items():
                if not rows:
                    continue
                tok = [r["tok_s"] for r in rows]
                entry = {"tok_s": summary(tok), "runs": rows}
                if arm in learnt:
                    entry["learnt"] = learnt[arm]
                if len(plain_runs) == len(tok):
                    # paired: each round against plain's run of the same round (arms interleave within a round)
                    entry["x_plain"] = summary([t / p for t, p in zip(tok, plain_runs)])
                cell["arms"][arm] = entry
            cell["seconds"] = round(time.monotonic() - t_cell, 1)
            record["cells"].append(cell)
            line = " ".join(f"{a}={e['tok_s']['median']:.1f}" + (f"({e['x_plain']['median']:.2f}x)" if 'x_plain' in e else "")
                            for a, e in cell["arms"].items())
            print(f"depth {depth} acceptance {level or 'natural'} ({cell['seconds']} s): {line}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(record, indent=1))
            if args.trace:
                tracefile.save(args.trace, traces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
