"""The raw binding: cffi (ABI mode) over the shim's header, and nothing else.

header: the declarations and the constants they carry (no library needed); loader: finding and opening the
library, with the runtime checks that say what to install; calls: status codes to exceptions, and handles
that a close() cannot free under a call in flight.
"""

from .header import (FINISH_REASONS, HEADER, MAX_DRAFT, MAX_SCHEDULE, MAX_SPEC_TYPES, MAX_STREAMS, MAX_TRACE,
                     PACKAGE_DIR,
                     ROLLBACK_KINDS, SPEC_TYPE_IDS, SPEC_TYPES, cdef_source, constants, ffi)
from .calls import NativeHandle, NativeOwner, check, error_for
from .loader import (ABI_VERSION, LIB_DIR_ENV, ROCM_HELP, ROCM_LIBS, ErrorBuffer, build_info, build_info_path, lib_dir,
                     load)

__all__ = [
    "ABI_VERSION", "ErrorBuffer", "FINISH_REASONS", "HEADER", "LIB_DIR_ENV", "MAX_DRAFT", "MAX_SCHEDULE",
    "MAX_SPEC_TYPES", "MAX_TRACE",
    "MAX_STREAMS", "PACKAGE_DIR", "ROCM_HELP", "ROCM_LIBS", "ROLLBACK_KINDS", "SPEC_TYPES", "SPEC_TYPE_IDS",
    "NativeHandle", "NativeOwner", "build_info", "build_info_path", "cdef_source", "check", "constants", "error_for", "ffi",
    "lib_dir", "load",
]
