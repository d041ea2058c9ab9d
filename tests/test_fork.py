"""A model or session opened before os.fork() cannot be used in the child: a typed error naming the fix, not a
hang; the parent keeps working, and the child can open its own model."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ForkedProcessError

CHILD_TIMEOUT_S = 60


def _in_child(fn) -> str:
    """Run fn() in a forked child; return what it wrote (its result or its error), killing it if it hangs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        os.close(r)
        try:
            out = f"ok: {fn()}"
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            out = f"{type(e).__name__}: {e}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while True:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail("the child hung")
        time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        return f.read().decode()


def test_a_model_used_after_fork_raises_a_typed_error_naming_the_fix(dense_pair):
    target_path, _ = dense_pair
    with Model(target_path) as target, SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)) as s:
        before = s.generate([1, 2, 3, 4], 8).tokens  # the native threads have run

        for call in (lambda: target.tokenize("hello"), lambda: s.generate([1, 2, 3, 4], 8).tokens,
                     lambda: target.detokenize([1, 2])):
            out = _in_child(call)
            assert out.startswith("ForkedProcessError: "), out
            assert "fork" in out and "spawn" in out and "Open the model in the child" in out

        # the child may open its own model and use it
        out = _in_child(lambda: Model(target_path).tokenize("hello"))
        assert out.startswith("ok: ["), out
        # the parent is untouched
        assert s.generate([1, 2, 3, 4], 8).tokens == before
    assert issubclass(ForkedProcessError, Exception)
