"""What gets measured, and in which order.

Arms are interleaved within each (content class, depth) round - A B C, B C A, C A B, ... - so slow drift (heat, a
background job, the page cache) lands on every arm alike instead of on whichever arm happened to run last, and the
order turns by one place every round, so that what one arm leaves behind (a GPU's clocks after its load or after a
pause) does not always fall on the same next arm.
The first response after a model load is slow, so every arm's first generation is a discarded warm-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from pyllamaspec.errors import ConfigError

DEFAULT_REPEATS = 8

PLAIN_ARM_NAME = "plain"


@dataclass(frozen=True)
class PromptMode:
    """How a prompt is presented: through the chat template or raw, and with reasoning (thinking) on or off."""

    chat_template: bool = True
    reasoning: bool | None = None  # enable_thinking for the template; None keeps the template's own default

    def __post_init__(self) -> None:
        if not self.chat_template and self.reasoning is not None:
            raise ConfigError("reasoning is switched through the chat template; a raw prompt cannot set it "
                              "(use --reasoning default with --chat-template off)")

    @property
    def label(self) -> str:
        if not self.chat_template:
            return "raw prompt"
        return f"chat template, reasoning {({True: 'on', False: 'off', None: 'template default'})[self.reasoning]}"

    def to_dict(self) -> dict:
        return asdict(self)


ArmKind = Literal["session", "speculative-simple", "llama-cpp-python"]


@dataclass(frozen=True)
class Arm:
    """One configuration under test."""

    name: str
    spec_types: tuple[str, ...] = ("none",)
    n_max: int | None = None  # None: the session's default
    drafter: str | None = None  # label of the drafter model
    force_reject: bool = False  # every draft rejected: measures what speculating costs at zero acceptance
    kind: ArmKind = "session"
    mode: PromptMode = PromptMode()
    compare_to: str | None = None  # the arm this one is reported as a ratio to (external arms, forced twins)
    adaptive: bool | None = None  # draft lengths chosen per step (True), fixed (False), the session's default (None)
    synthetic: bool = False  # acceptance is drawn, not checked: a speed measurement whose output is not the model's

    @property
    def is_plain(self) -> bool:
        return self.kind == "session" and self.spec_types == ("none",) and not self.force_reject

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "spec_types": list(self.spec_types), "n_max": self.n_max,
                "drafter": self.drafter, "force_reject": self.force_reject, "mode": self.mode.to_dict(),
                "compare_to": self.compare_to, "adaptive": self.adaptive, "synthetic": self.synthetic}


def spec_arm_name(spec_types: Sequence[str], n_max: int | None, drafter: str | None,
                  adaptive: bool | None = None) -> str:
    name = "+".join(spec_types)
    if n_max is not None:
        name += f"/n{n_max}"
    if adaptive is not None:
        name += "/adaptive" if adaptive else "/fixed"
    if drafter is not None:
        name += f"@{drafter}"
    return name


class MixedModesError(ConfigError):
    """Arms differ in chat-template or reasoning mode, which would be misread as a drafter difference."""


def check_modes(arms: Sequence[Arm], force: bool = False) -> bool:
    """Refuse arms whose prompt modes differ unless forced; returns whether the modes are mixed."""
    modes = {arm.mode for arm in arms}
    if len(modes) <= 1:
        return False
    if not force:
        listed = "; ".join(f"{arm.name}: {arm.mode.label}" for arm in arms)
        raise MixedModesError(f"arms use different prompt modes ({listed}); a reasoning or template difference "
                              f"swamps any drafter difference. Use one mode, or --force-mixed-modes to compare "
                              f"anyway (the report marks it)")
    return True


StepKind = Literal["warmup", "reference", "measure"]


@dataclass(frozen=True)
class Step:
    """One generation. Warm-ups are discarded; references are untimed plain runs that record logit margins
    (margins cost time, so the timed plain runs never collect them); measurements are the figures."""

    kind: StepKind
    arm: str
    content_class: str
    depth: int
    prompt_index: int
    repeat: int | None = None  # the round, for measurements
    place: int | None = None   # the measurement's place in its round (0: the round's first)


def build_schedule(
    arms: Sequence[str],
    classes: Sequence[str],
    depths: Sequence[int],
    prompts_per_class: Mapping[str, int],
    repeats: int = DEFAULT_REPEATS,
    reference_arm: str = PLAIN_ARM_NAME,
) -> list[Step]:
    """Warm-ups first (one per arm), then per (class, depth): the reference runs, then ``repeats`` rounds of
    every arm, round r starting with arm r mod (arms) and going on in order. Round r uses prompt r mod (prompts in
    the class), the same prompt for every arm."""
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    if not arms or not classes or not depths:
        raise ConfigError("a schedule needs at least one arm, one content class and one depth")
    if reference_arm not in arms:
        raise ConfigError(f"the reference arm {reference_arm!r} is not among the arms {list(arms)}")
    schedule = [Step("warmup", arm, classes[0], depths[0], 0) for arm in arms]
    for content_class in classes:
        n_prompts = prompts_per_class[content_class]
        for depth in depths:
            used_prompts = sorted({repeat % n_prompts for repeat in range(repeats)})
            schedule += [Step("reference", reference_arm, content_class, depth, index) for index in used_prompts]
            for repeat in range(repeats):
                turn = repeat % len(arms)
                schedule += [Step("measure", arm, content_class, depth, repeat % n_prompts, repeat, place)
                             for place, arm in enumerate(list(arms[turn:]) + list(arms[:turn]))]
    return schedule
