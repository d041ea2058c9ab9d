"""benchmarks/cell_summary.py: what BENCHMARKS.md's tables read off a step_cost record - the adaptive arm against the
best of plain and the fixed lengths by medians, by total decode time and paired by round."""

from __future__ import annotations

import json

import pytest

from helpers import benchmark_script


@pytest.fixture(scope="module")
def cell_summary():
    return benchmark_script("cell_summary")


def runs(tok_s, k_histogram=None):
    return [{"tok_s": t, "k_histogram": k_histogram or [0, 0, 10]} for t in tok_s]


def test_the_adaptive_arm_is_read_against_the_best_arm_three_ways(cell_summary, tmp_path, capsys):
    record = {"n_predict": 100, "rounds": 3, "cells": [{
        "depth": 0, "synthetic_acceptance": 0.8, "arms": {
            "plain": {"runs": runs([100.0, 100.0, 100.0])},
            # n2 has the best median; n4 the least total time (its slow round is less slow)
            "n2": {"runs": runs([150.0, 160.0, 50.0])},
            "n4": {"runs": runs([140.0, 145.0, 120.0])},
            "adaptive": {"runs": runs([150.0, 140.0, 120.0], [5, 0, 15])},
        }}]}
    [row] = cell_summary.cell_rows(record)
    assert row["best"] == "n2" and row["x_best_median"] == pytest.approx(140.0 / 150.0)
    total = {a: sum(100 / t for t in v) for a, v in
             {"n4": [140.0, 145.0, 120.0], "adaptive": [150.0, 140.0, 120.0]}.items()}
    assert row["best_total"] == "n4" and row["x_best_total"] == pytest.approx(total["n4"] / total["adaptive"])
    assert row["x_best_paired"] == pytest.approx(sorted([150 / 140, 140 / 145, 120 / 120])[1])
    assert row["x_plain"] == pytest.approx(1.40)
    assert row["k_shares"] == {0: 0.25, 2: 0.75}
    assert row["spread"] == pytest.approx(150 / 120) and row["best_spread"] == pytest.approx(160 / 50)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    assert cell_summary.main([str(path), "--markdown"]) == 0
    assert "| d0 p 0.8 | n2 150.0 (50-160) | 140.0 (120-150), 1.400x plain | **0.933**" in capsys.readouterr().out


def test_a_cell_without_plain_or_fixed_arms_gives_no_row(cell_summary):
    record = {"n_predict": 10, "rounds": 1, "cells": [{"depth": 0, "synthetic_acceptance": None,
                                                       "arms": {"adaptive": {"runs": runs([10.0])}}}]}
    assert cell_summary.cell_rows(record) == []


def test_a_record_of_another_tool_is_refused_with_what_it_takes(cell_summary, tmp_path, capsys):
    # a `pyllamaspec bench` record (the class grid's: records by class) is not a step_cost record
    bench = tmp_path / "classes.json"
    bench.write_text(json.dumps({"environment": {}, "arms": [], "records": []}))
    for path, says in ((bench, "not a record of benchmarks/step_cost.py"), (tmp_path / "none.json", "cannot read"),
                       (tmp_path / "bad.json", "not a record of")):
        if path.name == "bad.json":
            path.write_text("{")
        with pytest.raises(SystemExit) as e:
            cell_summary.main([str(path)])
        assert e.value.code == 2 and says in capsys.readouterr().err
