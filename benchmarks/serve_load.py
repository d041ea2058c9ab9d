"""Throughput and time to first token of OpenAI-compatible servers under concurrent clients.

The servers are started beforehand (benchmarks/serve_load.sh does it for pyllamaspec serve, upstream's
llama-server and llama-cpp-python's server); each is given as NAME=URL. Rounds interleave the servers and the
concurrency levels (round r: for each concurrency, every server, in orders that let each server follow every
other equally often: a server's phase is not always run just after the same one), after one discarded warm-up
phase per server, with --settle seconds of quiet before each phase. Every request is a streamed chat completion
at temperature 0 with a fixed max_tokens; a phase of concurrency c runs c clients that each send --requests
prompts one after another, each prompt numbered so that no server has seen it before (the numbers, not the
prompts, differ between phases). A phase's throughput is its generated tokens over its wall time; TTFT is from
sending a request to its first content.

    python benchmarks/serve_load.py --server ours=http://127.0.0.1:8081 --server upstream=http://127.0.0.1:8082 \\
        --concurrency 1,4,8 --requests 2 --max-tokens 64 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from pyllamaspec.atomicfile import atomic_output

PROMPT_DIR = Path(__file__).resolve().parents[1] / "pyllamaspec" / "bench" / "prompts"


def load_prompts(classes: list[str]) -> list[str]:
    prompts = []
    for name in classes:
        data = json.loads((PROMPT_DIR / f"{name}.json").read_text())
        items = data["prompts"] if isinstance(data, dict) else data
        prompts += [item["text"] if isinstance(item, dict) else item for item in items]
    return prompts


def served_model(url: str) -> str:
    """The id the server lists first (a server may refuse a model name it does not serve)."""
    return httpx.get(url + "/v1/models", timeout=30.0).json()["data"][0]["id"]


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    usage = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
    tokens = usage["completion_tokens"] if usage else chunks  # without usage: one token per chunk
    return {"ttft_s": ttft, "latency_s": time.perf_counter() - t0, "tokens": tokens,
            "tokens_from": "usage" if usage else "chunks"}


async def phase(url: str, model: str, prompts: list[str], concurrency: int, requests: int, max_tokens: int,
                offset: int) -> dict:
    async with httpx.AsyncClient(timeout=600.0) as client:
        async def worker(w: int) -> list[dict]:
            out = []
            for i in range(requests):
                # a request number first: no server answers from a cache of a prompt it has seen before
                prompt = f"Request {offset}.{w}.{i}. " + prompts[(offset + w * requests + i) % len(prompts)]
                out.append(await one_request(client, url, model, prompt, max_tokens))
            return out

        t0 = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(worker(w) for w in range(concurrency))) for r in rs]
        wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    return {"concurrency": concurrency, "wall_s": wall, "tokens": tokens, "tok_s": tokens / wall,
            "ttft_median_s": statistics.median(ttfts) if ttfts else None,
            "ttft_max_s": max(ttfts) if ttfts else None,
            "latency_median_s": statistics.median(r["latency_s"] for r in results),
            "tokens_from": sorted({r["tokens_from"] for r in results})}


def server_order(n: int, r: int) -> list[int]:
    """Round r's order of n servers: a Williams design (rows of a balanced Latin square), so that over n rounds
    (2n for odd n) every server comes first as often as any other and follows each other one equally often."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo if len(base) % 2 else hi)
        lo, hi = (lo + 1, hi) if len(base) % 2 == 0 else (lo, hi - 1)
    row = [(b + r) % n for b in base]
    return row[::-1] if n % 2 and (r // n) % 2 else row


def summarize(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def summary(phases: list[dict], names: list[str], levels: list[int]) -> dict:
    table = {}
    for name in names:
        for c in levels:
            mine = [p for p in phases if p["server"] == name and p["concurrency"] == c]
            if mine:
                table.setdefault(name, {})[str(c)] = {
                    "tok_s": summarize([p["tok_s"] for p in mine]),
                    "ttft_median_s": summarize([p["ttft_median_s"] for p in mine]),
                    "latency_median_s": summarize([p["latency_median_s"] for p in mine])}
    return table


def write_record(args, servers: dict, phases: list[dict], table: dict, rounds_done: int) -> None:
    """The record so far, replaced whole (a temp file renamed over it)."""
    doc = {"servers": servers, "args": vars(args) | {"json": str(args.json)}, "rounds_done": rounds_done,
           "phases": phases, "summary": table}
    with atomic_output(args.json, force=True) as tmp:
        tmp.write_text(json.dumps(doc, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends per phase")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--classes", default="code,prose")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of quiet before each phase")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    servers = dict(item.split("=", 1) for item in args.server)
    levels = [int(x) for x in args.concurrency.split(",")]
    prompts = load_prompts(args.classes.split(","))
    models = {name: served_model(url) for name, url in servers.items()}
    for name, url in servers.items():  # warm-up, discarded
        asyncio.run(phase(url, models[name], prompts, max(levels), 1, args.max_tokens, 0))
        print(f"warm: {name}", flush=True)
    phases: list[dict] = []
    names = list(servers)
    previous = None
    for r in range(args.rounds):
        for c in levels:
            for name in (names[i] for i in server_order(len(names), r)):
                time.sleep(args.settle)
                # the same prompts for every server in a round and level
                result = asyncio.run(phase(servers[name], models[name], prompts, c, args.requests, args.max_tokens,
                                           offset=r * 97 + c))
                result.update(server=name, round=r, after=previous)
                previous = name
                phases.append(result)
                print(f"round {r} c={c} {name}: {result['tok_s']:.1f} tok/s, TTFT median "
                      f"{result['ttft_median_s']:.2f} s", flush=True)
        if args.json:  # after every round: a run cut short keeps the rounds it finished
            write_record(args, servers, phases, summary(phases, names, levels), rounds_done=r + 1)
    table = summary(phases, names, levels)
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
