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
from pyllamaspec.errors import ConfigError

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
        progress: Callable[[str], None] = lambda message: None,
    ):
        plain_arms = [arm for arm in arms if arm.is_plain]
        if len(plain_arms) != 1:
            raise ConfigError(f"a benchmark needs exactly one plain arm to compare against, got {len(plain_arms)}")
        missing = sorted({arm.kind for arm in arms} - set(backends))
        if missing:
            raise ConfigError(f"no backend for arm kind(s) {', '.join(missing)}")
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
        return math.ceil(needed / CONTEXT_ALIGNMENT_TOKENS) * CONTEXT_ALIGNMENT_TOKENS

    def _cool_down(self) -> dict | None:
        if self.settings.cooling_gate_c is None or self.telemetry is None:
            return None
        result = wait_until_cool(self.telemetry.hottest_c, self.settings.cooling_gate_c,
                                 self.settings.cooling_max_wait_s, clock=self.clock, sleep=self.sleep)
        return result.to_dict()

    def _measure(self, step: Step, arm: Arm, prompt: RenderedPrompt, n_ctx: int, prompt_id: str,
                 filler_tokens: int) -> RunOutcome:
        """One timed run inside a co-tenant window, then a telemetry sample."""
        if self.detector is not None:
            self.detector.begin_window()
        result = self.backends[arm.kind].generate(arm, prompt, self.settings.n_predict, n_ctx=n_ctx, margins=False)
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
        cooling: list[dict] = []
        for number, step in enumerate(schedule, start=1):
            arm = arms_by_name[step.arm]
            backend = self.backends[arm.kind]
            prompt = workloads[(step.content_class, step.depth, step.prompt_index, arm.mode)]
            self.progress(f"[{number}/{len(schedule)}] {step.kind} {arm.name} {step.content_class} "
                          f"depth {step.depth}" + (f" round {step.repeat}" if step.repeat is not None else ""))
            if step.kind == "reference":
                references[(step.content_class, step.depth, step.prompt_index)] = backend.generate(
                    arm, prompt, settings.n_predict, n_ctx=n_ctx, margins=True)
                continue
            if step.kind == "measure" and step.arm == self.arms[0].name:
                gate = self._cool_down()  # between rounds, so every arm of a round starts from the same state
                if gate is not None:
                    cooling.append({"content_class": step.content_class, "depth": step.depth,
                                    "round": step.repeat, **gate})
            prompt_id = self.prompts[step.content_class][step.prompt_index].id
            if step.kind == "warmup":
                result = backend.generate(arm, prompt, settings.n_predict, n_ctx=n_ctx, margins=False)
                outcomes.append(RunOutcome(step, result, prompt_id, filler_tokens[step.depth]))
                continue
            outcomes.append(self._measure(step, arm, prompt, n_ctx, prompt_id, filler_tokens[step.depth]))

        records = build_records(self.arms, outcomes, references, preflight_contaminated=preflight_contaminated,
                                margin_tolerance=settings.margin_tolerance)
        return {
            "arms": [arm.to_dict() for arm in self.arms],
            "records": records,
            "breakeven": build_breakeven(self.arms, records),
            "mixed_modes": mixed_modes,
            "n_ctx": n_ctx,
            "cotenant": {
                "policy": settings.cotenant_policy,
                "preflight": [finding.to_dict() for finding in preflight],
                "contaminated_runs": sum(outcome.contaminated for outcome in outcomes),
                "uninspectable_processes": len(self.detector.uninspectable) if self.detector else None,
            },
            "cooling": cooling,
        }
