"""Speculative sampling at temp > 0 leaves the target's distribution unchanged.

Plain and speculative runs sample with disjoint sets of seeds; at each of the first positions the histograms of
the sampled tokens are compared with Pearson's chi-square test of homogeneity. The seeds are fixed, so the
verdict is reproducible; a control shows the statistic does reject a different distribution.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from pyllamaspec import Model, SessionConfig, SpecSession

PROMPT = [1, 5, 9, 2, 7, 3, 8, 1]
N_SEEDS = 240
POSITIONS = 4
TOP_K = 6          # a handful of candidates per position keeps the histograms dense


def sample(target, drafter, seeds, **cfg) -> list[list[int]]:
    out = []
    for seed in seeds:
        config = SessionConfig(n_ctx=64, temp=1.0, top_k=TOP_K, top_p=1.0, min_p=0.0, seed=seed, **cfg)
        with SpecSession(target, drafter, config) as s:
            out.append(s.generate(PROMPT, POSITIONS).tokens)
    return out


def chi2_pvalue(a: list[int], b: list[int]) -> float:
    cats = sorted(set(a) | set(b))
    ca, cb = Counter(a), Counter(b)
    table = np.array([[ca[c] for c in cats], [cb[c] for c in cats]])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(chi2_contingency(table)[1])


@pytest.fixture(scope="module")
def models(dense_pair):
    t, d = dense_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter


@pytest.fixture(scope="module")
def plain_samples(models):
    target, _ = models
    return sample(target, None, range(N_SEEDS), spec_types=[])


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_speculative_sampling_matches_plain_sampling(models, plain_samples, adaptive):
    target, drafter = models
    kw = {"adaptive": False, "n_max": 3} if not adaptive else {"n_max": 3}
    spec = sample(target, drafter, range(10_000, 10_000 + N_SEEDS), spec_types=["draft-simple"], **kw)
    for pos in range(POSITIONS):
        p = chi2_pvalue([s[pos] for s in plain_samples], [s[pos] for s in spec])
        assert p > 0.001, f"position {pos}: the speculative token distribution differs from plain (p = {p:.2g})"


def test_the_statistic_rejects_a_different_distribution(models, plain_samples):
    # the same target sampled cooler is a different distribution: the test must see it
    target, _ = models
    cold = []
    for seed in range(20_000, 20_000 + N_SEEDS):
        config = SessionConfig(spec_types=[], n_ctx=64, temp=0.3, top_k=TOP_K, top_p=1.0, min_p=0.0, seed=seed)
        with SpecSession(target, None, config) as s:
            cold.append(s.generate(PROMPT, POSITIONS).tokens)
    pvalues = [chi2_pvalue([s[pos] for s in plain_samples], [s[pos] for s in cold]) for pos in range(POSITIONS)]
    assert min(pvalues) < 0.001, pvalues


def test_drafts_were_made_and_judged_at_temperature(models):
    target, drafter = models
    config = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=3, n_ctx=256, temp=1.0, top_k=TOP_K,
                           top_p=1.0, min_p=0.0, seed=5)
    with SpecSession(target, drafter, config) as s:
        st = s.generate(PROMPT, 64).stats
    assert st.n_drafted > 0 and 0 < st.n_accepted < st.n_drafted  # both outcomes happen at temp 1
