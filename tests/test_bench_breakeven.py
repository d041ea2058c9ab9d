"""The break-even cost model on constructed inputs."""

import pytest

from pyllamaspec.bench.breakeven import (analyse, cost_ratio, equivalent_acceptance, expected_tokens_per_step,
                                         stop_paying_depth, tokens_per_step_from_rates)


def test_geometric_tokens_per_step():
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_step(0.0, 8) == 1.0
    assert expected_tokens_per_step(1.0, 8) == 9.0


def test_per_position_rates_add_up():
    assert tokens_per_step_from_rates([0.8, 0.6, 0.3]) == pytest.approx(2.7)


@pytest.mark.parametrize("acceptance", [0.05, 0.3, 0.62, 0.9, 0.99])
@pytest.mark.parametrize("n_max", [1, 4, 16])
def test_equivalent_acceptance_inverts_the_geometric_model(acceptance, n_max):
    tau = expected_tokens_per_step(acceptance, n_max)
    assert equivalent_acceptance(tau, n_max) == pytest.approx(acceptance, abs=1e-9)


def test_equivalent_acceptance_clamps_at_the_ends():
    assert equivalent_acceptance(1.0, 4) == 0.0
    assert equivalent_acceptance(0.7, 4) == 0.0
    assert equivalent_acceptance(5.0, 4) == 1.0


def test_cost_ratio_is_plain_speed_over_forced_reject_speed():
    assert cost_ratio(100.0, 80.0) == 1.25


def test_analysis_finds_where_speculation_stops_paying():
    result = analyse("draft", "code", 4, [0, 4096, 8192],
                     plain_tps=[100.0, 80.0, 60.0], forced_reject_tps=[80.0, 50.0, 30.0],
                     tokens_per_step=[2.0, 2.0, 1.8])
    assert [point.cost_ratio for point in result.points] == pytest.approx([1.25, 1.6, 2.0])
    assert [point.predicted_speedup for point in result.points] == pytest.approx([1.6, 1.25, 0.9])
    # gain +0.25 at 4096 and -0.1 at 8192: zero at 4096 + 0.25 / 0.35 * 4096
    assert result.status == "stops-paying"
    assert result.breakeven_depth == pytest.approx(4096 + 0.25 / 0.35 * 4096)
    first = result.points[0]
    assert first.tokens_per_step_needed == first.cost_ratio
    assert expected_tokens_per_step(first.acceptance_needed, 4) == pytest.approx(1.25)
    assert expected_tokens_per_step(first.equivalent_acceptance, 4) == pytest.approx(2.0)


def test_statuses_when_no_crossing_is_measured():
    assert stop_paying_depth([0, 1000], [1.5, 1.1]) == ("pays-throughout", None)
    assert stop_paying_depth([0, 1000], [0.9, 0.7]) == ("never-pays", None)
    assert stop_paying_depth([], []) == ("unmeasured", None)


def test_without_n_max_no_acceptance_rate_is_implied():
    result = analyse("ngram", "prose", None, [0], [100.0], [90.0], [1.5])
    assert result.points[0].acceptance_needed is None and result.points[0].equivalent_acceptance is None
    assert result.status == "pays-throughout"
