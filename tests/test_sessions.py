"""Speculative sessions on synthetic models: exactness, rollback paths, stats, control, bad input."""

from __future__ import annotations

import threading

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.tools import synth
from pyllamaspec.errors import (ConfigError, ContextOverflowError, GenerationError, ModelLoadError, PairingError,
                                PlacementError, PyllamaspecError)

from helpers import N_PREDICT, PROMPT, assert_equal_up_to_near_tie, assert_stats_consistent, plain

def test_plain_generation_is_deterministic(dense):
    target, _, ref = dense
    again = plain(target)
    assert again.tokens == ref.tokens
    assert len(ref.tokens) == N_PREDICT and ref.finish_reason == "length"
    assert len(ref.margins) == N_PREDICT and all(m >= 0 for m in ref.margins)


SPEC_TYPES = ["draft-simple", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"]


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("spec_type", SPEC_TYPES)
@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_greedy_equivalence(request, kind, spec_type, n_max):
    target, drafter, ref = request.getfixturevalue(kind)
    use_drafter = drafter if spec_type == "draft-simple" else None
    cfg = SessionConfig(adaptive=False, spec_types=[spec_type], n_max=n_max, n_ctx=512, ngram_size_n=2, ngram_size_m=8,
                        ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=n_max)
    with SpecSession(target, use_drafter, cfg) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert r.stats.n_generated == len(r.tokens) == N_PREDICT
    if spec_type == "draft-simple":
        assert r.stats.n_drafted > 0 and r.stats.n_accepted > 0, "the perturbed drafter should agree often"


# cycles of draft lengths with plain steps between drafts: the draft model falls behind and catches up
SCHEDULES = [(0, 3, 0, 0, 5, 1), (7, 0), (1, 2, 3, 0, 0, 0, 0, 0, 4), (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6)]


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(map(str, s)))
def test_varying_draft_lengths_with_plain_steps_stay_exact(request, kind, schedule):
    target, drafter, ref = request.getfixturevalue(kind)
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ctx=512, draft_schedule=schedule)
    with SpecSession(target, drafter, cfg) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    st = r.stats
    assert st.n_drafted > 0
    assert st.n_accepted > 0 or kind == "hybrid"      # the perturbed hybrid drafter agrees rarely (a few %)
    assert st.k_histogram[0] > 0                      # plain steps happened
    assert sum(st.k_histogram) == st.n_steps          # one draft length per step
    assert st.n_catchup > 0                           # and the draft model caught up after them
    assert max(i for i, n in enumerate(st.k_histogram) if n) <= max(schedule)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("spec_type", ["draft-simple", "ngram-mod"])
def test_adaptive_draft_lengths_are_exact(request, kind, spec_type):
    target, drafter, ref = request.getfixturevalue(kind)
    cfg = SessionConfig(spec_types=[spec_type], n_max=8, n_ctx=512, ngram_mod_n_match=2, ngram_mod_n_min=1,
                        ngram_mod_n_max=8)
    assert cfg.adaptive  # the default
    with SpecSession(target, drafter if spec_type == "draft-simple" else None, cfg) as s:
        assert s.info.adaptive
        r = s.generate(PROMPT, N_PREDICT)
        info = s.adaptive_info()
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert sum(r.stats.k_histogram) == r.stats.n_steps
    assert r.stats.k_histogram[0] >= 1                # it measured plain decoding at least once
    assert info.enabled and info.target_ms[0] > 0 and len(info.hazards) == 8
    assert r.stats.est_plain_ms > 0 and r.stats.estimated_plain_tokens_per_second > 0


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_lookups_beside_a_draft_model_are_exact_and_used_when_they_match(request, kind, adaptive):
    target, drafter, ref = request.getfixturevalue(kind)
    # a prompt that repeats itself, so the n-gram lookup finds matches as the answer goes on
    prompt = PROMPT * 4
    base = plain(target, prompt=prompt)
    cfg = SessionConfig(adaptive=adaptive, spec_types=["ngram-mod", "draft-simple"], n_max=6, n_ctx=512,
                        ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=6)
    with SpecSession(target, drafter, cfg) as s:
        r = s.generate(prompt, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, base)
    assert_stats_consistent(r.stats)
    if not adaptive:
        assert r.stats.n_free_drafts > 0                     # lookups drafted, free
        assert r.stats.n_drafts > r.stats.n_free_drafts      # the draft model drafted the rest


def test_a_schedule_needs_adaptive_off():
    with pytest.raises(ConfigError, match="adaptive=False"):
        SessionConfig(spec_types=["draft-simple"], draft_schedule=(1, 2))
    with pytest.raises(ConfigError, match="draft_schedule"):
        SessionConfig(adaptive=False, spec_types=["draft-simple"], draft_schedule=(1, -2))


def test_hybrid_uses_the_snapshot_ring(hybrid):
    target, drafter, ref = hybrid
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ctx=512)) as s:
        assert s.info.n_rs_seq == 7 and s.info.rollback_target == "ring" and s.info.ring_bytes > 0
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.n_rollback_ring > 0 and r.stats.n_rollback_checkpoint == 0


def test_hybrid_without_ring_uses_checkpoint_replay(hybrid):
    target, drafter, ref = hybrid
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ctx=512,
                                                    n_rs_seq=0)) as s:
        assert s.info.n_rs_seq == 0 and s.info.rollback_target == "checkpoint"
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.n_rollback_checkpoint > 0 and r.stats.n_rollback_ring == 0
    assert r.stats.n_replayed > 0


def test_draft_longer_than_ring_falls_back_to_checkpoint(hybrid):
    target, drafter, ref = hybrid
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ctx=512,
                                                    n_rs_seq=2)) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.n_rollback_checkpoint > 0


def test_dense_rolls_back_the_kv_cache(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ctx=512)) as s:
        assert s.info.rollback_target == "kv" and s.info.n_rs_seq == 0
        r = s.generate(PROMPT, N_PREDICT)
    assert r.stats.n_rollback_kv > 0 and r.stats.rollback_paths == ["kv"]


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_forced_rejection_keeps_output_and_accepts_nothing(request, kind):
    target, drafter, ref = request.getfixturevalue(kind)
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=512, force_reject=True)
    with SpecSession(target, drafter, cfg) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.n_accepted == 0 and r.stats.n_drafted > 0
    assert r.stats.mean_accepted_length == 1.0


def test_stream_matches_generate_and_stats_accumulate(dense):
    target, drafter, ref = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=3, n_ctx=512)) as s:
        pieces = list(s.stream(PROMPT, N_PREDICT))
        assert "".join(pieces) == target.detokenize(ref.tokens)
        first = s.stats()
        s.generate(PROMPT, N_PREDICT, reset_stats=False)
        assert s.stats().n_generated == 2 * first.n_generated


def test_callback_stop_and_session_reuse(dense):
    target, drafter, ref = dense
    seen = []
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=3, n_ctx=512)) as s:
        r = s.generate(PROMPT, N_PREDICT, on_tokens=lambda toks: seen.extend(toks) or len(seen) >= 5)
        assert r.finish_reason == "stopped" and 5 <= len(r.tokens) < N_PREDICT
        assert r.tokens == ref.tokens[:len(r.tokens)] == seen
        again = s.generate(PROMPT, N_PREDICT)  # reusable after a stop
        assert again.finish_reason == "length" and len(again.tokens) == N_PREDICT


def test_exception_in_callback_propagates_and_session_survives(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=512)) as s:
        def boom(_):
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            s.generate(PROMPT, N_PREDICT, on_tokens=boom)
        assert len(s.generate(PROMPT, 8).tokens) == 8


def test_request_stop_from_another_thread(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=2048)) as s:
        started = threading.Event()

        def on_tokens(_):
            started.set()

        stopper = threading.Thread(target=lambda: (started.wait(30), s.request_stop()))
        stopper.start()
        r = s.generate(PROMPT, 1500, on_tokens=on_tokens)
        stopper.join()
        assert r.finish_reason == "stopped" and len(r.tokens) < 1500


def test_closing_a_stream_early_ends_generation(dense):
    target, drafter, ref = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=512)) as s:
        it = s.stream(PROMPT, N_PREDICT)
        next(it)
        it.close()
        assert_equal_up_to_near_tie(s.generate(PROMPT, N_PREDICT).tokens, ref)


def test_context_full_ends_generation(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=32)) as s:
        n_ctx = s.info.n_ctx  # llama.cpp may round the context up
        r = s.generate(PROMPT, 2 * n_ctx)
        assert r.finish_reason == "context" and n_ctx - 2 <= len(PROMPT) + len(r.tokens) <= n_ctx


def test_threads_default_to_the_cores_and_explicit_counts_are_kept(dense):
    import os
    target, _, _ = dense
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=64)) as s:
        # llama.cpp's tools use every core useful for math; never ggml's fixed default of 4 on a smaller machine
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        assert 1 <= s.info.n_threads <= max(cores, 1) and s.info.n_threads_batch == s.info.n_threads
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=64, n_threads=3, n_threads_batch=5)) as s:
        assert (s.info.n_threads, s.info.n_threads_batch) == (3, 5)


# ---- bad input: typed exceptions, no crash --------------------------------------------------

def test_missing_model_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        Model(tmp_path / "nope.gguf")


def test_garbage_file_is_not_gguf(tmp_path):
    p = tmp_path / "garbage.gguf"
    p.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Model(p)


def test_truncated_gguf(tmp_path, dense_pair):
    p = tmp_path / "truncated.gguf"
    data = dense_pair[0].read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="failed to load"):
        Model(p)


def test_drafter_for_another_vocab_is_refused(tmp_path, dense):
    target, _, _ = dense
    other = synth.write_target(tmp_path / "other-vocab.gguf", synth.TargetShape(arch="qwen3", n_vocab=128), seed=2)
    with Model(other) as d, pytest.raises(PairingError, match="vocab"):
        SpecSession(target, d, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=512))


def test_prompt_longer_than_context(dense):
    target, drafter, _ = dense
    with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=64)) as s:
        too_long = [1 + i % 500 for i in range(s.info.n_ctx + 1)]
        with pytest.raises(ContextOverflowError, match="n_ctx"):
            s.generate(too_long, 4)
        assert len(s.generate(PROMPT, 4).tokens) == 4  # still usable


def test_prompt_token_outside_vocab(dense):
    target, _, _ = dense
    with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], n_ctx=64)) as s:
        with pytest.raises(PyllamaspecError, match="outside the vocab"):
            s.generate([1, 2, 10_000_000], 4)


@pytest.mark.parametrize("temp", [0.0, 0.8])
@pytest.mark.parametrize("spec_types", [[], ["draft-simple"]])
def test_nan_logits_end_the_generation_with_an_error(nan_target, dense, temp, spec_types):
    _, drafter, _ = dense
    config = SessionConfig(adaptive=False, spec_types=spec_types, n_ctx=128, temp=temp, seed=1)
    with SpecSession(nan_target, drafter if spec_types else None, config) as s:
        for _ in range(2):  # the session stays usable, and says so again
            with pytest.raises(GenerationError, match="NaN logits"):
                s.generate(PROMPT, 8)


def test_ubatch_too_small_for_the_draft():
    with pytest.raises(ConfigError, match="n_ubatch"):
        SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=16, n_ubatch=8, n_batch=8)


def test_ring_must_fit_one_micro_batch(hybrid):
    target, drafter, _ = hybrid
    with pytest.raises(ConfigError, match="n_rs_seq"):
        SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=7, n_ubatch=8, n_batch=8,
                                                   n_ctx=512))


def test_unknown_device_is_refused(dense_pair):
    with pytest.raises(PlacementError, match="unknown device 'CUDA7'"):
        Model(dense_pair[0], devices=["CUDA7"])


def test_drafter_type_without_drafter(dense):
    target, _, _ = dense
    with pytest.raises(ConfigError, match="needs a drafter"):
        SpecSession(target, None, SessionConfig(adaptive=False, spec_types=["draft-simple"], n_ctx=512))


def test_mtp_without_heads_is_refused(dense):
    target, _, _ = dense
    with pytest.raises(ConfigError, match="MTP"):
        SpecSession(target, None, SessionConfig(adaptive=False, spec_types=["draft-mtp"], n_ctx=512))


def test_unknown_spec_type():
    with pytest.raises(ConfigError, match="unknown speculative type"):
        SessionConfig(adaptive=False, spec_types="draft-magic")


def test_score_margins_reproduces_plain_margins_and_measures_batch_shape_noise(dense):
    target, _, ref = dense
    with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], n_ctx=512, n_max=7)) as s:
        single = s.score_margins(PROMPT, ref.tokens, chunk=1)
        batched = s.score_margins(PROMPT, ref.tokens, chunk=8)
        assert s.stats().n_generated == 0 and s.stats().n_prompt == 0  # scoring is not generation
        with pytest.raises(ConfigError, match="chunk=0"):
            s.score_margins(PROMPT, ref.tokens, chunk=0)
        with pytest.raises(ConfigError, match=r"chunk=9 must be within 1..8 \(n_max \+ 1"):
            s.score_margins(PROMPT, ref.tokens, chunk=9)
        with pytest.raises(ContextOverflowError, match="context holds 512"):
            s.score_margins(PROMPT, [1] * 600, chunk=8)
        with pytest.raises(ConfigError, match="continuation token 99999"):
            s.score_margins(PROMPT, [1, 99999], chunk=8)
        # the session still generates exactly afterwards
        assert s.generate(PROMPT, N_PREDICT).tokens == ref.tokens
    assert single == ref.margins  # plain decoding's batch shapes: the same numbers
    # close to plain (CPU ~1e-5, CUDA ~1e-3 on this model), aligned to the same positions
    assert batched == pytest.approx(ref.margins, abs=0.01)


def test_bytes_are_not_a_prompt(dense):
    target, _, _ = dense
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=64)) as s:
        for prompt in (b"hello", bytearray(b"hello")):
            with pytest.raises(ConfigError, match="not bytes"):
                s.generate(prompt, 4)
        with pytest.raises(ConfigError, match="32-bit ints"):
            s.generate([1, 2 ** 31], 4)


def test_a_directory_or_fifo_is_not_a_model(tmp_path):
    import os

    with pytest.raises(ModelLoadError, match="is a directory"):
        Model(tmp_path)
    os.mkfifo(tmp_path / "pipe.gguf")
    with pytest.raises(ModelLoadError, match="is a FIFO"):
        Model(tmp_path / "pipe.gguf")  # refused before llama.cpp would open (and block on) it


def test_metadata_of_any_length(tmp_path, dense_pair):
    import gguf

    from ckptfactory import rewrite_gguf

    lengths = (4095, 4096, 4097, 40_000)
    values = {n: "".join(chr(ord("a") + i % 26) for i in range(n)) for n in lengths}
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{# " + "x" * 9000 + " #}"
    extra = {f"test.value_{n}": (v, gguf.GGUFValueType.STRING, None) for n, v in values.items()}
    extra["tokenizer.chat_template"] = (template, gguf.GGUFValueType.STRING, None)
    path = rewrite_gguf(dense_pair[0], tmp_path / "long-meta.gguf", add_kv=extra)
    with Model(path) as m:
        for n, value in values.items():
            assert m.meta(f"test.value_{n}") == value
        assert m.chat_template == template  # longer than 4 KiB: read in full, not skipped
        assert m.meta("test.absent") is None
