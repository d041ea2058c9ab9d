"""The adaptive controller replayed against step costs recorded on an H200 (an H100 for one trace) and on a 2-core CPU
(pyllamaspec.bench.replay), with scripted acceptance: the replay prices fixed draft lengths as the machine measured
them, and the controller keeps the bounds BENCHMARKS.md records ("The GPU adaptive controller") - so a later change
cannot bring the loss back unnoticed. Traces: benchmarks/traces/ (benchmarks/step_cost.py --trace; on the H200,
synthetic models of real shape; on the CPU, the Qwen2.5-Coder 1.5B + 0.5B pair)."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from pyllamaspec.bench import replay, trace
from pyllamaspec.controller import Controller
from pyllamaspec.errors import ConfigError

TRACES = Path(__file__).resolve().parent.parent / "benchmarks" / "traces"

# trace: (adaptive ceiling, fixed lengths, {acceptance: least adaptive / best of plain and the fixed lengths})
# (the replay prices a DFlash probe's catch-up after plain steps since the sixth version; the 35B bounds of the earlier
# 64-token trace at 0 and 0.6 follow the replay's figures with it, less 0.02)
CASES = {
    "h200-27b-dflash2-d0.json": (7, (3, 5, 7), {0.0: 0.98, 0.3: 0.97, 0.6: 0.94, 0.8: 0.93, 0.9: 0.97}),
    "h200-27b-dflash2-d4096.json": (7, (3, 5, 7), {0.0: 0.96, 0.3: 0.96, 0.6: 0.94, 0.8: 0.97, 0.9: 0.97}),
    # (p 0.6: 0.92 since the eighth version prices a draft model's lengths by their whole steps - this trace's seed-1
    # figure 0.976 -> 0.947, the mean of 8 seeds 0.975 -> 0.986)
    "h200-7b-draft-d0.json": (8, (2, 4, 8), {0.0: 0.97, 0.3: 0.98, 0.6: 0.96, 0.8: 0.96, 0.9: 0.97}),
    # (p 0.9: 0.86 since a probe's switch cost is spread over 24 steps, not 8 - these 3 rounds 0.907 -> 0.867, the mean
    # of 4 seeds' 0.938 -> 0.928, for p 0.6 0.867 -> 0.922 on this trace and better at 0.6 on most others; p 0.3: 0.95
    # since the ninth version judges a probe with a standard error's hope - seed 1 1.00 -> 0.975, the mean of 8 seeds
    # 1.003 -> 1.001 - while its p 0.6 went 0.919 -> 0.942 and the bounds that rose with it are raised)
    # (p 0.9: 0.84 since the replay prices a DFlash call right after a change of draft length apart, as the GPU measured
    # it - 0.863 with this version and the last alike; so for the 35B-A3B's switch24 trace at p 0.9, 1.06 -> 1.02)
    "h200-35b-a3b-dflash-d0.json": (15, (3, 7), {0.0: 0.96, 0.3: 0.95, 0.6: 0.91, 0.8: 0.95, 0.9: 0.84}),
    # 128-token traces with a sweep arm (every length's steady and cold cost) and probes that caught up after plain steps
    "h200-27b-dflash2-d0-sweep-n128.json.gz": (7, (3, 5, 7), {0.0: 0.97, 0.3: 0.97, 0.6: 0.96, 0.8: 0.97, 0.9: 0.98}),
    "h200-35b-a3b-dflash-d0-sweep-n128.json.gz": (7, (3, 7), {0.0: 0.97, 0.3: 0.96, 0.6: 0.94, 0.8: 0.98, 0.9: 0.98}),
    # 128-token traces of a drafter that catches up in passes of 8, 4, 2, 1 (the GPU default since then), ceiling 15 on
    # the 35B as measured; bounds: the replay's figures less about 0.02
    "h200-27b-dflash2-d0-n128-passes.json.gz": (7, (3, 5, 7), {0.0: 0.97, 0.3: 0.96, 0.6: 0.95, 0.8: 0.96, 0.9: 0.98}),
    # (p 0.8 lowered by the rule since probes learn their cost and the call table's envelope is pooled: 0.91-0.95; p 0.9
    # since a single step's try of a longer draft no longer becomes the length held: 0.99 of n7, where it beat n7 by 1%;
    # p 0.9 lowered by the rule since a size between two measured ones is priced at most along the slope below them:
    # seed 1 0.971 -> 0.953, the mean of 4 seeds 0.979 -> 0.986)
    "h200-35b-a3b-dflash-d0-n128-passes.json.gz": (15, (3, 7), {0.0: 0.99, 0.3: 0.99, 0.6: 0.88, 0.8: 0.91, 0.9: 0.93}),
    # 128-token traces of the seventh version (a probe's switch cost over 24 steps), its arms only; bounds: the lower of
    # the replay's figure and its mean over 4 seeds, less 0.02 (the 7B's p 0.9 lowered by it since a size between two
    # measured ones is priced at most along the slope below them: seed 1 0.989 -> 0.957, 4 seeds' mean 0.990 -> 0.984)
    "h200-7b-draft-d0-n128-switch24.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.98, 0.6: 0.92, 0.8: 0.95, 0.9: 0.93}),
    "h200-35b-a3b-dflash-d0-n128-switch24.json.gz": (15, (3,), {0.0: 0.96, 0.3: 0.98, 0.6: 0.94, 0.8: 0.99, 0.9: 1.02}),
    "h200-27b-dflash2-d0-n128-switch24.json.gz": (7, (3, 5, 7), {0.0: 0.96, 0.3: 0.95, 0.6: 0.95, 0.8: 0.94, 0.9: 0.94}),
    "h200-27b-dflash2-d4096-n128-switch24.json.gz": (7, (3, 5), {0.0: 0.94, 0.3: 0.95, 0.6: 0.97, 0.8: 1.02, 0.9: 1.11}),
    # the eighth version's 7B trace (with the adaptive arm's lengths 2-7, whole steps measured): the same rule
    "h200-7b-draft-d0-n128-v8.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.98, 0.6: 0.95, 0.8: 0.95, 0.9: 0.95}),
    # the same pair with greedy rows sampled on the GPU (a plain step 3.0 ms instead of 3.2): the same rule
    # (p 0 lowered by the rule, and p 0.3 of the ninth version's trace below, since the replay prices a generation's
    # first step by its batch size: the adaptive arm's first step after a prompt, a batch of one whose CUDA graph is
    # captured there (10.6 ms), was drawn among the fixed arms' first verifies of 3 and 5 tokens, which run without
    # a graph (4.7-5.9 ms), so that it beat plain decoding by 2% at zero acceptance - now 0.99)
    "h200-7b-draft-d0-n128-bs.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.99, 0.6: 0.97, 0.8: 0.97, 0.9: 0.96}),
    # the ninth version (a stream off is judged back on with a standard error's hope where a drafter reading every
    # target batch makes a stay off dear; the ledger allows two standard errors of acceptance luck): its 7B trace, and
    # the 35B-A3B with every expert on the CPU (two calls' traces, 64 tokens) - a cell it still misses on the GPU
    # (0.96 of plain at natural acceptance, 0.94 of n3 at p 0.9), bounded where it stands. Bounds: the same rule
    "h200-7b-draft-d0-n128-v9.json.gz": (8, (2, 4), {0.0: 0.99, 0.3: 0.97, 0.6: 0.96, 0.8: 0.97, 0.9: 0.96}),
    # (p 0.8 since probes learn their cost: 0.92-0.94 over 4 seeds, where plain and n3 price alike and the adaptive arm
    # stays off; the bound lowered by the rule)
    # (p 0.9 lowered by the rule to 0.91 since a size's first runs in a KV window only bound what a one-off size is
    # believed to cost: seed 1 0.933 -> 0.929, the mean of 4 seeds 0.939 -> 0.960)
    "h200-35b-a3b-cpumoe-d0-v9.json.gz": (15, (3, 7), {0.0: 0.89, 0.3: 0.9, 0.6: 0.9, 0.8: 0.9, 0.9: 0.91}),
    # with graphs kept by shape (patch 0010: a change of batch size 0.8-1.3 ms cheaper on the 35B-A3B and the 27B),
    # 64 tokens, the single-graph arms left out of the trace. Bounds: the same rule
    "h200-35b-a3b-dflash-d0-graphs.json.gz": (15, (3, 7), {0.0: 0.98, 0.3: 0.96, 0.6: 0.99, 0.8: 0.96, 0.9: 0.85}),
    "h200-27b-dflash2-d0-graphs.json.gz": (7, (3, 5, 7), {0.0: 0.97, 0.3: 0.97, 0.6: 0.96, 0.8: 0.97, 0.9: 0.97}),
    # with a small batch's graph in a scheduler of its own (a change between sizes that ran before costs ~0.1 ms; a
    # size's first two runs, eager then captured, still cost about two steps more), 64 tokens, the -gs and -g1 arms
    # left out of the trace. Bounds: the same rule
    "h200-35b-a3b-dflash-d0-sched.json.gz": (15, (3, 7), {0.0: 1.0, 0.3: 1.0, 0.6: 0.97, 0.8: 0.93, 0.9: 0.84}),
    "h200-27b-dflash2-d0-sched.json.gz": (7, (3, 5, 7), {0.0: 0.98, 0.3: 0.97, 0.6: 0.94, 0.8: 0.97, 0.9: 0.97}),
    "h200-7b-draft-d0-n128-sched.json.gz": (8, (2, 4), {0.0: 0.99, 0.3: 0.99, 0.6: 0.96, 0.8: 0.95, 0.9: 0.93}),
    # the controller that prices a size's first runs in a KV window (and holds its length against small differences),
    # 64 tokens: the 35B-A3B's trace has its batch of 9 at 14.3 ms (8.4 for 8). Bounds: the same rule.
    # Since this version the replay prices a size's first two runs in a KV window and in a graph slot apart (see
    # pyllamaspec.bench.replay), and every prompt starts at the trace's depth: bounds that broke were lowered by the
    # rule - the 35B-A3B's at p 0.9 to 0.84-0.85, where its ceiling of 15 meets sizes 9-16 the traces never ran in a
    # row: the replay prices them on the line through 1-8 (no cliff at 9, which the GPU has) and the controller goes
    # long into batches that share slots with 1-8 (on the H200 itself this version ran that cell at 0.97 of n7)
    # (p 0.9 lowered by the rule to 0.79 with the same change: the replay's line through sizes 1-8 makes 9-16 look
    # cheap, and a new prompt now counts as a new window for the sizes' first runs; on the H200 at 512 tokens this
    # version's cell ran 0.97 of n7)
    "h200-35b-a3b-dflash-d0-window.json.gz": (15, (3, 7), {0.0: 0.95, 0.3: 0.95, 0.6: 0.98, 0.8: 0.86, 0.9: 0.79}),
    "h200-27b-dflash2-d0-window.json.gz": (7, (3, 5, 7), {0.0: 0.97, 0.3: 0.97, 0.6: 0.96, 0.8: 0.95, 0.9: 0.97}),
    # an H100 (the 7B pair, 128 tokens; the trace keeps each arm's warm-up round, so the replay prices the drafter's
    # first runs of a batch size as measured). Bounds: the same rule
    "h100-7b-draft-d0-n128-grid.json.gz": (8, (2, 4), {0.0: 0.98, 0.3: 0.96, 0.6: 1.02, 0.8: 0.96, 0.9: 0.96}),
    # the 35B-A3B + DFlash on an H100 (p 0.6 and 0.9, 256 tokens, warm-up rounds kept: its batch of 9 at 14.6 ms, 8.7
    # for 8), ceiling 15 as measured. Bounds: the same rule
    "h100-35b-a3b-dflash-d0-fr.json.gz": (15, (3, 7), {0.0: 1.02, 0.3: 1.03, 0.6: 0.96, 0.8: 0.95, 0.9: 0.93}),
    # the 7B pair on an H100 at 16 384 (p 0.3, 0.6 and 0.9, 256 tokens, warm-up rounds kept). Bounds: the same rule
    "h100-7b-draft-d16384-fr.json.gz": (8, (2, 4), {0.0: 0.98, 0.3: 0.98, 0.6: 0.99, 0.8: 0.97, 0.9: 0.98}),
    # the H200 again (the 27B + DFlash2 at 128 tokens, natural, 0.6-0.9; the 35B-A3B + DFlash at 256, natural, 0.6,
    # 0.9), the version that confirms a stalled verify before it counts and prices a block drafter's call measured in
    # runs by its own runs. Bounds: the same rule
    "h200-27b-dflash2-d0-own.json.gz": (7, (3, 5, 7), {0.0: 0.98, 0.3: 0.98, 0.6: 0.96, 0.8: 0.97, 0.9: 0.96}),
    "h200-35b-a3b-dflash-d0-own.json.gz": (15, (3, 7), {0.0: 1.02, 0.3: 1.02, 0.6: 1.02, 0.8: 0.94, 0.9: 0.94}),
    # the 27B + DFlash2 on an H100 (n5 and n7 at p 0.8 and 0.9, 256 tokens), the version that does not take a block
    # size's first calls in a KV window for steady runs. Bounds: the same rule
    "h100-27b-dflash2-d0-calls.json.gz": (7, (5, 7), {0.0: 0.97, 0.3: 0.97, 0.6: 0.98, 0.8: 0.97, 0.9: 0.97}),
    # an H100 with steps that draft nothing no longer rolling back what is not there (the 27B + DFlash2 at 4 096, p 0.3,
    # 0.6 and 0.9; the 7B pair at p 0.8 and 0.9, 12 rounds; 128 tokens). Bounds: the same rule
    "h100-27b-dflash2-d4096-h5.json.gz": (7, (3, 5, 7), {0.0: 0.96, 0.3: 0.96, 0.6: 0.97, 0.8: 0.97, 0.9: 0.97}),
    "h100-7b-draft-d0-h5.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.97, 0.6: 0.96, 0.8: 0.96, 0.9: 0.97}),
    # the 7B pair on an H100 with a draft model priced as its runs go (every level, 128 tokens). Bounds: the same rule
    "h100-7b-draft-d0-h6.json.gz": (8, (2, 4), {0.0: 0.96, 0.3: 0.96, 0.6: 0.97, 0.8: 0.96, 0.9: 0.97}),
    # a CPU: the Qwen2.5-Coder 1.5B + 0.5B pair on 2 cores (real weights, synthetic acceptance, 64 tokens). A verify of
    # 3 tokens costs 2.7 plain steps and a drafted token 0.7, so no fixed length beats plain decoding at any level
    # (n2 0.55x plain at p 0.9): the controller stays with it. Bounds: the same rule
    "cpu-qwen2.5-coder-d0.json.gz": (8, (2, 4, 8), {0.0: 0.97, 0.3: 0.97, 0.6: 0.97, 0.8: 0.97, 0.9: 0.97}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    arms = trace.load(TRACES / request.param)
    return request.param, arms, replay.CostModel.from_arms(arms, depth=arms[0]["setup"]["depth"])


def test_the_replay_prices_fixed_lengths_as_the_machine_measured_them(case):
    name, arms, model = case
    n_max, fixed, _ = CASES[name]
    checked = 0
    for a in arms:
        if not (a["arm"] == "plain" or (a["arm"].startswith("n") and a["arm"][1:].isdigit())):
            continue
        steps = [s for r in a["rounds"] for s in r]
        # natural acceptance: what the pair accepted, as the chance of each position once the ones before it landed
        # (about 0 for the GPU's random-weight models; a real pair's drafter agrees with its target now and then)
        tried = sum(s["accepted"] + (s["accepted"] < s["drafted"]) for s in steps)
        level = a["setup"]["synthetic_acceptance"] or (sum(s["accepted"] for s in steps) / tried if tried else 0.0)
        measured = sum(s["t_step"] for s in steps) / sum(s["accepted"] + 1 for s in steps)
        sims = [replay.simulate(model, a["arm"], replay.Acceptance.bernoulli(level, seed=50 + r), n_max,
                                seed=50 + r).ms_per_token for r in range(3)]
        assert statistics.median(sims) == pytest.approx(measured, rel=0.2), (a["arm"], level)
        checked += 1
    assert checked >= 6


def test_the_controller_keeps_its_bounds_on_recorded_costs(case):
    name, _arms, model = case
    n_max, fixed, bounds = CASES[name]
    rows = replay.summarize(replay.grid(model, n_max, sorted(bounds), fixed, rounds=3))
    for row in rows:
        assert row["adaptive_x_best"] >= bounds[row["level"]], (name, row)
    # drafting that cannot pay costs (almost) nothing; drafting that pays is taken (where no fixed length beats
    # plain decoding even at the highest acceptance - a CPU's - the bounds above hold the controller to plain's speed)
    assert rows[0]["adaptive_x_plain"] >= bounds[0.0]
    top = rows[-1]["ms_per_token"]
    if min(ms for arm, ms in top.items() if arm.startswith("n")) < 0.9 * top["plain"]:
        assert rows[-1]["adaptive_x_plain"] > 1.5 if "dflash" in name else rows[-1]["adaptive_x_plain"] > 1.1


# generations of 512 tokens (kv_window 1 024, the arms of 256 left out): what a user's long answer pays and a 64-token
# benchmark round never does - a probe rare enough to land where its batch runs anew, sizes re-captured after each
# prompt. Replayed at 512 tokens, 4 prompts a round; bounds by the same rule
LONG_CASES = {
    # (raised by the rule where a change between draft lengths came to be priced over SWITCH_SPREAD steps and a single
    # step's try no longer became the length held: the 27B at p 0.6 from 0.92, the 35B-A3B at p 0.6 / 0.8 / 0.9 from
    # 0.86 / 0.94 / 0.94, the 27B at 4 096 at p 0.6 from 0.93; and where a block drafter's calls after a change of
    # length came to be priced apart and learnt from runs: the 27B at p 0.8 from 0.95, the 35B-A3B at p 0.6 from 0.89,
    # the 27B at 4 096 at p 0.8 from 0.94, the 27B's long4 trace at p 0.8 from 0.96)
    "h200-27b-dflash2-d0-long.json.gz": (7, (3, 5), {0.0: 0.95, 0.6: 0.96, 0.8: 0.96, 0.9: 0.98}),
    "h200-35b-a3b-dflash-d0-long.json.gz": (15, (3, 7), {0.0: 0.94, 0.6: 0.98, 0.8: 0.97, 0.9: 0.95}),
    "h200-27b-dflash2-d4096-long.json.gz": (7, (3, 5), {0.0: 0.95, 0.6: 0.94, 0.8: 0.97, 0.9: 0.99}),
    # the 27B with n3, n5 and n7 at p 0.6 / 0.8 / 0.9, every arm 512 tokens
    "h200-27b-dflash2-d0-long4.json.gz": (7, (3, 5, 7), {0.0: 0.95, 0.6: 0.97, 0.8: 0.97, 0.9: 0.97}),
    # the version that learns a block drafter's call from runs, as measured on the GPU (n5 and n7 at p 0.8 / 0.9)
    "h200-27b-dflash2-d0-long7.json.gz": (7, (5, 7), {0.8: 0.97, 0.9: 0.97}),
    # the grid's other models and depths with the same version, as measured on the GPU (one call each): the 35B-A3B
    # (natural, 0.3, 0.6-0.9), the 27B at 4 096 (natural, 0.8, 0.9) and the 7B pair (natural, 0.3-0.9)
    "h200-35b-a3b-dflash-d0-long8.json.gz": (15, (3, 7), {0.0: 0.98, 0.3: 0.97, 0.6: 1.01, 0.8: 0.97, 0.9: 0.94}),
    "h200-27b-dflash2-d4096-long8.json.gz": (7, (3, 5, 7), {0.0: 0.95, 0.3: 0.94, 0.6: 0.96, 0.8: 0.96, 0.9: 0.96}),
    "h200-7b-draft-d0-long8.json.gz": (8, (2, 4), {0.0: 0.96, 0.3: 0.96, 0.6: 0.98, 0.8: 0.95, 0.9: 0.96}),
    # the same version at the depths the grid had left: the 27B at 16 384 (natural, 0.8; answers of 256 tokens) and at
    # 4 096 (0.3, 0.6), the 7B pair at 16 384 (natural, 0.8). Bounds: the same rule
    "h200-27b-dflash2-d16384-long8.json.gz": (7, (5, 7), {0.0: 0.95, 0.3: 0.95, 0.6: 0.98, 0.8: 0.96, 0.9: 0.96}),
    "h200-27b-dflash2-d4096-long8b.json.gz": (7, (3, 5), {0.0: 0.96, 0.3: 0.96, 0.6: 0.96, 0.8: 0.97, 0.9: 1.01}),
    "h200-7b-draft-d16384-long8.json.gz": (8, (2, 4), {0.0: 0.98, 0.3: 0.97, 0.6: 0.97, 0.8: 0.97, 0.9: 0.95}),
    # the 27B at 4 096, p 0.6, n2 and n3 against the adaptive arm (whose verify of 4 rows and drafter call of a block
    # of 4 it measured in tries of one step, cold, until its last answers), on the H200. Bounds: the same rule
    "h200-27b-dflash2-d4096-own.json.gz": (7, (2, 3), {0.6: 0.96, 0.8: 0.95}),
    # the same cell on an H100 with the version that holds a size's price to its latest runs (the arm drafted 3 on 95%
    # of its steps, where it had left 3 for 4 after five dear steps). Bounds: the same rule
    "h100-27b-dflash2-d4096-median.json.gz": (7, (2, 3), {0.6: 0.96}),
    # the grid's cells again on an H100 with the version that lowers a price set by few runs to a cheaper single try:
    # the 27B at 0 (natural, 0.9) and at 16 384 (natural, 0.8), the 35B-A3B (0.6, 0.9), the 7B pair at 16 384
    # (natural, 0.8). Bounds: the lower of the measured and the replayed figure, less 0.02
    "h100-27b-dflash2-d0-r2.json.gz": (7, (7,), {0.0: 0.96, 0.9: 0.97}),
    "h100-27b-dflash2-d16384-r2.json.gz": (7, (7,), {0.0: 0.95, 0.8: 0.96}),
    "h100-35b-a3b-dflash-d0-r2.json.gz": (15, (3, 7), {0.6: 1.03, 0.9: 0.97}),
    "h100-7b-draft-d16384-r2.json.gz": (8, (2,), {0.0: 0.96, 0.8: 0.96}),
    # the 27B and the 35B-A3B at depth 0 again on an H100 with the argmax in chunks (patch 0013), 128 tokens: the 27B at
    # p 0.6 / 0.8 (n3, n5, n7) and 0.9 (n7), the 35B-A3B in two calls - natural and 0.8, where its session held 7 (0.971
    # of n3 by medians), then 0.6 and 0.8, where it held 5 and 6 (1.008). Bounds: the same rule
    "h100-27b-dflash2-d0-g24mid.json.gz": (7, (3, 5, 7), {0.6: 0.96, 0.8: 0.97}),
    "h100-27b-dflash2-d0-g24p9.json.gz": (7, (7,), {0.9: 0.96}),
    "h100-35b-a3b-dflash-d0-g24.json.gz": (15, (3, 7), {0.0: 0.95, 0.8: 0.95}),
    "h100-35b-a3b-dflash-d0-g24b.json.gz": (15, (3, 7), {0.6: 1.03, 0.8: 0.97}),
    # the same package at the grid's depths and its other models on an H100, 128 tokens: the 27B at 4 096 (natural;
    # 0.6 and 0.8 with n3 and n5) and at 16 384 (natural; 0.8 with n5), the 7B pair at 0 (0.3-0.9) and at 16 384
    # (natural, 0.8), the 35B-A3B with every expert on the CPU (natural). Bounds: the same rule
    "h100-27b-dflash2-d4096-p13nat.json.gz": (7, (), {0.0: 0.95}),
    "h100-27b-dflash2-d4096-p13.json.gz": (7, (3, 5), {0.6: 0.96, 0.8: 0.96}),
    "h100-27b-dflash2-d16384-p13nat.json.gz": (7, (5,), {0.0: 0.96}),
    "h100-27b-dflash2-d16384-p13.json.gz": (7, (5,), {0.8: 0.96}),
    "h100-7b-draft-d0-p13.json.gz": (8, (2, 4), {0.3: 0.96, 0.6: 1.0, 0.8: 0.96, 0.9: 0.96}),
    "h100-7b-draft-d16384-p13.json.gz": (8, (2,), {0.0: 0.97, 0.8: 0.96}),
    "h100-35b-a3b-cpumoe-d0-p13nat.json.gz": (15, (3,), {0.0: 0.95}),
    # the same package's grid at depth 0 on an H100, 128 tokens: the 27B (natural; 0.3-0.9 with n3, n5, n7), the
    # 35B-A3B and the 7B pair (natural, 0.3-0.9). The 35B-A3B at p 0.6 stayed off there (0.90 of n3) after its first
    # four drafts were rejected; probes that go on in runs (PROBE_RUN) draft there, replayed 1.007 (seed 1) and 1.010
    # (mean of 4 seeds). Bounds: the lower of the replayed figures (and of the measured one where this controller's
    # choices made it) less 0.02
    "h100-27b-dflash2-d0-p13gridnat.json.gz": (7, (), {0.0: 0.96}),
    "h100-27b-dflash2-d0-p13grid.json.gz": (7, (3, 5, 7), {0.3: 0.95, 0.6: 0.96, 0.8: 0.96, 0.9: 0.97}),
    "h100-35b-a3b-dflash-d0-p13grid.json.gz": (15, (3, 7), {0.0: 0.95, 0.3: 0.95, 0.6: 0.98, 0.8: 0.97, 0.9: 0.95}),
    "h100-7b-draft-d0-p13grid.json.gz": (8, (2, 4), {0.0: 0.93, 0.3: 0.96, 0.6: 1.0, 0.8: 0.96, 0.9: 0.96}),
    # the same grid with probes in runs, on an H100: the 35B-A3B (natural, 0.3-0.8) stayed off at p 0.6 again (0.91 of
    # n3) - its session's first probe after plain steps was a draft of 15 tokens, whose batch's first runs (117 ms) set
    # the probe schedule - the 27B (0.3-0.9) and the 7B pair (natural, 0.3-0.9). Bounds: the replayed figures with a
    # schedule set by probes of a probe's length, less 0.02
    "h100-35b-a3b-dflash-d0-pr.json.gz": (15, (3, 7), {0.0: 0.95, 0.3: 0.95, 0.6: 1.0, 0.8: 0.94}),
    "h100-27b-dflash2-d0-pr.json.gz": (7, (3, 5, 7), {0.3: 0.95, 0.6: 0.96, 0.8: 0.96, 0.9: 0.97}),
    "h100-7b-draft-d0-pr.json.gz": (8, (2, 4), {0.0: 0.94, 0.3: 0.96, 0.6: 0.98, 0.8: 0.96, 0.9: 0.96}),
    # the version whose probe schedule a long probe no longer sets, on an H100: the 35B-A3B (natural, 0.3-0.9; at p 0.6
    # it drafted 2 on 97% of its steps, 1.057 of n3), the 27B (natural; 0.3-0.9), the 27B at 4 096 (0.3), the 35B-A3B
    # with every expert on the CPU (0.6, 0.8) and the 7B pair (natural, 0.3-0.9). Bounds: the lower of the measured
    # figure and the replayed ones (seed 1, mean of 4 seeds), less 0.02
    "h100-35b-a3b-dflash-d0-q1.json.gz": (15, (3, 7), {0.0: 0.95, 0.3: 0.94, 0.6: 1.02, 0.8: 0.96, 0.9: 0.95}),
    "h100-27b-dflash2-d0-q1nat.json.gz": (7, (), {0.0: 0.96}),
    "h100-27b-dflash2-d0-q1.json.gz": (7, (3, 5, 7), {0.3: 0.95, 0.6: 0.95, 0.8: 0.96, 0.9: 0.97}),
    "h100-27b-dflash2-d4096-q2.json.gz": (7, (3, 7), {0.3: 0.95}),
    "h100-35b-a3b-cpumoe-d0-q2.json.gz": (15, (3,), {0.6: 0.96, 0.8: 1.03}),
    "h100-7b-draft-d0-q2.json.gz": (8, (2, 4), {0.0: 0.93, 0.3: 0.94, 0.6: 0.99, 0.8: 0.97, 0.9: 0.96}),
    # the same version, the 27B at 4 096 on an H100: natural (0.975x plain) and 0.6 (n3, n5, n7; 0.977 of n3).
    # Bounds: the same rule
    "h100-27b-dflash2-d4096-q3nat.json.gz": (7, (), {0.0: 0.95}),
    "h100-27b-dflash2-d4096-q3.json.gz": (7, (3, 5), {0.6: 0.95}),
    # the same controller with the drafter's features kept on the target's device (patches 0014, 0015), on an H100:
    # the 35B-A3B (natural, 0.3, 0.6, 0.8 with n3; 0.8, 0.9 with n3 and n7) and the 27B (natural; 0.6-0.9 with n3 and
    # n7). Bounds: the same rule
    "h100-35b-a3b-dflash-d0-ringq.json.gz": (15, (3,), {0.3: 0.95, 0.6: 1.02}),
    "h100-35b-a3b-dflash-d0-ringq2.json.gz": (15, (3, 7), {0.8: 0.93, 0.9: 0.95}),
    "h100-35b-a3b-dflash-d0-ringq3.json.gz": (15, (3,), {0.0: 0.94, 0.8: 0.98}),
    "h100-27b-dflash2-d0-ringq2.json.gz": (7, (3, 7), {0.6: 0.96, 0.8: 1.0, 0.9: 0.96}),
    "h100-27b-dflash2-d0-ringq3.json.gz": (7, (), {0.0: 0.95}),
    # probes at half the budget after four in a row found drafting hopeless, on an H100: the 27B and the 35B-A3B at
    # natural acceptance (0.990 of plain each), the 27B at 0.8 and 0.9 (n3, n7), the 35B-A3B at 0.6 and 0.8 (n3).
    # Bounds: the same rule
    "h100-27b-dflash2-d0-sparseC.json.gz": (7, (), {0.0: 0.97}),
    "h100-35b-a3b-dflash-d0-sparseC.json.gz": (15, (), {0.0: 0.96}),
    "h100-27b-dflash2-d0-sparseD.json.gz": (7, (3, 7), {0.8: 0.99, 0.9: 0.96}),
    "h100-35b-a3b-dflash-d0-sparseD.json.gz": (15, (3,), {0.6: 1.03, 0.8: 0.98}),
    # the grid on an H200 with the same version (128 tokens, 8 rounds): the 27B at 0 (natural, 0.3, 0.6; n3, n5, n7)
    # and at 4 096 (0.8; n3, n5, n7), the 35B-A3B (natural to 0.9; n3, n7), the 7B pair at 0 (natural to 0.9; n2,
    # n4) and at 16 384 (natural, 0.8; n2). Bounds: the same rule
    "h200-27b-dflash2-d0-h2.json.gz": (7, (3, 5, 7), {0.0: 0.97, 0.3: 0.95, 0.6: 0.97, 0.8: 0.94, 0.9: 0.97}),
    "h200-27b-dflash2-d4096-h2b.json.gz": (7, (3, 5, 7), {0.0: 0.96, 0.3: 0.96, 0.6: 0.96, 0.8: 0.94, 0.9: 0.97}),
    "h200-35b-a3b-dflash-d0-h2.json.gz": (15, (3, 7), {0.0: 0.97, 0.3: 0.95, 0.6: 1.02, 0.8: 0.97, 0.9: 0.95}),
    "h200-7b-draft-d0-h2.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.96, 0.6: 0.97, 0.8: 0.95, 0.9: 0.96}),
    "h200-7b-draft-d16384-h2.json.gz": (8, (2,), {0.0: 0.96, 0.3: 0.98, 0.6: 0.97, 0.8: 0.96, 0.9: 0.96}),
    # the version that no longer tries a length past a cost cliff measured in runs, on an H100 (128 tokens, 8 rounds):
    # the 35B-A3B (0.6-0.9; n3, n7), the 27B at 4 096 (0.6-0.9; n3, n5, n7) and at 16 384 (natural; 0.8 with n5).
    # Bounds: the same rule
    "h100-35b-a3b-dflash-d0-h3.json.gz": (15, (3, 7), {0.6: 1.01, 0.8: 0.97, 0.9: 0.97}),
    "h100-27b-dflash2-d4096-h3.json.gz": (7, (3, 5, 7), {0.6: 0.96, 0.8: 0.94, 0.9: 0.96}),
    "h100-27b-dflash2-d16384-h3.json.gz": (7, (), {0.0: 0.96}),
    "h100-27b-dflash2-d16384-h3b.json.gz": (7, (5,), {0.8: 0.96}),
    # the version whose probes' runs count in their cost, on an H200 (128 tokens, 8 rounds): the 27B at 0 (natural, 0.3
    # with plain; 0.6-0.9 with n3, n5, n7) and at 4 096 (natural, 0.3), the 35B-A3B (natural, 0.3; 0.6-0.9 with plain,
    # n3, n7), the 7B pair (natural to 0.9; n2, n4). Bounds: the same rule
    "h200-27b-dflash2-d0-h4.json.gz": (7, (), {0.0: 0.96, 0.3: 0.96}),
    "h200-27b-dflash2-d0-h4b.json.gz": (7, (3, 5, 7), {0.6: 0.96, 0.8: 0.96, 0.9: 0.95}),
    "h200-27b-dflash2-d4096-h4.json.gz": (7, (), {0.0: 0.96, 0.3: 0.94}),
    "h200-35b-a3b-dflash-d0-h4.json.gz": (15, (), {0.0: 0.96, 0.3: 0.96}),
    "h200-35b-a3b-dflash-d0-h4b.json.gz": (15, (3, 7), {0.6: 1.02, 0.8: 0.96, 0.9: 0.95}),
    "h200-7b-draft-d0-h4.json.gz": (8, (2, 4), {0.0: 0.97, 0.3: 0.96, 0.6: 0.96, 0.8: 0.94, 0.9: 0.95}),
}


@pytest.mark.parametrize("name", sorted(LONG_CASES))
def test_the_controller_keeps_its_bounds_over_long_generations(name):
    n_max, fixed, bounds = LONG_CASES[name]
    arms = [a for a in trace.load(TRACES / name) if not a["arm"].endswith("-kv256")]
    model = replay.CostModel.from_arms(arms, depth=arms[0]["setup"]["depth"])
    assert model.kv_window == 1024
    rows = replay.summarize(replay.grid(model, n_max, sorted(bounds), fixed, n_predict=512, generations=4, rounds=3))
    for row in rows:
        assert row["adaptive_x_best"] >= bounds[row["level"]], (name, row)


def test_a_feature_reading_drafters_probe_after_plain_steps_does_not_price_its_drafting():
    # a DFlash drafter takes in the features of every token decoded since it last ran: a probe after 60 plain steps
    # cost 19 ms of drafter on the H200 where a step of a paying run costs 4.7. Priced by its probes, drafting looked
    # too dear to turn back on: after a run of bad luck at acceptance 0.6 the 27B stayed off for whole generations
    # (0.83-0.89x the best fixed length on the GPU). Sessions as the benchmark runs them: a warm-up, then 8 prompts
    name = "h200-27b-dflash2-d0-sweep-n128.json.gz"
    arms = trace.load(TRACES / name)
    model = replay.CostModel.from_arms(arms, depth=0)
    assert model.call_behind and max(n for n, _ in model.call_behind) > 32  # the trace holds such probes
    rng = random.Random(1)
    after_plain = statistics.median(model.drafter_ms(7, 3, 60, rng)[3] for _ in range(20))
    in_a_run = statistics.median(model.drafter_ms(7, 3, 2, rng)[3] for _ in range(20))
    assert after_plain > in_a_run + 5.0  # and the replay prices them so
    from pyllamaspec.controller import Controller

    for seed in range(1, 9):
        ctl = Controller(7, 1, kind=model.kind, adaptive=True, seed=seed)
        off = steps = 0
        for r in range(9):
            res = replay.simulate(model, "adaptive", replay.Acceptance.bernoulli(0.6, seed=seed * 1000 + r), 7,
                                  n_predict=128, generations=1, seed=seed * 100 + r, controller=ctl)
            if r:
                off, steps = off + res.k_hist.get(0, 0), steps + res.steps
        assert off <= 0.35 * steps, (seed, off / steps)


def test_a_run_of_rejections_at_a_paying_acceptance_does_not_leave_a_session_off():
    # the 35B-A3B + DFlash on an H100 at p 0.6 (n3 1.10x plain): a session that starts from an earlier one's costs
    # (a cost cache) drafts at once, and where its first drafts were rejected it went off. Probed one token at a time,
    # a probe every few hundred steps (each pays its batch's first runs and the drafter's catch-up: 3-5 plain steps),
    # a few more rejections kept it off for whole sessions - on the GPU, 0.90 of n3; replayed, 3 of these 24 sessions.
    # A probe that goes on for a few steps while drafting is not hopeless learns more for little more
    from pyllamaspec.controller import Controller

    arms = trace.load(TRACES / "h100-35b-a3b-dflash-d0-p13grid.json.gz")
    model = replay.CostModel.from_arms(arms, depth=0)
    earlier = Controller(15, 1, kind=model.kind, adaptive=True, seed=99, kv_window=model.kv_window)
    for r in range(2):
        replay.simulate(model, "adaptive", replay.Acceptance.bernoulli(0.3, seed=77 + r), 15, n_predict=128,
                        generations=8, seed=5 + r, controller=earlier)
    costs = earlier.learnt_costs()
    left_off = []
    for seed in range(1, 25):
        ctl = Controller(15, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
        ctl.seed_costs(costs)
        graphs: dict = {}
        off = []
        for r in range(9):  # a warm-up answer, then 8 (as the benchmark runs a cell)
            res = replay.simulate(model, "adaptive", replay.Acceptance.bernoulli(0.6, seed=seed * 1000 + r), 15,
                                  n_predict=128, generations=1, seed=seed + r, controller=ctl, graphs=graphs)
            if r:
                off.append(res.k_hist.get(0, 0) / res.steps)
        if statistics.mean(off) > 0.5:
            left_off.append((seed, [round(x, 2) for x in off]))
    assert not left_off


def test_a_block_drafters_calls_after_a_change_of_length_price_neither_its_runs_nor_the_length_held():
    # the 27B + DFlash2 on an H200 at p 0.8, answers of 512 tokens (n5 best, 10% faster a token than n7 in this trace):
    # a DFlash call right after a change of draft length runs its graph cold, about 1 ms dearer than one in a run. The
    # controller counted those calls into its call table - and calls of 1-4 tokens, drafted only after plain steps,
    # pooled with the steady ones - so drafts of 6 and 7 priced as cheap as 5, and whichever length a prompt's first
    # steps took was held for the answer: the GPU drafted 6 or 7 for whole rounds (0.956 of n5). The replay prices
    # such calls apart, and the controller learns a block drafter's call from runs of one length
    arms = trace.load(TRACES / "h200-27b-dflash2-d0-long6.json.gz")
    model = replay.CostModel.from_arms(arms, depth=0)
    rng = random.Random(1)
    cold = statistics.median(model.drafter_ms(7, 7, 4, rng, steady=False)[3] for _ in range(40))
    in_a_run = statistics.median(model.drafter_ms(7, 7, 4, rng)[3] for _ in range(40))
    assert cold > in_a_run + 0.5, (cold, in_a_run)
    from pyllamaspec.controller import Controller

    for seed in (1, 2):  # sessions as the benchmark runs them: a warm-up round, then 3 rounds of 4 prompts
        ctl = Controller(7, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
        graphs: dict = {"plain": {}, "n5": {}, "n7": {}, "adaptive": {}}
        ms: dict = {a: [] for a in graphs}
        hist: dict = {}
        for r in range(4):
            acc = replay.Acceptance.bernoulli(0.8, seed=seed * 1000 + r)
            for a in graphs:
                res = replay.simulate(model, a, acc, 7, n_predict=512, generations=4, seed=seed + r, graphs=graphs[a],
                                      controller=ctl if a == "adaptive" else None)
                if r:
                    ms[a].append(res.ms_per_token)
                    for k, n in (res.k_hist.items() if a == "adaptive" else ()):
                        hist[k] = hist.get(k, 0) + n
        long = (hist.get(6, 0) + hist.get(7, 0)) / sum(hist.values())
        best = min(statistics.median(ms[a]) for a in ("plain", "n5", "n7"))
        assert long <= 0.05, (seed, sorted(hist.items()))
        assert best / statistics.median(ms["adaptive"]) >= 0.975, (seed, best / statistics.median(ms["adaptive"]))


def test_a_length_that_leads_the_one_held_step_after_step_is_taken_within_the_answer():
    # the 27B + DFlash2 at 16 384 (its H200 trace): a session that drafted at p 0.6 (3 best) meets text at p 0.8 (5 best,
    # 5-9% faster a token than 3 once the hazards have caught up). A change between lengths is priced over a few steps
    # at its full cold cost (13.6 ms learnt here), a lead no neighbouring length has, so the length the answer started
    # with was held for the whole answer: 77-96% of its steps at 3 or less, 0.87-0.90 of n5. What the leading length
    # would have saved now builds up until it pays the change
    from pyllamaspec.controller import Controller

    model = replay.CostModel.from_arms(trace.load(TRACES / "h200-27b-dflash2-d16384-long8.json.gz"), depth=16384)
    short, vs_n5 = [], []
    for seed in range(1, 7):
        ctl = Controller(7, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
        graphs: dict = {}
        replay.simulate(model, "adaptive", replay.Acceptance.bernoulli(0.6, seed=seed * 1000 + 77), 7, n_predict=512,
                        generations=2, seed=seed, controller=ctl, graphs=graphs)
        acc = replay.Acceptance.bernoulli(0.8, seed=seed * 1000)
        res = replay.simulate(model, "adaptive", acc, 7, n_predict=512, generations=1, seed=seed, controller=ctl,
                              graphs=graphs)
        n5 = replay.simulate(model, "n5", acc, 7, n_predict=512, generations=1, seed=seed)
        short.append(sum(n for k, n in res.k_hist.items() if 0 < k <= 3) / sum(res.k_hist.values()))
        vs_n5.append(n5.ms_per_token / res.ms_per_token)
    # (0.46 and 0.895 now; 0.53 and 0.897 before the return from a refresh of the plain cost was no longer charged the
    # change from plain decoding)
    assert statistics.mean(short) <= 0.65, short  # (0.88 held by the margin alone)
    assert statistics.mean(vs_n5) >= 0.89, vs_n5  # (0.88 held by the margin alone)


def test_an_answers_last_tokens_do_not_measure_the_sizes_their_shrinking_cap_makes_best():
    # the 35B-A3B with every expert on the CPU (its H200 traces): a batch of 16 tokens costs ten plain steps, and the
    # best case (every token lands) pays at the ceiling, so the ceiling's size is measured - twice, once. Near an
    # answer's end the cap shrinks (14, 13, ... tokens left) and each size it made best was measured in turn, 5-9
    # probes of 11-15 tokens in 8 answers at zero acceptance; sizes below one measured twice are interpolated instead
    from pyllamaspec.controller import Controller

    arms = [a for f in ("h200-35b-a3b-cpumoe-d0-long8.json.gz", "h200-35b-a3b-cpumoe-d0-v9.json.gz")
            for a in trace.load(TRACES / f)]
    model = replay.CostModel.from_arms(arms, depth=0)
    for seed in (1, 2, 3):
        ctl = Controller(15, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
        long_probes = {}
        for rnd in range(3):
            res = replay.simulate(model, "adaptive", replay.Acceptance.bernoulli(0.0, seed=seed), 15, n_predict=256,
                                  generations=8, seed=seed, controller=ctl)
            long_probes[rnd] = sum(n for k, n in res.k_hist.items() if k > 1)
        assert long_probes[0] <= 2, (seed, long_probes)  # the ceiling measured twice (5-9 such probes before)
        assert long_probes[1] == long_probes[2] == 0, (seed, long_probes)


def test_probes_that_miss_do_not_price_drafting_by_their_cold_runs():
    # the 35B-A3B + DFlash (its H200 trace, ceiling 15) at p 0.8, where n3 runs 1.55x plain. A probe's batch after plain
    # steps is often its size's first or second run after a prompt (a GPU's graph built, run eagerly, captured): a batch
    # of 2 right after one of 16 cost 26 ms, a warm one 5. Taken as the size's cost once the first probes missed, it
    # priced every draft length above plain decoding, and the stream never drafted again (3 seeds of 8 at 1.05x plain);
    # such runs now only bound what a size measured in no warm run is believed to cost
    model = replay.CostModel.from_arms(trace.load(TRACES / "h200-35b-a3b-dflash-d0-n128-switch24.json.gz"), depth=0)
    for seed in range(1, 9):
        row = replay.summarize(replay.grid(model, 15, [0.8], (3,), rounds=3, seed=seed))[0]
        assert row["adaptive_x_plain"] >= 1.4, (seed, row)  # (1.53-1.62 now; 1.05 where it stopped drafting)


def cells_in_turn(model: replay.CostModel, levels, seed: int, n_predict: int = 128, answers: int = 9, n_max: int = 8,
                  ref: str = "n2") -> float:
    """A benchmark's cells one after another, as `benchmarks/step_cost.py` runs them: a session per acceptance level
    (answers of n_predict tokens, the first a warm-up), each seeded by the costs the last one learnt (its cost
    cache). Returns the last level's adaptive speed (ceiling n_max) as a share of the fixed arm ref's, over its
    answers after the first."""
    costs: list = []
    for level in levels:
        ctl = Controller(n_max, 1, kind=model.kind, adaptive=True, seed=seed, kv_window=model.kv_window)
        ctl.seed_costs(costs)
        graphs: dict = {}
        ms = {"adaptive": 0.0, ref: 0.0}
        for r in range(answers):
            acc = replay.Acceptance.bernoulli(level, seed=seed * 1000 + r)
            res = replay.simulate(model, "adaptive", acc, n_max, n_predict=n_predict, generations=1, seed=seed + r,
                                  controller=ctl, graphs=graphs)
            if r and level == levels[-1]:
                ms["adaptive"] += res.ms_per_token
                ms[ref] += replay.simulate(model, ref, acc, n_max, n_predict=n_predict, generations=1,
                                           seed=seed + r).ms_per_token
        costs = ctl.learnt_costs()
    return ms[ref] / ms["adaptive"]


def test_a_moe_whose_batches_of_9_cost_far_more_than_8_drafts_under_that_cliff():
    # the 35B-A3B + DFlash on an H100, ceiling 15, the cells run in turn (p 0.6, then p 0.9 seeded by its costs): at
    # p 0.9 the adaptive arm drafted 15 on 90% of its steps, 0.73 of n7. A batch of 9 tokens costs 14.6 ms there
    # against 8.7 for 8 (its warm-up round ran 9 three times in a row; the replay prices sizes only a warm-up ran
    # steadily by those runs). Priced on the line over that cliff, sizes 3-8 were never tried; priced at most along
    # the slope below it, a size under the cliff is tried and kept. Over 12 seeds the last version 0.879-1.033 of n7
    # (mean 0.973), this one 0.941-1.015 (mean 0.989)
    model = replay.CostModel.from_arms(trace.load(TRACES / "h100-35b-a3b-dflash-d0-fr.json.gz"), depth=0)
    rng = random.Random(0)
    assert model.target_ms(9, 2, rng) > 1.5 * model.target_ms(8, 2, rng)  # the cliff, as recorded
    ratios = [cells_in_turn(model, (0.6, 0.9), seed, n_predict=256, answers=7, n_max=15, ref="n7")
              for seed in range(1, 13)]
    assert min(ratios) >= 0.92 and statistics.mean(ratios) >= 0.98, ratios


def test_a_draft_models_first_runs_of_a_batch_size_do_not_price_drafting_out():
    # the 7B pair on an H100 (its trace keeps each arm's warm-up round): the 0.5B drafter decodes 1-2 rows in 3-5 ms on
    # a batch size's first two runs in a session (graph built, run eagerly, captured) and in 1.2-1.5 ms after. A probe's
    # decodes are first runs, most of them; taken for the sizes' costs they priced every draft length above plain
    # decoding, and at p 0.8 - where n2 runs 1.15x plain - the adaptive arm stayed plain for whole cells (0.87x n2 as
    # measured; replayed, 2 seeds of 40 at 0.84-0.87). The replay prices those first runs as the trace shows them
    model = replay.CostModel.from_arms(trace.load(TRACES / "h100-7b-draft-d0-n128-grid.json.gz"), depth=0)
    assert statistics.median(model.draft_cold[0]) > 1.5 and statistics.median(model.draft_cold[1]) > 1.5
    # (a trace without its warm-up round shows no first runs: its drafter is priced as before)
    assert not replay.CostModel.from_arms(trace.load(TRACES / "h200-7b-draft-d0-n128-bs.json.gz"), depth=0).draft_cold
    worst = min((cells_in_turn(model, (0.0, 0.3, 0.6, 0.8), seed), seed) for seed in range(1, 41))
    assert worst[0] >= 0.95, worst  # (0.979 now)
    # (a controller seeded with costs holds them: a draft model's first decode of 2 rows at depth 0, 1.5 ms)
    ctl = Controller(8, 1, kind="model", adaptive=True)
    ctl.seed_costs([(1, 0, 2, 4, 1.5)])
    assert [(t, b, n, ms) for t, b, n, _, ms in ctl.learnt_costs()] == [(1, 0, 2, 1.5)]
    with pytest.raises(ConfigError, match="cost point 0"):
        ctl.seed_costs([(1, 0, 2)])


def test_a_ceilings_one_dear_run_does_not_rule_drafting_out_for_good():
    # the 7B pair on an H100: a probe at the ceiling (9 tokens) after plain steps is that size's first run - 23.8 ms
    # against 7.6 in runs. Taken as what the ceiling costs, no length could beat plain decoding even were every token to
    # land, and the stream never drafted again: at p 0.9, where n2 runs 1.3x plain, seeds 3 and 6 of this bench-shaped
    # replay (one 128-token answer a round, 8 rounds) stayed plain throughout (0.78 and 0.77 of n2). A single run far
    # above the line through plain decoding's and the probe's costs is measured again before that verdict
    for seed, row in bench_shaped_7b(("h100-7b-draft-d0-h3c.json.gz", "h100-7b-draft-d0-h3.json.gz"), 0.9, (3, 6)):
        assert row["adaptive_x_best"] >= 0.95, (seed, row)  # (0.98 and 1.00 now)


def bench_shaped_7b(names: tuple[str, ...], level: float, seeds: tuple[int, ...]):
    """The H100 7B pair's traces replayed as the bench runs it (one 128-token answer a round, 8 rounds): (seed, row)."""
    arms = [a for n in names for a in trace.load(TRACES / n)]
    model = replay.CostModel.from_arms(arms, depth=0)
    for seed in seeds:
        result = replay.grid(model, 8, [level], (2, 4), n_predict=128, generations=1, rounds=8, seed=seed)
        yield seed, replay.summarize(result)[0]


def test_a_probes_verdict_and_the_next_choice_price_the_draft_models_catch_up_alike():
    # the 7B pair on an H100 at p 0.8, where drafting 2 runs 1.2x plain: a probe of 1 turned the stream on, pricing the
    # next step with nothing for the draft model to catch up, and the next choice turned it off, pricing the token it
    # catches up after a draft that landed whole by the catch-ups after plain steps (each a batch size's first run:
    # 1.9 ms a row, where a 2-row decode in a run costs what a 1-row one does). Seed 4 of this bench-shaped replay
    # stayed plain in every round (0.83 of n2; 0.95 seed 3)
    for seed, row in bench_shaped_7b(("h100-7b-draft-d0-h5.json.gz", "h100-7b-draft-d0-h3c.json.gz"), 0.8, (3, 4)):
        assert row["adaptive_x_best"] >= 0.97, (seed, row)  # (0.99 and 1.00 now)


def model_27b() -> replay.CostModel:
    return replay.CostModel.from_arms(trace.load(TRACES / "h200-27b-dflash2-d0-window.json.gz"), depth=0)


def test_a_sizes_first_runs_in_a_kv_window_and_graph_slot_are_priced_apart():
    graphs: dict = {}
    assert [replay._run_in_window(graphs, 6, d) for d in (40, 46, 52, 58)] == [0, 1, 2, 2]
    assert replay._run_in_window(graphs, 6, 300) == 0  # a window of 256 cells further: its graph built again
    assert replay._run_in_window(graphs, 6, 306) == 1
    replay._run_in_window(graphs, 14, 312)  # 14 and 6 share a graph slot: 6's graph is built over
    assert replay._run_in_window(graphs, 6, 330) == 0
    # a session whose KV view grows in steps of 1 024 cells (kv_window) builds the graph again 1 024 cells on
    wide: dict = {}
    assert [replay._run_in_window(wide, 6, d, 1024) for d in (40, 300, 700, 1030, 1040)] == [0, 1, 2, 0, 1]
    # and a plain step in a new window pays what a batch of one's first runs there cost (a trace's plain arm never
    # leaves its first window)
    rng, model = random.Random(1), model_27b()
    first = statistics.mean(model.plain_ms(False, rng, 0) for _ in range(50))
    steady = statistics.mean(model.plain_ms(False, rng, 2) for _ in range(50))
    assert first > steady + 5.0, (first, steady)
    # on the H200 a size's first two runs cost tens of ms more than its steady runs, and the replay prices them so
    first = [statistics.median(v) - model._steady_median(n) for (n, b), v in model.target.items() if b == 3]
    warm = [statistics.median(v) - model._steady_median(n) for (n, b), v in model.target.items() if b == 0]
    assert statistics.median(first) > 8.0 > 1.0 > statistics.median(warm)


def test_a_sizes_price_set_by_its_first_runs_in_a_window_comes_down_to_its_single_tries():
    # the 27B + DFlash2 on an H100 at depth 0, p 0.6: the adaptive session's first drafts were three of 3 in a row, the
    # process's first runs of a 4-row verify and a block of 4 (65 and 25 ms; 6.5, 7.0 and 4.7 ms), before any size's
    # first runs in a KV window were known to be dear. The second and third were taken for steady runs, so the block of
    # 4 was priced at 4.7 ms and kept there by every later single try (3.9 ms) - a single try is not a steady run - and
    # drafting 3 looked 3-4% dearer than it was: the stream drafted 2 through whole answers (0.976 of n3). A one-off run
    # costs at least what a steady one does, so one cheaper than a price set by few runs brings the price down.
    # The recorded steps are fed to a controller as they ran (it is asked to choose at each, and not followed)
    from pyllamaspec.controller import Observation

    arms = trace.load(TRACES / "h100-27b-dflash2-d0-high.json.gz")
    adaptive = next(a for a in arms if a["arm"] == "adaptive7" and a["setup"]["synthetic_acceptance"] == 0.6)
    n3 = next(a for a in arms if a["arm"] == "n3" and a["setup"]["synthetic_acceptance"] == 0.6)
    in_runs = statistics.median(s["t_draft_call"] for r in n3["rounds"] for s in r if s["k"] == 3)
    ctl = Controller(7, 1, kind="block", adaptive=True, seed=1, kv_window=adaptive["setup"]["kv_window"])

    def block_of_4() -> float:
        return next(p[4] for p in ctl.learnt_costs() if p[0] == 3 and p[2] == 4)

    for r, steps in enumerate([adaptive["warmup"]] + adaptive["rounds"][:1]):
        ctl.reset_stream(0)
        for s in steps:
            ctl.choose([7], [s["depth"]], [1], [0])
            ctl.observe(Observation(k=[s["k"]], drafted=[s["drafted"]], accepted=[s["accepted"]], depth=[s["depth"]],
                                    active=[1], catchup=[s["catchup"]], t_draft_first=s["t_draft_first"],
                                    t_draft_rest=s["t_draft_rest"], draft_iters=s["draft_iters"],
                                    t_draft_call=s["t_draft_call"], t_target=s["t_target"], t_step=s["t_step"]))
        if r == 0:
            singles = [steps[i]["t_draft_call"] for i in range(6, len(steps) - 1)
                       if steps[i]["k"] == 3 and steps[i - 1]["k"] != 3 and steps[i + 1]["k"] != 3]
            assert singles and max(singles) < 4.7  # the single tries the recorded warm-up holds
    assert block_of_4() <= 1.08 * in_runs, (block_of_4(), in_runs)


def test_a_generations_first_step_is_priced_by_its_batch_size():
    # on the H200 the 7B's first step after a prompt costs 10.6 ms as a batch of one (its CUDA graph captured there)
    # and 4.7-5.9 ms as a first verify of 3 or 5 tokens (run without a graph): one pool for both made an adaptive
    # arm that starts plain 2% faster than plain decoding at zero acceptance
    model = replay.CostModel.from_arms(trace.load(TRACES / "h200-7b-draft-d0-n128-bs.json.gz"), depth=0)
    rng = random.Random(1)
    one = statistics.median(model.first_ms(1, rng) for _ in range(40))
    three = statistics.median(model.first_ms(3, rng) for _ in range(40))
    assert one > three + 4.0, (one, three)
    # a size no trace began with: its steady cost and what first steps cost over steady at the sizes measured
    assert 8 not in model.first
    assert model._steady_median(8) < model.first_ms(8, rng) < model._steady_median(8) + one


def test_acceptance_is_a_property_of_the_position_the_same_for_every_arm():
    a = replay.Acceptance.bernoulli(0.6, seed=3)
    # a draft of 5 from position 10 lands as far as drafts of 1 from each position would
    singles = [a.accepted(10 + i, 1) for i in range(5)]
    first_miss = singles.index(0) if 0 in singles else 5
    assert a.accepted(10, 5) == first_miss
    switch = replay.Acceptance.switch(0.0, 1.0, at=100, seed=1)
    assert switch.accepted(50, 8) == 0 and switch.accepted(100, 8) == 8


def test_the_controller_refuses_per_stream_lists_of_another_length():
    # the native side reads one value per stream: a shorter list would be read past its end
    from pyllamaspec.controller import Controller
    from pyllamaspec.errors import ConfigError

    c = Controller(4, n_streams=2, kind="block")
    assert len(c.choose([4, 4], [10, 10])) == 2
    with pytest.raises(ConfigError, match="1 values given for a controller of 2 streams"):
        c.choose([4], [10, 10])
    with pytest.raises(ConfigError, match="n_streams=0"):
        Controller(4, n_streams=0)


def test_the_replay_command_takes_a_seed_and_refuses_what_it_cannot_use(capsys, tmp_path):
    import json

    name = "h200-7b-draft-d0.json"
    args = [str(TRACES / name), "--levels", "0.8", "--rounds", "1", "--generations", "2", "--json"]
    model = replay.CostModel.from_arms(trace.load(TRACES / name), depth=0)
    for seed in (1, 3):
        assert replay.main(args + ["--seed", str(seed)]) == 0
        rows = json.loads(capsys.readouterr().out)
        want = replay.summarize(replay.grid(model, 8, [0.8], [2, 4, 8], generations=2, rounds=1, seed=seed))
        assert rows[0]["ms_per_token"] == pytest.approx(want[0]["ms_per_token"])
    not_a_trace = tmp_path / "notes.json"
    not_a_trace.write_text("[1, 2]")
    for bad, says in ((["--seed", "-1"], "--seed -1: give a seed from 0"), (["--rounds", "0"], "--rounds 0: give 1 or more"),
                      (["--levels", "0,1.5"], "lie within 0..1"), (["--levels", "x"], "--levels takes acceptance levels"),
                      (["--fixed", "0"], "draft lengths are 1 or more"), (["--n-max", "99"], "n_max=99 must be within"),
                      (["--depth", "5"], "no steps at that depth")):
        with pytest.raises(SystemExit) as e:
            replay.main([str(TRACES / name)] + bad)
        assert e.value.code == 2 and says in capsys.readouterr().err, bad
    # a trace of arms that never drafted (plain, zero7: a session that never drafts) has no cost of drafting: refused,
    # not replayed as if drafting were free
    never = TRACES / "h100-27b-dflash2-d0-ring.json.gz"
    assert not any(s["drafted"] for a in trace.load(never) for r in a["rounds"] for s in r)
    for path, says in ((tmp_path / "none.json", "cannot read a trace"), (not_a_trace, "not a trace of"),
                       (never, "holds no step that drafted")):
        with pytest.raises(SystemExit):
            replay.main([str(path)])
        assert says in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no step that drafted"):
        replay.CostModel.from_arms(trace.load(never), depth=0)
