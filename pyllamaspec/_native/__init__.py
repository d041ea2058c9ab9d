"""The raw binding: cffi (ABI mode) over the shim's header, and nothing else.

header: the declarations and the constants they carry (no library needed); loader: finding and opening the
library, with the runtime checks that say what to install.
"""

from .header import (FINISH_REASONS, HEADER, MAX_DRAFT, MAX_SPEC_TYPES, MAX_STREAMS, PACKAGE_DIR,
                     ROLLBACK_KINDS, SPEC_TYPE_IDS, SPEC_TYPES, cdef_source, constants, ffi)
from .loader import (ABI_VERSION, LIB_DIR_ENV, ROCM_HELP, ROCM_LIBS, ErrorBuffer, build_info, build_info_path, lib_dir,
                     load)

__all__ = [
    "ABI_VERSION", "ErrorBuffer", "FINISH_REASONS", "HEADER", "LIB_DIR_ENV", "MAX_DRAFT", "MAX_SPEC_TYPES",
    "MAX_STREAMS", "PACKAGE_DIR", "ROCM_HELP", "ROCM_LIBS", "ROLLBACK_KINDS", "SPEC_TYPES", "SPEC_TYPE_IDS",
    "build_info", "build_info_path", "cdef_source", "constants", "ffi", "lib_dir", "load",
]
