"""Loading the native library: where it lies, what it was built with, and the ROCm/CUDA runtime checks.

The declarations it is opened with are header.py's (the one FFI of the process). The safe API lives in
model.py / session.py; code outside those should not need `lib` directly.
"""

from __future__ import annotations

import ctypes
import json
import os
from functools import lru_cache
from pathlib import Path

from ..errors import BackendUnavailableError, BuildError
from . import header
from .header import PACKAGE_DIR

ABI_VERSION = 16  # must match PLS_ABI_VERSION in native/shim_common.h
LIB_DIR_ENV = "PYLLAMASPEC_LIB_DIR"  # development: point at a build tree instead of the installed libs

ROCM_LIBS = ("libamdhip64.so.6", "libhipblas.so.2", "librocblas.so.4")
ROCM_HELP = ("This is the ROCm build of pyllamaspec: it needs a ROCm 6.x runtime with gfx906 rocBLAS kernels "
             "(AMD ROCm <= 6.3, Debian's own ROCm 6.x packages, or AMD's TheRock gfx906 builds). ROCm 7 renamed "
             "these libraries and is not supported by this wheel. Install one of those, or make its lib "
             "directory visible (e.g. /opt/rocm/lib in /etc/ld.so.conf.d or LD_LIBRARY_PATH).")


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
    ffi = header.ffi()
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


class ErrorBuffer:
    """A C char buffer for the (err, err_size) arguments."""

    SIZE = 2048

    def __init__(self, ffi):
        self._ffi = ffi
        self.buf = ffi.new("char[]", self.SIZE)

    @property
    def text(self) -> str:
        return self._ffi.string(self.buf).decode("utf-8", "replace")
