"""Where an adaptive arm's time goes against plain decoding, read off a `benchmarks/step_cost.py --trace` file: per cell
(depth, acceptance), the adaptive arm's decode time beyond the plain arm's, split into its plain steps (k = 0: what a
session with a drafter attached pays on a step that drafts nothing, against the plain arm's median step) and its
drafting steps (their time beyond what plain decoding of the tokens they committed costs: negative where drafting
paid), and those into the first drafting step after plain ones (a probe's, mostly: on a GPU its batch's first runs
and a feature-reading drafter's catch-up of the steps it skipped), the next RUN - 1 steps in a row (a probe's run, or
drafting just turned on) and the steps beyond them (drafting held). Shares of the plain arm's time, medians over the
rounds (a generation's first step, which runs after its prompt, is in the total alone), each round against the plain
arm's round of the same index - the arms ran interleaved, so a machine that moves between rounds moves both alike. A
cell without a plain arm takes the plain arm of another cell at the same depth, pooled over its rounds (another run:
nothing to pair with).

    python benchmarks/loss_split.py benchmarks/traces/h100-35b-a3b-dflash-d0-q1.json.gz [more ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from pyllamaspec.bench import trace

RUN = 6  # a probe's steps in a row at most (the controller's PROBE_RUN)


def _plain_of(rnd: list) -> tuple[float, float] | None:
    """A plain round's median step (its generation's first aside) and its total, or None where it has no such step."""
    steps = [s["t_step"] for s in rnd[1:]]
    return (statistics.median(steps), sum(s["t_step"] for s in rnd)) if steps else None


def split(arms: list[dict]) -> list[dict]:
    """One row per adaptive arm and cell: plain's median ms per step, the adaptive arm's, and its excess split.

    Each of the arm's rounds is set against the plain arm's round of the same index where the cell has its own plain
    arm with as many rounds (the arms ran interleaved, so the machine's moves between rounds hit both alike:
    `paired`); a cell without one takes the plain arm of its depth (another run) pooled over its rounds."""
    cells: dict = {}
    for a in arms:
        st = a["setup"]
        cells.setdefault((st["depth"], st.get("synthetic_acceptance") or 0.0), {})[a["arm"]] = a
    plain_of_depth = {d: c["plain"] for (d, _), c in cells.items() if "plain" in c}
    rows = []
    for (depth, level), by_arm in sorted(cells.items()):
        plain = by_arm.get("plain") or plain_of_depth.get(depth)
        if plain is None:
            continue
        plain_steps = [s["t_step"] for r in plain["rounds"] for s in r[1:]]  # a generation's first step aside
        if not plain_steps:
            continue
        p_step = statistics.median(plain_steps)
        p_round = statistics.median(sum(s["t_step"] for s in r) for r in plain["rounds"])
        own = [_plain_of(r) for r in plain["rounds"]] if "plain" in by_arm else []  # this cell's plain, by round
        for name, a in by_arm.items():
            if not name.startswith("adaptive"):
                continue
            paired = len(own) == len(a["rounds"]) and all(own)
            per = {"plain_steps": [], "drafting": [], "first": [], "run": [], "held": [], "total": []}
            k0_steps = []  # the arm's steps that drafted nothing, a generation's first aside
            k0_less = []  # per round: its median such step less the plain round's median step
            for i, r in enumerate(a["rounds"]):
                step_ms, round_ms = own[i] if paired else (p_step, p_round)
                k0 = [s["t_step"] for s in r[1:] if s["k"] == 0 and not s["drafted"]]
                k0_steps += k0
                if k0:
                    k0_less.append(statistics.median(k0) - step_ms)
                parts = {"first": 0.0, "run": 0.0, "held": 0.0}
                in_row = 0  # drafting steps in a row, this one counted
                for s in r:
                    if not (s["k"] > 0 or s["drafted"]):
                        in_row = 0
                        continue
                    in_row += 1
                    part = "first" if in_row == 1 else "run" if in_row <= RUN else "held"
                    parts[part] += s["t_step"] - (1 + min(s["accepted"], s["drafted"])) * step_ms
                per["plain_steps"].append((sum(k0) - len(k0) * step_ms) / round_ms)
                per["drafting"].append(sum(parts.values()) / round_ms)
                for part, ms in parts.items():
                    per[part].append(ms / round_ms)
                per["total"].append(sum(s["t_step"] for s in r) / round_ms - 1.0)
            rows.append({
                "depth": depth, "level": level, "arm": name, "plain_step_ms": p_step, "paired": paired,
                "adaptive_plain_step_ms": statistics.median(k0_steps) if k0_steps else None,
                "plain_step_beyond_ms": statistics.median(k0_less) if k0_less else None,
                **{key: statistics.median(v) for key, v in per.items() if v},
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.traces:
        print(f"# {path.name}")
        for r in split(trace.load(path)):
            level = "natural" if not r["level"] else f"p {r['level']}"
            k0, beyond = r["adaptive_plain_step_ms"], r["plain_step_beyond_ms"]
            k0 = f"{k0:.3f}" if k0 is not None else "-"
            beyond = f", {beyond * 1000:+.0f} us a round" if beyond is not None else ""
            how = "paired by round" if r["paired"] else "against plain pooled over its rounds"
            print(f"d{r['depth']} {level} {r['arm']}: {r['total']:+.1%} of plain's time; plain steps "
                  f"{r['plain_steps']:+.1%} (a step {k0} ms against {r['plain_step_ms']:.3f}{beyond}), drafting "
                  f"{r['drafting']:+.1%} ({how}): first steps {r['first']:+.1%}, the next {RUN - 1} "
                  f"{r['run']:+.1%}, beyond {r['held']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
