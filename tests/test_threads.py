"""Ownership and threads: what a server will do to a session must never crash the interpreter.

Models outlive their Python handles while a session uses them; a session runs one generation at a time and
says so; close(), request_stop() and stats() work from any thread, also from inside the session's own callback.
"""

from __future__ import annotations

import threading
import time

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import GenerationError, ModelLoadError, SessionBusyError

from helpers import N_PREDICT, PROMPT, assert_equal_up_to_near_tie, plain

LONG = 400  # tokens: long enough that another thread acts while it runs


def spec_config(**kw):
    return SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=3, n_ctx=1024, **kw)


def test_closing_the_models_does_not_disturb_a_session_using_them(dense_pair):
    t, d = dense_pair
    target, drafter = Model(t), Model(d)
    ref = plain(target)
    session = SpecSession(target, drafter, spec_config())
    target.close()
    drafter.close()
    with pytest.raises(ModelLoadError, match="closed"):
        target.tokenize("x")
    r = session.generate(PROMPT, N_PREDICT)   # the session holds the models natively
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert session.detokenize(r.tokens) == r.text
    session.close()
    with pytest.raises(GenerationError, match="closed"):
        session.generate(PROMPT, 4)
    session.close()  # a second close is harmless


def test_a_second_generation_while_one_runs_is_refused(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, spec_config()) as s:
        started = threading.Event()
        errors = []

        def on_tokens(_toks):
            started.set()
            time.sleep(0.002)

        worker = threading.Thread(target=lambda: s.generate(PROMPT, LONG, on_tokens=on_tokens))
        worker.start()
        assert started.wait(30)
        try:
            s.generate(PROMPT, 4)
        except SessionBusyError as e:
            errors.append(e)
        s.request_stop()
        worker.join(60)
        assert not worker.is_alive()
        assert errors and "already generating" in str(errors[0])
        assert s.generate(PROMPT, 4).finish_reason == "length"  # free again afterwards


def test_close_from_another_thread_stops_and_frees(dense):
    target, drafter, _ = dense
    s = SpecSession(target, drafter, spec_config())
    results, started = [], threading.Event()

    def run():
        results.append(s.generate(PROMPT, 10_000, on_tokens=lambda _t: started.set()))

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(30)
    s.close()  # returns once the generation has stopped
    worker.join(60)
    assert not worker.is_alive()
    assert results and results[0].finish_reason == "stopped"
    assert s.closed
    with pytest.raises(GenerationError, match="closed"):
        s.stats()


def test_close_from_inside_the_callback_takes_effect_when_the_call_returns(dense):
    target, drafter, _ = dense
    s = SpecSession(target, drafter, spec_config())
    steps = []

    def on_tokens(toks):
        steps.append(toks)
        if len(steps) == 3:
            s.close()

    r = s.generate(PROMPT, LONG, on_tokens=on_tokens)
    assert r.finish_reason == "stopped" and len(steps) == 3
    assert s.closed


def test_stats_and_info_from_another_thread_while_generating(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, spec_config()) as s:
        seen, started = [], threading.Event()

        def watch():
            started.wait(30)
            for _ in range(50):
                st = s.stats()
                seen.append((st.n_generated, st.n_steps))
                s.adaptive_info()
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        r = s.generate(PROMPT, LONG, on_tokens=lambda _t: started.set())
        watcher.join(60)
        assert len(seen) == 50
        assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))  # counters only grow within a run
        assert all(n <= LONG for n, _ in seen) and r.stats.n_generated == LONG


def test_a_stop_before_any_generation_does_not_stop_the_next_one(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, spec_config()) as s:
        s.request_stop()
        assert s.generate(PROMPT, 8).finish_reason == "length"


def test_a_stop_right_after_starting_is_not_lost(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, spec_config()) as s:
        claimed = threading.Event()
        original = s._claim

        def claim():
            original()
            claimed.set()
            time.sleep(0.05)  # the stop arrives between the claim and the native begin

        s._claim = claim
        stopper = threading.Thread(target=lambda: (claimed.wait(30), s.request_stop()))
        stopper.start()
        r = s.generate(PROMPT, LONG)
        stopper.join(30)
        assert r.finish_reason == "stopped" and len(r.tokens) < LONG


def test_closing_a_session_between_stream_steps_ends_the_iterator(dense):
    target, drafter, _ = dense
    s = SpecSession(target, drafter, spec_config())
    pieces = s.stream(PROMPT, LONG)
    next(pieces)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(30)
    assert s.closed
    with pytest.raises(GenerationError, match="closed"):
        for _ in pieces:
            pass


def test_reset_stats_during_a_generation_restarts_the_counts(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, spec_config()) as s:
        calls = []

        def on_tokens(toks):
            calls.append(len(toks))
            if len(calls) == 5:
                s.reset_stats()

        r = s.generate(PROMPT, 64, on_tokens=on_tokens)
        assert 0 < r.stats.n_generated < 64  # counted from the reset on


def test_many_threads_each_with_their_own_session_share_the_models(dense):
    target, drafter, ref = dense
    results, errors = [], []

    def run():
        try:
            with SpecSession(target, drafter, spec_config()) as s:
                results.append(s.generate(PROMPT, N_PREDICT).tokens)
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors
    for tokens in results:
        assert_equal_up_to_near_tie(tokens, ref)
