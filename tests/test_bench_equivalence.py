"""Exactness check: a divergence from plain greedy output is forgiven only at a near-tie."""

from pyllamaspec.bench.equivalence import Equivalence, compare_greedy, least_equivalent

PLAIN = [11, 12, 13, 14, 15, 16]
MARGINS = [3.0, 2.1, 0.9, 2.5, 0.01, 1.7]


def test_identical_outputs():
    assert compare_greedy(PLAIN, MARGINS, list(PLAIN)).to_dict() == \
        {"equal": True, "kind": "identical", "position": None, "margin": None}


def test_planted_divergence_at_a_clear_winner_is_caught():
    planted = [11, 12, 13, 99, 15, 16]
    result = compare_greedy(PLAIN, MARGINS, planted)
    assert result == Equivalence(False, "diverged", 3, 2.5)


def test_divergence_at_a_near_tie_is_accepted():
    flipped = [11, 12, 13, 14, 77, 78]  # later tokens differ too: they follow a different prefix
    assert compare_greedy(PLAIN, MARGINS, flipped) == Equivalence(True, "near-tie", 4, 0.01)


def test_tolerance_is_a_parameter():
    flipped = [11, 12, 13, 14, 77]
    assert compare_greedy(PLAIN, MARGINS, flipped, tolerance=0.005).kind == "diverged"
    assert compare_greedy(PLAIN, MARGINS, [11, 12, 55], tolerance=1.0).kind == "near-tie"


def test_early_stop_is_a_divergence_at_the_shorter_end():
    assert compare_greedy(PLAIN, MARGINS, PLAIN[:3]) == Equivalence(False, "diverged", 3, 2.5)
    # the plain run stopped; no margin was recorded past its end, so nothing proves a tie
    assert compare_greedy(PLAIN, MARGINS, PLAIN + [17]) == Equivalence(False, "diverged", 6, None)


def test_without_margins_no_divergence_is_forgiven():
    assert compare_greedy(PLAIN, None, [11, 12, 13, 14, 77]) == Equivalence(False, "diverged", 4, None)


def test_least_equivalent_of_several_runs():
    identical = Equivalence(True, "identical", None, None)
    tie = Equivalence(True, "near-tie", 4, 0.01)
    diverged = Equivalence(False, "diverged", 3, 2.5)
    assert least_equivalent([identical, tie, diverged, tie]) is diverged
    assert least_equivalent([identical, tie]) is tie
    assert least_equivalent([]) is None
