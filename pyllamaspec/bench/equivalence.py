"""Is a speculative arm's greedy output the plain arm's output?

Exact speculative decoding must reproduce greedy decoding token for token - except where the target's top two
logits are so close that the different batch shapes of verification (many tokens per step) and plain decoding
(one token per step) legitimately round them the other way. So a divergence is forgiven only when the plain
run's top1-top2 logit margin at the first differing position is below a tolerance; after the first divergence
the two texts are conditioned on different prefixes and later positions say nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

DEFAULT_MARGIN_TOLERANCE = 0.05

EquivalenceKind = Literal["identical", "near-tie", "diverged"]


@dataclass(frozen=True)
class Equivalence:
    equal: bool
    kind: EquivalenceKind
    position: int | None  # index into the generated tokens of the first difference
    margin: float | None  # the plain run's top1-top2 logit margin there, when it was recorded

    def to_dict(self) -> dict:
        return asdict(self)


def compare_greedy(
    reference_tokens: Sequence[int],
    reference_margins: Sequence[float] | None,
    candidate_tokens: Sequence[int],
    tolerance: float = DEFAULT_MARGIN_TOLERANCE,
) -> Equivalence:
    """Compare ``candidate_tokens`` with the plain run's ``reference_tokens`` (margins aligned with them).

    When one sequence is a prefix of the other, the difference is at the shorter one's end (one run stopped, the
    other produced a token); a margin that was not recorded there cannot prove a tie, so that counts as diverged.
    """
    if list(reference_tokens) == list(candidate_tokens):
        return Equivalence(True, "identical", None, None)
    pairs = zip(reference_tokens, candidate_tokens, strict=False)  # unequal lengths are handled below
    position = next((index for index, (expected, actual) in enumerate(pairs) if expected != actual),
                    min(len(reference_tokens), len(candidate_tokens)))
    margin = None
    if reference_margins is not None and position < len(reference_margins):
        margin = float(reference_margins[position])
    if margin is not None and margin < tolerance:
        return Equivalence(True, "near-tie", position, margin)
    return Equivalence(False, "diverged", position, margin)


_SEVERITY = {"identical": 0, "near-tie": 1, "diverged": 2}


def least_equivalent(results: Iterable[Equivalence]) -> Equivalence | None:
    """The worst of several comparisons (diverged over near-tie over identical), or None if there were none."""
    return max(results, key=lambda result: _SEVERITY[result.kind], default=None)
