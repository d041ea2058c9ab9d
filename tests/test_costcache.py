"""Costs measured on this machine, kept between sessions: seeded at open, stored at close, one file per setup.

A broken or foreign file is ignored (never an error), a bad point is refused whole, and a pair seeded as unable to
pay keeps its draft model out of the prompt - catching up on it, exactly, once drafting pays again.
"""

from __future__ import annotations

import argparse
import json

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession, costcache
from pyllamaspec._native import constants
from pyllamaspec.cli.flags import add_speculative_flags, speculative_settings
from pyllamaspec.errors import ConfigError

from helpers import assert_equal_up_to_near_tie as assert_near
from helpers import solo

PROMPT = [1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7, 4, 4, 8, 15, 16, 23, 42, 7, 3, 3, 7, 1, 2, 9, 8, 7, 6, 5, 4, 3, 2, 1,
          2, 4, 6, 8, 10, 12]
C = constants()


@pytest.fixture(scope="module")
def pair(dense_pair):
    t, d = dense_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "costs"
    monkeypatch.setenv(costcache.ENV, str(d))
    return d


def costs(target_ms, first_ms, rest_ms, n_max=4):
    """Cost points: a target batch of n tokens costs target_ms(n), a draft model's first decode first_ms(n)."""
    pts = [(C["PLS_COST_TARGET"], 0, n, 2, target_ms(n)) for n in range(1, n_max + 2)]
    pts += [(C["PLS_COST_DRAFT_FIRST"], 0, n, 2, first_ms(n)) for n in (1, 65)]
    pts += [(C["PLS_COST_DRAFT_REST"], 0, 1, 2, rest_ms)]
    return pts


HOPELESS = costs(lambda n: 10.0 * n, lambda n: 10.0 + 0.5 * (n - 1), 10.0)  # k + 1 tokens cost k + 1 plain steps
PAYING = costs(lambda n: 1.0 + 0.01 * (n - 1), lambda n: 0.05 + 0.001 * (n - 1), 0.05)


def test_costs_are_kept_per_setup_and_seed_the_next_session(pair, cache):
    target, drafter = pair
    cfg = SessionConfig(n_max=4, n_ctx=512)
    with SpecSession(target, drafter, cfg) as s:
        assert s.learnt_costs() == []
        s.generate(PROMPT, 48)
        learnt = s.learnt_costs()
    assert learnt and {p[0] for p in learnt} >= {C["PLS_COST_TARGET"]}
    files = list(cache.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["schema"] == costcache.SCHEMA and data["setup"]["spec_types"] == ["draft-simple"]
    assert data["setup"]["target"][0] == str(target.path.resolve())
    with SpecSession(target, drafter, cfg) as s:
        seeded = s.learnt_costs()  # before any step: what the first session measured
    assert [(t, b, n, min(k, 2)) for t, b, n, k, _ in learnt] == [(t, b, n, k) for t, b, n, k, _ in seeded]
    assert [p[4] for p in seeded] == pytest.approx([p[4] for p in learnt])
    # another setup (threads) has its own file; a session that does not adapt, or opts out, writes none
    with SpecSession(target, drafter, cfg.replace(n_threads=1)) as s:
        assert s.learnt_costs() == []
        s.generate(PROMPT, 16)
    with SpecSession(target, drafter, cfg.replace(adaptive=False)) as s:
        s.generate(PROMPT, 16)
    with SpecSession(target, drafter, cfg.replace(cost_cache=False, n_threads=2)) as s:
        s.generate(PROMPT, 16)
    assert len(list(cache.glob("*.json"))) == 2


def test_the_cache_turned_off_writes_nothing(pair, tmp_path, monkeypatch):
    target, drafter = pair
    monkeypatch.setenv(costcache.ENV, "off")
    monkeypatch.setenv("PYLLAMASPEC_CACHE", str(tmp_path / "root"))
    assert costcache.cache_dir() is None
    with SpecSession(target, drafter, SessionConfig(n_max=4, n_ctx=512)) as s:
        s.generate(PROMPT, 16)
    assert not (tmp_path / "root").exists()
    monkeypatch.delenv(costcache.ENV)
    assert costcache.cache_dir() == tmp_path / "root" / "costs"


@pytest.mark.parametrize("content", [b"\x00not json{", b'{"schema": 1, "setup": {}, "points": []}', None])
def test_a_broken_or_foreign_cost_file_is_ignored_and_replaced(pair, cache, content):
    target, drafter = pair
    cfg = SessionConfig(n_max=4, n_ctx=512)
    with SpecSession(target, drafter, cfg) as s:
        path = costcache.path_for(costcache.setup_of(s), cache)
    cache.mkdir(parents=True, exist_ok=True)
    if content is None:  # our format and setup, but a point the library refuses
        good = json.loads(json.dumps({"schema": costcache.SCHEMA, "setup": costcache.setup_of(s)}, default=str))
        good["points"] = [[0, 0, 1, 2, 1.0], [0, 99, 1, 2, 1.0]]
        content = json.dumps(good).encode()
    path.write_bytes(content)
    with SpecSession(target, drafter, cfg) as s:
        assert s.learnt_costs() == []  # nothing seeded
        out = s.generate(PROMPT, 24)
        assert len(out.tokens) == 24
    data = json.loads(path.read_text())
    assert data["points"] and all(costcache._valid_point(p) for p in data["points"])


def test_bad_cost_points_are_refused_whole(pair):
    target, drafter = pair
    with SpecSession(target, drafter, SessionConfig(n_max=4, n_ctx=512, cost_cache=False)) as s:
        for bad in [[(0, 0, 1, 2)], [(0, 0, 1, 2, "x")], [(0, 0, 1, 2, 1.0), (0, 0, 1, 2, float("inf"))],
                    [(C["PLS_COST_WHOLE"] + 1, 0, 1, 2, 1.0)], [(0, 0, 5000, 2, 1.0)], 42, [(0, 0, 1, 2, 1.0)] * 5000]:
            with pytest.raises(ConfigError, match="cost point"):
                s.seed_costs(bad)
        assert s.learnt_costs() == []
        s.seed_costs(PAYING)
        assert len(s.learnt_costs()) == len(PAYING)


def test_a_pair_that_cannot_pay_leaves_the_drafter_out_of_the_prompt_until_it_can(pair):
    target, drafter = pair
    ref = solo(target, PROMPT, 48)
    cfg = SessionConfig(n_max=4, n_ctx=512, cost_cache=False)
    with SpecSession(target, drafter, cfg) as s:
        s.seed_costs(HOPELESS)
        s.submit(PROMPT, n_predict=48)
        tokens, steps = [], 0
        while steps < 12:
            events, _ = s.step_sequences()
            for e in events:
                tokens.extend(e.tokens)
                assert e.n_drafted == 0
            steps += 1
        assert s.stats().n_catchup == 0 and s.stats().n_drafted == 0
        # costs by which drafting pays, on the scale of the plain steps this machine just ran (a session re-measures
        # plain decoding after an import, and weighs every choice against what it measures now)
        plain = next(p[4] for p in s.learnt_costs() if p[0] == C["PLS_COST_TARGET"] and p[2] == 1)
        s.seed_costs(costs(lambda n: plain * (1.0 + 0.01 * (n - 1)), lambda n: plain * (0.05 + 0.001 * (n - 1)),
                           plain * 0.05))  # between steps, as a server could
        left = 1
        while left:
            events, left = s.step_sequences()
            for e in events:
                tokens.extend(e.tokens)
        st = s.stats()
    assert st.n_drafted > 0
    # the draft model never read the prompt: its first draft caught up on all of it and what came since
    assert st.n_catchup >= len(PROMPT)
    assert_near(tokens, ref)


def test_the_cost_cache_flag():
    for value, want in (("on", True), ("off", False)):
        ap = argparse.ArgumentParser()
        add_speculative_flags(ap)
        assert speculative_settings(ap.parse_args(["--spec-cost-cache", value]))["cost_cache"] is want
    ap = argparse.ArgumentParser()
    add_speculative_flags(ap)
    assert "cost_cache" not in speculative_settings(ap.parse_args([]))
    with pytest.raises(ConfigError, match="cost_cache"):
        SessionConfig(cost_cache="yes")
