"""README's main job (`pyllamaspec generate` on its default pair and prompt) against plain decoding of the same
target, arms interleaved in one run, one process per generation (as a user runs it).

    python benchmarks/main_job.py --rounds 8 --json benchmarks/cpu-main-job.json

Arms: plain (the target alone); the default (draft-simple, adaptive, ceiling 8) as a user runs it again and again,
its costs kept between runs (a cost cache of this benchmark's own, filled by the warm-up round); the default as
on a fresh machine (an empty cost cache at every run); the default with adaptive off (a fixed draft of 8 every
step). The first round is a warm-up and is discarded; the arm order rotates per round. Decode tok/s excludes model
loading and prompt processing (the session's own timers); prompt ms is reported beside it.

--version NAME=DIR (repeatable) runs every arm once per installed package (a `pip install --target DIR` of another
tree), interleaved in the same rounds: two versions of the package compared in one run.

    python benchmarks/main_job.py --rounds 8 -n 128 --arms "plain,default (adaptive)" \
        --version before=/tmp/before --version after= --json out.json"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = {
    "plain": ["-m", "qwen2.5-coder-1.5b-instruct"],
    "default (adaptive)": [],
    "default, first run": [],
    "fixed n8": ["--spec-adaptive", "off"],
}
FRESH = {"default, first run"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(extra: list[str], n_predict: int, cost_cache: str, package_dir: str = "") -> dict:
    cmd = [sys.executable, "-m", "pyllamaspec.cli", "generate", *extra, "-n", str(n_predict), "--json"]
    env = dict(os.environ, PYLLAMASPEC_COST_CACHE=cost_cache)
    if package_dir:  # another installed copy of the package first on the path
        env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    # not from a source checkout's root, where `-m` would import the source tree instead of the installed package
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir(), env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds (a warm-up round comes first)")
    ap.add_argument("-n", "--n-predict", type=int, default=256)
    ap.add_argument("--arms", default=",".join(ARMS), help="a comma list of: " + ", ".join(ARMS))
    ap.add_argument("--version", action="append", default=[], metavar="NAME=DIR",
                    help="also run every arm with the package installed in DIR (empty: this Python's own)")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in wanted if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {list(ARMS)}")
    versions = dict(v.split("=", 1) for v in args.version) or {"": ""}
    # an arm per (version, arm); its name carries the version when there are several
    arms = {(f"{v}: " if v else "") + a: (a, d) for v, d in versions.items() for a in wanted}
    names = list(arms)
    samples: dict[str, list[dict]] = {n: [] for n in names}
    kept = {v: tempfile.TemporaryDirectory(prefix="pls-costs-") for v in versions}
    for r in range(args.rounds + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            arm, package_dir = arms[name]
            version = next(v for v, d in versions.items() if d == package_dir)
            with tempfile.TemporaryDirectory(prefix="pls-costs-") as fresh:
                res = run(ARMS[arm], args.n_predict, fresh if arm in FRESH else kept[version].name, package_dir)
            st = res["stats"]
            row = {"tok_s": st["tokens_per_second"], "acceptance": st["acceptance"], "prompt_ms": st["t_prefill_ms"],
                   "al": st["mean_accepted_length"], "k_histogram": st["k_histogram"], "tokens": res["tokens"]}
            print(f"round {r}{' (warm-up)' if r == 0 else ''} {name}: {row['tok_s']:.2f} tok/s", file=sys.stderr)
            if r > 0:
                samples[name].append(row)

    plain_name = next((n for n in names if arms[n][0] == "plain"), names[0])
    plain = statistics.median(s["tok_s"] for s in samples[plain_name])
    report = {"command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "cpu": cpu_model(),
              "n_predict": args.n_predict, "rounds": args.rounds, "versions": versions, "arms": {}}
    reference = samples[plain_name][0]["tokens"]
    for name in names:
        tok = [s["tok_s"] for s in samples[name]]
        lo, hi = quartiles(tok)
        med = statistics.median(tok)
        report["arms"][name] = {
            "command": "pyllamaspec generate " + " ".join(ARMS[arms[name][0]] + ["-n", str(args.n_predict)]),
            "tok_s": tok, "median": med, "q1": lo, "q3": hi, "vs_plain": med / plain,
            "prompt_ms_median": statistics.median(s["prompt_ms"] for s in samples[name]),
            "acceptance": statistics.median(s["acceptance"] for s in samples[name]),
            "al": statistics.median(s["al"] for s in samples[name]),
            "k_histogram_last": samples[name][-1]["k_histogram"],
            "same_tokens_as_plain": all(s["tokens"] == reference for s in samples[name]),
        }
        print(f"{name:20s} {med:7.2f} tok/s [{lo:.2f}, {hi:.2f}]  {med / plain:.2f}x plain  prompt "
              f"{report['arms'][name]['prompt_ms_median']:.0f} ms", file=sys.stderr)
    for k in kept.values():
        k.cleanup()
    args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
