"""The shim's header as Python sees it: the cffi declarations and the constants they carry.

The declarations come verbatim from include/pyllamaspec.h (the region between PLS_CDEF_BEGIN and
PLS_CDEF_END), so the header is the one source of truth for both sides. Its enum values (speculative
type ids, finish reasons, limits) are read here from the parsed declarations, without opening the
native library: configuration can be validated on a machine that has no build.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from cffi import FFI

from ..errors import BuildError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
HEADER = PACKAGE_DIR / "include" / "pyllamaspec.h"


def cdef_source(header: Path = HEADER) -> str:
    text = header.read_text(encoding="utf-8")
    m = re.search(r"/\* PLS_CDEF_BEGIN \*/(.*)/\* PLS_CDEF_END \*/", text, re.S)
    if not m:
        raise BuildError(f"{header} has no PLS_CDEF_BEGIN/END region")
    return m.group(1)


@lru_cache(maxsize=1)
def ffi() -> FFI:
    """The process's one FFI, declared from the header (the library is opened with it by loader.load)."""
    f = FFI()
    f.cdef(cdef_source())
    return f


@lru_cache(maxsize=1)
def constants() -> dict[str, int]:
    """Every PLS_* enum value of the header. In ABI mode the values come from the declarations, so a handle
    on the running process (dlopen(None)) answers for them: the native library is not needed."""
    own = ffi().dlopen(None)
    return {name: getattr(own, name) for name in dir(own) if name.startswith("PLS_")}


def _enum(prefix: str) -> dict[int, str]:
    """value -> the enumerator's name without its prefix, for the enumerators named PREFIX*."""
    return {value: name.removeprefix(prefix) for name, value in constants().items() if name.startswith(prefix)}


def _llama_cpp_name(enumerator: str) -> str:
    """DRAFT_SIMPLE -> draft-simple: llama.cpp's --spec-type spelling of an enumerator."""
    return enumerator.lower().replace("_", "-")


_spec = {value: name for value, name in _enum("PLS_SPEC_").items() if name != "COUNT"}

# llama.cpp's names of the speculative types, indexed by their id (upstream's common_speculative_type)
SPEC_TYPES: tuple[str, ...] = tuple(_llama_cpp_name(_spec[i]) for i in range(constants()["PLS_SPEC_COUNT"]))
SPEC_TYPE_IDS: dict[str, int] = {name: i for i, name in enumerate(SPEC_TYPES)}

# PLS_FINISH_* -> the finish reason a result reports (None: still generating)
FINISH_REASONS: dict[int, str | None] = {
    value: None if name == "NONE" else name.lower() for value, name in _enum("PLS_FINISH_").items()}

# pls_session_info.rollback_target / rollback_draft. The header documents these values in a comment rather
# than an enum, so they are the one table here not read from the declarations.
ROLLBACK_KINDS: dict[int, str] = {0: "none", 1: "kv", 2: "ring", 3: "checkpoint"}

MAX_DRAFT: int = constants()["PLS_MAX_DRAFT"]
MAX_STREAMS: int = constants()["PLS_MAX_STREAMS"]
MAX_SPEC_TYPES: int = constants()["PLS_MAX_SPEC_TYPES"]
MAX_SCHEDULE: int = constants()["PLS_MAX_SCHEDULE"]
MAX_TRACE: int = constants()["PLS_MAX_TRACE"]
MAX_TOP_LOGPROBS: int = constants()["PLS_MAX_TOP_LOGPROBS"]
