"""benchmarks/step_cost.py, the GPU grids' harness, on the tiny synthetic pair: arms interleave with their order turned
every round, every run says where it stood, and --ignore-eos makes every round as long as asked."""

from __future__ import annotations

import json

import pytest

from helpers import benchmark_script


@pytest.fixture(scope="module")
def step_cost():
    return benchmark_script("step_cost")


def test_the_arms_order_turns_every_round_and_each_run_says_where_it_stood(step_cost, dense_pair, tmp_path):
    target, drafter = dense_pair
    out, trace = tmp_path / "grid.json", tmp_path / "grid-trace.json.gz"
    arms = ["plain", "n2", "adaptive4"]
    assert step_cost.main(["-m", str(target), "-md", str(drafter), "--arms", ",".join(arms), "--synth", "0.8",
                           "--rounds", "3", "--n-predict", "12", "--ignore-eos", "--json", str(out),
                           "--trace", str(trace)]) == 0
    cell = json.loads(out.read_text())["cells"][0]
    runs = {arm: cell["arms"][arm]["runs"] for arm in arms}
    assert all(len(r) == 3 for r in runs.values())
    for rnd in range(3):  # measured round r is the run's round r + 1 (round 0 is the warm-up): it starts with arm r + 1
        first = arms[(rnd + 1) % len(arms)]
        assert runs[first][rnd]["place"] == 0
        by_place = sorted(arms, key=lambda a: runs[a][rnd]["place"])
        assert [runs[a][rnd]["place"] for a in by_place] == [0, 1, 2]
        # each run names the one before it; a round's first follows the last round's last
        for before, arm in zip(by_place, by_place[1:]):
            assert runs[arm][rnd]["after"] == before
        assert runs[first][rnd]["after"] == arms[(rnd - 1) % len(arms)]
    # with the end of generation never sampled, every round decodes what it was asked for
    for arm, rows in runs.items():
        for row in rows:
            assert round(row["steps"] * row["al"]) == 12, (arm, row)
            assert row["prefill_ms"] > 0, (arm, row)  # every round's prompt is its own, processed in full
    # the trace keeps each arm's measured rounds, in the arm's own round order
    from pyllamaspec.bench import trace as tracefile

    kept = {a["arm"]: a for a in tracefile.load(trace)}
    assert set(kept) == set(arms) and all(len(a["rounds"]) == 3 for a in kept.values())
    # and the discarded warm-up round's steps apart - what an adaptive arm's controller learnt before round 1
    for a in kept.values():
        tokens = [sum(s["accepted"] + 1 for s in steps) for steps in [a["warmup"]] + a["rounds"]]
        assert a["warmup"] and len(set(tokens)) == 1, (a["arm"], tokens)


def test_an_arm_the_harness_does_not_know_is_refused_with_the_arms_it_knows(step_cost, dense_pair, capsys):
    target, drafter = dense_pair
    for arms in ("plain,n4,adaptve4", "plain,n4,plain", "plain,adaptivex"):
        with pytest.raises(SystemExit) as e:
            step_cost.main(["-m", str(target), "-md", str(drafter), "--arms", arms])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--arms: " in err and (arms.split(",")[-1] in err if arms.count("plain") == 1 else "named twice" in err)
    cfg = step_cost.arm_config("n4-kv1024", 512, 0.8, None, 4, 512, 0, ignore_eos=True)
    assert cfg.n_max == 4 and cfg.kv_window == 1024 and cfg.ignore_eos and not cfg.adaptive
    # a twin (-b) is a second session of the arm it names, its configuration the same
    assert step_cost.arm_config("n4-kv1024-b", 512, 0.8, None, 4, 512, 0, ignore_eos=True) == cfg
    assert step_cost.arm_config("plain-b", 512, 0.0, None, 4, 512, 0) == step_cost.arm_config("plain", 512, 0.0, None,
                                                                                           4, 512, 0)
    assert step_cost.arm_config("n4-kv1024-e", 512, 0.8, None, 4, 512, 0, ignore_eos=True) == cfg
    assert step_cost.graph_suffix("n4-gs-b") == step_cost.graph_suffix("n4-gs") == "-gs"
    assert step_cost.graph_suffix("n4-b") is None
    assert not step_cost.known_arm("n4-f") and not step_cost.known_arm("-b") and not step_cost.known_arm("n4-bb")
    # -hf copies a drafter's features to the host: an arm without a drafter has none
    assert step_cost.arm_config("zero15-hf", 512, 0.0, None, 4, 512, 0).host_features
    assert step_cost.known_arm("adaptive7-ring7-hf")
    for arm in ("plain-hf", "plain-ring7-hf", "plain-kv1024-hf"):
        assert not step_cost.known_arm(arm), arm


def test_ignore_eos_reaches_upstreams_speculative_simple(step_cost, monkeypatch, tmp_path):
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return step_cost.subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.setattr(step_cost.subprocess, "run", fake_run)
    for ignore_eos in (False, True):
        with pytest.raises(RuntimeError, match="stopped here"):
            step_cost.run_upstream(tmp_path / "bin", tmp_path / "t.gguf", tmp_path / "d.gguf", 4, "tok_1", 16, 256,
                                   "draft-simple", ignore_eos)
    assert ["--ignore-eos" in cmd for cmd in seen] == [False, True]


def test_fresh_gives_every_run_a_session_of_its_own_one_alive_at_a_time(step_cost, dense_pair, tmp_path, monkeypatch):
    target, drafter = dense_pair
    monkeypatch.setenv("PYLLAMASPEC_COST_CACHE", str(tmp_path / "costs"))
    opened, alive, most = [], set(), [0]
    real_open = step_cost.open_session

    def tracking_open(arm, *a, **kw):
        s = real_open(arm, *a, **kw)
        opened.append(arm)
        alive.add(id(s))
        most[0] = max(most[0], len(alive))
        real_close = s.close

        def close():
            alive.discard(id(s))
            real_close()

        s.close = close
        return s

    monkeypatch.setattr(step_cost, "open_session", tracking_open)
    arms = ["plain", "n2", "adaptive4"]
    out, trace = tmp_path / "fresh.json", tmp_path / "fresh-trace.json.gz"
    assert step_cost.main(["-m", str(target), "-md", str(drafter), "--arms", ",".join(arms), "--synth", "0.8",
                           "--rounds", "2", "--n-predict", "10", "--ignore-eos", "--fresh", "--json", str(out),
                           "--trace", str(trace)]) == 0
    # a session per run (the warm-up round's too), in the rounds' turned order, never two at once, none left open
    assert opened == ["plain", "n2", "adaptive4", "n2", "adaptive4", "plain", "adaptive4", "plain", "n2"]
    assert most[0] == 1 and not alive
    cell = json.loads(out.read_text())["cells"][0]
    assert all(len(cell["arms"][a]["runs"]) == 2 for a in arms)
    assert cell["arms"]["adaptive4"]["learnt"]["costs"]  # read from its last session before it closed
    from pyllamaspec.bench import trace as tracefile

    kept = {a["arm"]: a for a in tracefile.load(trace)}
    assert kept["n2"]["setup"]["n_max"] == 2 and kept["adaptive4"]["setup"]["adaptive"]
    assert all(a["setup"]["fresh"] for a in kept.values())
