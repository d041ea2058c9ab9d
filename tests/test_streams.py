"""Several streams in one session (n_parallel): every stream's drafts verified in one target batch per step.

Each stream must produce what a single-stream plain run of its own prompt produces (up to a near-tie), whatever
rolls back in the streams beside it.
"""

from __future__ import annotations

import json

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.tools import synth
from pyllamaspec.cli import main as cli_main
from pyllamaspec.errors import ConfigError, ContextOverflowError

from helpers import N_PREDICT, TARGETS, assert_equal_up_to_near_tie, assert_stats_consistent, make_dflash, plain

PROMPTS = [
    [1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7],
    [4, 4, 11, 30, 2],
    [17, 3, 3, 9, 100, 41, 7, 7, 8, 250, 3, 1, 6, 6, 12, 90, 5, 2],
]
N_CTX = 1536  # shared: 512 positions per stream


@pytest.fixture(scope="module")
def dense(dense_pair):
    t, d = dense_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter, [plain(target, prompt=p) for p in PROMPTS]


@pytest.fixture(scope="module")
def hybrid(hybrid_pair):
    t, d = hybrid_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter, [plain(target, prompt=p) for p in PROMPTS]


def assert_streams_exact(results, refs):
    assert len(results) == len(refs)
    for r, ref in zip(results, refs):
        assert_equal_up_to_near_tie(r.tokens, ref)
        assert r.finish_reason == "length" and len(r.tokens) == N_PREDICT
        assert_stats_consistent(r.stats)


def assert_totals_are_stream_sums(session, results):
    total = session.stats()
    for name in ("n_generated", "n_steps", "n_drafted", "n_accepted", "n_rollback_kv", "n_rollback_ring",
                 "n_rollback_checkpoint", "n_replayed", "n_prompt"):
        assert getattr(total, name) == sum(getattr(r.stats, name) for r in results), name
    assert_stats_consistent(total)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("n_max", [1, 3, 7])
def test_draft_model_streams_are_exact(request, kind, n_max):
    target, drafter, refs = request.getfixturevalue(kind)
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=n_max, n_ctx=N_CTX, n_parallel=3)
    with SpecSession(target, drafter, cfg) as s:
        assert s.info.n_parallel == 3
        results = s.generate_batch(PROMPTS, N_PREDICT)
        assert_streams_exact(results, refs)
        assert_totals_are_stream_sums(s, results)
    assert all(r.stats.n_accepted > 0 for r in results), "the perturbed drafter should agree in every stream"
    assert any(r.stats.n_accepted < r.stats.n_drafted for r in results), "some draft must be rejected"
    expected = "ring" if kind == "hybrid" else "kv"
    assert all(r.stats.rollback_paths in ([], [expected]) for r in results)


def test_hybrid_streams_replay_from_checkpoints(hybrid):
    target, drafter, refs = hybrid
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=5, n_ctx=N_CTX, n_parallel=3, n_rs_seq=0)
    with SpecSession(target, drafter, cfg) as s:
        assert s.info.rollback_target == "checkpoint"
        results = s.generate_batch(PROMPTS, N_PREDICT)
        assert_streams_exact(results, refs)
        assert_totals_are_stream_sums(s, results)
    assert sum(r.stats.n_rollback_checkpoint for r in results) > 0
    assert sum(r.stats.n_replayed for r in results) > 0


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_ngram_streams_are_exact(request, kind):
    target, _, refs = request.getfixturevalue(kind)
    cfg = SessionConfig(adaptive=False, spec_types=["ngram-map-k"], n_max=4, n_ctx=N_CTX, n_parallel=3, ngram_size_n=2,
                        ngram_size_m=8)
    with SpecSession(target, None, cfg) as s:
        assert_streams_exact(s.generate_batch(PROMPTS, N_PREDICT), refs)


def test_plain_streams_match_single_stream_runs(dense):
    target, _, refs = dense
    with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], n_ctx=N_CTX, n_parallel=3, margins=True)) as s:
        results = s.generate_batch(PROMPTS, N_PREDICT)
    assert_streams_exact(results, refs)
    assert all(len(r.margins) == N_PREDICT for r in results)


def test_fewer_prompts_than_streams_and_session_reuse(dense):
    target, drafter, refs = dense
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=3, n_ctx=N_CTX, n_parallel=3)
    with SpecSession(target, drafter, cfg) as s:
        two = s.generate_batch(PROMPTS[1:], N_PREDICT)
        one = s.generate(PROMPTS[0], N_PREDICT)
    assert_streams_exact(two, refs[1:])
    assert_equal_up_to_near_tie(one.tokens, refs[0])


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("version", [1, 2])
def test_dflash_streams_are_exact(request, tmp_path_factory, kind, version):
    fixture, n_embd, ids = TARGETS[kind]
    target_path, _ = request.getfixturevalue(fixture)
    extra = {"block_size": 16} if version == 1 else dict(block_size=8, conv_group_size=16, selector_rank=16,
                                                          selector_top_k=4)
    drafter_path = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=version, **extra)
    with Model(target_path) as target, Model(drafter_path) as drafter:
        refs = [plain(target, prompt=p) for p in PROMPTS]
        with SpecSession(target, drafter, SessionConfig(adaptive=False, n_max=7, n_ctx=N_CTX, n_parallel=3)) as s:
            results = s.generate_batch(PROMPTS, N_PREDICT)
            assert_totals_are_stream_sums(s, results)
    assert_streams_exact(results, refs)
    assert all(r.stats.n_drafted > 0 for r in results)


def test_mtp_streams_are_exact(mtp_target):
    with Model(mtp_target) as target:
        refs = [plain(target, prompt=p) for p in PROMPTS]
        with SpecSession(target, None, SessionConfig(adaptive=False, spec_types="draft-mtp", n_max=3, n_ctx=N_CTX,
                                                     n_parallel=3)) as s:
            results = s.generate_batch(PROMPTS, N_PREDICT)
    assert_streams_exact(results, refs)
    assert all(r.stats.n_drafted > 0 for r in results)


def test_stream_batch_yields_every_streams_text(dense):
    target, drafter, _ = dense
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=N_CTX, n_parallel=3)
    with SpecSession(target, drafter, cfg) as s:
        texts = ["", "", ""]
        seen = set()
        for i, piece in s.stream_batch(PROMPTS, N_PREDICT):
            texts[i] += piece
            seen.add(i)
        results = s.generate_batch(PROMPTS, N_PREDICT)
    assert seen == {0, 1, 2}
    assert texts == [r.text for r in results]


def test_closing_a_batch_stream_stops_every_stream(dense):
    target, drafter, refs = dense
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=N_CTX, n_parallel=3)
    with SpecSession(target, drafter, cfg) as s:
        it = s.stream_batch_tokens(PROMPTS, N_PREDICT)
        next(it)
        it.close()
        assert s.stats().n_generated < 3 * N_PREDICT
        # the session is free again and exact
        assert_streams_exact(s.generate_batch(PROMPTS, N_PREDICT), refs)


def test_more_prompts_than_streams_is_refused(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=N_CTX, n_parallel=2)) as s:
        with pytest.raises(ConfigError, match="3 prompts for a session of n_parallel=2"):
            s.generate_batch(PROMPTS, 8)
        with pytest.raises(ConfigError, match="list of prompts"):
            s.generate_batch("one string", 8)


def test_each_stream_gets_its_share_of_the_context(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=1024, n_parallel=4)) as s:
        with pytest.raises(ContextOverflowError, match=r"prompt 1: .*holds 256 per stream \(n_ctx / n_parallel\)"):
            s.generate_batch([[1, 2, 3], [5] * 300], 8)


def test_bad_token_names_its_prompt(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=N_CTX, n_parallel=2)) as s:
        with pytest.raises(ConfigError, match="prompt 1: prompt token 99999 at position 2 is outside the vocab"):
            s.generate_batch([[1, 2, 3], [1, 2, 99999]], 8)


def test_verify_batch_must_hold_every_stream(dense):
    target, drafter, _ = dense
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=15, n_ctx=N_CTX, n_parallel=8, n_batch=64, n_ubatch=64)
    with pytest.raises(ConfigError, match=r"n_batch=64 must be at least n_parallel x \(n_max \+ 1\) = 128"):
        SpecSession(target, drafter, cfg)


def test_block_drafter_needs_every_block_in_one_micro_batch(tmp_path_factory, dense_pair):
    target_path, _ = dense_pair
    drafter_path = make_dflash(tmp_path_factory, target_path, 64, (0,), version=1, block_size=16)
    with Model(target_path) as target, Model(drafter_path) as drafter:
        cfg = SessionConfig(adaptive=False, n_max=15, n_ctx=N_CTX, n_parallel=4, n_ubatch=32)
        with pytest.raises(ConfigError, match=r"n_ubatch=32 must be at least n_parallel x \(n_max \+ 1\) = 64"):
            SpecSession(target, drafter, cfg)


def test_n_parallel_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="n_parallel=0 must be within 1..64"):
        SessionConfig(n_parallel=0)


def test_cli_generates_several_prompts_together(dense_pair, capsys):
    t, d = dense_pair
    rc = cli_main(["generate", "-m", str(t), "-md", str(d), "--spec-type", "draft-simple", "-p", "hello",
                   "-p", "world", "-n", "12", "-c", "512", "--raw", "--json", "--no-memory-check"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["session"]["n_parallel"] == 2
    assert [len(s["tokens"]) for s in out["streams"]] == [12, 12]
    assert out["stats"]["n_generated"] == 24


def test_cli_refuses_fewer_streams_than_prompts(dense_pair, capsys):
    t, d = dense_pair
    rc = cli_main(["generate", "-m", str(t), "-md", str(d), "-p", "a", "-p", "b", "-np", "1", "--raw"])
    assert rc == 2
    assert "2 prompts need -np 2 or more" in capsys.readouterr().err


def test_dspark_streams_are_exact(tmp_path_factory, hybrid_pair):
    fixture, n_embd, ids = TARGETS["hybrid"]
    target_path, _ = hybrid_pair
    base = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=1, block_size=8)
    dspark = synth.write_dspark_drafter(tmp_path_factory.mktemp("dspark") / "dspark.gguf", base)
    with Model(target_path) as target, Model(dspark) as drafter:
        refs = [plain(target, prompt=p) for p in PROMPTS]
        with SpecSession(target, drafter, SessionConfig(adaptive=False, n_max=8, n_ctx=N_CTX, n_parallel=3)) as s:
            assert s.info.spec_types == ("draft-dspark",)
            results = s.generate_batch(PROMPTS, N_PREDICT)
    assert_streams_exact(results, refs)
    assert all(r.stats.n_drafted > 0 for r in results)


def test_context_too_small_for_every_streams_verify_batch(dense):
    target, drafter, _ = dense
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=15, n_ctx=256, n_parallel=32, n_batch=2048, n_ubatch=512)
    with pytest.raises(ConfigError, match=r"n_ctx=256 caps the batch at 256 tokens, below n_parallel x \(n_max \+ 1\) = 512"):
        SpecSession(target, drafter, cfg)
