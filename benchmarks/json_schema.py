"""JSON-schema output with and without speculation: decode tok/s and acceptance per arm (plain, n-gram, the draft
model fixed and adaptive), arms interleaved per round, greedy, the same prompts for every arm.

python benchmarks/json_schema.py -m TARGET.gguf -md DRAFTER.gguf --rounds 3 --n-predict 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pyllamaspec import Model, SessionConfig, SpecSession

SCHEMA = {"type": "array", "minItems": 4, "maxItems": 4, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "email", "role", "active"],
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
                   "role": {"enum": ["admin", "editor", "viewer"]}, "active": {"type": "boolean"}}}}
PROMPTS = ["List four users of a small company's wiki as JSON.",
           "Make up four accounts for a test database, as JSON records.",
           "Give four example staff members of a bakery's web shop as JSON."]
ARMS = {"plain": dict(spec_types=[]), "ngram-mod": dict(spec_types=["ngram-mod"], n_max=8),
        "draft n_max=4": dict(spec_types=["draft-simple"], n_max=4, adaptive=False),
        "draft adaptive": dict(spec_types=["draft-simple"], n_max=8)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("-md", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {k: [] for k in ARMS}
    with Model(a.m) as target, Model(a.md) as drafter:
        sessions = {k: SpecSession(target, drafter if "draft-simple" in v["spec_types"] else None,
                                   SessionConfig(n_ctx=2048, json_schema=SCHEMA, cost_cache=False, **v))
                    for k, v in ARMS.items()}
        prompts = [target.tokenize(target.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
        for s in sessions.values():  # warm-up, discarded
            s.generate(prompts[0], 16)
        for r in range(a.rounds):
            prompt = prompts[r % len(prompts)]
            ref = None
            for name, s in sessions.items():
                res = s.generate(prompt, a.n_predict)
                json.loads(res.text) if res.finish_reason == "eog" else None
                ref = ref or res.tokens
                st = res.stats
                rows[name].append({"round": r, "tok_s": st.tokens_per_second, "acceptance": st.acceptance,
                                   "al": st.mean_accepted_length, "n": st.n_generated,
                                   "same_as_plain": res.tokens == ref, "finish": res.finish_reason})
        for s in sessions.values():
            s.close()
    base = {r["round"]: r["tok_s"] for r in rows["plain"]}
    for name, rs in rows.items():
        ratio = [r["tok_s"] / base[r["round"]] for r in rs]
        print(f"{name:15s} tok/s {statistics.median(r['tok_s'] for r in rs):6.2f} "
              f"[{min(r['tok_s'] for r in rs):.2f}-{max(r['tok_s'] for r in rs):.2f}]  x plain "
              f"{statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]  acceptance "
              f"{statistics.median(r['acceptance'] for r in rs):.2f}  AL {statistics.median(r['al'] for r in rs):.2f}  "
              f"same tokens as plain {sum(r['same_as_plain'] for r in rs)}/{len(rs)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"when": time.strftime("%Y-%m-%d %H:%M"), "schema": SCHEMA, "prompts": PROMPTS,
                       "n_predict": a.n_predict, "arms": ARMS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
