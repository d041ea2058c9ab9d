"""Graphs kept by shape (patch 0010): a context keeps the graphs of the batch shapes it ran and allocates a kept one
again when its shape comes back, instead of building it anew. A speculative loop alternates shapes every step, so a
kept graph must run exactly as a rebuilt one would: the same tokens, on every path that changes shapes (a draft
model's catch-up and single-token decodes, DFlash's feature batches, a ring rollback's recurrent-state views,
several streams, the device's sampler nodes). A kept graph of a small batch lives in a scheduler of its own and runs
as it was allocated; LLAMA_GRAPH_CACHE_SCHED=0 keeps every graph in the context's scheduler, which allocates a kept
one again. LLAMA_GRAPH_CACHE=1 (both read when a context is made) gives llama's single-graph reuse, the reference."""

from __future__ import annotations

import pytest

from helpers import PROMPT, STREAM_PROMPTS

from pyllamaspec import SessionConfig, SpecSession

N = 48


def config(arm, **cfg):
    cfg.setdefault("n_ctx", 1024)
    if arm == "dflash2":
        return SessionConfig(spec_types="draft-dflash", adaptive=False, n_max=7, **cfg)
    if arm == "dflash2-adaptive":
        return SessionConfig(spec_types="draft-dflash", n_max=7, **cfg)
    return SessionConfig(spec_types=["draft-simple"], adaptive=arm == "adaptive", n_max=4, **cfg)


WAYS = {"single": {"LLAMA_GRAPH_CACHE": "1"},  # llama's reuse of the previous graph
        "shared": {"LLAMA_GRAPH_CACHE_SCHED": "0"},  # graphs kept, allocated again in the context's scheduler
        "kept": {}}  # the default: small batches' graphs in schedulers of their own


def all_ways(monkeypatch, run):
    """run() with llama's single-graph reuse, with graphs kept in one scheduler, and with the default."""
    out = {}
    for way, env in WAYS.items():
        for var in ("LLAMA_GRAPH_CACHE", "LLAMA_GRAPH_CACHE_SCHED"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        out[way] = run()
    return out["single"], out["shared"], out["kept"]


@pytest.mark.parametrize("arm", ["n4", "adaptive", "dflash2", "dflash2-adaptive"])
@pytest.mark.parametrize("backend_sampling", [False, True])
def test_a_kept_graph_decodes_what_a_rebuilt_one_does(trio, arm, backend_sampling, monkeypatch):
    kind, target, drafter, d2 = trio

    def run():
        cfg = config(arm, backend_sampling=backend_sampling)
        with SpecSession(target, d2 if arm.startswith("dflash2") else drafter, cfg) as s:
            if kind == "hybrid":
                assert s.info.rollback_target == "ring"
            return s.generate(PROMPT, N)

    single, shared, kept = all_ways(monkeypatch, run)
    assert len(kept.tokens) == N
    assert kept.tokens == single.tokens, f"{kind} {arm}"
    assert shared.tokens == single.tokens, f"{kind} {arm}"
    if "adaptive" not in arm:
        for r in (shared, kept):
            # the same verdicts step by step (adaptive lengths follow measured costs, which differ between runs)
            assert (r.stats.n_steps, r.stats.n_drafted, r.stats.n_accepted) == \
                   (single.stats.n_steps, single.stats.n_drafted, single.stats.n_accepted)
            # every batch whose graph llama reused is reused when graphs are kept, and more where shapes alternate
            assert r.stats.n_graph_reused >= single.stats.n_graph_reused


def test_shapes_that_alternate_run_kept_graphs(trio, monkeypatch):
    """A hybrid draft model decodes a catch-up batch, then single tokens, every step: with graphs kept, the shapes
    that come back are not rebuilt. (A dense draft model on these random weights drafts in single tokens only.)"""
    kind, target, drafter, _ = trio
    if kind != "hybrid":
        pytest.skip("the dense pair's batches keep one shape per context here")

    def run():
        with SpecSession(target, drafter, config("n4")) as s:
            return s.generate(PROMPT, 64)

    single, shared, kept = all_ways(monkeypatch, run)
    for r in (shared, kept):
        assert r.tokens == single.tokens
        # most steps change shape twice (catch-up -> single tokens in the draft model, then the target's verify)
        assert r.stats.n_graph_reused >= single.stats.n_graph_reused + r.stats.n_steps


def test_streams_decoded_together_keep_their_graphs(trio, monkeypatch):
    _, target, drafter, _ = trio

    def run():
        cfg = SessionConfig(spec_types=["draft-simple"], adaptive=False, n_max=4, n_ctx=2048, n_parallel=3)
        with SpecSession(target, drafter, cfg) as s:
            return [r.tokens for r in s.generate_batch(STREAM_PROMPTS, N)]

    single, shared, kept = all_ways(monkeypatch, run)
    assert kept == single
    assert shared == single
    assert all(len(t) == N for t in kept)

