"""One line per cell of a `benchmarks/step_cost.py` record: every arm's median tok/s (min-max), and each adaptive arm
against plain and against the best of plain and the fixed lengths - by medians, by total decode time, and the median
of the per-round ratios to the arm best by total time (arms interleave within a round, so a round's ratio is paired).
Also the adaptive arm's draft lengths (share of steps at each k) and the spreads the done-when compares.

    python benchmarks/cell_summary.py benchmarks/h200-35b-a3b-dflash-d0-long8.json [more.json ...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _is_fixed(arm: str) -> bool:
    return arm == "plain" or (arm.startswith("n") and arm[1:].isdigit())


def _k_shares(runs: list[dict]) -> dict[int, float]:
    hist: dict[int, int] = {}
    for r in runs:
        for k, n in enumerate(r.get("k_histogram") or []):
            hist[k] = hist.get(k, 0) + n
    total = sum(hist.values()) or 1
    return {k: n / total for k, n in sorted(hist.items()) if n}


def cell_rows(record: dict) -> list[dict]:
    """What the done-when reads off each cell, one row per adaptive arm."""
    n_predict = record["n_predict"]
    rows = []
    for cell in record["cells"]:
        arms = cell["arms"]
        tok = {a: [r["tok_s"] for r in e["runs"]] for a, e in arms.items()}
        fixed = [a for a in arms if _is_fixed(a)]
        if not fixed:
            continue
        med = {a: statistics.median(v) for a, v in tok.items()}
        total = {a: sum(n_predict / t for t in v) for a, v in tok.items()}
        best_med = max(fixed, key=lambda a: med[a])
        best_tot = min(fixed, key=lambda a: total[a])
        for a in arms:
            if not a.startswith("adaptive"):
                continue
            row = {
                "depth": cell["depth"], "level": cell["synthetic_acceptance"] or 0.0, "arm": a,
                "tok_s": med[a], "min": min(tok[a]), "max": max(tok[a]),
                "best": best_med, "best_tok_s": med[best_med], "best_min": min(tok[best_med]),
                "best_max": max(tok[best_med]),
                "x_best_median": med[a] / med[best_med],
                "x_best_total": total[best_tot] / total[a], "best_total": best_tot,
                "k_shares": _k_shares(arms[a]["runs"]),
                "arms": {b: (med[b], min(tok[b]), max(tok[b])) for b in arms},
            }
            if len(tok[a]) == len(tok[best_tot]):
                row["x_best_paired"] = statistics.median(x / y for x, y in zip(tok[a], tok[best_tot]))
            if "plain" in med:
                row["x_plain"] = med[a] / med["plain"]
            # the done-when's spread: the adaptive arm's rounds no wider (max/min) than the best fixed arm's
            row["spread"] = max(tok[a]) / min(tok[a])
            row["best_spread"] = max(tok[best_med]) / min(tok[best_med])
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true", help="a table row per cell")
    args = ap.parse_args(argv)
    for path in args.records:
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or not isinstance(record.get("cells"), list) or "n_predict" not in record:
                raise ValueError("no cells")
        except OSError as e:
            ap.error(f"cannot read {path}: {e}")
        except ValueError:
            # (a `pyllamaspec bench` record - the class grid's - holds records by class, not cells by level)
            ap.error(f"{path}: not a record of benchmarks/step_cost.py (its --json: n_predict, rounds and cells)")
        print(f"# {path.name} ({record['n_predict']} tokens, {record['rounds']} rounds)")
        for r in cell_rows(record):
            level = "natural" if not r["level"] else f"p {r['level']}"
            ks = " ".join(f"{k}:{s:.0%}" for k, s in r["k_shares"].items() if s >= 0.02)
            plain = f", {r['x_plain']:.3f}x plain" if "x_plain" in r else ""
            paired = f"{r['x_best_paired']:.3f}" if "x_best_paired" in r else "-"
            if args.markdown:
                print(f"| d{r['depth']} {level} | {r['best']} {r['best_tok_s']:.1f} ({r['best_min']:.0f}-{r['best_max']:.0f}) "
                      f"| {r['tok_s']:.1f} ({r['min']:.0f}-{r['max']:.0f}){plain} | **{r['x_best_median']:.3f}**, "
                      f"{r['x_best_total']:.3f}, {paired} | {ks} |")
            else:
                arms = " ".join(f"{b}={m:.1f}({lo:.0f}-{hi:.0f})" for b, (m, lo, hi) in r["arms"].items())
                print(f"d{r['depth']} {level}: {arms}")
                print(f"  {r['arm']}/best({r['best']}) median {r['x_best_median']:.3f} total {r['x_best_total']:.3f} "
                      f"({r['best_total']}) paired {paired}{plain}; spread {r['spread']:.2f} vs {r['best_spread']:.2f}; "
                      f"k {ks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
