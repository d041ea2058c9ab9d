"""When does speculation pay, and at what context depth does it stop?

A plain step yields one token in time t_plain. A speculative step (draft, then verify the drafts in one batch)
takes t_spec and yields tau tokens (accepted drafts plus the target's own token). Speculation pays while
tau / (t_spec / t_plain) > 1. The cost ratio c = t_spec / t_plain is measured directly by forcing every draft to
be rejected: each step then yields exactly one token, so c = plain tok/s / forced tok/s at the same depth.
The ratio grows with depth (verifying a batch reads the whole KV cache), so the tau needed to break even grows
too; where the measured tau falls below it, speculation stops paying.

The geometric acceptance model (each draft position accepted with probability a once its predecessors were)
turns tau into a single acceptance rate and back, so the cost model can be evaluated at assumed rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from numpy.polynomial import polynomial


def expected_tokens_per_step(acceptance: float, n_max: int) -> float:
    """Tokens per step under the geometric model with ``n_max`` drafts: 1 + a + a^2 + ... + a^n_max."""
    return float(polynomial.polyval(acceptance, np.ones(n_max + 1)))


def tokens_per_step_from_rates(rates: Sequence[float]) -> float:
    """Tokens per step from unconditional per-position acceptance probabilities (position i accepted at all, as
    upstream's --spec-synth-rates takes them): the expected accepted drafts are their sum, plus the target token."""
    return 1.0 + float(np.sum(rates))


def equivalent_acceptance(tokens_per_step: float, n_max: int) -> float:
    """The geometric model's per-position acceptance that yields ``tokens_per_step`` with ``n_max`` drafts."""
    if tokens_per_step <= 1.0:
        return 0.0
    if tokens_per_step >= n_max + 1:
        return 1.0
    # 1 + a + ... + a^n - tau rises from 1 - tau < 0 at a=0 to n + 1 - tau > 0 at a=1: one real root in between
    coefficients = np.ones(n_max + 1)
    coefficients[0] -= tokens_per_step
    roots = polynomial.polyroots(coefficients)
    in_range = roots[(roots.real >= -1e-9) & (roots.real <= 1 + 1e-9)]
    real_root = in_range[np.argmin(np.abs(in_range.imag))].real
    return float(np.clip(real_root, 0.0, 1.0))


def cost_ratio(plain_tps: float, forced_reject_tps: float) -> float:
    """A speculative step's time over a plain step's, from a zero-acceptance run (one token per step)."""
    return plain_tps / forced_reject_tps


@dataclass(frozen=True)
class DepthPoint:
    depth: int
    cost_ratio: float
    tokens_per_step_needed: float  # equal to the cost ratio: tau must exceed it to pay
    acceptance_needed: float | None  # the geometric model's rate that breaks even (None without n_max)
    tokens_per_step: float | None  # measured on the speculative arm
    equivalent_acceptance: float | None  # the measured tau as a geometric rate, comparable to acceptance_needed
    predicted_speedup: float | None  # tau / cost ratio


BreakEvenStatus = Literal["pays-throughout", "stops-paying", "never-pays", "unmeasured"]


@dataclass(frozen=True)
class BreakEven:
    arm: str
    content_class: str
    n_max: int | None
    points: list[DepthPoint]
    status: BreakEvenStatus
    breakeven_depth: float | None  # linearly interpolated depth where the predicted speedup crosses 1

    def to_dict(self) -> dict:
        return asdict(self)


def stop_paying_depth(depths: Sequence[float], speedups: Sequence[float]) -> tuple[BreakEvenStatus, float | None]:
    """Where a speedup curve first drops below 1, interpolated linearly between the depths around the drop."""
    if not depths:
        return "unmeasured", None
    gains = np.asarray(speedups, dtype=float) - 1.0
    losing = np.flatnonzero(gains < 0)
    if losing.size == 0:
        return "pays-throughout", None
    first = int(losing[0])
    if first == 0:
        return "never-pays", None
    # np.interp needs increasing x: the gain falls from >= 0 at first-1 to < 0 at first
    depth = np.interp(0.0, [gains[first], gains[first - 1]], [depths[first], depths[first - 1]])
    return "stops-paying", float(depth)


def analyse(
    arm: str,
    content_class: str,
    n_max: int | None,
    depths: Sequence[int],
    plain_tps: Sequence[float],
    forced_reject_tps: Sequence[float],
    tokens_per_step: Sequence[float | None],
) -> BreakEven:
    """Break-even per depth for one arm and content class, from per-depth medians."""
    points = []
    for depth, plain, forced, tau in zip(depths, plain_tps, forced_reject_tps, tokens_per_step, strict=True):
        ratio = cost_ratio(plain, forced)
        points.append(DepthPoint(
            depth=depth,
            cost_ratio=ratio,
            tokens_per_step_needed=ratio,
            acceptance_needed=equivalent_acceptance(ratio, n_max) if n_max else None,
            tokens_per_step=tau,
            equivalent_acceptance=equivalent_acceptance(tau, n_max) if n_max and tau is not None else None,
            predicted_speedup=tau / ratio if tau is not None else None,
        ))
    measured = [point for point in points if point.predicted_speedup is not None]
    status, depth = stop_paying_depth([point.depth for point in measured],
                                      [point.predicted_speedup for point in measured])
    return BreakEven(arm, content_class, n_max, points, status, depth)
