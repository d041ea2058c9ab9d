"""Calling the native library safely: status codes to exceptions (one table), and handles that outlive no call.

Every fallible C call returns a pls_status; check() raises the exception that code stands for, with the message
the call wrote. NativeHandle keeps a native object alive while calls use it, from any thread.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache

from ..errors import (ChatTemplateError, ConfigError, ContextOverflowError, ForkedProcessError, GenerationError,
                      MemoryBudgetError, ModelLoadError, PairingError, PlacementError, PyllamaspecError,
                      RemoteDeviceError, SessionBusyError)
from .header import constants

# what each status code of the C API means on the Python side: one table for every call
_STATUS_ERRORS = {
    "PLS_ERR_CONTEXT": ContextOverflowError,
    "PLS_ERR_INVALID": ConfigError,
    "PLS_ERR_PAIRING": PairingError,
    "PLS_ERR_PLACEMENT": PlacementError,
    "PLS_ERR_LOAD": ModelLoadError,
    "PLS_ERR_BUSY": SessionBusyError,
    "PLS_ERR_DECODE": GenerationError,
    "PLS_ERR_NO_TEMPLATE": ChatTemplateError,
    "PLS_ERR_TEMPLATE": ChatTemplateError,
    "PLS_ERR_MEMORY": MemoryBudgetError,
    "PLS_ERR_REMOTE": RemoteDeviceError,
}


@lru_cache(maxsize=1)
def _status_table() -> dict[int, type]:
    return {value: _STATUS_ERRORS[name] for name, value in constants().items() if name in _STATUS_ERRORS}


def error_for(rc: int, message: str, default: type[PyllamaspecError] = GenerationError) -> PyllamaspecError:
    """The exception a negative status code stands for (PLS_ERR_INTERNAL and unknown codes: ``default``)."""
    return _status_table().get(rc, default)(message or f"native call failed with status {rc}")


def check(rc: int, err: "object | str", default: type[PyllamaspecError] = GenerationError) -> int:
    """Raise the exception a negative status code stands for (PLS_ERR_INTERNAL: ``default``); return rc."""
    if rc >= 0:
        return rc
    raise error_for(rc, err if isinstance(err, str) else err.text, default)


# Bumped in a child process after os.fork(): a handle made before the fork belongs to the parent. The child
# has none of the parent's native threads (llama.cpp's thread pool, device contexts), so a call there would
# wait for ever; it raises ForkedProcessError instead, and the child never frees what the parent owns.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_error(what: str = "this model or session") -> ForkedProcessError:
    return ForkedProcessError(
        f"{what} was opened in process {os.getppid()} and this is a child it forked (os.fork, or "
        "multiprocessing's 'fork' start method): native models cannot cross a fork. Open the model in the child "
        "process, or start workers with multiprocessing.get_context('spawn') (or 'forkserver')."
    )


class NativeHandle:
    """A native pointer that close() frees only once no call is using it. A call after close() raises; a
    close() from inside a call on the same thread (a callback) is carried out when that call returns. In a
    child process forked after the handle was made, every call raises ForkedProcessError and close() only
    forgets the pointer (the parent owns it)."""

    def __init__(self, ptr, free, closed: PyllamaspecError) -> None:
        self._generation = _fork_generation
        self._ptr = ptr
        self._free = free
        self._closed = closed
        self._cv = threading.Condition()
        self._users: dict[int, int] = {}  # thread id -> nested calls
        self._closing = False
        self._deferred = False  # close() came from inside a call: the last call out frees

    @property
    def closed(self) -> bool:
        return self._ptr is None or self._closing

    @property
    def forked(self) -> bool:
        return self._generation != _fork_generation

    @contextmanager
    def use(self):
        if self._generation != _fork_generation:  # before the lock: a parent's thread may have held it at the fork
            raise forked_error()
        tid = threading.get_ident()
        with self._cv:
            if self._ptr is None or self._closing:
                raise type(self._closed)(*self._closed.args)
            self._users[tid] = self._users.get(tid, 0) + 1
            ptr = self._ptr
        try:
            yield ptr
        finally:
            free = None
            with self._cv:
                self._users[tid] -= 1
                if not self._users[tid]:
                    del self._users[tid]
                if not self._users:
                    self._cv.notify_all()
                    if self._deferred and self._ptr is not None:
                        free, self._ptr = self._ptr, None
            if free is not None:
                self._free(free)

    def signal(self, fn) -> None:
        """Call fn(ptr) now if the handle is open, without waiting for the calls in flight (e.g. a stop)."""
        if self._generation != _fork_generation:
            raise forked_error()
        with self._cv:
            if self._ptr is not None:
                fn(self._ptr)

    def close(self, before=None) -> None:
        if self._generation != _fork_generation:
            self._ptr = None  # the parent's: never freed here
            return
        free = None
        with self._cv:
            if self._ptr is None or self._closing:
                return
            self._closing = True
            if before is not None:
                before(self._ptr)  # e.g. ask a running generation to stop
            if self._users.get(threading.get_ident()):
                self._deferred = True  # inside a call of this thread: freed when it returns
                return
            while self._users:
                self._cv.wait()
            free, self._ptr = self._ptr, None
        self._free(free)




class NativeOwner:
    """What owns a NativeHandle as self._handle (a model, a session, an embedder): `closed`, close() (safe before
    the handle exists, and again), a context manager that closes, and closed when collected."""

    _handle: NativeHandle | None = None

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: what close() needs may be gone already
            pass
