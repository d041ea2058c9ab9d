"""Per-step traces (SessionConfig.trace_steps, SpecSession.take_trace) and synthetic acceptance by position."""

from __future__ import annotations

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.bench import trace as tracefile
from pyllamaspec.errors import ConfigError

PROMPT = [1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7]


@pytest.fixture(scope="module")
def pair(dense_pair):
    target_path, drafter_path = dense_pair
    with Model(target_path) as target, Model(drafter_path) as drafter:
        yield target, drafter


def test_a_trace_holds_every_step_as_the_stats_count_them(pair):
    target, drafter = pair
    cfg = SessionConfig(adaptive=False, n_max=3, n_ctx=512, trace_steps=4096, draft_schedule=(0, 3, 1))
    with SpecSession(target, drafter, cfg) as s:
        r = s.generate(PROMPT, 40)
        steps = s.take_trace()
        assert s.take_trace() == []  # taken: forgotten
    st = r.stats
    assert len(steps) == st.n_steps
    assert sum(x["drafted"][0] for x in steps) == st.n_drafted
    assert sum(x["accepted"][0] for x in steps) == st.n_accepted
    assert [x["k"][0] for x in steps[:6]] == [0, 3, 1, 0, 3, 1]  # the schedule, step by step
    assert all(x["n_tokens"] == x["drafted"][0] + 1 for x in steps)  # one stream: its verify rows
    assert all(x["t_step"] >= x["t_target"] > 0 for x in steps)
    assert all(x["t_draft_first"] == 0 for x in steps if x["k"][0] == 0)
    assert abs(sum(x["t_step"] for x in steps) - st.t_decode_ms) < 0.05 * st.t_decode_ms
    rows = tracefile.compact(steps)
    assert [tracefile.expand(r)["accepted"] for r in rows] == [x["accepted"][0] for x in steps]


def test_a_trace_keeps_at_most_its_steps_and_says_what_it_dropped(pair):
    target, drafter = pair
    with SpecSession(target, drafter, SessionConfig(n_max=3, n_ctx=512, trace_steps=5)) as s:
        s.generate(PROMPT, 30)
        with pytest.warns(UserWarning, match=r"steps were not recorded: more than trace_steps=5"):
            steps = s.take_trace()
    assert len(steps) == 5


def test_a_session_without_a_trace_says_how_to_get_one(pair):
    target, drafter = pair
    with SpecSession(target, drafter, SessionConfig(n_max=3, n_ctx=512)) as s:
        with pytest.raises(ConfigError, match="trace_steps"):
            s.take_trace()
    with pytest.raises(ConfigError, match="trace_steps"):
        SessionConfig(trace_steps=-1)


def _outcomes(target, drafter, n_max: int, seed: int) -> dict[int, bool]:
    """Position -> whether the token drafted there landed, over one synthetic-acceptance generation."""
    cfg = SessionConfig(adaptive=False, n_max=n_max, n_ctx=512, synth_rates=[0.6 ** (i + 1) for i in range(n_max)],
                        synth_seed=seed, trace_steps=4096)
    out = {}
    with SpecSession(target, drafter, cfg) as s:
        s.generate(PROMPT, 60)
        for x in s.take_trace():
            depth, drafted, accepted = x["depth"][0], x["drafted"][0], x["accepted"][0]
            for i in range(min(drafted, accepted + 1)):  # judged: the accepted ones and the first rejection
                out[depth + 1 + i] = i < accepted
    return out


def test_synthetic_acceptance_is_drawn_by_position_the_same_for_every_draft_length(pair):
    # two arms that split the same text into drafts differently face the same acceptance at every position both
    # judged: they differ by their choices, not by their luck
    target, drafter = pair
    short, long_ = _outcomes(target, drafter, 1, seed=7), _outcomes(target, drafter, 5, seed=7)
    both = sorted(set(short) & set(long_))
    assert len(both) >= 10
    assert [short[p] for p in both] == [long_[p] for p in both]
    assert any(short[p] for p in both) and not all(short[p] for p in both)
    # another seed is another text
    other = _outcomes(target, drafter, 1, seed=8)
    common = sorted(set(short) & set(other))
    assert [short[p] for p in common] != [other[p] for p in common]


def test_a_trace_file_keeps_an_arms_warm_up_apart_and_reads_older_files_without_one(tmp_path):
    row = [1, 2, 2, 1, 0, 40, 3, 0, 0, 0, 0.0, 0.0, 4.5, 17.0, 21.6]
    tracefile.save(tmp_path / "t.json.gz", [{"arm": "adaptive7", "setup": {"depth": 0}, "rounds": [[row, row]],
                                             "warmup": [row]}])
    (a,) = tracefile.load(tmp_path / "t.json.gz")
    assert a["warmup"] == [tracefile.expand(row)] and a["rounds"] == [[tracefile.expand(row)] * 2]
    tracefile.save(tmp_path / "old.json", [{"arm": "n3", "setup": {"depth": 0}, "rounds": [[row]]}])
    (b,) = tracefile.load(tmp_path / "old.json")
    assert b["warmup"] == [] and b["rounds"] == [[tracefile.expand(row)]]
