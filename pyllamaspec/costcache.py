"""What the draft-length controller measured on this machine, kept between processes.

The controller learns what a target batch of each size costs here, what the drafter costs and what a step
costs beyond both. A fresh process would learn it again by drafting - and on a machine where drafting cannot
pay, learning is what costs. So a session seeds its controller from the costs a previous session of the same
setup measured (same model files, drafter, spec types, threads, placement, cache types, build and CPU) and
stores what it learnt when it closes: one small JSON file per setup under the cache directory. Costs only:
acceptance depends on the text and is learnt afresh. An imported size counts for two measurements, so what
the machine measures now soon outweighs it.

``PYLLAMASPEC_COST_CACHE`` names another directory, or ``off``; ``SessionConfig(cost_cache=False)`` turns it
off for one session. A file that cannot be read or is not ours is ignored (and replaced on close); nothing here
ever fails a generation.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

from . import _native
from .paths import cache_root

ENV = "PYLLAMASPEC_COST_CACHE"
SCHEMA = 1
MAX_POINTS = 4096


def cache_dir() -> Path | None:
    """Where the cost files live; None when the cache is turned off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "0", "no", "false", "none"):
        return None
    return Path(value) if value else cache_root() / "costs"


def _file_id(path: Path | None) -> list | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
        return [str(Path(path).resolve()), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(path), None, None]


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def setup_of(session) -> dict:
    """Everything a measured cost depends on, as plain JSON."""
    cfg, info = session.config, session.info
    build = _native.build_info()
    return {
        "target": _file_id(session.target.path),
        "target_config": asdict(session.target.config),
        "drafter": _file_id(session.drafter.path if session.drafter is not None else None),
        "drafter_config": asdict(session.drafter.config) if session.drafter is not None else None,
        "spec_types": list(info.spec_types),
        "drafter_kind": info.drafter_kind,
        "n_batch": info.n_batch,
        "n_ubatch": info.n_ubatch,
        "n_threads": info.n_threads,
        "n_threads_batch": info.n_threads_batch,
        "n_threads_draft": cfg.n_threads_draft,
        "cache_types": [cfg.cache_type_k, cfg.cache_type_v, cfg.cache_type_k_draft, cfg.cache_type_v_draft],
        "flash_attn": cfg.flash_attn,
        "draft_backend_sampling": cfg.draft_backend_sampling,
        "backend_sampling": info.backend_sampling,
        "kv_window": info.kv_window,
        "placement": [list(info.target_layers), info.target_head_device, info.draft_device],
        "build": [build.get("version"), build.get("upstream", {}).get("commit"), build.get("backends"),
                  build.get("upstream", {}).get("patches")],
        "cpu": [_cpu(), os.cpu_count()],
    }


def path_for(setup: dict, directory: Path) -> Path:
    digest = hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return directory / f"{digest}.json"


def _valid_point(p) -> bool:
    return (isinstance(p, list) and len(p) == 5 and all(isinstance(v, int) and not isinstance(v, bool) for v in p[:4])
            and isinstance(p[4], (int, float)) and not isinstance(p[4], bool) and math.isfinite(p[4]) and p[4] >= 0)


def load(path: Path, setup: dict) -> list[list] | None:
    """The points stored for this setup, or None (no file, unreadable, another setup, another schema)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    if json.dumps(data.get("setup"), sort_keys=True, default=str) != json.dumps(setup, sort_keys=True, default=str):
        return None  # a hash collision, or a file copied from elsewhere
    points = data.get("points")
    if not isinstance(points, list) or len(points) > MAX_POINTS or not all(_valid_point(p) for p in points):
        return None
    return points


def save(path: Path, setup: dict, points: list[list]) -> bool:
    """Write atomically (a temp file renamed over the old one); False when it could not be written."""
    from .atomicfile import atomic_output

    data = {"schema": SCHEMA, "saved": int(time.time()), "setup": setup, "points": points}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path, force=True) as tmp:
            tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    except Exception:
        return False
    return True
