"""benchmarks/loss_split.py: an adaptive arm's time beyond plain decoding, split into its plain steps and its drafting
steps, read off a step_cost trace."""

from __future__ import annotations

import pytest

from helpers import benchmark_script


@pytest.fixture(scope="module")
def loss_split():
    return benchmark_script("loss_split")


def step(t, k=0, drafted=0, accepted=0):
    return {"t_step": t, "k": k, "drafted": drafted, "accepted": accepted}


def arm(name, level, rounds, depth=0):
    return {"arm": name, "setup": {"depth": depth, "synthetic_acceptance": level}, "rounds": rounds}


def test_the_excess_splits_into_plain_steps_and_drafting(loss_split):
    plain = arm("plain", None, [[step(1.0)] * 10, [step(1.0)] * 10])
    # 8 plain steps 0.1 ms dearer than plain's, and a draft of 2 that landed 1 (2 tokens) in 2.5 ms: 0.5 beyond plain
    rnd = [step(1.1)] * 8 + [step(2.5, k=2, drafted=2, accepted=1)]
    rows = loss_split.split([plain, arm("adaptive", None, [rnd, rnd])])
    [row] = rows
    assert row["plain_step_ms"] == pytest.approx(1.0) and row["adaptive_plain_step_ms"] == pytest.approx(1.1)
    assert row["plain_steps"] == pytest.approx(0.07)  # the generation's first step aside
    assert row["drafting"] == pytest.approx(0.05)
    assert row["total"] == pytest.approx(0.13)


def test_drafting_splits_into_first_steps_their_runs_and_drafting_held(loss_split):
    plain = arm("plain", None, [[step(1.0)] * 20])
    probe = step(3.0, k=1, drafted=1)          # 2.0 beyond plain decoding of its one token
    warm = step(1.5, k=1, drafted=1, accepted=1)  # 0.5 less than plain decoding of its two
    # a probe and its run of 6 steps in all, then plain steps, then a stretch of 8 drafting steps
    rnd = [step(1.0)] + [probe] + [warm] * 5 + [step(1.0)] * 3 + [probe] + [warm] * 7
    [row] = loss_split.split([plain, arm("adaptive", None, [rnd])])
    assert row["first"] == pytest.approx(2 * 2.0 / 20)
    assert row["run"] == pytest.approx(-10 * 0.5 / 20)  # the 2nd to 6th of each row
    assert row["held"] == pytest.approx(-2 * 0.5 / 20)  # the 7th and 8th of the second
    assert row["drafting"] == pytest.approx(row["first"] + row["run"] + row["held"])


def test_each_round_is_set_against_plain_decodings_round_beside_it(loss_split):
    # the machine moved between rounds: plain's steps 1.0 ms in one, 2.0 in the other; the adaptive arm's plain steps
    # 10% dearer than plain's in each. Pooled (plain 1.5 ms) one round would seem 27% cheaper, the other 47% dearer
    plain = arm("plain", None, [[step(1.0)] * 10, [step(2.0)] * 10])
    adaptive = arm("adaptive", None, [[step(1.0)] + [step(1.1)] * 9, [step(2.0)] + [step(2.2)] * 9])
    [row] = loss_split.split([plain, adaptive])
    assert row["paired"]
    assert row["plain_steps"] == pytest.approx(0.09)  # 9 steps 10% dearer, in a round of 10 plain steps
    assert row["total"] == pytest.approx(0.09)
    assert row["plain_step_beyond_ms"] == pytest.approx(0.15)  # 0.1 and 0.2 ms beyond the round beside each
    # rounds that do not line up (a plain arm of fewer rounds) are set against plain pooled, and say so
    [row] = loss_split.split([arm("plain", None, [[step(1.0)] * 10]), adaptive])
    assert not row["paired"] and row["plain_step_ms"] == pytest.approx(1.0)


def test_a_cell_without_plain_takes_plain_of_its_depth_and_drafting_that_pays_is_negative(loss_split):
    plain = arm("plain", None, [[step(1.0)] * 10], depth=4096)
    paying = arm("adaptive7", 0.8, [[step(1.0)] + [step(1.5, k=3, drafted=3, accepted=3)] * 3], depth=4096)
    other_depth = arm("adaptive7", 0.8, [[step(1.0)] * 4], depth=0)  # no plain arm at depth 0: no row
    [row] = loss_split.split([plain, paying, other_depth])
    assert (row["depth"], row["level"]) == (4096, 0.8)
    assert row["drafting"] == pytest.approx(3 * (1.5 - 4.0) / 10.0)
    assert row["plain_steps"] == 0.0 and not row["paired"]  # plain of another cell: another run, pooled


def test_the_command_reads_a_trace_file(loss_split, tmp_path, capsys):
    from pyllamaspec.bench import trace

    path = tmp_path / "t.json.gz"
    arms = [arm("plain", None, [[step(1.0)] * 4]), arm("adaptive", None, [[step(1.0)] * 3 + [step(1.2)]])]
    trace.save(path, [{**a, "rounds": [[[s.get(f, 0) for f in trace.FIELDS] for s in r] for r in a["rounds"]]}
                      for a in arms])
    assert loss_split.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "d0 natural adaptive: +5.0% of plain's time; plain steps +5.0%" in out and "(paired by round)" in out
