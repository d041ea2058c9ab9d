"""The draft-length controller on a simulated machine whose speed moves (another process comes and goes).

The unit tests' simulated machine (tests/test_adaptive.py: a target batch priced by its size, a draft model's decodes
and catch-up, scripted acceptance; the native controller through the package) with every cost times a factor drawn
anew at each answer and, with --within, at 5% of the steps: factors uniform in 1 +- D. Nine 64-token answers a seed,
the first left out (it learns); what plain decoding of the same tokens costs at the same speeds against what the
controller's steps cost, and the best fixed length's at no drift.

    python benchmarks/drift_sim.py --machine linear --drift 0,0.15,0.3 --seeds 6
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_adaptive.py"
spec = importlib.util.spec_from_file_location("adaptive_sim", _TESTS)
sim_mod = importlib.util.module_from_spec(spec)
sys.modules["adaptive_sim"] = sim_mod  # (dataclasses look their module up)
spec.loader.exec_module(sim_mod)
Machine, Sim, speedup = sim_mod.Machine, sim_mod.Sim, sim_mod.speedup

MACHINES = {
    # 2 cores, the shipped Q4_K_M pair: a verify of 2 costs 2 plain steps, drafting never pays
    "linear": Machine(base=32, per_token=30, draft_first=12, draft_token=12, catchup_token=7, overhead=0.5),
    # a slower CPU: a verify of 2 at 1.35 plain steps, a caught-up token 7 ms against a plain step's 58
    "marginal": Machine(base=58, per_token=20, draft_first=22, draft_token=20, catchup_token=7, overhead=0.5),
}
COSTS = ("base", "per_token", "draft_first", "draft_token", "catchup_token", "draft_call", "overhead")


def scaled(m: Machine, f: float) -> Machine:
    return dataclasses.replace(m, **{k: getattr(m, k) * f for k in COSTS})


def run(m: Machine, accept: float, n_max: int, drift: float, seed: int, within: bool, adaptive: bool = True,
        answers: int = 9, tokens: int = 64) -> float:
    rng = random.Random(seed)
    sim = Sim(m, n_max=n_max, seed=seed, adaptive=adaptive)
    out = []
    for g in range(answers):
        if g:
            sim.new_prompt()
        t0, p0, n0 = sim.time_ms, sim.plain_ms, sim.tokens
        sim.machine = scaled(m, rng.uniform(1 - drift, 1 + drift))
        while sim.tokens - n0 < tokens:
            if within and rng.random() < 0.05:
                sim.machine = scaled(m, rng.uniform(1 - drift, 1 + drift))
            sim.step(accept)
        out.append((sim.plain_ms - p0, sim.time_ms - t0))
    return speedup(out[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", choices=sorted(MACHINES), default="linear")
    ap.add_argument("--levels", default="0,0.6,0.8,0.9", help="acceptance levels")
    ap.add_argument("--drift", default="0,0.15,0.3", help="speed factors uniform in 1 +- D")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--n-max", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        levels = [float(x) for x in args.levels.split(",")]
        drifts = [float(x) for x in args.drift.split(",")]
    except ValueError as e:
        ap.error(f"--levels and --drift take comma-separated numbers ({e})")
    if not all(0.0 <= p <= 1.0 for p in levels) or not all(0.0 <= d < 1.0 for d in drifts):
        ap.error("--levels must lie in 0..1 and --drift in 0..1 (exclusive)")
    if args.seeds < 1 or args.n_max < 1:
        ap.error("--seeds and --n-max must be at least 1")
    m = MACHINES[args.machine]
    for p in levels:
        best = max((run(m, p, k, 0.0, 1, False, adaptive=False), k) for k in range(1, args.n_max + 1))
        cells = []
        for d in drifts:
            for within in (False, True):
                v = [run(m, p, args.n_max, d, s, within) for s in range(1, args.seeds + 1)]
                cells.append(f"{d:g}{'w' if within else ''} {sum(v) / len(v):.3f} (least {min(v):.3f})")
        print(f"p {p:g}: best fixed n{best[1]} {best[0]:.3f}x plain; adaptive x plain, by drift: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
