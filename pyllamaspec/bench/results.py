"""Turn executed runs into the report's records: one per arm x content class x depth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyllamaspec.bench import breakeven
from pyllamaspec.bench.backends import RunResult
from pyllamaspec.bench.cotenant import Finding, GpuSample
from pyllamaspec.bench.equivalence import Equivalence, compare_greedy, least_equivalent
from pyllamaspec.bench.plan import Arm, Step
from pyllamaspec.bench.stats import ratio_range, summarize


@dataclass(frozen=True)
class RunOutcome:
    """A step as it was executed."""

    step: Step
    result: RunResult
    prompt_id: str
    filler_tokens: int
    findings: list[Finding] = field(default_factory=list)
    contaminated: bool = False
    telemetry: list[GpuSample] = field(default_factory=list)


ReferenceKey = tuple[str, int, int]  # content class, depth, prompt index

# A divergence within 1.5x the measured batch-shape noise of the target's margins is a tie: verification sees
# other batch shapes than the plain reference, and the noise was measured on one of them only.
NOISE_FACTOR = 1.5


def sum_by_position(rows: Sequence[Sequence[int]]) -> list[int]:
    """Per-position totals of rows of different lengths (drafts stop early, so later positions are rarer)."""
    width = max((len(row) for row in rows), default=0)
    padded = np.zeros((len(rows), width), dtype=np.int64)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = row
    return padded.sum(axis=0).tolist()


def _median_or_none(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return float(np.median(present)) if present else None


def _value_range(values: Sequence[float | None]) -> list[float] | None:
    present = [value for value in values if value is not None]
    return [min(present), max(present)] if present else None


def tie_tolerance(margin_tolerance: float, noise: float | None) -> float:
    """The margin below which a divergence counts as a tie: the configured floor, or more where the target's
    margins were measured to move further than that with batch shape alone."""
    return margin_tolerance if noise is None else max(margin_tolerance, NOISE_FACTOR * noise)


def _equivalence(arm: Arm, plain: Arm, runs: Sequence[RunOutcome], references: Mapping[ReferenceKey, RunResult],
                 tolerance: float, noise: Mapping[ReferenceKey, float]) -> dict | None:
    """The least equivalent of this arm's runs against the plain reference of the same prompt."""
    if arm.mode != plain.mode or arm.synthetic:
        return None  # another prompt, so another text; or drawn acceptance, so not the model's text
    checked: list[tuple[Equivalence, str, float, float | None]] = []
    for run in runs:
        key = (run.step.content_class, run.step.depth, run.step.prompt_index)
        reference = references.get(key)
        if reference is None or reference.tokens is None or run.result.tokens is None:
            continue
        used = tie_tolerance(tolerance, noise.get(key))
        checked.append((compare_greedy(reference.tokens, reference.margins, run.result.tokens, used),
                        run.prompt_id, used, noise.get(key)))
    worst = least_equivalent(result for result, *_ in checked)
    if worst is None:
        return None
    _, prompt_id, used, measured = next(item for item in checked if item[0] is worst)
    counts = {kind: sum(result.kind == kind for result, *_ in checked) for kind in ("identical", "near-tie",
                                                                                     "diverged")}
    return {**worst.to_dict(), "prompt": prompt_id, "tolerance": used, "batch_shape_noise": measured,
            "counts": counts}


def _paired_ratio(runs: Sequence[RunOutcome], baseline: Sequence[RunOutcome]) -> dict | None:
    """Ratio of tok/s to the baseline arm's run in the same round, median and range over the rounds."""
    baseline_by_round = {run.step.repeat: run.result.tokens_per_second for run in baseline}
    pairs = [(run.result.tokens_per_second, baseline_by_round[run.step.repeat])
             for run in runs if run.step.repeat in baseline_by_round]
    if not pairs:
        return None
    ours, theirs = zip(*pairs, strict=True)
    return ratio_range(ours, theirs).to_dict()


def _group_outcomes(outcomes: Sequence[RunOutcome]) -> tuple[dict, dict]:
    """The measured runs and the warm-up throughputs, per (arm, content class, depth)."""
    measured: dict[tuple[str, str, int], list[RunOutcome]] = {}
    warmups: dict[tuple[str, str, int], list[float]] = {}
    for outcome in outcomes:
        key = (outcome.step.arm, outcome.step.content_class, outcome.step.depth)
        if outcome.step.kind == "measure":
            measured.setdefault(key, []).append(outcome)
        elif outcome.step.kind == "warmup":
            warmups.setdefault(key, []).append(outcome.result.tokens_per_second)
    return measured, warmups


def _arm_fields(arm: Arm) -> dict:
    return {
        "arm": arm.name,
        "arm_kind": arm.kind,
        "spec_types": list(arm.spec_types),
        "n_max": arm.n_max,
        "drafter": arm.drafter,
        "force_reject": arm.force_reject,
        "adaptive": arm.adaptive,
        "synthetic": arm.synthetic,
        "mode": arm.mode.to_dict(),
        "mode_label": arm.mode.label,
    }


def _run_fields(runs: Sequence[RunOutcome], warmups: list[float]) -> dict:
    """The runs one by one, and their throughput summarized."""
    results = [run.result for run in runs]
    summary = summarize([result.tokens_per_second for result in results])
    return {
        "filler_tokens": runs[0].filler_tokens,
        "prompt_tokens": _median_or_none([result.n_prompt for result in results]),
        "runs": [result.tokens_per_second for result in results],
        "run_prompts": [run.prompt_id for run in runs],
        "run_contaminated": [run.contaminated for run in runs],
        "n_generated": [result.n_generated for result in results],
        "warmup_discarded": warmups,
        "median_tps": summary.median,
        "min_tps": summary.min,
        "max_tps": summary.max,
        "spread_pct": summary.spread_pct,
        "mad_tps": summary.mad,
        "iqr_tps": summary.iqr,
    }


def _acceptance_fields(results: Sequence[RunResult]) -> dict:
    drafted = sum(result.n_drafted or 0 for result in results)
    accepted = sum(result.n_accepted or 0 for result in results)
    steps = [result.n_steps for result in results if result.n_steps]
    session_lengths = [(result.mean_accepted_length, result.n_steps) for result in results
                       if result.mean_accepted_length is not None and result.n_steps]
    return {
        "acceptance": accepted / drafted if drafted else None,
        # the session's own figure, step-weighted; tokens_per_step is derived from counts instead, so it does
        # not depend on whether an accepted length counts the target's own token
        "mean_accepted_length": (sum(length * n for length, n in session_lengths)
                                 / sum(n for _, n in session_lengths)) if session_lengths else None,
        "tokens_per_step": (sum(result.n_generated for result in results if result.n_steps) / sum(steps)
                            if steps else None),
        "accepted_per_position": sum_by_position([result.accepted_per_position for result in results]),
        "drafted_per_position": sum_by_position([result.drafted_per_position for result in results]),
    }


def _telemetry_fields(runs: Sequence[RunOutcome]) -> dict:
    samples = [sample for run in runs for sample in run.telemetry]
    return {
        "temperature_c": _value_range([sample.temperature_c for sample in samples]),
        "sm_clock_mhz": _value_range([sample.sm_clock_mhz for sample in samples]),
        "power_w": _value_range([sample.power_w for sample in samples]),
    }


def build_records(
    arms: Sequence[Arm],
    outcomes: Sequence[RunOutcome],
    references: Mapping[ReferenceKey, RunResult],
    *,
    preflight_contaminated: bool,
    margin_tolerance: float,
    noise: Mapping[ReferenceKey, float] | None = None,
) -> list[dict]:
    """noise: per plain reference, how far the target's margins moved between plain decoding and a verify-shaped
    batch (teacher-forced on the reference's own tokens); divergences within it count as ties."""
    arms_by_name = {arm.name: arm for arm in arms}
    plain = next(arm for arm in arms if arm.is_plain)
    measured, warmups = _group_outcomes(outcomes)

    # Every figure is marked once anything was seen, not only the runs it was seen in: speedups pair each arm with
    # the plain arm's run of the same round, and a tenant seen once was likely there, below threshold, elsewhere.
    contaminated = preflight_contaminated or any(outcome.contaminated for outcome in outcomes)
    records = []
    for (arm_name, content_class, depth), runs in measured.items():
        arm = arms_by_name[arm_name]
        baseline = arms_by_name.get(arm.compare_to) if arm.compare_to else None
        records.append({
            **_arm_fields(arm),
            "class": content_class,
            "depth": depth,
            **_run_fields(runs, warmups.get((arm_name, content_class, depth), [])),
            **_acceptance_fields([run.result for run in runs]),
            "equal_to_plain": _equivalence(arm, plain, runs, references, margin_tolerance, noise or {}),
            "speedup_vs_plain": None if arm.is_plain else _paired_ratio(runs, measured.get(
                (plain.name, content_class, depth), [])),
            "ratio_to": ({"arm": baseline.name, **(_paired_ratio(runs, measured.get(
                (baseline.name, content_class, depth), [])) or {})} if baseline else None),
            "cold_start_each_run": arm.kind == "speculative-simple",
            "contaminated": contaminated,
            "cotenant_findings": sorted({finding.describe() for run in runs for finding in run.findings}),
            "telemetry": _telemetry_fields(runs),
        })
    return records


def build_breakeven(arms: Sequence[Arm], records: Sequence[dict]) -> list[dict]:
    """Break-even analysis for every speculative arm that has a forced-reject twin, per content class."""
    by_key = {(record["arm"], record["class"], record["depth"]): record for record in records}
    plain = next(arm for arm in arms if arm.is_plain)
    analyses = []
    for twin in arms:
        if not twin.force_reject or twin.compare_to is None:
            continue
        spec = twin.compare_to
        for content_class in dict.fromkeys(record["class"] for record in records):
            # a twin that drafted nothing measured no speculation cost, only noise (an n-gram arm with no match)
            depths = sorted(depth for arm, cls, depth in by_key
                            if arm == spec and cls == content_class and (plain.name, cls, depth) in by_key
                            and (twin.name, cls, depth) in by_key
                            and by_key[(twin.name, cls, depth)]["acceptance"] is not None)
            spec_records = [by_key[(spec, content_class, depth)] for depth in depths]
            n_max = next((arm.n_max for arm in arms if arm.name == spec), None) \
                or max((len(record["drafted_per_position"]) for record in spec_records), default=0) or None
            analyses.append(breakeven.analyse(
                spec, content_class, n_max, depths,
                plain_tps=[by_key[(plain.name, content_class, depth)]["median_tps"] for depth in depths],
                forced_reject_tps=[by_key[(twin.name, content_class, depth)]["median_tps"] for depth in depths],
                tokens_per_step=[record["tokens_per_step"] for record in spec_records],
            ).to_dict())
    return analyses
