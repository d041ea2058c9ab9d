"""Summary statistics and paired ratios on inputs whose answers are worked out by hand."""

import pytest

from pyllamaspec.bench.stats import paired_ratios, ratio_range, summarize


def test_summary_of_known_values():
    summary = summarize([10, 12, 11, 9, 13, 20, 11, 12])
    assert summary.n == 8
    assert summary.median == 11.5
    assert (summary.min, summary.max) == (9, 20)
    assert summary.spread_pct == pytest.approx((20 - 9) / 11.5 * 100)
    # |x - 11.5| sorted: .5 .5 .5 .5 1.5 1.5 2.5 8.5 -> median 1.0; the outlier 20 barely moves it
    assert summary.mad == 1.0
    # order statistics 9 10 11 11 12 12 13 20: q1 = 10 + .75 * 1, q3 = 12 + .25 * 1
    assert summary.iqr == pytest.approx(12.25 - 10.75)


def test_summary_of_a_single_run_has_no_spread():
    summary = summarize([42.0])
    assert (summary.median, summary.spread_pct, summary.mad, summary.iqr) == (42.0, 0.0, 0.0, 0.0)


def test_summary_refuses_empty_and_non_positive_input():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([0.0, 0.0, 1.0])


def test_paired_ratios_pair_by_position():
    assert paired_ratios([20, 30, 25], [10, 10, 5]).tolist() == [2.0, 3.0, 5.0]
    with pytest.raises(ValueError):
        paired_ratios([1, 2], [1])


def test_speedup_range_is_median_min_max_of_paired_ratios():
    speedup = ratio_range([20, 33, 25, 22], [10, 11, 10, 11])
    assert (speedup.median, speedup.min, speedup.max, speedup.n) == (2.25, 2.0, 3.0, 4)
    # pairing matters: the same values unpaired (median over median) would give 23.5 / 10.5
    assert speedup.median != pytest.approx(23.5 / 10.5)
