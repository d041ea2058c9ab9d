"""The interface between the harness and whatever generates tokens, and the adapter onto pyllamaspec's sessions.

The harness only ever sees ``RunResult``s, so tests drive it with fakes and external arms (upstream's binary,
llama-cpp-python) plug in beside the session adapter. The session API is imported lazily, inside the adapter,
so the rest of the bench package imports without the native library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyllamaspec.bench.plan import Arm, PromptMode
from pyllamaspec.errors import ConfigError


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt as the model receives it: the rendered text (for arms that take text) and its tokens."""

    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class RunResult:
    """One generation's outcome, in the harness's terms."""

    tokens_per_second: float  # decode speed, prefill excluded
    n_generated: int
    tokens: tuple[int, ...] | None = None  # None when the arm cannot report them (upstream's binary)
    margins: tuple[float, ...] | None = None  # target top1-top2 logit margin per generated token
    n_prompt: int | None = None
    n_steps: int | None = None
    n_drafted: int | None = None
    n_accepted: int | None = None
    mean_accepted_length: float | None = None
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    finish_reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_session_result(cls, result: Any) -> RunResult:
        return cls.from_stats(result.stats, result.tokens, result.margins, result.finish_reason)

    @classmethod
    def from_stats(cls, stats: Any, tokens: Any, margins: Any, finish_reason: str | None) -> RunResult:
        return cls(
            tokens_per_second=float(stats.tokens_per_second),
            n_generated=int(stats.n_generated),
            tokens=tuple(tokens),
            margins=tuple(margins) if margins else None,
            n_prompt=stats.n_prompt,
            n_steps=stats.n_steps,
            n_drafted=stats.n_drafted,
            n_accepted=stats.n_accepted,
            mean_accepted_length=stats.mean_accepted_length,
            accepted_per_position=tuple(stats.accepted_per_position),
            drafted_per_position=tuple(stats.drafted_per_position),
            finish_reason=finish_reason,
            timings_ms={phase: getattr(stats, f"t_{phase}_ms")
                        for phase in ("prefill", "draft", "verify", "rollback", "sample", "decode")},
        )


class ArmBackend(Protocol):
    """Runs generations for arms of one kind."""

    def generate(self, arm: Arm, prompt: RenderedPrompt, n_predict: int, *, n_ctx: int,
                 margins: bool) -> RunResult: ...

    def close(self) -> None: ...


class PromptRenderer(Protocol):
    """Turns text into what the target model receives."""

    def count_tokens(self, text: str) -> int: ...

    def render(self, user_message: str, mode: PromptMode) -> RenderedPrompt: ...


class PyllamaspecBackend:
    """Adapter onto pyllamaspec's Model / SpecSession: loads each model once, opens a fresh session per run.

    A fresh session per run keeps runs independent: n-gram drafters learn from what they have seen, and a session
    reused across repeats of the same prompt would draft the remembered answer. Models stay loaded, so the
    first-after-load slowness hits only each arm's warm-up.
    """

    def __init__(
        self,
        target_path: str | Path,
        drafter_paths: Mapping[str, str | Path] | None = None,
        *,
        n_gpu_layers: int = -1,
        n_threads: int | None = None,
        seed: int = 0,
        api: Any = None,
        target_options: Mapping[str, Any] | None = None,
        drafter_options: Mapping[str, Any] | None = None,
        session_options: Mapping[str, Any] | None = None,
        speculative_options: Mapping[str, Any] | None = None,
    ):
        """target_options / drafter_options: ModelConfig fields (the drafter takes n_gpu_layers unless its
        options set it); session_options: SessionConfig fields of every arm's session; speculative_options:
        those of the speculative arms only (draft length floor, n-gram settings)."""
        self.target_path = Path(target_path)
        self.drafter_paths = {label: Path(path) for label, path in (drafter_paths or {}).items()}
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads
        self.seed = seed
        self.target_options = {k: v for k, v in (target_options or {}).items() if k != "n_gpu_layers"}
        self.drafter_options = {"n_gpu_layers": n_gpu_layers, **(drafter_options or {})}
        self.session_options = dict(session_options or {})
        self.speculative_options = dict(speculative_options or {})
        self._api = api
        self._target = None
        self._drafters: dict[str, Any] = {}

    @property
    def api(self) -> Any:
        if self._api is None:
            import pyllamaspec

            self._api = pyllamaspec
        return self._api

    def describe(self) -> dict:
        """The build and the devices it sees (``pyllamaspec.info()``); needs the native library, not a model."""
        return dict(self.api.info())

    def _loaded_target(self) -> Any:
        if self._target is None:
            self._target = self.api.Model(str(self.target_path), n_gpu_layers=self.n_gpu_layers,
                                          **self.target_options)
            drafter_options = dict(self.drafter_options)
            if self.target_options.get("rpc") and "devices" not in drafter_options:
                # remote devices: the drafter goes where the target's head is, as generate and serve place it
                from ..config import ModelConfig
                from ..placement import drafter_config

                target_cfg = ModelConfig(n_gpu_layers=self.n_gpu_layers, **self.target_options)
                drafter_options["devices"] = drafter_config(self.target_path, target_cfg,
                                                            ModelConfig(**drafter_options)).devices
            self._drafters = {label: self.api.Model(str(path), **drafter_options)
                              for label, path in self.drafter_paths.items()}
        return self._target

    def count_tokens(self, text: str) -> int:
        return len(self._loaded_target().tokenize(text))

    def render(self, user_message: str, mode: PromptMode) -> RenderedPrompt:
        target = self._loaded_target()
        text = user_message
        if mode.chat_template:
            messages = [{"role": "user", "content": user_message}]
            text = target.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=mode.reasoning)
            if mode.reasoning is not None and text == target.apply_chat_template(
                    messages, add_generation_prompt=True, enable_thinking=not mode.reasoning):
                # the template ignores enable_thinking: the run would be labelled with a mode it does not have
                raise ConfigError(f"the chat template of {self.target_path.name} does not switch on enable_thinking; "
                                  f"use --reasoning default")
        return RenderedPrompt(text, tuple(target.tokenize(text)))

    def session_config(self, arm: Arm, *, n_ctx: int, margins: bool, n_parallel: int = 1) -> Any:
        fields: dict[str, Any] = dict(self.session_options)
        if arm.spec_types != ("none",):
            fields.update(self.speculative_options)
        fields.update({"spec_types": list(arm.spec_types), "n_ctx": n_ctx, "temp": 0.0, "seed": self.seed,
                       "margins": margins, "force_reject": arm.force_reject})
        if n_parallel > 1:
            fields["n_parallel"] = n_parallel
        # unset values keep the session's defaults rather than a second copy of them here
        if arm.n_max is not None:
            fields["n_max"] = arm.n_max
        if arm.adaptive is not None and arm.spec_types != ("none",):
            fields["adaptive"] = arm.adaptive
        if self.n_threads is not None:
            fields["n_threads"] = fields["n_threads_batch"] = self.n_threads
        return self.api.SessionConfig(**fields)

    def generate(self, arm: Arm, prompt: RenderedPrompt, n_predict: int, *, n_ctx: int,
                 margins: bool) -> RunResult:
        target = self._loaded_target()
        drafter = self._drafters[arm.drafter] if arm.drafter is not None else None
        config = self.session_config(arm, n_ctx=n_ctx, margins=margins)
        with self.api.SpecSession(target=target, drafter=drafter, config=config) as session:
            return RunResult.from_session_result(session.generate(list(prompt.tokens), n_predict=n_predict))

    def score_margins(self, prompt: RenderedPrompt, continuation: tuple[int, ...], chunk: int, *,
                      n_ctx: int) -> list[float]:
        """The target's margins on a fixed continuation, decoded in batches of ``chunk`` tokens."""
        fields: dict[str, Any] = dict(self.session_options)
        if self.n_threads is not None:
            fields["n_threads"] = fields["n_threads_batch"] = self.n_threads
        # a plain session keeps logits for n_max + 1 tokens per batch
        fields.update({"spec_types": [], "n_ctx": n_ctx, "n_max": chunk - 1})
        config = self.api.SessionConfig(**fields)
        with self.api.SpecSession(target=self._loaded_target(), drafter=None, config=config) as session:
            return session.score_margins(list(prompt.tokens), list(continuation), chunk)

    def generate_streams(self, arm: Arm, prompts: list[RenderedPrompt], n_predict: int, *, n_ctx: int,
                         margins: bool) -> RunResult:
        """Several prompts as streams of one session (n_parallel): stream 0's tokens, and the counters and
        throughput of all streams together."""
        target = self._loaded_target()
        drafter = self._drafters[arm.drafter] if arm.drafter is not None else None
        config = self.session_config(arm, n_ctx=n_ctx, margins=margins, n_parallel=len(prompts))
        with self.api.SpecSession(target=target, drafter=drafter, config=config) as session:
            results = session.generate_batch([list(p.tokens) for p in prompts], n_predict=n_predict)
            total = session.stats()
        first = results[0]
        return RunResult.from_stats(total, first.tokens, first.margins, first.finish_reason)

    def close(self) -> None:
        for model in [self._target, *self._drafters.values()]:
            if model is not None:
                model.close()
        self._target, self._drafters = None, {}
