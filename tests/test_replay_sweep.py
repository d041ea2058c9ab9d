"""benchmarks/replay_sweep.py: the controller over the replay cases of tests/test_replay.py at more seeds, set beside
an earlier run's cells."""

from __future__ import annotations

import json

import pytest

from helpers import benchmark_script
from pyllamaspec.bench import replay, trace


@pytest.fixture(scope="module")
def sweep():
    return benchmark_script("replay_sweep")


def test_a_sweep_writes_a_cell_per_case_level_and_seed_as_the_replay_figures_it(sweep, tmp_path, capsys):
    out = tmp_path / "cells.json"
    assert sweep.main(["--cases", "short", "--only", "h200-7b-draft-d0.json", "--seeds", "1,2", "--levels", "0,0.8",
                       "--json", str(out)]) == 0
    cells = json.loads(out.read_text())
    assert sorted(cells) == [f"short|h200-7b-draft-d0.json|{p}|{s}" for p in (0.0, 0.8) for s in (1, 2)]
    model = replay.CostModel.from_arms(trace.load(sweep.ROOT / "benchmarks" / "traces" / "h200-7b-draft-d0.json"), 0)
    want = replay.summarize(replay.grid(model, 8, [0.0, 0.8], (2, 4, 8), rounds=3, seed=2))
    assert cells["short|h200-7b-draft-d0.json|0.8|2"]["x_best"] == pytest.approx(want[1]["adaptive_x_best"])
    assert "short p 0.8: 2 cells" in capsys.readouterr().out
    # an earlier run set beside it: each level's figures then, and the cells that moved
    before = {k: {**v, "x_best": v["x_best"] - 0.1} for k, v in cells.items()}
    (tmp_path / "before.json").write_text(json.dumps(before))
    sweep.main(["--cases", "short", "--only", "h200-7b-draft-d0.json", "--seeds", "1,2", "--levels", "0,0.8",
                "--compare", str(tmp_path / "before.json")])
    text = capsys.readouterr().out
    assert "(before: mean" in text and "+0.100  short|h200-7b-draft-d0.json" in text


def test_a_sweep_refuses_what_it_cannot_use(sweep, tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1, 2]")
    for bad, says in ((["--seeds", "x"], "--seeds takes seeds"), (["--levels", "2"], "levels within 0..1"),
                      (["--only", "no-such-trace"], "trace name holds 'no-such-trace'"),
                      (["--compare", str(tmp_path / "none.json")], "--compare"),
                      (["--compare", str(tmp_path / "list.json")], "not the cells of an earlier --json")):
        with pytest.raises(SystemExit) as e:
            sweep.main(["--cases", "short", "--levels", "0.8", "--seeds", "1"] + bad)
        assert e.value.code == 2 and says in capsys.readouterr().err, bad
