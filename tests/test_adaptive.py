"""The draft-length controller as a unit: an injected clock and scripted acceptance, no models.

A simulated machine prices every step (target batch by tokens and depth, a draft model's decodes, a fixed
overhead) and decides acceptance from a seeded generator; the controller sees only what the native loop
would tell it. Deterministic: the same seed gives the same run.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

import pytest

from pyllamaspec import _native

MODEL, AUTOREGRESSIVE, BLOCK, NGRAM = 1, 2, 3, 4


@dataclass
class Machine:
    """Costs in ms. target(T, depth) = base * (1 + depth_growth * depth) + per_token * (T - 1) * (1 + verify_growth * depth)"""

    base: float = 10.0
    per_token: float = 2.0
    depth_growth: float = 0.0
    verify_growth: float = 0.0
    draft_first: float = 2.0       # a draft model's first decode (one token)
    draft_token: float = 1.5       # each further drafted token
    catchup_token: float = 0.2     # per token caught up in the first decode
    draft_call: float = 3.0        # one call of an upstream drafter (block / autoregressive / n-gram)
    overhead: float = 0.3

    def target(self, n_tokens: int, depth: int) -> float:
        return (self.base * (1 + self.depth_growth * depth)
                + self.per_token * (n_tokens - 1) * (1 + self.verify_growth * depth))


def _note_window_run(record: dict, size: int, cells: int, kv_window: int) -> int:
    """Runs of a batch size in the KV window of a batch after `cells` before this one (0, 1, or 2: twice or more),
    this one counted in `record` (size -> (window, runs))."""
    window = (cells + size - 1) // kv_window
    w, runs = record.get(size, (-1, 0))
    runs = runs if w == window else 0
    record[size] = (window, min(runs + 1, 2))
    return runs


@dataclass
class Sim:
    machine: Machine
    n_max: int = 8
    n_streams: int = 1
    kind: int = MODEL
    adaptive: bool = True
    seed: int = 7
    depth: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    time_ms: float = 0.0
    tokens: int = 0
    plain_ms: float = 0.0           # what plain decoding of the same tokens at the same depths would cost
    ks: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ffi, self.lib = _native.load()
        p = self.ffi.new("pls_controller_params *")
        p.n_max, p.n_streams, p.drafter_kind, p.adaptive, p.seed = self.n_max, self.n_streams, self.kind, int(self.adaptive), self.seed
        p.kv_window = self.kv_window
        slot = self.ffi.new("pls_controller **")
        err = _native.ErrorBuffer(self.ffi)
        _native.check(self.lib.pls_controller_new(p, slot, err.buf, err.SIZE), err)
        self.ctl = self.ffi.gc(slot[0], self.lib.pls_controller_free)
        self.rng = random.Random(self.seed)
        self.depth = self.depth or [256] * self.n_streams
        self.pending = [0] * self.n_streams

    first_shape_ms: float = 0.0     # one-time cost of a batch size's first run (a GPU graph captured for it)
    seen_shapes: set = field(default_factory=set)
    draft_shape_ms: float = 0.0     # the same for a draft model's first decode of a new size (its catch-ups vary)
    seen_draft_shapes: set = field(default_factory=set)
    kv_window: int = 256            # the KV cache's view grows in steps of this many cells (the session's kv_window)
    behind_ms: float = 0.0          # a block drafter's call: per token beyond a steady run's it takes in after k = 0
    window_first_ms: tuple = (0.0, 0.0)  # a size's first and second run in a KV window of 256 cells (a GPU graph built
    window_runs: dict = field(default_factory=dict)  # for the window and run eagerly, then captured): size -> (window, runs)
    cold_ms: float = 0.0            # a target batch of a size none of the 3 steps before ran (a GPU graph run eagerly)
    recent_sizes: list = field(default_factory=list)
    draft_cold_ms: float = 0.0      # the same for a draft model's first decode where the step before drafted nothing
    drafted_before: bool = False
    stalls: dict = field(default_factory=dict)  # step index -> factor on that step's target batch (a stalled run)
    call_stalls: dict = field(default_factory=dict)  # step index -> ms more on that step's drafter call
    rest_ms: list = field(default_factory=list)  # a lone draft model's further decodes by their index (else draft_token)
    call_cold_ms: float = 0.0       # a block drafter's call of another block size than the step before's (run cold)
    call_by_block: dict = field(default_factory=dict)  # a block drafter's call by its block size (else draft_call)
    block_before: int = 0           # the block size of the step before's call (0: it drafted nothing)
    call_window_ms: tuple = (0.0, 0.0)  # a block drafter's call of a size's first and second run in a KV window (its
    call_window_runs: dict = field(default_factory=dict)  # graph built for the window): block -> (window, runs)
    call_first_ms: float = 0.0      # a block drafter's first call of a block size in the session (kernels loaded)
    seen_blocks: set = field(default_factory=set)

    def step(self, accept: list[float] | float, active: list[int] | None = None,
             free: list[int] | None = None) -> list[int]:
        """One step: the controller chooses, the machine runs it, the controller observes. accept: the
        probability that each drafted position is accepted given the earlier ones were, per stream. free: the
        length of a draft that exists at no cost for each stream (an n-gram match), 0 for none."""
        n = self.n_streams
        accept = accept if isinstance(accept, list) else [accept] * n
        active = active or [1] * n
        free = free or [0] * n
        caps = [self.n_max] * n
        k = self.ffi.new("int32_t[]", n)
        rc = self.lib.pls_controller_choose(self.ctl, self.ffi.new("int32_t[]", caps), self.ffi.new("int32_t[]", self.depth),
                                            self.ffi.new("int32_t[]", active), self.ffi.new("int32_t[]", self.pending),
                                            self.ffi.new("int32_t[]", free), k)
        assert rc == 0
        ks = [k[i] if active[i] else 0 for i in range(n)]
        self.ks.append(ks)
        m = self.machine
        accepted, catchup = [0] * n, [0] * n
        for i in range(n):
            while accepted[i] < ks[i] and self.rng.random() < accept[i]:
                accepted[i] += 1
        drafting = [i for i in range(n) if active[i] and ks[i] > 0 and not free[i]]  # free drafts cost no drafter
        t_first = t_rest = t_call = 0.0
        iters = 0
        if drafting and self.kind == MODEL:
            # a draft model further behind than the controller's limit restarts from the recent tokens
            limit = self.info().catchup_limit
            catchup = [min(self.pending[i], limit) if i in drafting else 0 for i in range(n)]
            t_first = m.draft_first + m.catchup_token * sum(catchup) + 0.2 * m.draft_first * (len(drafting) - 1)
            first_rows = len(drafting) + sum(catchup)
            if not self.drafted_before:
                t_first += self.draft_cold_ms
            if first_rows not in self.seen_draft_shapes:
                self.seen_draft_shapes.add(first_rows)
                t_first += self.draft_shape_ms
            k_top = max(ks[i] for i in drafting)
            iters = k_top - 1
            if self.rest_ms and len(drafting) == 1:
                t_rest = sum(self.rest_ms[min(it, len(self.rest_ms)) - 1] for it in range(1, k_top))
            else:
                t_rest = sum(m.draft_token * (1 + 0.2 * (sum(1 for i in drafting if ks[i] > it) - 1))
                             for it in range(1, k_top))
        elif drafting:
            block = max(ks[i] for i in drafting) + 1
            call = self.call_by_block.get(block, m.draft_call) if self.kind == BLOCK else m.draft_call
            t_call = call * (1 + 0.2 * (len(drafting) - 1))
            # a drafter reading the target's features takes in those of the tokens decoded since it last ran
            t_call += self.behind_ms * sum(max(0, self.pending[i] - self.n_max - 1) for i in drafting)
            if self.kind == BLOCK and block != self.block_before:
                t_call += self.call_cold_ms
            t_call += self.call_stalls.get(len(self.ks) - 1, 0.0)
            if self.kind == BLOCK:
                cells = sum(self.depth[i] for i in drafting)
                runs = _note_window_run(self.call_window_runs, block, cells, self.kv_window)
                t_call += self.call_window_ms[runs] if runs < 2 else 0.0
                if block not in self.seen_blocks:
                    self.seen_blocks.add(block)
                    t_call += self.call_first_ms
        self.block_before = max([ks[i] + 1 for i in drafting], default=0) if self.kind == BLOCK else 0
        self.drafted_before = bool(drafting) and self.kind == MODEL
        n_tok = sum(ks[i] + 1 for i in range(n) if active[i])
        mean_depth = sum(self.depth[i] for i in range(n) if active[i]) // max(1, sum(active))
        t_target = m.target(n_tok, mean_depth)
        if n_tok not in self.seen_shapes:
            self.seen_shapes.add(n_tok)
            t_target += self.first_shape_ms
        cells = sum(self.depth[i] for i in range(n) if active[i])
        runs = _note_window_run(self.window_runs, n_tok, cells, self.kv_window)
        if runs < 2:
            t_target += self.window_first_ms[runs]
        t_target *= self.stalls.get(len(self.ks) - 1, 1.0)
        if n_tok not in self.recent_sizes:
            t_target += self.cold_ms
        self.recent_sizes = ([n_tok] + self.recent_sizes)[:3]
        t_step = t_first + t_rest + t_call + t_target + m.overhead
        committed = [accepted[i] + 1 if active[i] else 0 for i in range(n)]
        o = self.ffi.new("pls_step_observation *")
        source = [1 if free[i] and ks[i] > 0 else 0 for i in range(n)]
        keep = [self.ffi.new("int32_t[]", v) for v in (ks, ks, accepted, catchup, self.depth, active, source)]
        o.n_streams = n
        o.k, o.n_drafted, o.n_accepted, o.n_catchup, o.depth, o.active, o.source = keep
        o.t_draft_first_ms, o.t_draft_rest_ms, o.n_draft_iters = t_first, t_rest, iters
        o.t_draft_call_ms, o.t_target_ms, o.t_step_ms = t_call, t_target, t_step
        assert self.lib.pls_controller_observe(self.ctl, o) == 0
        self.time_ms += t_step
        n_active = sum(active)
        self.plain_ms += sum(committed) * (m.target(n_active, mean_depth) + m.overhead) / n_active
        self.tokens += sum(committed)
        for i in range(n):
            if active[i]:
                self.depth[i] += committed[i]
                # a draft model that drafted saw everything but what it never decoded; one that did not falls behind
                from_model = ks[i] > 0 and not free[i]
                self.pending[i] = (1 if accepted[i] == ks[i] else 0) if from_model else self.pending[i] + committed[i]
        return ks

    def new_prompt(self, stream: int = 0, depth: int = 256) -> None:
        """The stream's next generation: what a session does at each new prompt (the draft model reads it)."""
        assert self.lib.pls_controller_reset_stream(self.ctl, stream) == 0
        self.depth[stream], self.pending[stream] = depth, 0
        self.recent_sizes = []  # the prompt's batches came in between

    def run(self, n_steps: int, accept) -> "Sim":
        for _ in range(n_steps):
            self.step(accept)
        return self

    def info(self):
        o = self.ffi.new("pls_adaptive_info *")
        assert self.lib.pls_controller_info(self.ctl, o) == 0
        return o

    def stats(self):
        o = self.ffi.new("pls_stats *")
        assert self.lib.pls_controller_stats(self.ctl, o) == 0
        return o


def window(sim: Sim, start: int, stream: int = 0) -> list[int]:
    return [ks[stream] for ks in sim.ks[start:]]


CPU_LINEAR = Machine(base=27.0, per_token=24.0, draft_first=11.7, draft_token=11.7, catchup_token=10.3)
GPU = Machine(base=3.7, per_token=0.35, draft_first=1.8, draft_token=1.6, catchup_token=0.03, draft_call=2.0)
GPU_CHEAP_DRAFT = Machine(base=3.7, per_token=0.35, draft_first=0.5, draft_token=0.3, catchup_token=0.01)
CPU_BATCHING = Machine(base=27.0, per_token=5.0, draft_first=6.0, draft_token=6.0, catchup_token=1.5)
# a 7B-shape Q4_0 target and a 0.5B-shape draft model on an H200, as its controller measured them
H200_7B = Machine(base=3.2, per_token=0.3, draft_first=1.6, draft_token=1.6, catchup_token=0.06, overhead=0.3)


def generations(sim: Sim, n: int, tokens: int, accept: float) -> list[tuple[float, float]]:
    """n generations of a stream, each a new prompt: (plain ms, ms) of each."""
    out = []
    for g in range(n):
        if g:
            sim.new_prompt()
        t0, plain0, n0 = sim.time_ms, sim.plain_ms, sim.tokens
        while sim.tokens - n0 < tokens:
            sim.step(accept)
        out.append((sim.plain_ms - plain0, sim.time_ms - t0))
    return out


def speedup(runs: list[tuple[float, float]]) -> float:
    return sum(p for p, _ in runs) / sum(t for _, t in runs)


@pytest.mark.parametrize("machine", [CPU_LINEAR, GPU, CPU_BATCHING], ids=["cpu-linear", "gpu", "cpu-batching"])
def test_zero_acceptance_settles_at_plain_within_five_percent(machine):
    sim = Sim(machine).run(100, 0.0)
    t0, tok0, plain0 = sim.time_ms, sim.tokens, sim.plain_ms
    sim.run(3000, 0.0)
    ratio = (sim.time_ms - t0) / (sim.plain_ms - plain0)
    assert ratio <= 1.05, f"after warm-up the loop costs {ratio:.3f}x plain decoding at zero acceptance"
    assert sum(1 for k in window(sim, 100) if k > 0) < 0.05 * 3000  # k = 0 but for sparse probes
    assert sim.stats().k_hist[0] > 0.95 * 3000


@pytest.mark.parametrize("kind", [MODEL, AUTOREGRESSIVE, BLOCK, NGRAM])
def test_perfect_acceptance_reaches_n_max(kind):
    sim = Sim(GPU, kind=kind).run(300, 1.0)
    tail = window(sim, 200)
    assert sum(1 for k in tail if k == sim.n_max) >= 0.9 * len(tail), tail[-20:]
    assert sim.time_ms < 0.7 * sim.plain_ms  # and it pays


def test_rising_verify_cost_with_depth_shrinks_k_then_turns_it_off():
    # verifying extra tokens gets dearer as the context deepens (attention over it), acceptance stays 0.7
    m = Machine(base=10.0, per_token=0.5, depth_growth=0.0, verify_growth=1.0 / 500, draft_first=1.0, draft_token=0.8,
                catchup_token=0.05)
    sim = Sim(m, n_max=8)
    mean_k = []
    while sim.depth[0] < 12000:
        start = len(sim.ks)
        d0 = sim.depth[0]
        while sim.depth[0] < d0 + 1500:
            sim.step(0.7)
        ks = window(sim, start)
        mean_k.append(sum(ks) / len(ks))
    assert mean_k[0] >= 2.0, mean_k
    assert mean_k[2] < mean_k[0], mean_k
    # past the crossover (extra verified tokens cost more than they return) speculation is off but for probes
    assert all(mk < 0.3 for mk in mean_k[-2:]), mean_k
    assert sim.time_ms <= 1.03 * sim.plain_ms or sim.time_ms < sim.plain_ms


def test_recovers_within_bounded_steps_after_acceptance_jumps():
    sim = Sim(GPU).run(600, 0.0)  # prose: nothing lands, speculation off
    assert sum(window(sim, 400)) < 0.1 * 200 * sim.n_max
    jump = len(sim.ks)
    sim.run(260, 0.9)  # code: almost everything lands (long enough for the bound below to be reached)
    ks = window(sim, jump)
    first_on = next(i for i in range(len(ks)) if sum(ks[i:i + 10]) >= 20)
    assert first_on <= 250, f"speculation came back only {first_on} steps after the content changed"
    t0, tok0, plain0 = sim.time_ms, sim.tokens, sim.plain_ms
    sim.run(200, 0.9)
    # at this acceptance and cost the best lengths are 3..4: 1.33x plain; the rate is flat around them
    assert (sim.plain_ms - plain0) / (sim.time_ms - t0) >= 1.2


def test_probes_grow_sparse_where_nothing_lands_and_a_landing_token_brings_the_next_at_once():
    # where probe after probe finds drafting hopeless, probing was most of what the stream lost to plain decoding (a
    # GPU's probe costs its cold batches and a catch-up): after a few such misses its budget halves
    sim = Sim(GPU).run(500, 0.0)
    t0, plain0, n0 = sim.time_ms, sim.plain_ms, len(sim.ks)
    sim.run(2000, 0.0)
    probes = [i for i, k in enumerate(window(sim, n0)) if k > 0]
    assert (sim.time_ms - t0) / (sim.plain_ms - plain0) <= 1.02  # 1.018; at the full budget 1.025
    assert 4 <= len(probes) <= 20, probes  # sparse, not stopped: a change of content is still found (40 at full)
    # the first token to land after them brings the next probe at once: a change shows within a few steps
    before = len(sim.ks)
    sim.run(600, 1.0)
    ks = window(sim, before)
    first = next(i for i, k in enumerate(ks) if k > 0)
    assert next(i for i, k in enumerate(ks) if k > 0 and i > first) <= first + 8, ks[:first + 40]


def test_probes_where_their_runs_land_tokens_but_drafting_does_not_pay_are_as_sparse_as_where_nothing_lands():
    # a block drafter on a GPU (the 27B + DFlash2 on an H100, its calls' first runs in a KV window dear, its catch-up of
    # skipped features 0.11 ms a token): at p 0.3 drafting never pays, yet a probe's run of warm steps lands a token
    # most times. Its steps cost the probe too (2 ms each over what they committed on the card), and landed tokens
    # that leave drafting implausible are no reason for the full budget: the card spent 3% of plain's time probing
    # every ~64 steps with runs of ~4 more. Here the last version probed 2.3 times as often as where nothing lands
    def probes(p):
        n = 0
        for seed in range(1, 9):
            sim = Sim(DFLASH2_H100, kind=BLOCK, n_max=7, seed=seed, kv_window=1024, behind_ms=0.11,
                      **dict(GPU_GRAPHS, window_first_ms=(6.0, 3.0))).run(500, p)
            start = len(sim.ks)
            sim.run(2000, p)
            ks = window(sim, start)
            n += sum(1 for i, k in enumerate(ks) if k > 0 and (i == 0 or ks[i - 1] == 0))
        return n

    nothing, some = probes(0.0), probes(0.3)
    assert nothing >= 8  # (probed still: a change of content is found)
    assert some <= 2.0 * nothing, (some, nothing)


@pytest.mark.parametrize("kind", [MODEL, BLOCK])
def test_a_new_shapes_one_time_cost_does_not_turn_speculation_off(kind):
    # on a GPU the first batch of a new size captures a graph: tens of ms once, then a fraction of a step
    m = Machine(base=10.7, per_token=0.4, draft_first=1.5, draft_token=1.2, draft_call=4.9, catchup_token=0.02)
    sim = Sim(m, kind=kind, n_max=7, first_shape_ms=40.0).run(400, 0.8)
    assert sum(k[0] for k in sim.ks[200:]) / 200 >= 3
    t0, plain0 = sim.time_ms, sim.plain_ms
    sim.run(200, 0.8)
    assert (sim.plain_ms - plain0) / (sim.time_ms - t0) >= 1.3  # and it pays as it should (~1.7x here)


def test_a_size_new_to_the_kv_window_is_taken_only_where_it_pays_its_first_runs_there():
    # the 27B hybrid + DFlash2 on an H200: a batch's graph serves one window of 256 KV cells, and a size's first two
    # runs in a window cost ~35 and ~15 ms more (built and run eagerly, then captured) where a step costs 15-25 ms.
    # At acceptance 0.8 lengths 4-6 price within a few percent of each other, and every change of mind costs those
    # runs: the controller must settle rather than wander, and stay near the best fixed length
    m = Machine(base=10.0, per_token=1.5, draft_call=4.3, overhead=0.05)
    first = (35.0, 15.0)

    def run(**kw) -> tuple[list[int], float]:
        sim = Sim(m, kind=BLOCK, window_first_ms=first, **{"n_max": 7, **kw})
        sim.run(300, 0.8)  # learning
        t0, tok0, n0 = sim.time_ms, sim.tokens, len(sim.ks)
        sim.run(900, 0.8)  # ~3 500 tokens: 14 windows
        return [k[0] for k in sim.ks[n0:]], (sim.tokens - tok0) / (sim.time_ms - t0)

    best = max(run(adaptive=False, seed=3, n_max=k)[1] for k in (3, 4, 5, 6, 7))  # 6, then 7 (0.98 of it)
    for seed in (1, 2, 3):
        ks, rate = run(seed=seed)
        settled = max(ks.count(k) for k in set(ks) if k > 0)
        assert settled >= 0.8 * len(ks), (seed, sorted((k, ks.count(k)) for k in set(ks)))
        assert rate >= 0.94 * best, (seed, rate / best)


def test_a_single_steps_try_of_a_longer_draft_is_not_the_length_held():
    # the 27B hybrid + DFlash2 on an H200 at acceptance 0.8, answers of 512 tokens: 5 was best, 6 and 7 2% and 8% slower
    # a token. A lone stream keeps its length unless another prices 3% better, and a try of one position more (a single
    # step) became the length kept: the loop climbed from 5 to 7 a try at a time and drafted 6 and 7 for most of its
    # rounds (0.93 of n5 on the GPU). The length chosen before a try is the one held. Here 4 and 5 price alike, 6 and
    # 7 are 2% and 5% slower
    m = Machine(base=10.3, per_token=2.4, draft_call=4.6, overhead=0.05)
    kw = dict(kind=BLOCK, n_max=7, kv_window=1024, window_first_ms=(10.0, 4.0))
    fixed = {k: speedup(generations(Sim(m, seed=1, adaptive=False, **{**kw, "n_max": k}), 9, 512, 0.8)[1:])
             for k in (4, 5, 7)}
    assert fixed[7] < 0.96 * max(fixed.values())  # the shape of the case
    for seed in range(1, 5):
        sim = Sim(m, seed=seed, **kw)
        runs = generations(sim, 9, 512, 0.8)[1:]
        ks = [k[0] for k in sim.ks[len(sim.ks) // 9:]]
        long = sum(1 for k in ks if k >= 6)
        assert long <= 0.08 * len(ks), (seed, sorted((k, ks.count(k)) for k in set(ks)))
        assert speedup(runs) >= 0.98 * max(fixed.values()), (seed, speedup(runs) / max(fixed.values()))


def test_streams_with_different_acceptance_get_different_k():
    sim = Sim(GPU_CHEAP_DRAFT, n_streams=2)
    for _ in range(400):
        sim.step([0.95, 0.05])
    tail = sim.ks[200:]
    k0 = sum(k[0] for k in tail) / len(tail)
    k1 = sum(k[1] for k in tail) / len(tail)
    assert k0 >= 4 and k1 <= 1, (k0, k1)


def best_fixed(machine: Machine, accept: float, n_steps: int, n_max: int = 8) -> tuple[int, float]:
    rates = {}
    for k in range(n_max + 1):
        sim = Sim(machine, n_max=k, adaptive=False, seed=3).run(n_steps, accept)
        rates[k] = sim.tokens / sim.time_ms
    k = max(rates, key=rates.get)
    return k, rates[k]


@pytest.mark.parametrize("machine,accept", [(GPU, 0.6), (GPU, 0.85), (CPU_BATCHING, 0.8), (CPU_LINEAR, 0.8),
                                            (CPU_LINEAR, 0.95)],
                         ids=["gpu-0.6", "gpu-0.85", "cpu-batching-0.8", "cpu-linear-0.8", "cpu-linear-0.95"])
def test_adaptive_is_near_the_best_fixed_length_and_never_below_plain(machine, accept):
    n = 1500
    k_best, rate_best = best_fixed(machine, accept, n)
    sim = Sim(machine, seed=3).run(n, accept)
    rate = sim.tokens / sim.time_ms
    plain_rate = sim.tokens / sim.plain_ms
    assert rate >= 0.95 * rate_best, f"adaptive {rate:.4f} vs best fixed k={k_best} {rate_best:.4f} tok/ms"
    assert rate >= 0.97 * plain_rate


def test_not_adaptive_always_drafts_n_max():
    sim = Sim(CPU_LINEAR, adaptive=False).run(50, 0.0)
    assert all(k == [sim.n_max] for k in sim.ks)


def test_learnt_costs_and_acceptance_are_reported():
    sim = Sim(CPU_BATCHING).run(400, 0.8)
    info = sim.info()
    assert info.enabled == 1 and info.n_max == 8
    # the target's plain cost is measured (calibration step), the batch costs grow with size
    assert info.target_ms[0] == pytest.approx(CPU_BATCHING.target(1, 300), rel=0.1)
    assert all(b >= a for a, b in zip(info.target_ms[0:9], info.target_ms[1:9]))
    assert 0.6 < info.hazard[0] < 0.95
    st = sim.stats()
    assert st.est_plain_ms == pytest.approx(sim.plain_ms, rel=0.1)
    assert sum(st.k_hist[i] for i in range(9)) == len(sim.ks)


def test_bad_parameters_are_refused():
    ffi, lib = _native.load()
    p = ffi.new("pls_controller_params *")
    p.n_max, p.n_streams, p.drafter_kind = 100, 1, MODEL
    slot = ffi.new("pls_controller **")
    err = _native.ErrorBuffer(ffi)
    assert lib.pls_controller_new(p, slot, err.buf, err.SIZE) == _native.constants()["PLS_ERR_INVALID"]
    assert "n_max" in err.text


# ---- costs kept between sessions --------------------------------------------------------------------------------

def export_costs(sim: Sim) -> list[tuple]:
    n = sim.lib.pls_controller_export_costs(sim.ctl, sim.ffi.NULL, 0)
    buf = sim.ffi.new("pls_cost_point[]", max(1, n))
    assert sim.lib.pls_controller_export_costs(sim.ctl, buf, n) == n
    return [(p.table, p.bucket, p.n_tokens, p.count, p.ms) for p in buf[0:n]]


def import_costs(sim: Sim, points: list[tuple]) -> tuple[int, str]:
    buf = sim.ffi.new("pls_cost_point[]", max(1, len(points)))
    for i, (table, bucket, n_tokens, count, ms) in enumerate(points):
        buf[i].table, buf[i].bucket, buf[i].n_tokens, buf[i].count, buf[i].ms = table, bucket, n_tokens, count, ms
    err = _native.ErrorBuffer(sim.ffi)
    rc = sim.lib.pls_controller_import_costs(sim.ctl, buf, len(points), err.buf, err.SIZE)
    return rc, err.text


def test_a_fresh_controller_learns_cheaply_that_a_pair_cannot_pay():
    # every drafted token would land, yet on this machine verifying k + 1 tokens costs about k + 1 plain steps:
    # the controller measures the short draft (in a steady run: three in a row) and the ceiling, early (while a draft
    # model has little to catch up), then never drafts again
    sim = Sim(CPU_LINEAR, seed=3).run(600, 1.0)
    drafting = [i for i, k in enumerate(sim.ks) if k[0] > 0]
    assert 0 < len(drafting) <= 6 and max(drafting) < 40, drafting
    assert sim.time_ms <= 1.02 * sim.plain_ms


def test_a_draft_model_priced_only_by_its_catch_ups_is_not_judged_hopeless():
    # a GPU where a draft model's decode of a new batch size captures a graph and a caught-up token costs a tenth of
    # a drafted one: at zero acceptance every probe follows plain steps, so it catches up on a new number of tokens
    # and pays a capture each time - priced by those alone, drafting looks as if it could never pay. Its steady
    # cost (a draft right after a draft) is measured before that verdict, so when acceptance rises the pair drafts
    # and pays (priced by catch-ups alone, this seed stayed near k = 0 at 1.01x plain).
    m = Machine(base=3.3, per_token=0.2, draft_first=1.1, draft_token=1.1, catchup_token=0.1, overhead=0.3)
    sim = Sim(m, n_max=8, first_shape_ms=6.0, draft_shape_ms=6.0, seed=5).run(1000, 0.0)
    assert sim.time_ms <= 1.05 * sim.plain_ms
    t0, plain0, n0 = sim.time_ms, sim.plain_ms, len(sim.ks)
    sim.run(1000, 0.9)
    assert sum(k[0] for k in sim.ks[n0 + 500:]) / 500 >= 2
    assert (sim.plain_ms - plain0) / (sim.time_ms - t0) >= 1.3


def test_drafting_resumes_right_after_a_refresh_of_the_plain_cost():
    # every 128 steps of drafting a few plain steps re-measure plain decoding. Where a change of batch size runs cold
    # (a GPU's), the return to drafting after them was charged that change in one step: a pair 15% over plain decoding
    # found no length paying it back, went plain, and waited for a probe (8 plain steps after each refresh, not 3)
    m = Machine(base=3.2, per_token=0.35, draft_first=1.3, draft_token=1.3, catchup_token=0.05, overhead=0.05)
    after_refresh = []
    for seed in (1, 2, 3, 4):
        sim = Sim(m, n_max=8, cold_ms=3.0, seed=seed).run(800, 0.8)
        ks = [k[0] for k in sim.ks]
        i = streak = 0
        while i < len(ks):
            if ks[i] > 0:
                streak, i = streak + 1, i + 1
                continue
            j = i
            while j < len(ks) and ks[j] == 0:
                j += 1
            if streak >= 120 and j < len(ks):
                after_refresh.append(j - i)  # plain steps after a long run of drafting (a refresh, most of them)
            streak, i = 0, j
        assert sim.plain_ms / sim.time_ms > 1.1
    assert len(after_refresh) >= 12
    assert sum(1 for n in after_refresh if n <= 3) >= 0.75 * len(after_refresh), after_refresh  # (16 of 18 now; 0)


def test_seeded_costs_skip_the_learning_and_keep_a_pair_that_pays():
    hopeless = Sim(CPU_LINEAR, seed=3).run(300, 1.0)
    seeded = Sim(CPU_LINEAR, seed=4)
    rc, err = import_costs(seeded, export_costs(hopeless))
    assert rc == 0, err
    seeded.run(600, 1.0)
    assert all(k == [0] for k in seeded.ks) and seeded.stats().n_probes == 0
    # the same seeding where drafting pays: speculation starts at once and reaches long drafts
    paying = Sim(GPU, seed=3).run(300, 0.9)
    sim = Sim(GPU, seed=4)
    assert import_costs(sim, export_costs(paying))[0] == 0
    sim.run(60, 0.9)
    assert sum(1 for k in sim.ks[:30] if k[0] > 0) >= 20
    assert max(k[0] for k in sim.ks) >= 4


def test_exported_costs_round_trip_and_bad_points_are_refused():
    sim = Sim(CPU_BATCHING).run(300, 0.8)
    pts = export_costs(sim)
    tables = {p[0] for p in pts}
    c = _native.constants()
    assert {c["PLS_COST_TARGET"], c["PLS_COST_DRAFT_FIRST"], c["PLS_COST_OVERHEAD_PLAIN"]} <= tables
    assert all(p[3] >= 1 and p[4] >= 0 for p in pts)
    other = Sim(CPU_BATCHING)
    assert import_costs(other, pts)[0] == 0
    again = export_costs(other)
    assert [(t, b, n, min(k, 2)) for t, b, n, k, _ in pts] == [(t, b, n, k) for t, b, n, k, _ in again]
    assert [p[4] for p in again] == pytest.approx([p[4] for p in pts])
    # a size another session saw once stays seen once until this one measures: its first runs in a KV window (which
    # decide whether one run is enough) are its own, and it has run none
    seeded = Sim(CPU_BATCHING)
    once = [(c["PLS_COST_TARGET"], 0, 1, 2, 10.0), (c["PLS_COST_TARGET"], 0, 2, 2, 10.5),
            (c["PLS_COST_TARGET"], 0, 5, 1, 12.0), (c["PLS_COST_COLD"], 0, 0, 1, 0.1)]
    assert import_costs(seeded, once)[0] == 0
    exported = [(n, k) for t, _, n, k, _ in export_costs(seeded) if t == c["PLS_COST_TARGET"]]
    assert exported == [(1, 2), (2, 2), (5, 1)]
    fresh = Sim(CPU_BATCHING)
    for bad in [(99, 0, 1, 2, 1.0), (0, 8, 1, 2, 1.0), (0, 0, 0, 2, 1.0), (0, 0, 1, 0, 1.0), (0, 0, 1, 2, float("nan")),
                (0, 0, 1, 2, -1.0), (c["PLS_COST_OVERHEAD_PLAIN"], 0, 3, 1, 0.5)]:
        rc, err = import_costs(fresh, [(0, 0, 2, 2, 5.0), bad])
        assert rc == c["PLS_ERR_INVALID"] and "cost point 1" in err, (bad, err)
    assert export_costs(fresh) == []  # a refused import imports nothing


def test_whole_step_costs_are_kept_between_sessions_once_measured_enough_to_judge_by():
    # a simulated GPU whose draft model's decodes do not add up: the lengths its tries ran long enough go to the cache
    # (table PLS_COST_WHOLE, one point per length), each counted as two steps when imported - a length run once or
    # twice (a try cut short) does not, as the session that measured it does not judge by it either
    c = _native.constants()
    gpu = Machine(base=3.3, per_token=0.45, draft_first=1.94, draft_token=1.66, catchup_token=0.06, overhead=0.3)
    sim = Sim(gpu, seed=2, rest_ms=[1.66, 1.58, 0.77, 1.2, 1.2], **GPU_GRAPHS)
    generations(sim, 9, 128, 0.9)
    whole = [p for p in export_costs(sim) if p[0] == c["PLS_COST_WHOLE"]]
    assert len({p[2] for p in whole}) >= 3 and all(p[3] >= 6 for p in whole), whole
    # each length's mean step is what the machine charges for it, the draft model's decodes as they are
    for _, _, k, _, ms in whole:
        rows = [min(i, 5) - 1 for i in range(1, k)]
        parts = gpu.target(k + 1, 256) + gpu.draft_first + sum(sim.rest_ms[r] for r in rows) + gpu.overhead
        assert ms == pytest.approx(parts, rel=0.05), (k, ms, parts)
    seeded = Sim(gpu, seed=3, **GPU_GRAPHS)
    assert import_costs(seeded, export_costs(sim))[0] == 0
    again = [p for p in export_costs(seeded) if p[0] == c["PLS_COST_WHOLE"]]
    assert [(b, k, 2, ms) for _, b, k, _, ms in whole] == [(b, k, n, ms) for _, b, k, n, ms in again]


def test_free_drafts_are_taken_while_the_drafter_is_off():
    # n-gram matches beside a draft model: the drafter's own drafts rarely land (it is turned off), the matches -
    # there every other step, 4 tokens long - almost always do, and cost only their verify rows
    sim = Sim(CPU_BATCHING, seed=5)
    taken = offered = drafted = 0
    for step in range(600):
        has_free = step % 2 == 0
        ks = sim.step(0.95 if has_free else 0.05, free=[4 if has_free else 0])
        if step >= 100 and has_free:
            offered += 1
            taken += ks[0] == 4  # the whole match: a free draft needs no short probe
        if step >= 100 and not has_free:
            drafted += ks[0] > 0  # the drafter itself: off, but for sparse probes
    assert taken >= 0.9 * offered, (taken, offered)
    assert drafted <= 0.05 * 250, drafted


# ---- a GPU's one-time costs ---------------------------------------------------------------------------------------

GPU_GRAPHS = dict(cold_ms=1.2, first_shape_ms=3.0, draft_shape_ms=1.0, draft_cold_ms=2.4)


def test_a_batch_size_is_priced_by_its_steady_runs_not_its_one_off_runs():
    # on a GPU the first runs of a batch size after other sizes capture its graph or run it eagerly (here 1.2 ms
    # more; a draft model's first decode after plain steps 2.4 ms), and a session's first run of each size captures
    # one (3 ms): a short probe between plain steps always pays that, the steps of a run that keeps its draft length
    # do not. Priced into the sizes it made short drafts look dear for good (an H200 learnt 4.4-4.7 ms for a 2-token
    # batch that costs about 3.5), and at acceptance 0.8 the loop stayed plain where drafting 2 or 3 gains 15-20%
    sim = Sim(H200_7B, seed=1, **GPU_GRAPHS)
    runs = generations(sim, 9, 128, 0.8)[1:]
    info = sim.info()
    for t in range(1, 7):
        assert info.target_ms[t - 1] == pytest.approx(H200_7B.target(t, 256), rel=0.05), t
    assert info.cold_ms > 0.1
    # the draft model alike: a probe's first decode after plain steps paid 4 ms where a run's costs 1.6
    assert info.draft_first_ms == pytest.approx(H200_7B.draft_first, rel=0.1)
    fixed = max(speedup(generations(Sim(H200_7B, n_max=k, adaptive=False, seed=1, **GPU_GRAPHS), 9, 128, 0.8)[1:])
                for k in (2, 3))
    assert speedup(runs) >= 1.05 and speedup(runs) >= 0.9 * fixed, (speedup(runs), fixed)


def test_a_draft_length_is_priced_by_its_whole_step_where_the_parts_do_not_add_up():
    # the 7B pair on an H200 at acceptance 0.9: the draft model's second decode of a step cost 1.66 ms, its third 1.58
    # and its fourth 0.77, so 4 tokens cost less per token than 2 or 3 - a price per further decode, learnt where the
    # loop drafted 2, said 4 was dearer, and the loop drafted 2 and 3 for whole generations (0.94x the best fixed
    # length). A lone stream's whole step, measured in runs at the lengths a try reaches, prices it as it is
    gpu = Machine(base=3.3, per_token=0.45, draft_first=1.94, draft_token=1.66, catchup_token=0.06, overhead=0.3)
    rest = [1.66, 1.58, 0.77, 1.2, 1.2]

    def run(seed, **kw):
        return speedup(generations(Sim(gpu, seed=seed, rest_ms=rest, **GPU_GRAPHS, **kw), 9, 128, 0.9)[1:])

    seeds = range(1, 25)
    n2, n4 = ([run(sd, n_max=k, adaptive=False) for sd in seeds] for k in (2, 4))
    assert statistics.mean(n2) < 0.95 * statistics.mean(n4)  # the shape of the case
    # against 4 (the best fixed length, with 5), over the acceptance draws of 24 seeds: the controller that priced each
    # length by its parts alone reached 0.95 of it over 4 seeds; this one 0.950-0.952 over these 24 (4 seeds' means
    # range from 0.94 to 0.97: a bound of 0.96 over 4 held by the draw of the seeds, and broke with a change to how a
    # draft model's first runs are learnt that left the 24 seeds' mean where it was)
    ratios = [run(sd, n_max=8) / f for sd, f in zip(seeds, n4)]
    assert statistics.mean(ratios) >= 0.94, ratios


@dataclass
class CliffMachine(Machine):
    """A target whose batches of cliff_at tokens and more run another way (a GPU's vector kernels stop at 8 rows):
    below it the line of Machine, from it cliff_ms plus above a token."""

    cliff_at: int = 9
    cliff_ms: float = 14.6
    above: float = 0.47

    def target(self, n_tokens: int, depth: int) -> float:
        if n_tokens < self.cliff_at:
            return super().target(n_tokens, depth)
        return self.cliff_ms + self.above * (n_tokens - self.cliff_at)


# the 35B-A3B MoE + DFlash on an H100, as its trace reads: batches of 1-8 tokens 4.15-8.7 ms, of 9 14.6, of 16 17.9;
# the drafter's call 2.5 ms; a size's first two runs in a KV window of 1 024 cells 20 and 10 ms more
MOE_H100 = CliffMachine(base=4.15, per_token=0.65, draft_call=2.5, overhead=0.1)


def test_a_size_under_a_cost_cliff_is_tried_not_priced_on_the_line_over_it():
    # at p 0.9 with a ceiling of 15 the 35B-A3B drafted 15 on 90% of its steps, 0.73 of n7: it had measured batches
    # of 1-2 and of 9 and 16 tokens, priced 8 on the line from 2 to 9 (13 ms, where it costs 8.7), and never tried a
    # length between. Over these 8 seeds the last version held 4, 5, 13 or 15 in most: 0.76-0.98 of n7, mean 0.88
    def run(seed, **kw):
        sim = Sim(MOE_H100, kind=BLOCK, seed=seed, window_first_ms=(20.0, 10.0), kv_window=1024, **kw)
        return sim, speedup(generations(sim, 7, 256, 0.9)[1:])

    ratios, long_steps = [], 0
    for seed in range(1, 9):
        sim, adaptive = run(seed, n_max=15)
        ratios.append(adaptive / run(seed, n_max=7, adaptive=False)[1])
        long_steps += sum(1 for ks in sim.ks if ks[0] > 8)
    assert min(ratios) >= 0.95 and statistics.mean(ratios) >= 0.98, ratios  # (0.955-0.998, mean 0.984 now)
    assert long_steps < 0.02 * 8 * 7 * 256 / 6, long_steps  # drafts past the cliff: tries, not a length held


def test_a_length_past_a_cost_cliff_measured_in_runs_is_not_tried_again():
    # once the batch past the cliff (9 tokens) was measured in runs, a try of 8 cannot pay even were its last position
    # to land every time: the 35B-A3B at p 0.9 on an H200's costs tried it in one answer of five anyway, each try paying
    # the cliff and the size's first runs in its KV window (0.98 of n7 replayed; 1.00 without). Here the last version
    # tried 8 on 6-12 of the ~370 steps of the later half of each seed's 16 answers
    for seed in range(1, 9):
        sim = Sim(MOE_H100, kind=BLOCK, seed=seed, window_first_ms=(20.0, 10.0), kv_window=1024, n_max=15)
        generations(sim, 16, 256, 0.9)
        ks = [k[0] for k in sim.ks]
        assert max(ks[: len(ks) // 2]) >= 8, seed  # (measured past the cliff while learning)
        assert not [k for k in ks[len(ks) // 2:] if k >= 8], seed


# the 27B + DFlash2 at 4 096 on an H100, in round numbers: verifies of 1-4 rows 10.9 ms and 1.5-1.6 a row, a batch of
# 5 far dearer (so that 2 is the length next best to 3), the drafter's call 4.1-4.5 ms
DFLASH2_H100 = CliffMachine(base=10.9, per_token=1.5, draft_call=4.1, overhead=0.05, cliff_at=5, cliff_ms=18.5,
                            above=1.5)


def test_one_stalled_verify_does_not_price_the_length_it_ran_at_out_for_good():
    # one verify of 23.9 ms among runs of 14.4 (a stall) raised the price of drafting 3 by 12%, the stream left it for
    # 2, and no steady run of 3 came again to bring the price back: it drafted 2 through whole answers where 3 was 4%
    # faster a token. A run that dear counts once the size's next run confirms it. The stall here falls on the last
    # step before a refresh of plain decoding, after which the length is chosen afresh (seeds 2 and 3 of these held 2
    # or 4 for a third of their later steps on the last version)
    def run(seed, stalls=None, n=1500):
        sim = Sim(DFLASH2_H100, kind=BLOCK, n_max=7, seed=seed, stalls=stalls or {}, **GPU_GRAPHS)
        for _ in range(n):
            sim.step(0.6)
        return sim

    for seed in range(1, 6):
        ks = [k[0] for k in run(seed, n=800).ks]
        at = next((i for i in range(400, 790) if ks[i - 2] == ks[i - 1] == ks[i] == 3 and ks[i + 1] == 0), None)
        assert at is not None, (seed, "no run of 3 before a refresh of plain decoding to stall in")
        after = [k[0] for k in run(seed, {at: 1.7}).ks[at + 50:]]  # (the same draws up to the stall: the same steps)
        assert after.count(3) >= 0.85 * len(after), (seed, {k: after.count(k) for k in set(after)})


def test_a_block_drafters_call_is_priced_by_its_own_runs_where_a_longer_block_costs_less():
    # a DFlash2 call of a block of 4 costs 3.8-4.3 ms on an H100 and an H200 against 4.2-4.9 for a block of 3 (the 27B
    # at 4 096), and a call of another block size than the step before's runs cold. Pooled into a non-decreasing fit,
    # and tried a single step at a time (cold runs only), drafting 3 was priced as dear as drafting 2 in the drafter:
    # the stream drafted 2 at p 0.6 for whole answers (0.95 of n3). Tried in runs, a length's target batch and call
    # are measured steady, and a size measured so is priced by its own runs (the last version held 2 on a tenth to
    # nearly half of the later steps of seeds 1, 5 and 7 of these)
    machine = CliffMachine(base=10.9, per_token=1.6, draft_call=4.5, overhead=0.05, cliff_at=5, cliff_ms=18.5,
                           above=1.5)
    for seed in range(1, 9):
        sim = Sim(machine, kind=BLOCK, n_max=7, seed=seed,
                  **dict(GPU_GRAPHS, cold_ms=4.0, call_cold_ms=2.0, call_by_block={3: 5.2, 4: 4.0}))
        for _ in range(400):
            sim.step(0.5)  # 2 is best
        for _ in range(1500):
            sim.step(0.6)  # 3 is best, by 8% a token
        after = [k[0] for k in sim.ks[700:]]
        assert after.count(3) >= 0.88 * len(after), (seed, {k: after.count(k) for k in set(after)})


# the 27B + DFlash2 at 4 096 on an H100 as its traces priced it, ceiling 7, p 0.6: 3 is best, by 5% a token (3% over 4)
DFLASH2_4096 = Machine(base=10.9, per_token=1.3, draft_call=4.4, overhead=0.05)


def _holds_3(**sim_kw) -> None:
    """8 seeds of 1500 steps at p 0.6 on DFLASH2_4096 (GPU_GRAPHS, a KV window of 1024 and sim_kw over them): each
    holds 3 on 80% of its steps after the 500th."""
    kw = dict(GPU_GRAPHS, window_first_ms=(20.0, 8.0), call_by_block={3: 4.4, 4: 4.0})
    kw.update(sim_kw)
    for seed in range(1, 9):
        sim = Sim(DFLASH2_4096, kind=BLOCK, n_max=7, seed=seed, kv_window=1024, depth=[4096], **kw)
        for _ in range(1500):
            sim.step(0.6)
        after = [k[0] for k in sim.ks[500:]]
        assert after.count(3) >= 0.8 * len(after), (seed, {k: after.count(k) for k in set(after)})


def test_a_block_drafters_first_calls_in_a_kv_window_do_not_price_its_length():
    # a DFlash2 call's graph is built for the drafter's KV window as a target batch's is: a block size's first two
    # calls in a window cost 6-13 ms where later ones cost 4-5 (the 27B at 4 096 and at 0 on an H100). Its second
    # call, counted as a steady run, priced drafting 3 at 9.4 ms a call for good - a single try's call is never
    # steady - and the stream drafted 2 at p 0.6 through whole answers where 3 was 3-4% faster a token (0.966 of n3)
    _holds_3(call_window_ms=(5.0, 5.0))


def test_a_block_drafters_first_calls_in_a_session_do_not_keep_its_drafts_short():
    # a session's first run of each batch size and block size pays one-time costs: the first 27B + DFlash2 session of
    # a process, at 4 096 on an H100, verified 3 and 6 rows for 33 and 208 ms and called blocks of 3 and 6 for 34 and
    # 78 where steady runs cost 11-17 and 3.5-4.5. With one block size measured in runs (2: drafting 1), every longer
    # one kept the price of its first calls, and the stream drafted 1 through whole answers at p 0.6 where 3 was 15%
    # faster a token (0.80-0.86 of n3; 20% on the simulated machine). Such a block is held to the measured one's cost
    # per token now (without it, 4 seeds here hold 0, 2 or 3 on less than 80% of their later steps)
    _holds_3(first_shape_ms=30.0, call_window_ms=(5.0, 5.0), call_first_ms=40.0)


def test_a_few_dear_steps_in_a_row_do_not_price_the_length_out():
    # a GPU's steps go dear for a few in a row now and then: the 27B + DFlash2 at 4 096 on an H100 verified 2-8% and
    # called its drafter 40-75% dearer for five steps drafting 3. A moving average took that in, 3 was priced 7% too
    # dear, the stream moved to 4 (3% slower a token) and never drafted 3 in a row again to learn its price back
    # (0.95 of n3). A size measured in enough steady runs is priced at most 1% over the mean of the middle half of its
    # latest ones (without it, no seed here holds 3 on 80% of its later steps)
    bursts = [b + j for b in range(300, 1500, 300) for j in range(5)]
    _holds_3(stalls={i: 1.06 for i in bursts}, call_stalls={i: 3.0 for i in bursts})


def test_where_probes_are_dear_a_new_prompt_keeps_its_streams_probe_schedule():
    # each generation is a new prompt. On a GPU a probe changes the batch size twice
    # (eager runs, graphs captured): a stream whose drafts never landed keeps its probe schedule across prompts, at the
    # rate the probe budget allows however short the generations are, instead of a run of early probes at each prompt
    # (which cost 3.5% on 128-token generations) - and it is still probed, never written off. A new batch size's
    # eager run costs about half a plain step here, as the H200 traces in benchmarks/traces/ measured
    sim = Sim(H200_7B, seed=1, **dict(GPU_GRAPHS, cold_ms=2.0))
    runs = generations(sim, 9, 128, 0.0)[1:]
    assert 1 / speedup(runs) <= 1.02
    probes = sum(1 for ks in sim.ks[-128 * 8:] if ks[0] > 0)
    assert 1 <= probes <= 4


def test_where_probes_are_cheap_a_new_prompt_is_probed_as_its_stream_last_was():
    # a CPU's probe costs what its steps cost (no cold batches): each prompt is probed, from a longer interval than a
    # fresh stream's where its drafts did not land before
    sim = Sim(CPU_BATCHING, seed=1)
    gens = generations(sim, 9, 128, 0.0)
    assert sum(1 for ks in sim.ks[-128 * 8:] if ks[0] > 0) >= 8


def test_one_stalled_plain_step_does_not_keep_short_generations_drafting():
    # the first steady plain step of a session stalls (another process, a page fault): priced by it, plain decoding
    # looks 60% dearer and drafting pays on paper. Held to the cheaper earlier runs it is not; and where a cost is
    # wrong the ledger, kept across prompts, stops drafting within its window (it was emptied at every prompt, and a
    # 64-token generation is shorter than the window: the loop drafted through four generations at 0.65x plain)
    sim = Sim(CPU_LINEAR, seed=3, stalls={2: 1.6})
    runs = generations(sim, 8, 64, 1.0)
    assert 1 / speedup(runs[1:]) <= 1.03
    assert sum(1 for ks in sim.ks[-64 * 7:] if ks[0] > 0) <= 3



# a 2-core CPU where drafting would pay only if nearly every drafted token landed: verifying 9 tokens costs about 3.7
# plain steps, a drafted token a seventh of one, and catching the draft model up on a token a twentieth
CPU_MARGINAL = Machine(base=30.0, per_token=10.0, draft_first=4.0, draft_token=4.0, catchup_token=1.5, overhead=0.3)


def sessions(machine: Machine, n: int, tokens: int, accept: float, seed: int = 3,
             edit=lambda pts: pts) -> list[Sim]:
    """n sessions one after another, each seeded with what the one before it exported (a cost cache), one
    generation of `tokens` each; edit(points) changes what is handed on."""
    out, pts = [], None
    for i in range(n):
        sim = Sim(machine, seed=seed + i)
        if pts is not None:
            assert import_costs(sim, edit(pts))[0] == 0
        while sim.tokens < tokens:
            sim.step(accept)
        pts = export_costs(sim)
        out.append(sim)
    return out


def test_a_cpu_session_seeded_by_an_earlier_one_does_not_probe_the_ceiling_again():
    # one-off runs cost what steady runs do here, so the ceiling's batch, measured once by the first session's probe,
    # is measured: later sessions do not draft n_max again (with a draft model's catch-up of the whole prompt) to
    # measure it twice - which, every 64-token generation, cost 9-21% of plain decoding
    runs = sessions(CPU_MARGINAL, 8, 64, 0.4)
    assert max(k[0] for k in runs[0].ks) == 8  # the first learns the ceiling's cost
    assert all(max(k[0] for k in sim.ks) < 8 for sim in runs[1:]), [max(k[0] for k in s.ks) for s in runs]
    # what is left is each session's short probes to learn acceptance, which is not handed on (it was 1.08x)
    later = runs[2:]
    assert sum(s.time_ms for s in later) <= 1.05 * sum(s.plain_ms for s in later)


def test_plain_decoding_priced_in_a_busier_time_is_measured_again_before_it_weighs_a_choice():
    # the cost cache holds a plain step priced while the machine was busier (or one stalled run): 60% dearer than
    # now, by which drafting pays at this acceptance. A session seeded with it runs plain steps first and prices
    # plain decoding as the machine runs now - else it drafts its whole 64-token generation at a loss (the ledger's
    # window is longer than that, and plain steps are not refreshed while speculating)
    target = _native.constants()["PLS_COST_TARGET"]

    def busier_plain(pts):
        return [(t, b, n, c, ms * 1.6 if (t, n) == (target, 1) else ms) for t, b, n, c, ms in pts]

    runs = sessions(CPU_MARGINAL, 4, 64, 0.4, edit=busier_plain)
    later = runs[1:]
    assert all(s.ks[:3] == [[0]] * 3 for s in later)
    # short probes to learn acceptance, as without the dearer price (it drafted throughout at 1.26-1.43x)
    assert sum(s.time_ms for s in later) <= 1.06 * sum(s.plain_ms for s in later)


@pytest.mark.parametrize("kv_window", [256, 1024])
def test_probes_keep_their_budget_where_each_pays_its_batchs_first_runs_in_a_new_kv_window(kv_window):
    # the 27B hybrid + DFlash2 on an H200 at zero acceptance, generations of 512 tokens: a probe after plain steps is
    # rare enough to land in a new KV window each time, where its batch's first two runs cost ~20 and ~11 ms more
    # than its steady 11.5 (plain steps of 10 ms), and the drafter takes in the features of the ~100 tokens it skipped
    # (~0.09 ms each). Priced by its steady costs a probe looked like 0.6 plain steps; it costs about 3. Probes
    # learn what they cost, and a stream that stays off probes within the budget (2% of what plain decoding costs; a
    # new prompt's first probe comes on its schedule, beyond it). The controller before this paid 2.8% here
    m = Machine(base=10.0, per_token=1.5, draft_call=4.3, overhead=0.05)

    def run(n_max: int) -> float:
        sim = Sim(m, kind=BLOCK, n_max=n_max, adaptive=n_max > 0, window_first_ms=(20.0, 11.0), kv_window=kv_window,
                  behind_ms=0.09)
        return sum(t for _, t in generations(sim, 9, 512, 0.0)[1:])  # the first one learns

    plain = run(0)  # k = 0 throughout: plain steps that pay their batch's first runs in each window too
    for_probes = run(7) / plain - 1.0
    assert for_probes <= 0.026, f"probing cost {for_probes:.3f} of plain decoding (kv_window {kv_window})"
