"""The real Qwen2.5-Coder 1.5B target and 0.5B draft model (fetched from PyPI once, then cached)."""

from __future__ import annotations

import json
import subprocess

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession

pytestmark = pytest.mark.realmodel

NEAR_TIE = 0.05  # logit units; measured divergences on this pair sit at margins well below this
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


def _check(spec, ref):
    for i, (a, b) in enumerate(zip(spec.tokens, ref.tokens)):
        if a != b:
            assert ref.margins[i] < NEAR_TIE, f"divergence at {i}, margin {ref.margins[i]:.4f}"
            return i
    assert spec.tokens == ref.tokens
    return None


@pytest.mark.parametrize("content", sorted(PROMPTS))
@pytest.mark.parametrize("spec_type,n_max", [("draft-simple", 4), ("ngram-map-k", 8)])
def test_real_pair_reproduces_plain_greedy(models, content, spec_type, n_max):
    target, drafter = models
    prompt = _prompt(target, PROMPTS[content])
    base = SessionConfig(n_ctx=1024, n_threads=2, margins=True)
    with SpecSession(target, None, base.replace(spec_types=[])) as s:
        ref = s.generate(prompt, N_PREDICT)
    cfg = base.replace(spec_types=[spec_type], n_max=n_max, ngram_size_n=3, ngram_size_m=8)
    with SpecSession(target, drafter if spec_type == "draft-simple" else None, cfg) as s:
        r = s.generate(prompt, N_PREDICT)
    _check(r, ref)
    if spec_type == "draft-simple":
        assert r.stats.acceptance > 0


def test_generate_cli_json_on_the_default_pair(real_pair):
    t, d = real_pair
    out = subprocess.run(["pyllamaspec", "generate", "-m", str(t), "-md", str(d),
                          "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "-n", "24", "-t", "2",
                          "-p", "def add(a, b):", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert len(d["tokens"]) == len(d["margins"]) == d["stats"]["n_generated"] == 24
    for key in ("n_steps", "n_drafted", "n_accepted", "acceptance", "mean_accepted_length",
                "accepted_per_position", "tokens_per_second", "t_verify_ms", "rollback_paths"):
        assert key in d["stats"]
    assert d["finish_reason"] in ("length", "eog") and d["text"]
