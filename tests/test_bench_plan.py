"""The schedule: warm-ups first, references before each block, arms interleaved round by round in an order that
turns every round."""

import pytest

from pyllamaspec.bench.plan import (DEFAULT_REPEATS, Arm, MixedModesError, PromptMode, build_schedule,
                                    check_modes, spec_arm_name)
from pyllamaspec.errors import ConfigError

ARMS = ["plain", "B", "C"]


def schedule(**overrides):
    options = {"arms": ARMS, "classes": ["code", "prose"], "depths": [0, 4096],
               "prompts_per_class": {"code": 2, "prose": 5}, "repeats": 3}
    return build_schedule(**{**options, **overrides})


def test_one_warmup_per_arm_comes_first():
    steps = schedule()
    warmups = [step for step in steps if step.kind == "warmup"]
    assert steps[:3] == warmups
    assert [step.arm for step in warmups] == ARMS
    assert all((step.content_class, step.depth) == ("code", 0) for step in warmups)


def test_arms_are_interleaved_round_by_round_within_each_block():
    measured = [step for step in schedule() if step.kind == "measure"]
    assert len(measured) == 3 * 2 * 2 * 3
    first_block = measured[:9]
    # the order turns by one place every round: no arm always follows the same one
    assert [step.arm for step in first_block] == ["plain", "B", "C", "B", "C", "plain", "C", "plain", "B"]
    assert [step.place for step in first_block] == [0, 1, 2] * 3
    assert [step.repeat for step in first_block] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # every arm of a round gets the same prompt; rounds cycle through the class's prompts
    assert [step.prompt_index for step in first_block] == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    blocks = list(dict.fromkeys((step.content_class, step.depth) for step in measured))
    assert blocks == [("code", 0), ("code", 4096), ("prose", 0), ("prose", 4096)]


def test_untimed_references_precede_each_block_once_per_prompt_used():
    steps = schedule()
    for content_class, depth, prompts_used in [("code", 0, [0, 1]), ("prose", 4096, [0, 1, 2])]:
        block = [index for index, step in enumerate(steps)
                 if (step.content_class, step.depth) == (content_class, depth) and step.kind != "warmup"]
        references = [steps[index] for index in block if steps[index].kind == "reference"]
        assert [step.prompt_index for step in references] == prompts_used
        assert all(step.arm == "plain" for step in references)
        assert max(index for index in block if steps[index].kind == "reference") < \
            min(index for index in block if steps[index].kind == "measure")


def test_default_repeats_is_at_least_eight():
    assert DEFAULT_REPEATS >= 8
    measured = [s for s in build_schedule(["plain"], ["code"], [0], {"code": 1}) if s.kind == "measure"]
    assert len(measured) == DEFAULT_REPEATS


def test_invalid_schedules_are_refused():
    with pytest.raises(ConfigError):
        schedule(repeats=0)
    with pytest.raises(ConfigError):
        schedule(arms=["B", "C"])  # no plain reference arm


def test_arms_in_different_prompt_modes_are_refused_unless_forced():
    thinking = PromptMode(chat_template=True, reasoning=True)
    arms = [Arm("plain"), Arm("draft", ("draft-simple",), drafter="q4", mode=thinking)]
    with pytest.raises(MixedModesError, match="reasoning on"):
        check_modes(arms)
    assert check_modes(arms, force=True) is True
    assert check_modes([Arm("plain"), Arm("ngram", ("ngram-mod",))]) is False


def test_mode_labels_say_what_the_model_saw():
    assert PromptMode(chat_template=False).label == "raw prompt"
    with pytest.raises(ConfigError, match="raw prompt"):
        PromptMode(chat_template=False, reasoning=True)
    assert PromptMode(chat_template=True, reasoning=False).label == "chat template, reasoning off"
    assert PromptMode().label == "chat template, reasoning template default"


def test_arm_names_and_plainness():
    assert spec_arm_name(("ngram-mod", "draft-simple"), 8, "q8") == "ngram-mod+draft-simple/n8@q8"
    assert spec_arm_name(("ngram-mod",), None, None) == "ngram-mod"
    assert Arm("plain").is_plain
    assert not Arm("x", force_reject=True).is_plain
    assert not Arm("lcp", kind="llama-cpp-python").is_plain
