"""Robust summaries of repeated measurements.

Medians and ranges rather than means and standard deviations: a benchmark's noise is one-sided (a hiccup only
ever makes a run slower) and eight repeats are too few for a mean to shrug off an outlier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    min: float
    max: float
    spread_pct: float  # (max - min) / median * 100: how far apart the best and worst run are
    mad: float  # median absolute deviation from the median (unscaled)
    iqr: float  # interquartile range, linear interpolation between order statistics

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("cannot summarize zero measurements")
    median = float(np.median(data))
    if median <= 0:
        raise ValueError(f"measurements must be positive rates, got median {median}")
    q1, q3 = np.percentile(data, [25, 75])
    return Summary(
        n=int(data.size),
        median=median,
        min=float(data.min()),
        max=float(data.max()),
        spread_pct=float((data.max() - data.min()) / median * 100.0),
        mad=float(np.median(np.abs(data - median))),
        iqr=float(q3 - q1),
    )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> np.ndarray:
    """Element-wise ratios of runs taken in the same round, so slow drift over the session cancels out."""
    top = np.asarray(numerators, dtype=float)
    bottom = np.asarray(denominators, dtype=float)
    if top.shape != bottom.shape or top.size == 0:
        raise ValueError(f"paired ratios need two equally long, non-empty series ({top.size} vs {bottom.size})")
    return top / bottom


@dataclass(frozen=True)
class RatioRange:
    median: float
    min: float
    max: float
    n: int

    def to_dict(self) -> dict:
        return asdict(self)


def ratio_range(numerators: Sequence[float], denominators: Sequence[float]) -> RatioRange:
    """Median and range of paired ratios, e.g. a speculative arm's tok/s over the plain arm's in each round."""
    ratios = paired_ratios(numerators, denominators)
    return RatioRange(median=float(np.median(ratios)), min=float(ratios.min()), max=float(ratios.max()),
                      n=int(ratios.size))
