"""The raw binding: cffi (ABI mode) over the shim's header, and nothing else.

The declarations come verbatim from include/pyllamaspec.h (the region between PLS_CDEF_BEGIN and
PLS_CDEF_END), so the header is the one source of truth for both sides. The safe API lives in
model.py / session.py; code outside those modules should not need `lib` directly.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from cffi import FFI

from .errors import (BackendUnavailableError, BuildError, ConfigError, ContextOverflowError, GenerationError,
                     MemoryBudgetError, ModelLoadError, PairingError, PlacementError, PyllamaspecError,
                     SessionBusyError)

PACKAGE_DIR = Path(__file__).resolve().parent
HEADER = PACKAGE_DIR / "include" / "pyllamaspec.h"
ABI_VERSION = 3  # must match PLS_ABI_VERSION in native/shim_common.h
LIB_DIR_ENV = "PYLLAMASPEC_LIB_DIR"  # development: point at a build tree instead of the installed libs

ROCM_LIBS = ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4")
ROCM_HELP = ("This is the ROCm build of pyllamaspec: it needs a ROCm 6.x runtime with gfx906 rocBLAS kernels "
             "(AMD ROCm <= 6.3, Debian's own ROCm 6.x packages, or AMD's TheRock gfx906 builds). ROCm 7 renamed "
             "these libraries and is not supported by this wheel. Install one of those, or make its lib "
             "directory visible (e.g. /opt/rocm/lib in /etc/ld.so.conf.d or LD_LIBRARY_PATH).")


def cdef_source(header: Path = HEADER) -> str:
    text = header.read_text(encoding="utf-8")
    m = re.search(r"/\* PLS_CDEF_BEGIN \*/(.*)/\* PLS_CDEF_END \*/", text, re.S)
    if not m:
        raise BuildError(f"{header} has no PLS_CDEF_BEGIN/END region")
    return m.group(1)


def lib_dir() -> Path:
    override = os.environ.get(LIB_DIR_ENV)
    return Path(override) if override else PACKAGE_DIR / "lib"


def build_info_path() -> Path:
    return lib_dir() / "build_info.json"


@lru_cache(maxsize=1)
def build_info() -> dict:
    path = build_info_path()
    if not path.exists():
        raise BuildError(f"{path} is missing: this pyllamaspec has no native build. Reinstall with "
                         f"'pip install .' from a source checkout (it compiles llama.cpp).")
    return json.loads(path.read_text())


def _check_rocm_runtime() -> None:
    missing, reasons = [], []
    for name in ROCM_LIBS:
        try:
            ctypes.CDLL(name)
        except OSError as e:
            missing.append(name)
            if name not in str(e):  # found, but one of its own dependencies (libhsa-runtime64, ...) is not
                reasons.append(str(e))
    if missing:
        why = f" (loader: {'; '.join(dict.fromkeys(reasons))})" if reasons else ""
        raise BackendUnavailableError(f"missing ROCm runtime libraries: {', '.join(missing)}{why}. {ROCM_HELP}")


@lru_cache(maxsize=1)
def load():
    """Return (ffi, lib). Raises BuildError / BackendUnavailableError with what to do."""
    path = lib_dir() / "libpyllamaspec.so"
    if not path.exists():
        raise BuildError(f"native library {path} not found: pyllamaspec was installed without its build "
                         f"(reinstall with 'pip install .' from a source checkout)")
    info = build_info()
    if "hip" in info.get("backends", []):
        _check_rocm_runtime()
    ffi = FFI()
    ffi.cdef(cdef_source())
    try:
        lib = ffi.dlopen(str(path))
    except OSError as e:
        msg = str(e)
        if "cuda" in msg.lower() or "libcu" in msg:
            raise BackendUnavailableError(f"cannot load the CUDA build: {msg}. Install the NVIDIA driver and the "
                                          f"CUDA runtime this wheel was built with, or install the CPU wheel.") from e
        raise BuildError(f"cannot load {path}: {msg}") from e
    got = lib.pls_abi_version()
    if got != ABI_VERSION:
        raise BuildError(f"native library ABI {got} does not match the Python binding ({ABI_VERSION}): "
                         f"rebuild with 'pip install .'")
    return ffi, lib


@lru_cache(maxsize=1)
def declarations() -> FFI:
    """The header's declarations alone (no library): enum values can be read without loading anything."""
    ffi = FFI()
    ffi.cdef(cdef_source())
    return ffi


def enum_values(enum_type: str) -> dict[str, int]:
    """{name: value} of an enum declared in the header, e.g. enum_values("enum pls_status")."""
    return dict(declarations().typeof(enum_type).relements)


# what each status code of the C API means on the Python side: one table for every call
_STATUS_ERRORS = {
    "PLS_ERR_CONTEXT": ContextOverflowError,
    "PLS_ERR_INVALID": ConfigError,
    "PLS_ERR_PAIRING": PairingError,
    "PLS_ERR_PLACEMENT": PlacementError,
    "PLS_ERR_LOAD": ModelLoadError,
    "PLS_ERR_BUSY": SessionBusyError,
    "PLS_ERR_DECODE": GenerationError,
    "PLS_ERR_NO_TEMPLATE": ConfigError,
    "PLS_ERR_TEMPLATE": ConfigError,
    "PLS_ERR_MEMORY": MemoryBudgetError,
}


@lru_cache(maxsize=1)
def _status_table() -> dict[int, type]:
    names = enum_values("enum pls_status")
    return {value: _STATUS_ERRORS[name] for name, value in names.items() if name in _STATUS_ERRORS}


def error_for(rc: int, message: str, default: type[PyllamaspecError] = GenerationError) -> PyllamaspecError:
    """The exception a negative status code stands for (PLS_ERR_INTERNAL and unknown codes: ``default``)."""
    return _status_table().get(rc, default)(message or f"native call failed with status {rc}")


def check(rc: int, err: "ErrorBuffer | str", default: type[PyllamaspecError] = GenerationError) -> int:
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


class ErrorBuffer:
    """A C char buffer for the (err, err_size) arguments."""

    SIZE = 2048

    def __init__(self, ffi):
        self._ffi = ffi
        self.buf = ffi.new("char[]", self.SIZE)

    @property
    def text(self) -> str:
        return self._ffi.string(self.buf).decode("utf-8", "replace")
