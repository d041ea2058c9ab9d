"""Shipped prompt sets and the deterministic context-depth filler."""

import pytest

from pyllamaspec.bench.workloads import CONTENT_CLASSES, DepthFiller, compose_user_message, load_prompt_set
from pyllamaspec.errors import ConfigError


def count_words_with_bos(text):
    return len(text.split()) + 1


def count_chars_per_four_with_bos(text):
    return len(text) // 4 + 1


@pytest.mark.parametrize("content_class", CONTENT_CLASSES)
def test_each_shipped_prompt_set_has_several_labelled_prompts(content_class):
    prompts = load_prompt_set(content_class)
    assert len(prompts) >= 3
    assert len({prompt.id for prompt in prompts}) == len(prompts)
    assert all(prompt.text.strip() and prompt.label.strip() for prompt in prompts)
    assert all(prompt.content_class == content_class for prompt in prompts)


def test_unknown_class_is_refused():
    with pytest.raises(ConfigError):
        load_prompt_set("poetry")


def test_filler_has_the_requested_token_count_not_counting_bos():
    filler = DepthFiller(count_words_with_bos)
    for depth in (1, 100, 1000):
        assert filler.tokens_in(filler.text(depth)) == depth
    assert filler.text(0) == ""


def test_filler_never_exceeds_the_depth_and_stays_within_a_word_of_it():
    filler = DepthFiller(count_chars_per_four_with_bos)
    for depth in (50, 333, 2048):
        text = filler.text(depth)
        assert depth - 5 <= filler.tokens_in(text) <= depth


def test_filler_is_deterministic_whatever_order_depths_are_asked_in():
    ascending = DepthFiller(count_words_with_bos, seed=7)
    descending = DepthFiller(count_words_with_bos, seed=7)
    shallow, deep = ascending.text(50), ascending.text(500)
    assert descending.text(500) == deep and descending.text(50) == shallow
    assert deep.startswith(shallow)
    assert DepthFiller(count_words_with_bos, seed=8).text(500) != deep


def test_user_message_puts_filler_before_the_task():
    assert compose_user_message("Write a haiku.", "") == "Write a haiku."
    message = compose_user_message("Write a haiku.", "Some background.")
    assert message.index("Some background.") < message.index("Write a haiku.")
    assert message.endswith("Write a haiku.")
