"""Replay: the draft-length controller against step costs recorded on a machine, with scripted acceptance.

A trace (``pyllamaspec.bench.trace``, recorded by ``benchmarks/step_cost.py --trace``) says what every step of every
arm cost on the machine it ran on: the target batch by its size, by whether it was the size's first or second run in
its KV window and graph slot (a GPU builds a size's graph for the window and runs it eagerly, then captures it),
else by how many steps before ran the same size; the drafter's call (a block drafter's right after a change of draft
length apart: its graph runs cold); the rest. A ``CostModel`` keeps those costs as samples; ``simulate`` runs plain
decoding, fixed draft lengths and the adaptive controller (the native one, through ``pyllamaspec.controller``)
through them, each step's cost drawn from what that machine measured for such a step, acceptance drawn by position
from a scripted process (Bernoulli, bursts, content switches) - the same positions for every arm. So the controller
can be tuned against GPU costs on any CPU, and CI can hold it to bounds.

    python -m pyllamaspec.bench.replay benchmarks/traces/h200-27b-d0.json.gz --levels 0,0.3,0.6,0.8,0.9
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..config import check_kv_window
from ..controller import Controller, Observation
from ..errors import ConfigError
from . import trace as tracefile

KIND_OF_SPEC = {"draft-simple": "model", "draft-eagle3": "autoregressive", "draft-mtp": "autoregressive",
                "draft-dflash": "block", "draft-dspark": "block"}


KV_WINDOW = 256  # llama pads the KV cache's view to this many cells by default: a batch's graph serves one window
KEPT_GRAPHS = 8  # a context keeps a graph per batch shape in this many slots: sizes n and n + 8 share one


def _age_bucket(age: int) -> int:
    return min(age, 2)  # 0: the size did not run in the step before; 1: it ran once before; 2: steady


def _window_bucket(runs: int, age: int) -> int:
    """A step's cost class: 3 (4) the first (second) run of its batch size in this KV window - a GPU builds the
    size's graph for the window and runs it eagerly, then captures it - else its age bucket."""
    return 3 + runs if runs < 2 else _age_bucket(age)


_FIRST_RUN_DEAR = 1.25  # a size's first run in a trace above this many times its steady cost was a first run


def _steady_runs(rounds: Sequence[list], graphs: dict | None = None, kv_window: int = KV_WINDOW):
    """(n_tokens, t_target) of the single-stream steps whose two steps before ran the same size - with `graphs` (a
    session's record, see _run_in_window), only a size's third run or later in its KV window."""
    for rnd in rounds:
        prev: list[int] = []
        for s in rnd:
            if s["n_active"] != 1 or s["n_prompt"]:
                prev = []
                continue
            n = s["n_tokens"]
            warm = graphs is None or _run_in_window(graphs, n, s["depth"], kv_window) >= 2
            if warm and prev[-2:] == [n] * 2:
                yield n, s["t_target"]
            prev.append(n)


def _steady_targets(arms: Sequence[dict], depth: int | None) -> dict:
    """Median target cost by batch size over the steps whose two steps before ran the same size."""
    out: dict = {}
    for a in arms:
        if depth is None or a["setup"]["depth"] == depth:
            for n, ms in _steady_runs(a["rounds"]):
                out.setdefault(n, []).append(ms)
    return {n: statistics.median(v) for n, v in out.items()}


def _warmup_steady(arms: Sequence[dict], depth: int | None) -> dict:
    """Target costs by batch size of the warm-up rounds' steady runs: a size's third run or later in its KV window
    whose two steps before ran the same size (sessions with a drafter)."""
    out: dict = {}
    for a in arms:
        if a["arm"] == "plain" or not a.get("warmup") or (depth is not None and a["setup"]["depth"] != depth):
            continue
        for n, ms in _steady_runs([a["warmup"]], {}, a["setup"].get("kv_window") or KV_WINDOW):
            out.setdefault(n, []).append(ms)
    return out


def _drafter_cold(arm: dict, n_max: int, kv_window: int, out: dict) -> None:
    """A draft model's first runs of each batch size in an arm's session (its warm-up round included; counted as
    `simulate` charges them, by KV window and graph slot): what they cost beyond the size's steady cost (the median of
    its later runs), by run (0 or 1) into `out`. A step's first decode runs catch-up + 1 rows, its further decodes one
    row each; catch-ups longer than a draft (after plain steps) are priced by what they caught up, not here."""
    if not arm.get("warmup"):
        return  # a trace without its warm-up round: the first runs it shows came after the real ones
    steps = [s for rnd in [arm["warmup"]] + arm["rounds"] for s in rnd
             if s["n_active"] == 1 and not s["n_prompt"] and s["drafted"] > 0 and s["t_draft_first"] > 0]
    graphs: dict = {}
    seen = []  # (size, run, ms) of first decodes and of single further decodes
    for s in steps:
        r = _run_in_window(graphs, s["catchup"] + 1, s["depth"], kv_window)
        if s["catchup"] <= n_max + 1:
            seen.append((s["catchup"] + 1, r, s["t_draft_first"]))
        for _ in range(s["draft_iters"]):
            r = _run_in_window(graphs, 1, s["depth"], kv_window)
            if s["draft_iters"] == 1:
                seen.append((1, r, s["t_draft_rest"]))
    steady: dict = {}
    for size, r, ms in seen:
        if r >= 2:
            steady.setdefault(size, []).append(ms)
    for size, r, ms in seen:
        if r < 2 and len(steady.get(size, ())) >= 4:
            out.setdefault(r, []).append(max(0.0, ms - statistics.median(steady[size])))


def _run_in_window(graphs: dict, n: int, depth: int, kv_window: int = KV_WINDOW) -> int:
    """Runs of batch size n in the KV window of a batch at this depth before this one (0, 1 or 2: twice or more),
    counting this one in `graphs` (size -> (window, runs)), a session's record of the graphs it built."""
    window = (depth + n - 1) // kv_window
    w, runs = graphs.get(n, (-1, 0))
    runs = runs if w == window else 0
    for m in [m for m in graphs if isinstance(m, int) and m % KEPT_GRAPHS == n % KEPT_GRAPHS]:
        graphs[m] = (-1, 0)  # the same slot: built over by this size's graph
    graphs[n] = (window, min(runs + 1, 2))
    return runs


@dataclass
class CostModel:
    """Step costs of one setup (models, depth) as measured: samples by what the step was."""

    kind: str
    depth: int
    kv_window: int = KV_WINDOW                        # the session's (a trace's setup says; replayed as another)
    target: dict = field(default_factory=dict)       # (n_tokens, cost class) -> [ms], sessions with a drafter
    first: dict = field(default_factory=dict)         # a generation's first step (after its prompt): n_tokens -> [ms]
    plain: list = field(default_factory=list)         # a session without a drafter: its steps after the first
    plain_first: list = field(default_factory=list)
    draft_call: dict = field(default_factory=dict)   # block length - 1 (DFlash) or draft length -> [ms] per drafting step
    call_cold: dict = field(default_factory=dict)    # DFlash: block length - 1 -> [ms] of calls cold (see from_arms)
    call_behind: list = field(default_factory=list)  # (tokens caught up, ms beyond the call's steady cost): after plain steps
    draft_first: list = field(default_factory=list)   # draft model: (catch-up rows, ms)
    draft_rest: list = field(default_factory=list)    # draft model: ms per further decode
    draft_rest_by: dict = field(default_factory=dict) # draft model: further decodes of a step -> [ms of them all]
    # draft model: what a decode of a batch size the drafter had run 0 (1) times before in its session cost beyond
    # the size's steady cost (on a GPU its graph is built and run eagerly, then captured) -> [ms]
    draft_cold: dict = field(default_factory=dict)
    rest: list = field(default_factory=list)          # step time beyond target and drafter -> [ms]
    # draft_first's costs of the steps that caught up about as many rows, by catch-up (built as first asked for)
    _first_near: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_arms(cls, arms: Sequence[dict], depth: int | None = None) -> "CostModel":
        """From the arms of trace files (all levels of a depth): every measured step goes into its bucket."""
        kinds = {KIND_OF_SPEC.get(a["setup"].get("spec_type"), "model") for a in arms if a["arm"] != "plain"}
        m = cls(kind=kinds.pop() if len(kinds) == 1 else "model",
                depth=depth if depth is not None else arms[0]["setup"]["depth"],
                kv_window=arms[0]["setup"].get("kv_window") or KV_WINDOW)
        behind: list = []
        steady = _steady_targets(arms, depth)
        for a in arms:
            if depth is not None and a["setup"]["depth"] != depth:
                continue
            n_max = a["setup"].get("n_max", 0)
            # a DFlash block as long as the step's draft (patch 0007), or the session's n_max + 1 before it
            per_draft = a["setup"].get("dflash_block") == "draft"
            graphs: dict = {}  # the graphs the arm's session built, across its rounds
            kvw = a["setup"].get("kv_window") or KV_WINDOW
            if m.kind == "model" and a["arm"] != "plain":
                _drafter_cold(a, n_max, kvw, m.draft_cold)
            for rnd in a["rounds"]:
                prev: list[int] = []
                prev_k = 0
                calls: dict = {}  # a block drafter's call sizes by KV window, since the prompt (its graphs run anew)
                for i, s in enumerate(rnd):
                    if s["n_active"] != 1 or s["n_prompt"]:
                        prev, prev_k, calls = [], 0, {}
                        continue
                    n = s["n_tokens"]
                    runs = _run_in_window(graphs, n, s["depth"], kvw)
                    if runs == 0 and s["t_target"] < _FIRST_RUN_DEAR * steady.get(n, 0.0):
                        # a size first seen here at its steady cost ran in the arm's warm-up round (not traced)
                        graphs[n] = (graphs[n][0], 2)
                        runs = 2
                    if a["arm"] == "plain":
                        (m.plain_first if i == 0 else m.plain).append(s["t_target"])
                    elif i == 0:
                        m.first.setdefault(n, []).append(s["t_target"])
                    else:
                        age = 0
                        for p in reversed(prev):
                            if p != n:
                                break
                            age += 1
                        m.target.setdefault((n, _window_bucket(runs, age)), []).append(s["t_target"])
                    prev.append(n)
                    if s["drafted"] > 0 and s["t_draft_call"] > 0:
                        key = s["k"] if per_draft or m.kind == "autoregressive" else n_max
                        # a block as long as the draft: the drafter's graph of its size is built for the KV window
                        # (and anew after a prompt), so a size's first two calls there run cold (on a GPU: the second
                        # dearest, 8-11 ms against 4-5 in runs, 27B + DFlash2), and a call of another length than the
                        # step before's a little (5-10%) - one-offs priced apart
                        call_runs = _run_in_window(calls, key + 1, s["depth"], kvw) if per_draft else 2
                        cold = per_draft and m.kind == "block" and (call_runs < 2 or s["k"] != prev_k)
                        # a drafter reading the target's features first takes in those of the tokens decoded since
                        # it last ran: a call after plain steps (a probe) is priced apart, by what it caught up
                        if s["catchup"] <= n_max + 1:
                            (m.call_cold if cold else m.draft_call).setdefault(key, []).append(s["t_draft_call"])
                        else:
                            behind.append((key, s["catchup"], s["t_draft_call"]))
                    if s["drafted"] > 0 and s["t_draft_first"] > 0:
                        m.draft_first.append((s["catchup"], s["t_draft_first"]))
                        if s["draft_iters"]:
                            m.draft_rest.extend([s["t_draft_rest"] / s["draft_iters"]] * s["draft_iters"])
                            m.draft_rest_by.setdefault(s["draft_iters"], []).append(s["t_draft_rest"])
                    drafter = s["t_draft_first"] + s["t_draft_rest"] + s["t_draft_call"]
                    m.rest.append(max(0.0, s["t_step"] - s["t_target"] - drafter))
                    prev_k = s["k"] if s["drafted"] > 0 else 0
        # a batch size that only an arm's warm-up round ran steadily (a length the controller left before the measured
        # rounds: the 35B-A3B's batch of 9, 14.6 ms against 8.7 for 8) is priced by those runs, not on a line over it
        measured = {n for n, _ in m.target}
        for n, ms in _warmup_steady(arms, depth).items():
            if n not in measured:
                m.target[(n, 2)] = ms
        if not m.target:
            raise ValueError("the trace holds no single-stream steps to learn costs from")
        if not (m.draft_call or m.call_cold or behind or m.draft_first):
            # (a trace of plain and never-drafting arms: priced as free, every draft would look like a gain)
            raise ConfigError("the trace holds no step that drafted, so drafting has no cost to replay: "
                              "record an arm that drafts (a fixed length or adaptive) beside it")
        if m.call_cold and not m.draft_call:
            m.draft_call, m.call_cold = m.call_cold, {}  # no steady run of any length: the calls as measured
        for key, n, ms in behind:
            if m.draft_call:
                m.call_behind.append((n, max(0.0, ms - m._call_median(key))))
        return m

    def _call_median(self, key: int) -> float:
        near = min(self.draft_call, key=lambda x: abs(x - key))
        return statistics.median(self.draft_call[near])

    # -- costs of a step ------------------------------------------------------------------------

    def _steady_median(self, n: int) -> float:
        """Median steady cost of a size, interpolated (or extrapolated linearly) from the sizes measured."""
        sizes = sorted({k for k, a in self.target if a == 2} or {k for k, _ in self.target})
        med = {k: statistics.median(self.target.get((k, 2)) or [v for (kk, _), vs in self.target.items() if kk == k
                                                                   for v in vs]) for k in sizes}
        if n in med:
            return med[n]
        j = bisect.bisect_left(sizes, n)
        if len(sizes) == 1:
            return med[sizes[0]]
        lo, hi = (sizes[j - 1], sizes[j]) if 0 < j < len(sizes) else ((sizes[-2], sizes[-1]) if j else (sizes[0], sizes[1]))
        return med[lo] + (med[hi] - med[lo]) * (n - lo) / (hi - lo)

    def target_ms(self, n: int, age: int, rng: random.Random, runs: int = 2) -> float:
        """A target batch of n tokens whose size ran in the `age` steps before (0: not in the step before), and
        `runs` times before in this KV window (0 or 1: its graph's first runs there; 2: twice or more)."""
        b = _window_bucket(runs, age)
        samples = self.target.get((n, b))
        if samples:
            return rng.choice(samples)
        # not measured at this age: the size's steady cost plus what this age costs over steady elsewhere
        base = self._steady_median(n)
        if b == 2:
            return base
        extra = [statistics.median(v) - self._steady_median(k) for (k, a), v in self.target.items() if a == b]
        return base + (statistics.median(extra) if extra else 0.0)

    def first_ms(self, n: int, rng: random.Random) -> float:
        """A generation's first target batch (after its prompt) of n tokens: as measured for that size, else the
        size's steady cost plus what a first step cost over steady at the sizes measured."""
        samples = self.first.get(n)
        if samples:
            return rng.choice(samples)
        if not self.first:
            return self.target_ms(n, 0, rng)
        extra = [statistics.median(v) - self._steady_median(k) for k, v in self.first.items()]
        return self._steady_median(n) + statistics.median(extra)

    def plain_ms(self, first: bool, rng: random.Random, runs: int = 2) -> float:
        """A step of plain decoding in a session without a drafter (no snapshot ring, no features kept); runs: of a
        batch of one in this KV window before (0 or 1: its graph's first runs there cost what a drafting session's
        batch of one paid over its steady cost in its first runs - a trace's plain arm never leaves its window)."""
        samples = (self.plain_first if first else self.plain) or self.plain
        ms = rng.choice(samples) if samples else self.target_ms(1, 2, rng)
        if runs < 2 and not first:
            ms += max(0.0, self.target_ms(1, 0, rng, runs) - self._steady_median(1))
        return ms

    def drafter_ms(self, n_max: int, k: int, catchup: int, rng: random.Random,
                   steady: bool = True) -> tuple[float, float, int, float]:
        """(first decode, further decodes, their count, call) for a draft of k tokens; steady: the step before drafted
        k too (and a block drafter's size ran twice in the KV window since the prompt - else its call runs cold)."""
        if self.kind == "model":
            if not self.draft_first:
                return 0.0, 0.0, 0, 0.0
            near = self._first_near.get(catchup)
            if near is None:
                near = [ms for c, ms in self.draft_first if abs(c - catchup) <= max(2, catchup // 4)] or [
                    ms for _, ms in self.draft_first]
                self._first_near[catchup] = near
            # a step's further decodes as steps of as many cost on that machine (a GPU's do not add up linearly:
            # the 7B pair's third and fourth decode cost less than its second), else as that many of any step's
            by = self.draft_rest_by.get(k - 1, [])
            if len(by) >= 8:
                rest = rng.choice(by)
            else:
                rest = sum(rng.choice(self.draft_rest) for _ in range(k - 1)) if self.draft_rest else 0.0
            return rng.choice(near), rest, k - 1, 0.0
        # a block drafter's block is as long as the draft (patch 0007); an autoregressive one drafts k tokens
        key = k
        extra = self.behind_ms(catchup, n_max, rng)
        if not steady and self.call_cold:
            extra += self._call_cold_extra(key, rng)
        calls = self.draft_call.get(key)
        if calls:
            return 0.0, 0.0, 0, rng.choice(calls) + extra
        keys = sorted(self.draft_call)
        if not keys:
            return 0.0, 0.0, 0, 0.0
        # not measured at this length: the nearest one's samples, scaled along the line through the lengths measured
        med = {x: statistics.median(v) for x, v in self.draft_call.items()}
        near = min(keys, key=lambda x: abs(x - key))
        if len(keys) > 1:
            lo, hi = keys[0], keys[-1]
            slope = (med[hi] - med[lo]) / (hi - lo)
            want = med[near] + slope * (key - near)
        else:
            want = med[near]
        return 0.0, 0.0, 0, rng.choice(self.draft_call[near]) * max(0.1, want / med[near]) + extra

    def _call_cold_extra(self, key: int, rng: random.Random) -> float:
        """A cold call's cost beyond the steady one: a recorded cold call of this length (or the nearest) less its
        length's steady median."""
        near = min(self.call_cold, key=lambda x: abs(x - key))
        return max(0.0, rng.choice(self.call_cold[near]) - self._call_median(near))

    def behind_ms(self, catchup: int, n_max: int, rng: random.Random) -> float:
        """What a feature-reading drafter's call costs beyond its steady one for catching up on `catchup` tokens:
        the per-token extra of a recorded call that caught up on about as many (none within a steady run's)."""
        if catchup <= n_max + 1 or not self.call_behind:
            return 0.0
        near = sorted(self.call_behind, key=lambda c: abs(c[0] - catchup))[:8]
        return catchup * rng.choice([ms / n for n, ms in near])

    def rest_ms(self, rng: random.Random) -> float:
        return rng.choice(self.rest) if self.rest else 0.0


# -- acceptance processes ---------------------------------------------------------------------------


def _uniform(seed: int, pos: int) -> float:
    return random.Random((seed << 32) ^ pos).random()


class Acceptance:
    """Whether the token drafted for a position lands: a function of the position, the same for every arm."""

    def __init__(self, p_at: Callable[[int], float], seed: int = 1) -> None:
        self.p_at, self.seed = p_at, seed

    def accepted(self, pos0: int, k: int) -> int:
        """Tokens accepted of a draft of k for positions pos0 + 1 ... (the first rejection ends it)."""
        a = 0
        while a < k and _uniform(self.seed, pos0 + 1 + a) < self.p_at(pos0 + 1 + a):
            a += 1
        return a

    @classmethod
    def bernoulli(cls, p: float, seed: int = 1) -> "Acceptance":
        return cls(lambda pos: p, seed)

    @classmethod
    def switch(cls, p_before: float, p_after: float, at: int, seed: int = 1) -> "Acceptance":
        """A content switch: acceptance p_before up to position `at`, p_after from there."""
        return cls(lambda pos: p_before if pos < at else p_after, seed)

    @classmethod
    def bursts(cls, p_high: float, p_low: float, mean_len: int, seed: int = 1) -> "Acceptance":
        """Stretches of high and low acceptance of geometric length (mean mean_len positions)."""
        rng = random.Random(seed * 7919)
        edges, pos = [], 0
        while pos < 1 << 22:
            pos += max(1, int(rng.expovariate(1.0 / mean_len)))
            edges.append(pos)
        def p_at(q: int) -> float:
            return p_high if bisect.bisect_right(edges, q) % 2 == 0 else p_low
        return cls(p_at, seed)


# -- simulation ---------------------------------------------------------------------------------


@dataclass
class ArmResult:
    arm: str
    ms: float = 0.0
    tokens: int = 0
    steps: int = 0
    k_hist: dict = field(default_factory=dict)
    gen_ms: list = field(default_factory=list)  # per generation

    @property
    def ms_per_token(self) -> float:
        return self.ms / max(1, self.tokens)


def simulate(model: CostModel, arm: str, accept: Acceptance, n_max: int, *, n_predict: int = 64, generations: int = 8,
             seed: int = 1, controller: Controller | None = None, graphs: dict | None = None) -> ArmResult:
    """One arm over `generations` prompts of n_predict tokens: 'plain', 'nK' (fixed K) or 'adaptive' (the controller,
    ceiling n_max; pass one to keep what it learnt from an earlier call, as a session's cost cache does). Every prompt
    starts at the model's depth, as a benchmark's do; graphs: the session's record of the batch sizes it ran in
    each KV window (pass one to keep it across calls, as a session keeps its graphs)."""
    graphs = {} if graphs is None else graphs
    drafter = graphs.setdefault("drafter", {})  # a draft model's graphs, by its batch sizes
    rng = random.Random(seed)
    fixed = int(arm[1:]) if arm.startswith("n") else 0
    ceiling = fixed if fixed else n_max
    ctl = None
    if arm == "adaptive":
        ctl = controller or Controller(n_max, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
    res = ArmResult(arm)
    for g in range(generations):
        pos = model.depth + 32 + 1000 * g  # each generation its own stretch of acceptance draws (its own prompt)
        if ctl is not None:
            ctl.reset_stream(0)
        produced, prev, pending, t_gen = 0, [], 0, 0.0
        calls: dict = {}  # a block drafter's call sizes by KV window since the prompt
        while produced < n_predict:
            depth = model.depth + 32 + produced  # after a prompt of 32 tokens
            cap = min(ceiling, n_predict - produced - 1)
            if arm == "plain":
                k = 0
            elif ctl is None:
                k = max(0, min(fixed, cap))
            else:
                k = ctl.choose([cap], [depth], [1], [pending if model.kind == "model" else 0])[0]
            catchup = 0
            n = k + 1
            age = 0
            for p in reversed(prev):
                if p != n:
                    break
                age += 1
            runs = _run_in_window(graphs, n, depth, model.kv_window)
            if arm == "plain":
                t_target = model.plain_ms(not prev, rng, runs)
            else:
                t_target = model.first_ms(n, rng) if not prev else model.target_ms(n, age, rng, runs)
            first = rest = call = 0.0
            iters = 0
            if k > 0:
                catchup = pending
                steady = bool(prev) and prev[-1] == n
                if model.kind == "block":  # (as from_arms tells them)
                    steady = _run_in_window(calls, k + 1, depth, model.kv_window) >= 2 and steady
                first, rest, iters, call = model.drafter_ms(ceiling, k, catchup, rng, steady=steady)
                if model.draft_cold:
                    # a draft model's batch of a size its session ran fewer than twice: its graph's first runs
                    d = model.draft_cold
                    r = _run_in_window(drafter, catchup + 1, depth, model.kv_window)
                    first += rng.choice(d[r]) if r < 2 and r in d and catchup <= ceiling + 1 else 0.0
                    for _ in range(iters):
                        r = _run_in_window(drafter, 1, depth, model.kv_window)
                        rest += rng.choice(d[r]) if r < 2 and r in d else 0.0
            a = accept.accepted(pos, k)
            committed = min(a + 1, n_predict - produced)
            t_step = t_target + first + rest + call + model.rest_ms(rng)
            if ctl is not None:
                ctl.observe(Observation(k=[k], drafted=[k], accepted=[a], depth=[depth], active=[1], catchup=[catchup],
                                        t_draft_first=first, t_draft_rest=rest, draft_iters=iters, t_draft_call=call,
                                        t_target=t_target, t_step=t_step))
            # a draft model that drafted saw all but a token it never decoded; one that did not falls behind. A
            # drafter reading the target's features takes in those of every committed token at its next call
            if model.kind == "model":
                pending = (1 if a == k else 0) if k > 0 else pending + committed
            else:
                pending = committed if k > 0 else pending + committed
            prev.append(n)
            t_gen += t_step
            pos += committed
            produced += committed
            res.steps += 1
            res.k_hist[k] = res.k_hist.get(k, 0) + 1
        res.ms += t_gen
        res.tokens += produced
        res.gen_ms.append(t_gen)
    return res


def grid(model: CostModel, n_max: int, levels: Sequence[float], fixed: Sequence[int], *, n_predict: int = 64,
         generations: int = 8, rounds: int = 3, seed: int = 1, warm: bool = True) -> dict:
    """Every level: plain, each fixed length and adaptive, `rounds` times with different acceptance draws (the same
    draws for every arm of a round). warm: the controller keeps what it learnt across rounds (a kept cost cache, as a
    benchmark's later rounds have) after one discarded warm-up round. Returns {level: {arm: [ms per token, ...]}}."""
    out = {}
    for level in levels:
        arms = ["plain"] + [f"n{k}" for k in fixed] + ["adaptive"]
        per = {a: [] for a in arms}
        ctl = Controller(n_max, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window) if warm else None
        graphs: dict = {a: {} for a in arms}  # each arm's session keeps its graphs across rounds
        for r in range(rounds + (1 if warm else 0)):
            acc = Acceptance.bernoulli(level, seed=seed * 1000 + r)
            for a in arms:
                res = simulate(model, a, acc, n_max, n_predict=n_predict, generations=generations, seed=seed + r,
                               controller=ctl if a == "adaptive" else None, graphs=graphs[a] if warm else None)
                if not warm or r > 0:
                    per[a].append(res.ms_per_token)
        out[level] = per
    return out


def summarize(result: dict) -> list[dict]:
    """Per level: each arm's median ms/token, adaptive against plain and against the best fixed length."""
    rows = []
    for level, per in result.items():
        med = {a: statistics.median(v) for a, v in per.items()}
        fixed = {a: m for a, m in med.items() if a.startswith("n")}
        best = min(fixed, key=fixed.get) if fixed else "plain"
        best_ms = min(med["plain"], fixed[best]) if fixed else med["plain"]
        rows.append({"level": level, "ms_per_token": med, "best_fixed": best,
                     "adaptive_x_plain": med["plain"] / med["adaptive"],
                     "adaptive_x_best": best_ms / med["adaptive"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--depth", type=int, default=None, help="the depth whose steps price the run (default: the first)")
    ap.add_argument("--levels", default="0,0.3,0.6,0.8,0.9")
    ap.add_argument("--n-max", type=int, default=0, help="the adaptive ceiling (default: the traces' largest)")
    ap.add_argument("--fixed", default="", help="fixed lengths to compare (default: those the traces have)")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1,
                    help="the acceptance draws' and the controller's seed (the tests' bounds hold at seed 1)")
    ap.add_argument("--kv-window", type=int, default=0,
                    help="replay as if the KV cache's view grew in steps of this many cells (default: the traces')")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        ap.error(f"--seed {args.seed}: give a seed from 0 to {2**32 - 1}")
    for name in ("n_predict", "generations", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1 or more")
    try:
        levels = [float(x) for x in args.levels.split(",")]
        fixed_given = [int(x) for x in args.fixed.split(",") if x]
    except ValueError as e:
        ap.error(f"--levels takes acceptance levels (0,0.3,0.6), --fixed draft lengths (3,5): {e}")
    if not all(0.0 <= x <= 1.0 for x in levels):
        ap.error(f"--levels {args.levels}: acceptance levels lie within 0..1")
    if any(k < 1 for k in fixed_given):
        ap.error(f"--fixed {args.fixed}: draft lengths are 1 or more (plain decoding is always compared)")
    try:
        arms = [a for p in args.traces for a in tracefile.load(p)]
        model = CostModel.from_arms(arms, args.depth if args.depth is not None else arms[0]["setup"]["depth"])
    except OSError as e:
        ap.error(f"cannot read a trace: {e}")
    except ConfigError as e:
        ap.error(f"{', '.join(str(p) for p in args.traces)}: {e}")
    except (ValueError, KeyError, TypeError, IndexError, EOFError) as e:
        ap.error(f"not a trace of benchmarks/step_cost.py --trace ({type(e).__name__}: {e}), or no steps at that depth")
    if args.kv_window:
        try:
            check_kv_window(args.kv_window, "")
        except ConfigError as e:
            ap.error(f"--kv-window: {e}")
        model = dataclasses.replace(model, kv_window=args.kv_window)
    fixed = fixed_given or sorted(
        {a["setup"]["n_max"] for a in arms if a["arm"].startswith("n") and a["arm"][1:].isdigit()})
    n_max = args.n_max or max([a["setup"]["n_max"] for a in arms if a["arm"].startswith("adaptive")] or fixed
                              or [a["setup"]["n_max"] for a in arms if a["arm"] != "plain"])
    try:
        rows = summarize(grid(model, n_max, levels, fixed, n_predict=args.n_predict,
                              generations=args.generations, rounds=args.rounds, seed=args.seed))
    except ConfigError as e:
        ap.error(str(e))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        arms_txt = " ".join(f"{a}={ms:.2f}" for a, ms in r["ms_per_token"].items())
        print(f"p={r['level']:.2f}  {arms_txt}  adaptive {r['adaptive_x_plain']:.2f}x plain, "
              f"{r['adaptive_x_best']:.2f}x best ({r['best_fixed']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
