"""JSON-schema output with and without speculation: decode tok/s and acceptance per arm (plain, n-gram, the draft
model fixed and adaptive, each with the draft model seeing the grammar and blind to it), arms interleaved per round, greedy, the same prompts for every arm.

python benchmarks/json_schema.py -m TARGET.gguf -md DRAFTER.gguf --rounds 3 --n-predict 128 --json out.json

With --server NAME=URL (repeated) it sends the same requests instead to OpenAI-compatible servers started beforehand
(`pyllamaspec serve`, upstream's llama-server): a chat completion with `response_format` json_schema, temperature 0,
max_tokens n-predict, the servers' order rotated per round after a discarded warm-up request each; tok/s is the
server's own `timings.predicted_per_second`.

python benchmarks/json_schema.py --server ours=http://127.0.0.1:8081 --server upstream=http://127.0.0.1:8082 \
    --rounds 8 --n-predict 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.atomicfile import atomic_output

SCHEMA = {"type": "array", "minItems": 4, "maxItems": 4, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "email", "role", "active"],
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
                   "role": {"enum": ["admin", "editor", "viewer"]}, "active": {"type": "boolean"}}}}
PROMPTS = ["List four users of a small company's wiki as JSON.",
           "Make up four accounts for a test database, as JSON records.",
           "Give four example staff members of a bakery's web shop as JSON."]
ARMS = {"plain": dict(spec_types=[]), "ngram-mod": dict(spec_types=["ngram-mod"], n_max=8),
        "draft n_max=4": dict(spec_types=["draft-simple"], n_max=4, adaptive=False),
        "draft adaptive": dict(spec_types=["draft-simple"], n_max=8),
        # the draft model blind to the schema's grammar (its first choice drafted, as upstream's draft-simple)
        "draft n_max=4, blind": dict(spec_types=["draft-simple"], n_max=4, adaptive=False, draft_grammar=False),
        "draft adaptive, blind": dict(spec_types=["draft-simple"], n_max=8, draft_grammar=False)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m")
    ap.add_argument("-md")
    ap.add_argument("--server", action="append", default=[], metavar="NAME=URL")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.server:
        return servers(a)
    if not (a.m and a.md):
        ap.error("-m and -md are needed (or --server NAME=URL)")
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
    save(a, arms=ARMS, rows=rows)


def save(a, **record) -> None:
    """The run's record into --json (written to a temp file, then renamed), when given."""
    if a.json:
        doc = {"when": time.strftime("%Y-%m-%d %H:%M"), "schema": SCHEMA, "prompts": PROMPTS, "n_predict": a.n_predict,
               **record}
        with atomic_output(Path(a.json), force=True) as tmp:
            tmp.write_text(json.dumps(doc, indent=1))


def servers(a) -> None:
    import httpx

    named = dict(item.split("=", 1) for item in a.server)
    rows: dict[str, list[dict]] = {k: [] for k in named}

    def ask(url: str, prompt: str, n: int) -> dict:
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": n, "seed": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "records", "schema": SCHEMA}}}
        r = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    for url in named.values():  # warm-up, discarded
        ask(url, PROMPTS[0], 16)
    names = list(named)
    for r in range(a.rounds):
        prompt = PROMPTS[r % len(PROMPTS)]
        order = names[r % len(names):] + names[:r % len(names)]
        texts = {}
        for name in order:
            out = ask(named[name], prompt, a.n_predict)
            t = out.get("timings", {})
            text = out["choices"][0]["message"]["content"]
            texts[name] = text
            finish = out["choices"][0]["finish_reason"]
            parsed = False
            if finish == "stop":
                json.loads(text)
                parsed = True
            drafted, accepted = t.get("draft_n"), t.get("draft_n_accepted")
            rows[name].append({"round": r, "tok_s": t.get("predicted_per_second"), "n": t.get("predicted_n"),
                               "drafted": drafted, "accepted": accepted, "finish": finish, "parsed": parsed,
                               "text": text})
        for name in names:
            rows[name][-1]["same_as_first"] = texts[name] == texts[names[0]]
    for name, rs in rows.items():
        tps = [x["tok_s"] for x in rs]
        drafted = sum(x["drafted"] or 0 for x in rs)
        acc = sum(x["accepted"] or 0 for x in rs) / drafted if drafted else None
        print(f"{name:15s} tok/s {statistics.median(tps):6.2f} [{min(tps):.2f}-{max(tps):.2f}]  drafted {drafted}  "
              f"acceptance {acc if acc is None else round(acc, 2)}  same text as {names[0]} "
              f"{sum(x['same_as_first'] for x in rs)}/{len(rs)}")
    save(a, servers=named, rows=rows)


if __name__ == "__main__":
    main()
