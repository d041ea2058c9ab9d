"""Where the drafter goes when nothing says: on the device that holds the target's output layer (its LM head).

With one GPU (or none) that is what every default already does. With several devices — local GPUs, rpc-servers
(RPC0, RPC1, ...) — a drafter left to llama.cpp's default would be spread over all of them, and every draft token
would cross each; placed with the target's head, its logits and the target's meet on one device (a drafter that
borrows the head, DFlash or EAGLE3, cannot work anywhere else). An explicit -devd (ModelConfig.devices) is
honoured as given.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from . import _native
from .config import ModelConfig
from .errors import ModelLoadError
from .native_params import native_model_params


def accelerators() -> list[str]:
    """Names of the devices other than the CPU, the remote ones (RPC*) included."""
    import json

    ffi, lib = _native.load()
    size = 1 << 16
    buf = ffi.new("char[]", size)
    n = lib.pls_system_info_json(buf, size)
    if n < 0:
        buf = ffi.new("char[]", -n + 1)
        n = lib.pls_system_info_json(buf, -n + 1)
    info = json.loads(ffi.string(buf, n).decode())
    return [d["name"] for d in info["devices"] if d["type"] not in ("cpu", "accel")]


def head_device(target: str | os.PathLike, config: ModelConfig | None = None) -> str:
    """The device the target's placement puts its output layer on ("CPU" for host memory), found by upstream's
    loader without allocating anything."""
    config = config or ModelConfig()
    if config.rpc:
        from .rpc import add_servers

        add_servers(config.rpc, config.rpc_timeout)
    ffi, lib = _native.load()
    p, _keep = native_model_params(ffi, Path(target), config)
    out = ffi.new("char[]", 64)
    err = _native.ErrorBuffer(ffi)
    _native.check(lib.pls_plan_head_device(p, out, 64, err.buf, err.SIZE), err, ModelLoadError)
    return ffi.string(out).decode()


def drafter_config(target: str | os.PathLike, target_config: ModelConfig | None,
                   drafter_config: ModelConfig | None) -> ModelConfig:
    """The drafter's ModelConfig with the placement rule applied: devices unset, layers to offload, and more than one
    device to choose from (two or more GPUs, or any remote device beside the CPU) -> the device of the target's head
    (the CPU only when the head stays in host memory)."""
    drafter_config = drafter_config or ModelConfig()
    if drafter_config.devices is not None or drafter_config.n_gpu_layers == 0:
        return drafter_config
    for cfg in (target_config, drafter_config):
        if cfg is not None and cfg.rpc:
            from .rpc import add_servers

            add_servers(cfg.rpc, cfg.rpc_timeout)
    devices = accelerators()
    if len(devices) < 2 and not any(d.startswith("RPC") for d in devices):
        return drafter_config  # one GPU or none: every default already puts the drafter with the head
    head = head_device(target, target_config)
    return replace(drafter_config, devices=["none"] if head == "CPU" else [head])
