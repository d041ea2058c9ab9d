"""A chat template that loops without end or prints without bound is refused with a ChatTemplateError (its
first render runs in a child process under a time and a memory budget); the process goes on."""

from __future__ import annotations

import time

import pytest

from pyllamaspec import Model
from pyllamaspec.errors import ChatTemplateError

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture()
def target(dense_pair, monkeypatch):
    monkeypatch.setenv("PYLLAMASPEC_TEMPLATE_MAX_S", "3")
    monkeypatch.setenv("PYLLAMASPEC_TEMPLATE_MAX_MIB", "256")
    with Model(dense_pair[0]) as m:
        yield m


def test_a_template_that_prints_without_bound_is_refused(target):
    huge = "{% for i in range(2000000000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}"
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"given chat template .*(within 3 s|256 MiB of memory).*refusing it"):
        target.apply_chat_template(MESSAGES, template=huge)
    assert time.monotonic() - t0 < 30
    # the process is usable, and a sound template renders as before (probed once, then in the process)
    assert "hi" in target.apply_chat_template(MESSAGES, template="chatml")
    ok = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
    assert target.apply_chat_template(MESSAGES, template=ok) == "[user] hi"
    assert target.apply_chat_template([{"role": "user", "content": "again"}], template=ok) == "[user] again"


def test_a_template_that_never_ends_is_refused(target):
    slow = "{% for i in range(2000000000) %}{% endfor %}done"
    with pytest.raises(ChatTemplateError, match="(within 3 s|MiB of memory)"):
        target.apply_chat_template(MESSAGES, template=slow)
    assert target.tokenize("still usable")
