"""The KV cache's view grown in steps of kv_window cells (patch 0012): a graph serves one view, so a larger step
rebuilds graphs less often as a sequence grows (on a GPU each rebuild runs eagerly, then captures). The tokens
must not change with the step, on any path; the step must hold (fewer graphs built across the same views); and
values llama cannot pad to are refused before anything loads."""

from __future__ import annotations

import json
import subprocess

import pytest

from clirun import CLI
from helpers import PROMPT, arm_session

from pyllamaspec import SessionConfig, SpecSession
from pyllamaspec.controller import Controller
from pyllamaspec.errors import ConfigError

N = 300  # past the 256 cells of llama's own view: a run at 256 outgrows its first view, one at 1024 does not


@pytest.mark.parametrize("arm", ["plain", "n4", "dflash2"])
def test_the_tokens_do_not_depend_on_the_window(trio, arm):
    kind, target, drafter, d2 = trio
    runs = {}
    for window in (256, 1024, 4096):
        with arm_session(target, drafter, d2, arm, n_ctx=2048, kv_window=window, ignore_eos=True) as s:
            assert s.info.kv_window == window
            runs[window] = s.generate(PROMPT, N)
    assert len(runs[256].tokens) == N
    assert runs[1024].tokens == runs[256].tokens, f"{kind} {arm}"
    assert runs[4096].tokens == runs[256].tokens, f"{kind} {arm}"
    # the same verdicts step by step
    steps = {w: (r.stats.n_steps, r.stats.n_drafted, r.stats.n_accepted) for w, r in runs.items()}
    assert steps[1024] == steps[256] and steps[4096] == steps[256], steps


def test_a_larger_window_builds_fewer_graphs_across_the_same_cells(dense):
    """Plain decoding from a short prompt to past 256 cells: at 256 the crossing rebuilds the batch of one's graph,
    at 1024 the one graph serves every step."""
    target, _, _ = dense
    built = {}
    for window in (256, 1024):
        with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=2048, kv_window=window,
                                                     ignore_eos=True)) as s:
            r = s.generate(PROMPT, N)
            built[window] = r.stats.n_steps - r.stats.n_graph_reused
    assert built[1024] < built[256], built


def test_the_default_is_llamas_on_a_cpu(dense):
    target, _, _ = dense
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)) as s:
        if s.info.target_head_device.lower().startswith("cpu"):
            assert s.info.kv_window == 256
        else:
            assert s.info.kv_window == 1024


@pytest.mark.parametrize("bad", [0, 128, 300, 1000, 131072, -256])
def test_a_window_llama_cannot_pad_to_is_refused(bad):
    with pytest.raises(ConfigError, match="kv_window"):
        SessionConfig(kv_window=bad)
    with pytest.raises(ConfigError, match="kv_window"):
        Controller(4, kv_window=bad)


def test_a_window_of_another_type_is_refused():
    with pytest.raises(ConfigError, match="kv_window"):
        SessionConfig(kv_window=1024.0)
    with pytest.raises(ConfigError, match="kv_window"):
        SessionConfig(kv_window=True)


def test_the_cli_flag_is_honoured_and_checked(dense_pair):
    t, _ = dense_pair
    base = [*CLI, "generate", "-m", str(t), "--spec-type", "none", "-n", "4", "-p", "hello"]
    ok = subprocess.run(base + ["--kv-window", "2048", "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["session"]["kv_window"] == 2048
    bad = subprocess.run(base + ["--kv-window", "300"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "kv_window" in bad.stderr and "power of two" in bad.stderr
