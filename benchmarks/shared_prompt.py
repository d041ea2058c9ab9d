"""n sequences of one prompt (n choices of a request, or clients sending the same prompt together) against n sequences
of prompts that differ in their first token only, which share nothing: the time until every sequence has its first
token, and until every one has n_predict, on one session with n slots. Arms interleaved per round, greedy.

python benchmarks/shared_prompt.py -m TARGET.gguf [-md DRAFTER.gguf] --prompt-tokens 512 --n 3 --rounds 8 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.atomicfile import atomic_output


def run(s: SpecSession, prompts: list[list[int]], n_predict: int) -> dict:
    t0 = time.perf_counter()
    slots = {s.submit(p, n_predict=n_predict): 0 for p in prompts}
    first, processed = {}, 0
    left = len(slots)
    while left:
        events, left = s.step_sequences()
        now = time.perf_counter()
        for e in events:
            processed += e.n_prompt
            if e.tokens and e.slot not in first:
                first[e.slot] = now - t0
    return {"all_first_s": max(first.values()), "total_s": time.perf_counter() - t0, "prompt_processed": processed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = [(i * 37) % 5000 + 100 for i in range(args.prompt_tokens)]
    arms = {"shared": [base] * args.n, "distinct": [[base[0] + 1 + k] + base[1:] for k in range(args.n)]}
    cfg = SessionConfig(spec_types=["draft-simple"] if args.model_draft else [], n_parallel=args.n,
                        n_ctx=args.n * (args.prompt_tokens + args.n_predict + 64))
    results = {a: [] for a in arms}
    with Model(args.model) as target, (Model(args.model_draft) if args.model_draft else contextlib.nullcontext()) as drafter:
        with SpecSession(target, drafter, cfg) as s:
            for r in range(args.rounds + 1):  # round 0 is a warm-up, discarded
                for a, prompts in (arms.items() if r % 2 == 0 else reversed(arms.items())):
                    # a fresh first token per round: no slot holds any of the prompt from an earlier round
                    res = run(s, [[base[0] + 1000 + r] + p for p in prompts], args.n_predict)
                    if r > 0:
                        results[a].append(res)
                        print(f"round {r} {a}: {json.dumps(res)}", flush=True)
    summary = {a: {k: {"median": statistics.median(x[k] for x in v), "min": min(x[k] for x in v),
                       "max": max(x[k] for x in v)} for k in v[0]} for a, v in results.items()}
    for a, v in summary.items():
        print(f"{a}: every first token {v['all_first_s']['median']:.2f} s "
              f"({v['all_first_s']['min']:.2f}-{v['all_first_s']['max']:.2f}), all done {v['total_s']['median']:.2f} s, "
              f"prompt tokens processed {v['prompt_processed']['median']:.0f}")
    if args.json:
        doc = {"when": time.strftime("%Y-%m-%d %H:%M"), "args": {k: str(v) if isinstance(v, Path) else v
                                                                 for k, v in vars(args).items()},
               "summary": summary, "rounds": results}
        with atomic_output(args.json, force=True) as tmp:
            tmp.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
