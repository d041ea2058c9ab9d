"""What a session would allocate per device, measured before anything is loaded.

Upstream's loader runs without allocating (the same pass its memory fit uses) for the target with the
session's context — KV cache, recurrent snapshot ring, compute buffers — and for the drafter, so an
impossible configuration is refused with numbers instead of dying in an allocation.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from . import _native
from .config import ModelConfig, SessionConfig
from .errors import MemoryBudgetError, ModelLoadError
from .ggufinfo import check_model_file, detect_spec_types, read_summary
from .model import native_model_params
from .session import native_session_params

MiB = 2 ** 20


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    free: int
    total: int
    model: int
    context: int
    compute: int

    @property
    def need(self) -> int:
        return self.model + self.context + self.compute

    @property
    def is_host(self) -> bool:
        return self.name == "Host"


@dataclass(frozen=True)
class MemoryEstimate:
    devices: tuple[DeviceMemory, ...]
    drafter_approximate: bool  # a head-borrowing drafter is counted by its weights alone

    def check(self, headroom: int = 512 * MiB) -> None:
        """Raise MemoryBudgetError when a GPU would need more than it has free (minus headroom). Host memory is
        reported, not enforced: mmap'ed weights need not be resident."""
        short = [d for d in self.devices if not d.is_host and d.total and d.need + headroom > d.free]
        if short:
            lines = "; ".join(
                f"{d.name} needs {d.need / MiB:.0f} MiB (weights {d.model / MiB:.0f}, KV+ring {d.context / MiB:.0f}, "
                f"compute {d.compute / MiB:.0f}) but has {d.free / MiB:.0f} MiB free" for d in short)
            raise MemoryBudgetError(
                f"{lines}. Lower n_ctx, the draft length (the recurrent ring grows with it), the number of GPU "
                f"layers (-ngl), or move MoE experts to the CPU (--n-cpu-moe)")

    def to_dict(self) -> dict:
        return {"devices": [dict(asdict(d), need=d.need) for d in self.devices],
                "drafter_approximate": self.drafter_approximate}

    def format(self) -> str:
        rows = [f"{d.name:<8} need {d.need / MiB:8.0f} MiB (weights {d.model / MiB:.0f}, KV+ring {d.context / MiB:.0f},"
                f" compute {d.compute / MiB:.0f})" + (f", free {d.free / MiB:.0f} MiB" if d.total else "")
                for d in self.devices]
        return "\n".join(rows)


def estimate_memory(target: str | os.PathLike, drafter: str | os.PathLike | None = None, *,
                    target_config: ModelConfig | None = None, drafter_config: ModelConfig | None = None,
                    session_config: SessionConfig | None = None) -> MemoryEstimate:
    """Per-device memory of a session of these models, without loading them."""
    for path in (target, drafter):
        if path is not None:
            check_model_file(path)  # a directory or a FIFO: refused before the loader opens (and blocks on) it
    ffi, lib = _native.load()
    session_config = session_config or SessionConfig()
    if session_config.spec_types is None:
        types = detect_spec_types(read_summary(drafter)) if drafter is not None else ()
        session_config = session_config.replace(spec_types=types)
    tp, keep_t = native_model_params(ffi, Path(target), target_config or ModelConfig())
    dp, keep_d = (native_model_params(ffi, Path(drafter), drafter_config or ModelConfig())
                  if drafter is not None else (ffi.NULL, None))
    sp = native_session_params(ffi, session_config)
    out = ffi.new("pls_memory_estimate *")
    err = _native.ErrorBuffer(ffi)
    if lib.pls_estimate_memory(tp, dp, sp, out, err.buf, err.SIZE) != 0:
        raise ModelLoadError(err.text)
    devices = tuple(
        DeviceMemory(name=ffi.string(d.name).decode(), free=d.free, total=d.total, model=d.model,
                     context=d.context, compute=d.compute)
        for d in (out.devices[i] for i in range(out.n_devices)))
    del keep_t, keep_d
    return MemoryEstimate(devices=devices, drafter_approximate=bool(out.drafter_approximate))
