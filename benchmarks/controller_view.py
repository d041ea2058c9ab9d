"""What the draft-length controller believed at every step of real answers, beside what the steps cost.

One adaptive session (a draft model, ceiling --n-max) answers a content class's prompts one after another; after every
piece the stream yields (one a verify step, but where a step's bytes end inside a character) the controller's view is
read (the session's adaptive info: its price of a target batch by size, of a plain step, of a drafted token, its
acceptance hazards and the length it chose) beside the steps the session's trace recorded since the piece before (the
view belongs to the last of them: a step whose bytes were held has none). Each answer prints a line: decode tok/s,
the draft lengths' histogram, and - where it drafted - the plain step's price it weighed drafting against beside what
its plain steps cost in the answers so far (median), and what a step of its commonest length cost per committed token.
A plain price above what plain steps cost makes drafting look better than it is.

    python benchmarks/controller_view.py -m target.gguf -md drafter.gguf --class code --rounds 10 --json view.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.atomicfile import atomic_output
from pyllamaspec.errors import PyllamaspecError
from pyllamaspec.bench.workloads import CONTENT_CLASSES, load_prompt_set


def view(info) -> dict:
    return {"target_ms": [round(x, 2) for x in info.target_ms[:info.n_max + 1]],
            "hazards": [round(x, 3) for x in info.hazards[:info.n_max]],
            "plain_ms_per_token": round(info.plain_ms_per_token, 2), "k": info.last_k[0],
            "draft_first_ms": round(info.draft_first_ms, 2), "draft_token_ms": round(info.draft_token_ms, 2),
            "catchup_token_ms": round(info.catchup_token_ms, 3), "overhead_ms": round(info.overhead_ms, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True, type=Path)
    ap.add_argument("-md", "--model-draft", required=True, type=Path)
    ap.add_argument("--class", dest="content_class", default="code", choices=CONTENT_CLASSES)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=0, help="threads (0: the session's default)")
    ap.add_argument("--json", type=Path, help="every step's view and cost, per answer")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.n_predict < 1:
        ap.error("--rounds and --n-predict must be at least 1")
    if args.json is not None and not args.json.parent.is_dir():  # (before the run, not after it)
        ap.error(f"--json {args.json}: its directory does not exist")
    try:
        return run(args)
    except PyllamaspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def run(args) -> int:
    target, drafter = Model(args.model), Model(args.model_draft)
    threads = {"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}
    session = SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=args.n_max, n_ctx=4096,
                                                         trace_steps=65536, **threads))
    prompts = load_prompt_set(args.content_class)
    answers, plain_costs = [], []
    for r in range(args.rounds):
        prompt = prompts[r % len(prompts)]
        tokens = target.apply_chat_template([{"role": "user", "content": prompt.text}])
        session.reset_stats()
        steps, views = [], []
        for _ in session.stream(tokens, n_predict=args.n_predict):
            got = session.take_trace()
            if got:
                steps += got
                views += [None] * (len(got) - 1) + [view(session.adaptive_info())]
        rest = session.take_trace()
        steps, views = steps + rest, views + [None] * len(rest)
        stats = session.stats()
        plain_costs += [s["t_step"] for s in steps if s["k"][0] == 0 and s["n_prompt"] == 0]
        line = f"{r} {prompt.id}: {stats.tokens_per_second:.1f} tok/s, k {stats.k_histogram}"
        drafting = [(s, v) for s, v in zip(steps, views) if s["k"][0] > 0 and v is not None]
        if drafting and plain_costs:
            k_top = Counter(s["k"][0] for s, _ in drafting).most_common(1)[0][0]
            at_k = [s for s, _ in drafting if s["k"][0] == k_top]
            per_token = statistics.median(s["t_step"] / (1 + min(s["accepted"][0], s["drafted"][0])) for s in at_k)
            priced = statistics.median(v["plain_ms_per_token"] for _, v in drafting)
            line += (f"; plain priced {priced:.1f} ms, plain steps so far {statistics.median(plain_costs):.1f} ms; "
                     f"k {k_top}: {per_token:.1f} ms a committed token")
        print(line, flush=True)
        answers.append({"prompt": prompt.id, "stats": stats.to_dict(), "steps": steps, "views": views})
    session.close()
    if args.json:
        with atomic_output(args.json, force=True) as tmp:
            tmp.write_text(json.dumps({"model": str(args.model), "drafter": str(args.model_draft),
                                       "class": args.content_class, "n_max": args.n_max, "answers": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
