"""Calling the native library safely: status codes to exceptions (one table), and handles that outlive no call.

Every fallible C call returns a pls_status; check() raises the exception that code stands for, with the message
the call wrote. NativeHandle keeps a native object alive while calls use it, from any thread.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import lru_cache

from ..errors import (ChatTemplateError, ConfigError, ContextOverflowError, GenerationError, MemoryBudgetError,
                      ModelLoadError, PairingError, PlacementError, PyllamaspecError, SessionBusyError)
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


class NativeHandle:
    """A native pointer that close() frees only once no call is using it. A call after close() raises; a
    close() from inside a call on the same thread (a callback) is carried out when that call returns."""

    def __init__(self, ptr, free, closed: PyllamaspecError) -> None:
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

    @contextmanager
    def use(self):
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
        with self._cv:
            if self._ptr is not None:
                fn(self._ptr)

    def close(self, before=None) -> None:
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


