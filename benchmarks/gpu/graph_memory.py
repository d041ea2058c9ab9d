"""Device memory a session's graphs take, one arm of benchmarks/step_cost.py per process (what a process frees is
not always given back to the device at once, so arms never share a process):

    python benchmarks/gpu/graph_memory.py -m target.gguf -md drafter.gguf --arm sweep --sweep-n-max 7

Prints one JSON line: nvidia-smi's memory.used (MiB) with the models loaded, with the session open, and after a
generation of the arm (a sweep runs every batch size 1..n_max+1, so every kept graph is built), and the deltas.
--host measures the process's peak resident memory instead (a CPU's compute buffers live there):

    python benchmarks/gpu/graph_memory.py --host -m target.gguf -md drafter.gguf --arm sweep-gs --prompt "def f(x):"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyllamaspec import Model, ModelConfig  # noqa: E402
from step_cost import arm_config, open_session  # noqa: E402


def used_mib(host: bool) -> int:
    if host:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", required=True)
    ap.add_argument("-md", required=True)
    ap.add_argument("--arm", default="sweep")
    ap.add_argument("--sweep-n-max", type=int, default=7)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--host", action="store_true", help="the process's peak resident memory, not the GPU's")
    ap.add_argument("--prompt", default=None, help="a text prompt (default: token ids 100..163, for random weights)")
    a = ap.parse_args()
    cfg = arm_config(a.arm, a.n_ctx, 0.6, None, a.sweep_n_max, 512, 0)
    if cfg is None:
        ap.error(f"unknown arm {a.arm!r}")
    cfg = dataclasses.replace(cfg, ignore_eos=True)  # every length of a sweep, whatever the model's text
    with Model(a.m, ModelConfig()) as target, Model(a.md, ModelConfig()) as drafter:
        loaded = used_mib(a.host)
        with open_session(a.arm, target, drafter, cfg) as s:
            opened = used_mib(a.host)
            r = s.generate(a.prompt if a.prompt is not None else list(range(100, 164)), a.n_predict)
            after = used_mib(a.host)
            print(json.dumps({"arm": a.arm, "loaded_mib": loaded, "session_mib": opened - loaded,
                              "graphs_mib": after - opened, "n_generated": len(r.tokens), "finish": str(r.finish_reason), "n_steps": r.stats.n_steps,
                              "n_graph_reused": r.stats.n_graph_reused}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
