"""Requantize a GGUF through upstream's quantizer, drafter-aware and atomic (`pyllamaspec quantize`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .. import _native
from ..atomicfile import atomic_output
from ..errors import QuantizeError

# llama_ftype values by upstream's names (llama.h); the common ones plus the k-quants
FTYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
    "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
    "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32, "MXFP4_MOE": 38,
}

# Tensors a drafter needs at full precision: DFlash2's selector codebooks and gate, DSpark's Markov head,
# the reduced-vocab map. Upstream has no drafter-specific rules, so we pin them to F16 (maps stay as they are:
# the quantizer leaves integer tensors alone).
DRAFTER_KEEP = ("selector_predecessor\\.weight", "selector_successor\\.weight", "selector_hidden\\.weight",
                "markov_w1\\.weight", "markov_w2\\.weight", "conf_proj\\.weight", "fc\\.weight")


def drafter_overrides(arch: str | None) -> str | None:
    if arch != "dflash":
        return None
    return ",".join(f"^{p}$=F16" for p in DRAFTER_KEEP)


def quantize(path_in: str | os.PathLike, path_out: str | os.PathLike, ftype: str = "Q4_0", *, threads: int = 0,
             allow_requantize: bool = False, force: bool = False) -> dict:
    """Requantize into a temp file beside path_out and rename; the input is never touched."""
    src, dst = Path(path_in), Path(path_out)
    name = ftype.upper()
    if name not in FTYPES:
        raise QuantizeError(f"unknown type '{ftype}'; known: {', '.join(FTYPES)}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads < 2 ** 31:
        raise QuantizeError(f"threads={threads!r} must be a count >= 0 (0: every core)")
    if not src.is_file():
        raise QuantizeError(f"input '{src}' does not exist or is not a regular file")
    if dst.exists() and dst.resolve() == src.resolve():
        raise QuantizeError("output and input are the same file; quantize never overwrites its input")
    from ..ggufinfo import read_summary  # metadata only, no weights

    arch = read_summary(src).arch
    ffi, lib = _native.load()
    err = _native.ErrorBuffer(ffi)
    overrides = drafter_overrides(arch)
    t0 = time.perf_counter()
    with atomic_output(dst, force=force, error=QuantizeError) as tmp:
        rc = lib.pls_quantize(str(src).encode(), str(tmp).encode(), FTYPES[name], threads, int(allow_requantize),
                              overrides.encode() if overrides else ffi.NULL, err.buf, err.SIZE)
        if rc != 0:
            msg = err.text
            if "requantizing" in msg and not allow_requantize:
                msg += " (the input is already quantized: pass --allow-requantize)"
            raise QuantizeError(msg)
    return {"input": str(src), "output": str(dst), "type": name, "bytes_in": src.stat().st_size,
            "bytes_out": dst.stat().st_size, "seconds": time.perf_counter() - t0, "drafter_overrides": overrides}
