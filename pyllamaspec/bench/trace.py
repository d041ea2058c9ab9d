"""Per-step traces in a compact text form: what each step of a generation was and what it cost.

A session opened with ``SessionConfig(trace_steps=N)`` records its steps (``SpecSession.take_trace()``); a trace
file keeps them per arm of a benchmark - its setup, then one list of steps per round - one row of numbers per step
(``FIELDS``), so a few thousand steps stay a few hundred kilobytes of JSON. Streams of one step are summed (draft
lengths, tokens) or averaged (depth); ``n_active`` says how many took part. ``replay`` reads these files back.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable

from ..atomicfile import atomic_output

FIELDS = ("n_active", "k", "drafted", "accepted", "catchup", "depth", "n_tokens", "n_prompt", "draft_iters", "captures",
          "t_draft_first", "t_draft_rest", "t_draft_call", "t_target", "t_step")
_TIMES = {f for f in FIELDS if f.startswith("t_")}


def compact(steps: Iterable[dict]) -> list[list]:
    """SpecSession.take_trace() steps as rows of FIELDS (times in ms, rounded to microseconds)."""
    rows = []
    for s in steps:
        act = [i for i, a in enumerate(s["active"]) if a]
        n = len(act)
        row = {"n_active": n, "n_tokens": s["n_tokens"], "n_prompt": s["n_prompt"], "draft_iters": s["draft_iters"],
               "captures": s["captures"]}
        for key, name in (("k", "k"), ("drafted", "drafted"), ("accepted", "accepted"), ("catchup", "catchup")):
            row[name] = sum(s[key][i] for i in act)
        row["depth"] = round(sum(s["depth"][i] for i in act) / n) if n else 0
        for name in _TIMES:
            row[name] = round(s[name], 3)
        rows.append([row[f] for f in FIELDS])
    return rows


def expand(row: list) -> dict:
    """One compact row back as a dict of FIELDS."""
    return dict(zip(FIELDS, row))


def save(path: Path, arms: list[dict]) -> None:
    """arms: [{"arm": name, "setup": {...}, "rounds": [[row, ...], ...], "warmup": [row, ...]}, ...] as one JSON
    document (gzip if .gz); "warmup" (optional): the discarded warm-up round's steps, which the measured rounds' do
    not include but an adaptive arm's controller learnt from."""
    doc = {"fields": list(FIELDS), "arms": arms}
    data = json.dumps(doc, separators=(",", ":")).encode()
    path = Path(path)
    with atomic_output(path, force=True) as tmp:
        tmp.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def load(path: Path) -> list[dict]:
    """The arms of a trace file, each {"arm", "setup", "rounds", "warmup"} with rounds of step dicts (FIELDS); "warmup"
    is empty where the file holds none (traces recorded before it was kept)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    doc = json.loads(raw)
    fields = doc["fields"]
    out = []
    for a in doc["arms"]:
        out.append({**a, "rounds": [[dict(zip(fields, r)) for r in rnd] for rnd in a["rounds"]],
                    "warmup": [dict(zip(fields, r)) for r in a.get("warmup", [])]})
    return out
