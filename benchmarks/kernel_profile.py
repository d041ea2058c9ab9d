"""A decode step's kernels, from Nsight Compute's per-kernel CSV (`benchmarks/gpu/run.sh kernels`): the kernels of
one steady decoding step (the period of the launch sequence's tail), what each costs, and where two runs differ.

    python benchmarks/kernel_profile.py kernels-ours.csv kernels-llama-bench.csv [--markdown]   (.csv or .csv.gz)

Each kernel was timed alone (gpu__time_duration.sum), so a step's sum is its device time without launch gaps: the
difference between two runs' sums is what their graphs make the GPU do, not what their host code adds.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
import statistics
import sys
from pathlib import Path

_UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def read_kernels(path: Path) -> list[tuple[str, float]]:
    """(kernel name, µs) in launch order."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = [ln for ln in raw.decode(errors="replace").splitlines() if ln.startswith('"')]
    if not lines:
        raise ValueError(f"{path}: no CSV rows (is it Nsight Compute's --csv output?)")
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = _UNIT.get(row.get("Metric Unit", ""), None)
        if unit is None:
            raise ValueError(f"{path}: unknown unit {row.get('Metric Unit')!r}")
        try:
            out.append((row["Kernel Name"], float(row["Metric Value"].replace(",", "")) * unit))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{path}: a row without a kernel name or a number: {row}") from None
    return out


def short(name: str) -> str:
    """A kernel's name without its template arguments' values (`mul_mat_vec_q<...>`) and parameter list."""
    name = re.sub(r"\(.*$", "", name)
    depth, keep = 0, []
    for ch in name:
        if ch == "<":
            if depth == 0:
                keep.append("<>")
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            keep.append(ch)
    return "".join(keep).replace("void ", "").strip()


def period(names: list[str], min_p: int = 8) -> int:
    """The smallest p for which the last 3 p launches repeat every p (one decoding step's kernels), 0 if none."""
    n = len(names)
    for p in range(min_p, n // 3 + 1):
        if all(names[n - 1 - i] == names[n - 1 - i - p] for i in range(2 * p)):
            return p
    return 0


def steps(kernels: list[tuple[str, float]]) -> tuple[int, list[list[tuple[str, float]]]]:
    """The step's kernel count and the steady steps at the tail (each a list of its kernels, in launch order)."""
    names = [k for k, _ in kernels]
    p = period(names)
    if p == 0:
        raise ValueError("no repeating step at the end of the launch sequence")
    out = []
    end = len(kernels)
    while end - p >= 0 and [k for k, _ in kernels[end - p:end]] == names[-p:]:
        out.append(kernels[end - p:end])
        end -= p
    return p, out[::-1]


def summary(kernels: list[tuple[str, float]]) -> dict:
    p, st = steps(kernels)
    per_step = [sum(us for _, us in s) for s in st]
    by_name: dict[str, list[float]] = {}
    for j in range(p):
        name = short(st[0][j][0])
        by_name.setdefault(name, []).append(statistics.median(s[j][1] for s in st))
    return {"kernels_per_step": p, "steps": len(st), "step_us": statistics.median(per_step),
            "step_us_range": (min(per_step), max(per_step)),
            "by_name": {k: (len(v), sum(v)) for k, v in by_name.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    sums = []
    for p in args.csv:
        try:
            kernels = read_kernels(p)
            sums.append((p.name, summary(kernels)))
        except (OSError, ValueError) as e:
            print(f"error: {e}" if str(p) in str(e) else f"error: {p}: {e}", file=sys.stderr)
            return 2
    for name, s in sums:
        lo, hi = s["step_us_range"]
        print(f"{name}: {s['kernels_per_step']} kernels a step, {s['steps']} steady steps, "
              f"{s['step_us']:.1f} µs a step ({lo:.1f}-{hi:.1f})")
    names = sorted({k for _, s in sums for k in s["by_name"]},
                   key=lambda k: -max(s["by_name"].get(k, (0, 0.0))[1] for _, s in sums))
    sep = " | " if args.markdown else "  "
    head = ["kernel"] + [f"{n} (count, µs)" for n, _ in sums]
    print(("| " + sep.join(head) + " |") if args.markdown else sep.join(head))
    if args.markdown:
        print("|" + "---|" * len(head))
    for k in names:
        cells = [k] + [f"{s['by_name'].get(k, (0, 0.0))[0]}, {s['by_name'].get(k, (0, 0.0))[1]:.1f}" for _, s in sums]
        print(("| " + sep.join(cells) + " |") if args.markdown else sep.join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
