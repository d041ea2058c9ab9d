"""Runs a benchmark plan: co-tenant checks, cooling gate, the interleaved schedule, and aggregation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyllamaspec.bench.backends import ArmBackend, PromptRenderer, RenderedPrompt, RunResult
from pyllamaspec.bench.cotenant import CotenantDetector, CotenantPolicy, GpuTelemetry, enforce, wait_until_cool
from pyllamaspec.bench.equivalence import DEFAULT_MARGIN_TOLERANCE
from pyllamaspec.bench.plan import DEFAULT_REPEATS, Arm, PromptMode, Step, build_schedule, check_modes
from pyllamaspec.bench.results import ReferenceKey, RunOutcome, build_breakeven, build_records
from pyllamaspec.bench.workloads import DepthFiller, Prompt, compose_user_message
from pyllamaspec.config import SessionConfig
from pyllamaspec.errors import ConfigError

# A speculative arm without an explicit n_max drafts the session default.
DEFAULT_N_MAX = SessionConfig.n_max

# Room past the longest prompt plus n_predict: the last speculative step may draft beyond the final token.
CONTEXT_HEADROOM_TOKENS = 64
CONTEXT_ALIGNMENT_TOKENS = 256


@dataclass(frozen=True)
class BenchSettings:
    classes: tuple[str, ...]
    depths: tuple[int, ...]
    repeats: int = DEFAULT_REPEATS
    n_predict: int = 128
    cotenant_policy: CotenantPolicy = "flag"
    margin_tolerance: float = DEFAULT_MARGIN_TOLERANCE
    cooling_gate_c: float | None = None  # wait before every round until the hottest GPU is below this
    cooling_max_wait_s: float = 300.0
    force_mixed_modes: bool = False
    filler_seed: int = 0
    n_ctx: int | None = None  # None: just enough for the deepest prompt, the same for every arm and depth
    parallel: int = 1  # streams decoded together in every run: this prompt and the class's next ones


class BenchRunner:
    def __init__(
        self,
        arms: Sequence[Arm],
        backends: Mapping[str, ArmBackend],
        renderer: PromptRenderer,
        prompts: Mapping[str, Sequence[Prompt]],
        settings: BenchSettings,
        *,
        detector: CotenantDetector | None = None,
        telemetry: GpuTelemetry | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        progress: Callable[[int, int, str], None] = lambda done, total, message: None,
    ):
        plain_arms = [arm for arm in arms if arm.is_plain]
        if len(plain_arms) != 1:
            raise ConfigError(f"a benchmark needs exactly one plain arm to compare against, got {len(plain_arms)}")
        missing = sorted({arm.kind for arm in arms} - set(backends))
        if missing:
            raise ConfigError(f"no backend for arm kind(s) {', '.join(missing)}")
        if settings.parallel < 1:
            raise ConfigError(f"parallel={settings.parallel}: at least one stream per run")
        if settings.parallel > 1:
            single = sorted({arm.kind for arm in arms if not hasattr(backends[arm.kind], "generate_streams")})
            if single:
                raise ConfigError(f"arm kind(s) {', '.join(single)} run one stream at a time; drop them or --parallel")
        self.arms = list(arms)
        self.plain = plain_arms[0]
        self.backends = backends
        self.renderer = renderer
        self.prompts = prompts
        self.settings = settings
        self.detector = detector
        self.telemetry = telemetry
        self.clock = clock
        self.sleep = sleep
        self.progress = progress

    def _render_workloads(self) -> tuple[dict[tuple, RenderedPrompt], dict[int, int]]:
        """Every prompt at every depth in every mode in use, rendered before any timing starts."""
        filler = DepthFiller(self.renderer.count_tokens, seed=self.settings.filler_seed)
        filler_tokens = {depth: filler.tokens_in(filler.text(depth)) for depth in self.settings.depths}
        modes: list[PromptMode] = list(dict.fromkeys(arm.mode for arm in self.arms))
        workloads = {}
        for content_class in self.settings.classes:
            for depth in self.settings.depths:
                for index, prompt in enumerate(self.prompts[content_class]):
                    message = compose_user_message(prompt.text, filler.text(depth))
                    for mode in modes:
                        workloads[(content_class, depth, index, mode)] = self.renderer.render(message, mode)
        return workloads, filler_tokens

    def _context_size(self, workloads: Mapping[tuple, RenderedPrompt]) -> int:
        if self.settings.n_ctx is not None:
            return self.settings.n_ctx
        longest = max(len(prompt.tokens) for prompt in workloads.values())
        needed = longest + self.settings.n_predict + CONTEXT_HEADROOM_TOKENS
        # streams share the context equally, so each gets what one run alone would
        return math.ceil(needed / CONTEXT_ALIGNMENT_TOKENS) * CONTEXT_ALIGNMENT_TOKENS * self.settings.parallel

    def _generate(self, arm: Arm, step: Step, workloads: Mapping[tuple, RenderedPrompt], n_ctx: int,
                  margins: bool) -> RunResult:
        """One run of an arm on a step's prompt; with parallel > 1 the class's next prompts run beside it as
        further streams, and the result is stream 0's tokens with the total throughput."""
        backend = self.backends[arm.kind]
        key = (step.content_class, step.depth)
        prompt = workloads[(*key, step.prompt_index, arm.mode)]
        if self.settings.parallel == 1:
            return backend.generate(arm, prompt, self.settings.n_predict, n_ctx=n_ctx, margins=margins)
        count = len(self.prompts[step.content_class])
        prompts = [workloads[(*key, (step.prompt_index + k) % count, arm.mode)] for k in range(self.settings.parallel)]
        return backend.generate_streams(arm, prompts, self.settings.n_predict, n_ctx=n_ctx, margins=margins)

    def _batch_shape_noise(self, arm: Arm, step: Step, workloads: Mapping[tuple, RenderedPrompt],
                           reference: RunResult, n_ctx: int) -> float | None:
        """How far the target's margins on the reference's own tokens move when they are decoded in verify-sized
        batches instead of one at a time; None where the backend cannot tell."""
        backend = self.backends[arm.kind]
        if not hasattr(backend, "score_margins") or not reference.tokens or not reference.margins:
            return None
        speculative = [a for a in self.arms if not a.is_plain]
        if not speculative:
            return None
        chunk = max((a.n_max or DEFAULT_N_MAX) + 1 for a in speculative)  # the largest verify batch
        prompt = workloads[(step.content_class, step.depth, step.prompt_index, arm.mode)]
        batched = backend.score_margins(prompt, reference.tokens, chunk, n_ctx=n_ctx)
        return max(abs(a - b) for a, b in zip(batched, reference.margins))

    def _cool_down(self) -> dict | None:
        if self.settings.cooling_gate_c is None or self.telemetry is None:
            return None
        result = wait_until_cool(self.telemetry.hottest_c, self.settings.cooling_gate_c,
                                 self.settings.cooling_max_wait_s, clock=self.clock, sleep=self.sleep)
        return result.to_dict()

    def _measure(self, step: Step, arm: Arm, workloads: Mapping[tuple, RenderedPrompt], n_ctx: int, prompt_id: str,
                 filler_tokens: int) -> RunOutcome:
        """One timed run inside a co-tenant window, then a telemetry sample."""
        if self.detector is not None:
            self.detector.begin_window()
        result = self._generate(arm, step, workloads, n_ctx, margins=False)
        findings = self.detector.end_window() if self.detector is not None else []
        contaminated = enforce(findings, self.settings.cotenant_policy,
                               f"during {arm.name} on {step.content_class} at depth {step.depth}, "
                               f"round {step.repeat}")
        samples = self.telemetry.sample() if self.telemetry is not None else []
        return RunOutcome(step, result, prompt_id, filler_tokens, findings, contaminated, samples)

    def run(self) -> dict:
        settings = self.settings
        mixed_modes = check_modes(self.arms, settings.force_mixed_modes)
        # before any model is loaded: our own process must not yet be a GPU user
        preflight = self.detector.preflight() if self.detector is not None else []
        preflight_contaminated = enforce(preflight, settings.cotenant_policy, "before the run")

        workloads, filler_tokens = self._render_workloads()
        n_ctx = self._context_size(workloads)
        arms_by_name = {arm.name: arm for arm in self.arms}
        schedule = build_schedule([arm.name for arm in self.arms], settings.classes, settings.depths,
                                  {cls: len(self.prompts[cls]) for cls in settings.classes}, settings.repeats,
                                  reference_arm=self.plain.name)
        outcomes: list[RunOutcome] = []
        references: dict[ReferenceKey, RunResult] = {}
        noise: dict[ReferenceKey, float] = {}
        cooling: list[dict] = []
        for number, step in enumerate(schedule, start=1):
            arm = arms_by_name[step.arm]
            self.progress(number - 1, len(schedule), f"{step.kind} {arm.name} {step.content_class} depth {step.depth}"
                          + (f" round {step.repeat}" if step.repeat is not None else ""))
            if step.kind == "reference":
                key = (step.content_class, step.depth, step.prompt_index)
                references[key] = self._generate(arm, step, workloads, n_ctx, margins=True)
                measured = self._batch_shape_noise(arm, step, workloads, references[key], n_ctx)
                if measured is not None:
                    noise[key] = measured
                continue
            if step.kind == "measure" and step.place == 0:
                gate = self._cool_down()  # between rounds, so every arm of a round starts from the same state
                if gate is not None:
                    cooling.append({"content_class": step.content_class, "depth": step.depth,
                                    "round": step.repeat, **gate})
            prompt_id = self.prompts[step.content_class][step.prompt_index].id
            if step.kind == "warmup":
                result = self._generate(arm, step, workloads, n_ctx, margins=False)
                outcomes.append(RunOutcome(step, result, prompt_id, filler_tokens[step.depth]))
                continue
            outcomes.append(self._measure(step, arm, workloads, n_ctx, prompt_id, filler_tokens[step.depth]))

        self.progress(len(schedule), len(schedule), "")
        records = build_records(self.arms, outcomes, references, preflight_contaminated=preflight_contaminated,
                                margin_tolerance=settings.margin_tolerance, noise=noise)
        return {
            "arms": [arm.to_dict() for arm in self.arms],
            "records": records,
            "breakeven": build_breakeven(self.arms, records),
            "mixed_modes": mixed_modes,
            "n_ctx": n_ctx,
            "parallel": settings.parallel,
            "cotenant": {
                "policy": settings.cotenant_policy,
                "preflight": [finding.to_dict() for finding in preflight],
                "contaminated_runs": sum(outcome.contaminated for outcome in outcomes),
                "uninspectable_processes": len(self.detector.uninspectable) if self.detector else None,
            },
            "cooling": cooling,
        }
