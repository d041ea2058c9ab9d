"""`pyllamaspec info`: what this installation is and what it can use here."""

from __future__ import annotations

import json

from . import _native


def info() -> dict:
    """Version, upstream commit, patches, backends compiled in, devices visible, compiler and flags."""
    from . import __version__

    build = _native.build_info()
    ffi, lib = _native.load()
    n = lib.pls_system_info_json(ffi.NULL, 0)
    buf = ffi.new("char[]", -n)
    lib.pls_system_info_json(buf, -n)
    system = json.loads(ffi.string(buf).decode())
    upstream = build["upstream"]
    return {
        "version": __version__,
        "upstream": {"commit": upstream["commit"], "url": upstream["upstream"], "source": upstream["source"]},
        "patches": upstream["patches"],
        "backends": build["backends"],
        "gpu_targets": [t for t in build.get("gpu_targets", "").replace(",", ";").split(";") if t],
        "devices": system["devices"],
        "backend_registries": system["registries"],
        "cpu_features": system["system_info"],
        "compiler": build["compiler"],
        "build_type": build["build_type"],
        "ggml_native": build["ggml_native"].upper() in ("ON", "TRUE", "1"),
        "library_dir": str(_native.lib_dir()),
        "rpc_servers": _rpc_servers(),
    }


def _rpc_servers() -> list[dict]:
    from .rpc import servers

    return servers()


def format_info(d: dict) -> str:
    gib = 1024 ** 3
    lines = [
        f"pyllamaspec {d['version']}",
        f"llama.cpp    {d['upstream']['commit']} ({d['upstream']['source']})",
        f"patches      {', '.join(d['patches']) or 'none'}",
        f"backends     {', '.join(d['backends'])}" + (f" (targets {';'.join(d['gpu_targets'])})" if d['gpu_targets'] else ""),
        f"compiler     {d['compiler']['cxx']}; native={'on' if d['ggml_native'] else 'off'}; {d['build_type']}",
        "devices:",
    ]
    for dev in d["devices"]:
        mem = f"{dev['free_bytes'] / gib:.1f}/{dev['total_bytes'] / gib:.1f} GiB free" if dev["total_bytes"] else ""
        lines.append(f"  {dev['name']:<8} {dev['type']:<5} {dev['description']}  {mem}".rstrip())
    for s in d.get("rpc_servers", []):
        state = f"failed: {s['error']}" if s["failed"] else "connected"
        lines.append(f"rpc-server   {s['endpoint']} ({', '.join(s['devices'])}): {state}")
    return "\n".join(lines)
