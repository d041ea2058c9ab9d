"""What a session would allocate per device, measured before anything is loaded.

Upstream's loader runs without allocating (the same pass its memory fit uses) for the target with the
session's context — KV cache, recurrent snapshot ring, compute buffers — and for the drafter, so an
impossible configuration is refused with numbers instead of dying in an allocation. The features a DFlash,
DSpark or EAGLE3 drafter reads, which the target keeps on its layers' devices, count as context ("KV+ring").
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from . import _native
from .config import ModelConfig, SessionConfig
from .errors import MemoryBudgetError, ModelLoadError
from .ggufinfo import check_model_file, detect_spec_types, read_summary
from .native_params import native_model_params, native_session_params

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

    def check(self, headroom: int = 512 * MiB, host_available: int | None = None) -> None:
        """Raise MemoryBudgetError when a GPU would need more than it has free (minus headroom), or when host
        memory cannot hold what must be resident there (KV cache and compute buffers; mmap'ed weights need
        not be). host_available defaults to the system's MemAvailable."""
        short = [d for d in self.devices if not d.is_host and d.total and d.need + headroom > d.free]
        host = host_available if host_available is not None else _host_available()
        for d in self.devices:
            if d.is_host and host and d.context + d.compute + headroom > host:
                raise MemoryBudgetError(
                    f"host memory: the KV cache and compute buffers need {(d.context + d.compute) / MiB:.0f} MiB "
                    f"(KV+ring {d.context / MiB:.0f}, compute {d.compute / MiB:.0f}) plus a safety margin of "
                    f"{headroom / MiB:.0f} MiB, but {host / MiB:.0f} MiB are available. Lower n_ctx or n_parallel, "
                    f"or quantize the KV cache (-ctk/-ctv q8_0); --no-memory-check skips this estimate")
        if short:
            remote = _remote_labels() if any(d.name.startswith("RPC") for d in short) else {}
            lines = "; ".join(
                f"{remote.get(d.name, d.name)} needs {d.need / MiB:.0f} MiB (weights {d.model / MiB:.0f}, KV+ring {d.context / MiB:.0f}, "
                f"compute {d.compute / MiB:.0f}) but has {d.free / MiB:.0f} MiB free" for d in short)
            raise MemoryBudgetError(
                f"{lines}, and {headroom / MiB:.0f} MiB are kept free as a safety margin. Lower n_ctx, the draft length (the recurrent ring grows with it), the number of GPU "
                f"layers (-ngl), or move MoE experts to the CPU (--n-cpu-moe); --no-memory-check skips this estimate")

    def to_dict(self) -> dict:
        return {"devices": [dict(asdict(d), need=d.need) for d in self.devices],
                "drafter_approximate": self.drafter_approximate}

    def format(self) -> str:
        rows = [f"{d.name:<8} need {d.need / MiB:8.0f} MiB (weights {d.model / MiB:.0f}, KV+ring {d.context / MiB:.0f},"
                f" compute {d.compute / MiB:.0f})" + (f", free {d.free / MiB:.0f} MiB" if d.total else "")
                for d in self.devices]
        return "\n".join(rows)


def max_parallel(target: str | os.PathLike, drafter: str | os.PathLike | None = None, *,
                 target_config: ModelConfig | None = None, drafter_config: ModelConfig | None = None,
                 session_config: SessionConfig | None = None, headroom: int = 512 * MiB,
                 host_available: int | None = None, upper: int = 64) -> int:
    """The most sequences (n_parallel, at most ``upper``) that fit the devices with these settings: each slot adds
    its own snapshot-ring planes and outputs. Found by bisection over estimates; 0 when not even one fits."""
    session_config = session_config or SessionConfig()

    def fits(n: int) -> bool:
        cfg = session_config.replace(n_parallel=n, n_batch=max(session_config.n_batch, n * (session_config.n_max + 1)))
        try:
            estimate_memory(target, drafter, target_config=target_config, drafter_config=drafter_config,
                            session_config=cfg).check(headroom, host_available)
        except MemoryBudgetError:
            return False
        return True

    lo, hi = 0, max(1, upper)  # fits(lo) holds (0 trivially), the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(target: str | os.PathLike, drafter: str | os.PathLike | None = None, *,
               target_config: ModelConfig | None = None, drafter_config: ModelConfig | None = None,
               session_config: SessionConfig | None = None, headroom: int = 512 * MiB,
               host_available: int | None = None) -> MemoryEstimate:
    """estimate_memory(...).check(...); when several sequences do not fit, the error also says how many would."""
    session_config = session_config or SessionConfig()
    estimate = estimate_memory(target, drafter, target_config=target_config, drafter_config=drafter_config,
                               session_config=session_config)
    try:
        estimate.check(headroom, host_available)
    except MemoryBudgetError as error:
        n = session_config.n_parallel
        if n <= 1:
            raise
        fit = max_parallel(target, drafter, target_config=target_config, drafter_config=drafter_config,
                           session_config=session_config.replace(n_parallel=1), headroom=headroom,
                           host_available=host_available, upper=n - 1)
        hint = (f"at most {fit} of the {n} sequences fit with these settings (n_parallel / -np {fit})" if fit else
                f"not even one of the {n} sequences fits with these settings")
        raise MemoryBudgetError(f"{error}; {hint}") from None
    return estimate


def _remote_labels() -> dict[str, str]:
    """'RPC0' -> 'RPC0 (rpc-server HOST:PORT)' for the remote devices of this process."""
    from .rpc import servers

    return {dev: f"{dev} (rpc-server {s['endpoint']})" for s in servers() for dev in s["devices"]}


def _host_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


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
    from .rpc import add_servers

    for cfg in (target_config, drafter_config):
        if cfg is not None and cfg.rpc:
            add_servers(cfg.rpc, cfg.rpc_timeout)  # the remote devices' share is measured like a local device's
    tp, keep_t = native_model_params(ffi, Path(target), target_config or ModelConfig())
    dp, keep_d = (native_model_params(ffi, Path(drafter), drafter_config or ModelConfig())
                  if drafter is not None else (ffi.NULL, None))
    sp = native_session_params(ffi, session_config)
    out = ffi.new("pls_memory_estimate *")
    err = _native.ErrorBuffer(ffi)
    _native.check(lib.pls_estimate_memory(tp, dp, sp, out, err.buf, err.SIZE), err, ModelLoadError)
    devices = tuple(
        DeviceMemory(name=ffi.string(d.name).decode(), free=d.free, total=d.total, model=d.model,
                     context=d.context, compute=d.compute)
        for d in (out.devices[i] for i in range(out.n_devices)))
    del keep_t, keep_d
    return MemoryEstimate(devices=devices, drafter_approximate=bool(out.drafter_approximate))
