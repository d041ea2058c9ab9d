"""The adaptive controller over every replay case of tests/test_replay.py, at more seeds than the tests hold it to.

Each case (a recorded trace, the adaptive ceiling and the fixed lengths beside it) is replayed at each acceptance level
and seed with `pyllamaspec.bench.replay.grid` (3 rounds after a warm-up, as the tests do: the 64-token cases 8 answers
a round, the 512-token ones 4), and the adaptive arm's speed against the best of plain decoding and the fixed lengths
is written per cell. With --compare, an earlier run's cells (another build of the controller) are set beside these:
means by level, the cells below 0.9 and 0.95, and the cells that moved most.

    python benchmarks/replay_sweep.py --seeds 1,2 --json after.json --compare before.json

Run it from the checkout's root with the package installed (the controller is the installed native library).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

from pyllamaspec.bench import replay, trace

ROOT = Path(__file__).resolve().parent.parent


def _cases() -> tuple[dict, dict]:
    spec = importlib.util.spec_from_file_location("replay_cases", ROOT / "tests" / "test_replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES, mod.LONG_CASES


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def sweep(which: str, seeds: list[int], levels: list[float], only: str = "") -> dict:
    short, long_ = _cases()
    out = {}
    for kind, cases in (("short", short), ("long", long_)):
        if which not in (kind, "all"):
            continue
        kw = {"n_predict": 512, "generations": 4} if kind == "long" else {}
        for name, (n_max, fixed, _bounds) in sorted(cases.items()):
            if only not in name:
                continue
            arms = [a for a in trace.load(ROOT / "benchmarks" / "traces" / name) if not a["arm"].endswith("-kv256")]
            model = replay.CostModel.from_arms(arms, depth=arms[0]["setup"]["depth"])
            for seed in seeds:
                rows = replay.summarize(replay.grid(model, n_max, levels, fixed, rounds=3, seed=seed, **kw))
                for r in rows:
                    out[f"{kind}|{name}|{r['level']}|{seed}"] = {"x_best": r["adaptive_x_best"],
                                                                 "x_plain": r["adaptive_x_plain"],
                                                                 "best": r["best_fixed"]}
                print(f"{kind} {name} seed {seed}: " + " ".join(f"p{r['level']}={r['adaptive_x_best']:.3f}"
                                                                for r in rows), file=sys.stderr, flush=True)
    return out


def report(cells: dict, before: dict | None) -> None:
    keys = sorted(cells)
    for kind in ("short", "long"):
        for level in sorted({k.split("|")[2] for k in keys if k.startswith(kind)}, key=float):
            ks = [k for k in keys if k.startswith(kind + "|") and k.split("|")[2] == level]
            line = lambda d: (f"mean {statistics.mean(d[k]['x_best'] for k in ks):.4f}  "
                              f"min {min(d[k]['x_best'] for k in ks):.3f}  "
                              f"<0.9 {sum(d[k]['x_best'] < 0.9 for k in ks)}  "
                              f"<0.95 {sum(d[k]['x_best'] < 0.95 for k in ks)}")
            text = f"{kind:5s} p {level}: {len(ks)} cells  {line(cells)}"
            if before is not None and all(k in before for k in ks):
                text += f"   (before: {line(before)})"
            print(text)
    if before is not None:
        moved = sorted((cells[k]["x_best"] - before[k]["x_best"], k) for k in keys if k in before)
        for d, k in moved[:8] + moved[-8:]:
            print(f"  {d:+.3f}  {k}  {before[k]['x_best']:.3f} -> {cells[k]['x_best']:.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", choices=("short", "long", "all"), default="all")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--levels", default="0,0.3,0.6,0.8,0.9")
    ap.add_argument("--only", default="", help="only the traces whose file name holds this")
    ap.add_argument("--json", type=Path, help="write the cells here")
    ap.add_argument("--compare", type=Path, help="an earlier run's --json, set beside this one")
    args = ap.parse_args(argv)
    try:
        seeds, levels = _ints(args.seeds), [float(x) for x in args.levels.split(",") if x]
    except ValueError as e:
        ap.error(f"--seeds takes seeds (1,2,3), --levels acceptance levels (0,0.6): {e}")
    if not seeds or not levels or any(not 0 <= s < 2**32 for s in seeds) or any(not 0 <= x <= 1 for x in levels):
        ap.error("give seeds from 0 to 4294967295 and acceptance levels within 0..1")
    before = None
    if args.compare is not None:
        try:
            before = json.loads(args.compare.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--compare {args.compare}: {e}")
        if not isinstance(before, dict) or not all(isinstance(v, dict) and "x_best" in v for v in before.values()):
            ap.error(f"--compare {args.compare}: not the cells of an earlier --json")
    cells = sweep(args.cases, seeds, levels, args.only)
    if not cells:
        ap.error(f"no {args.cases} case's trace name holds {args.only!r}")
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(cells, indent=0, sort_keys=True) + "\n")
        tmp.replace(args.json)
    report(cells, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
