"""Chat templates through llama.cpp's Jinja engine: enable_thinking, template overrides, long templates, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from clirun import CLI

from pyllamaspec import Model
from pyllamaspec.bench.backends import PyllamaspecBackend
from pyllamaspec.bench.plan import PromptMode
from pyllamaspec.errors import ChatTemplateError, ConfigError

from ckptfactory import CHATML_TEMPLATE, write_target_gguf
from helpers import QWEN3_STYLE

EMPTY_THINK = "<think>\n\n</think>\n\n"
HELLO = [{"role": "user", "content": "hello"}]
USER_TURN = "<|im_start|>user\nhello<|im_end|>\n"

# over 4 KiB of template: a default system prompt that ends in a marker, so a cut template would show
LONG_SYSTEM = "aa " * 1500 + "END-OF-SYSTEM"
LONG_TEMPLATE = (
    "{%- if messages[0].role != 'system' %}"
    "{{- '<|im_start|>system\\n" + LONG_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}" + QWEN3_STYLE
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    return {name: write_target_gguf(d / f"{name}.gguf", chat_template=template) for name, template in
            (("qwen3", QWEN3_STYLE), ("chatml", CHATML_TEMPLATE), ("none", None), ("long", LONG_TEMPLATE))}


def test_enable_thinking_switches_the_thinking_block(models):
    with Model(models["qwen3"]) as m:
        off = m.apply_chat_template(HELLO, enable_thinking=False)
        on = m.apply_chat_template(HELLO, enable_thinking=True)
        default = m.apply_chat_template(HELLO)
    assert off == USER_TURN + "<|im_start|>assistant\n" + EMPTY_THINK
    assert on == USER_TURN + "<|im_start|>assistant\n"
    assert default == on  # llama.cpp's default passes enable_thinking = true


def test_add_generation_prompt_and_several_messages(models):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    with Model(models["qwen3"]) as m:
        text = m.apply_chat_template(messages, add_generation_prompt=False, enable_thinking=False)
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n")


def test_a_template_override_replaces_the_models_own(models):
    with Model(models["chatml"]) as m:
        assert m.apply_chat_template(HELLO, template=QWEN3_STYLE, enable_thinking=False).endswith(EMPTY_THINK)
        assert EMPTY_THINK not in m.apply_chat_template(HELLO, enable_thinking=False)  # its own ignores it


def test_a_model_without_a_template_gets_a_typed_error_unless_one_is_given(models):
    with Model(models["none"]) as m:
        assert m.chat_template is None
        with pytest.raises(ChatTemplateError, match="has no chat template"):
            m.apply_chat_template(HELLO)
        assert m.apply_chat_template(HELLO, template=QWEN3_STYLE).startswith(USER_TURN)


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m.content }}", "cannot parse"),                       # unclosed block
    ("{{ raise_exception('this template wants a system message') }}", "wants a system message"),
    ("{{ messages[0].content | no_such_filter }}", "cannot"),
])
def test_a_template_the_engine_cannot_render_is_a_typed_error(models, template, message):
    with Model(models["chatml"]) as m:
        with pytest.raises(ChatTemplateError, match=message) as error:
            m.apply_chat_template(HELLO, template=template)
        assert "\n" not in str(error.value)  # the engine's source excerpt is condensed to one line
        assert m.apply_chat_template(HELLO).startswith(USER_TURN)  # the model stays usable


def test_malformed_messages_are_refused_before_the_engine(models):
    with Model(models["chatml"]) as m:
        with pytest.raises(ConfigError, match="message 0"):
            m.apply_chat_template([{"role": "user"}])
        with pytest.raises(ConfigError, match="NUL"):
            m.apply_chat_template([{"role": "user", "content": "a\0b"}])


def test_a_template_over_4_kib_is_read_whole_and_applied(models):
    assert len(LONG_TEMPLATE.encode()) > 4096
    with Model(models["long"]) as m:
        assert m.chat_template == LONG_TEMPLATE
        text = m.apply_chat_template(HELLO, enable_thinking=False)
    assert text.startswith("<|im_start|>system\n" + LONG_SYSTEM + "<|im_end|>\n" + USER_TURN)
    assert text.endswith(EMPTY_THINK)


def test_generate_applies_a_long_template_and_the_reasoning_switch(models):
    path = models["long"]
    with Model(path) as m:
        expected = {mode: len(m.tokenize(m.apply_chat_template(HELLO, enable_thinking=thinking)))
                    for mode, thinking in (("off", False), ("on", True))}
    assert expected["off"] > expected["on"] > 1000
    for mode in ("off", "on"):
        out = subprocess.run([*CLI, "generate", "-m", str(path), "-p", "hello", "-n", "4", "-c", "4096",
                              "--reasoning", mode, "--json"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["stats"]["n_prompt"] == expected[mode]


def test_generate_refuses_reasoning_on_a_raw_prompt(models):
    out = subprocess.run([*CLI, "generate", "-m", str(models["qwen3"]), "-p", "x", "-n", "2", "--raw",
                          "--reasoning", "on"], capture_output=True, text=True)
    assert out.returncode == 2 and "--raw" in out.stderr and "Traceback" not in out.stderr


def test_templates_render_from_several_threads(models):
    with Model(models["qwen3"]) as m:
        expected = m.apply_chat_template(HELLO, enable_thinking=False)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: m.apply_chat_template(HELLO, enable_thinking=False), range(32)))
    assert results == [expected] * 32


def test_bench_reasoning_modes_render_through_the_template(models):
    backend = PyllamaspecBackend(models["qwen3"], n_gpu_layers=0)
    try:
        assert backend.render("hello", PromptMode(True, False)).text.endswith(EMPTY_THINK)
        on = backend.render("hello", PromptMode(True, True))
        assert EMPTY_THINK not in on.text and on.tokens == tuple(backend._loaded_target().tokenize(on.text))
    finally:
        backend.close()
    plain = PyllamaspecBackend(models["chatml"], n_gpu_layers=0)
    try:
        with pytest.raises(ConfigError, match="enable_thinking"):
            plain.render("hello", PromptMode(True, False))  # a template that ignores the switch is not mislabelled
        assert plain.render("hello", PromptMode(True, None)).text == USER_TURN
    finally:
        plain.close()


@pytest.mark.realmodel
def test_the_real_targets_template_renders_as_qwen_documents_it(real_pair):
    target_path, _ = real_pair
    with Model(target_path, n_gpu_layers=0) as m:
        assert m.apply_chat_template(HELLO) == (
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            + USER_TURN + "<|im_start|>assistant\n")
