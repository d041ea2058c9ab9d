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


def test_threads_rendering_a_new_template_together_probe_it_once(target, monkeypatch):
    # a server's first requests render the model's template from several threads at once; libraries' fork hooks
    # refuse a fork while another thread is forking (filelock: "os.fork is unsafe while filelock is changing
    # descriptor ownership"), which failed those requests with HTTP 500. Here a fork beside another one is refused
    # the same way: the threads wait for the one probe, and every render succeeds
    import os
    import threading

    real_fork, forking, forks = os.fork, [0], []
    guard = threading.Lock()

    def fork():
        with guard:
            if forking[0]:
                raise RuntimeError("os.fork is unsafe while another thread forks")
            forking[0] += 1
        try:
            time.sleep(0.05)  # a wide window for another thread's fork
            pid = real_fork()
            if pid == 0:
                return 0
            forks.append(pid)
            return pid
        finally:
            with guard:
                forking[0] -= 1

    monkeypatch.setattr(os, "fork", fork)
    tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    results, errors = [], []

    def render(i):
        try:
            results.append(target.apply_chat_template([{"role": "user", "content": f"q{i}"}], template=tmpl))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=render, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == sorted(f"<user>q{i}" for i in range(8))
    assert len(forks) == 1  # probed once; the others rendered in the process


def test_a_probe_that_cannot_fork_is_refused_with_a_message(target, monkeypatch):
    import os

    from pyllamaspec import templateguard

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(templateguard, "FORK_TRIES", 2)
    with pytest.raises(ChatTemplateError, match="could not be started.*PYLLAMASPEC_TEMPLATE_PROBE=0"):
        target.apply_chat_template(MESSAGES, template="{{ messages[0].content }}!")
    assert target.tokenize("still usable")
