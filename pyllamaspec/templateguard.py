"""A chat template is a program (Jinja): one with a loop that never ends, or that prints gigabytes, must not take
the process down. llama.cpp's Jinja engine has no budget of its own, so the first time a model renders a given
template, it renders it once in a forked child process under a memory limit and a time limit. A template that
runs out of either is refused with a ChatTemplateError saying so; a template that passes is rendered in the
process from then on (the probe costs one fork per template and model, not one per request).

Budgets: PYLLAMASPEC_TEMPLATE_MAX_S (default 10 s) and PYLLAMASPEC_TEMPLATE_MAX_MIB (default 1024 MiB of memory
beyond what the process already maps). Where fork() is missing (or PYLLAMASPEC_TEMPLATE_PROBE=0) templates
render unguarded.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import struct
import threading
import time
from typing import Callable

from .errors import ChatTemplateError

DEFAULT_MAX_S = 10.0
DEFAULT_MAX_MIB = 1024
_PASSED: set[tuple[int, str]] = set()  # (id of the native model, sha256 of the template) probed and passed
_LOCK = threading.Lock()
# one probe at a time in the process: threads rendering a new template together (a server's first requests) wait for
# the one probing it rather than fork beside it - forks from several threads at once are what libraries' fork hooks
# refuse (filelock: "os.fork is unsafe while filelock is changing descriptor ownership")
_PROBE_LOCK = threading.Lock()
FORK_TRIES = 20  # a fork refused for a moment (a library's fork hook, EAGAIN) is tried again, 50 ms apart


def _budget() -> tuple[float, int]:
    try:
        max_s = float(os.environ.get("PYLLAMASPEC_TEMPLATE_MAX_S", DEFAULT_MAX_S))
        max_mib = int(os.environ.get("PYLLAMASPEC_TEMPLATE_MAX_MIB", DEFAULT_MAX_MIB))
    except ValueError:
        max_s, max_mib = DEFAULT_MAX_S, DEFAULT_MAX_MIB
    return max(0.1, max_s), max(16, max_mib)


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


OUT_OF_MEMORY = ("bad_alloc", "out of memory", "length_error", "memoryerror")


def check(model_key: int, template: str | None, render: Callable[[], tuple[int, str]], what: str) -> None:
    """Probe `render` (renders the template once; returns the native status code and error text) in a forked
    child, unless this template already passed for this model. Raises ChatTemplateError when the child runs out
    of time or memory, or dies."""
    if not hasattr(os, "fork") or os.environ.get("PYLLAMASPEC_TEMPLATE_PROBE", "1") == "0":
        return
    key = (model_key, hashlib.sha256((template if template is not None else "\0model").encode("utf-8",
                                                                                      "surrogatepass")).hexdigest())
    with _LOCK:
        if key in _PASSED:
            return
    with _PROBE_LOCK:
        with _LOCK:
            if key in _PASSED:  # probed by the thread this one waited for
                return
        _probe(key, render, what)


def _fork() -> int:
    for attempt in range(FORK_TRIES):
        try:
            return os.fork()
        except (RuntimeError, OSError) as error:
            if attempt == FORK_TRIES - 1:
                raise ChatTemplateError(
                    f"the chat template's first render runs in a child process, which could not be started "
                    f"({error}); try again, or set PYLLAMASPEC_TEMPLATE_PROBE=0 to render templates unguarded") from error
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _probe(key: tuple[int, str], render: Callable[[], tuple[int, str]], what: str) -> None:
    max_s, max_mib = _budget()
    mapped = _mapped_bytes()
    r, w = os.pipe()
    try:
        pid = _fork()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # the child: limits, one render, its status code on the pipe, and out without any cleanup
        code = -1000
        try:
            os.close(r)
            if mapped is not None:
                limit = mapped + max_mib * 2**20
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            rc, text = render()
            code = -1000 if rc != 0 and any(k in text.lower() for k in OUT_OF_MEMORY) else int(rc)
        except MemoryError:
            code = -1000
        except BaseException:
            code = -1001
        finally:
            try:
                os.write(w, struct.pack("<i", code))
            finally:
                os._exit(0)
    os.close(w)
    deadline = time.monotonic() + max_s
    status = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise ChatTemplateError(
                    f"{what} did not finish rendering within {max_s:g} s (it loops without end, or prints too "
                    f"much): refusing it. Fix the template (or raise PYLLAMASPEC_TEMPLATE_MAX_S).")
            time.sleep(0.01)
        data = os.read(r, 4)
    finally:
        os.close(r)
    if len(data) != 4 or os.WIFSIGNALED(status):
        how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "ended early")
        raise ChatTemplateError(
            f"{what} could not be rendered: the rendering {how}, most likely out of its {max_mib} MiB of memory "
            f"(the template prints too much): refusing it. Fix the template (or raise PYLLAMASPEC_TEMPLATE_MAX_MIB).")
    code = struct.unpack("<i", data)[0]
    if code == -1000:
        raise ChatTemplateError(
            f"{what} could not be rendered within {max_mib} MiB of memory (the template prints too much): refusing "
            f"it. Fix the template (or raise PYLLAMASPEC_TEMPLATE_MAX_MIB).")
    # any other outcome (rendered, or the template's own error, which the real render reports) passes the probe
    with _LOCK:
        _PASSED.add(key)
