"""DFlash v1/v2 and MTP drafters on synthetic models of real layout: exact output, clamps, ring sizing."""

from __future__ import annotations

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError, PairingError

from helpers import (N_PREDICT, ON_GPU, PROMPT, TARGETS, assert_equal_up_to_near_tie, assert_stats_consistent, make_dflash,
                     plain)


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def dflash_setup(request, tmp_path_factory):
    fixture, n_embd, ids = TARGETS[request.param]
    target_path, _ = request.getfixturevalue(fixture)
    v1 = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=1, block_size=16)
    v2 = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=2, block_size=8,
                     conv_group_size=16, selector_rank=16, selector_top_k=4)
    with Model(target_path) as target, Model(v1) as d1, Model(v2) as d2:
        yield request.param, target, d1, d2, plain(target)


@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_dflash_v1_is_exact(dflash_setup, n_max):
    kind, target, d1, _, ref = dflash_setup
    assert d1.info.arch == "dflash" and d1.info.dflash_block_size == 16 and not d1.info.is_dflash2
    with SpecSession(target, d1, SessionConfig(adaptive=False, n_max=n_max, n_ctx=512)) as s:
        assert s.info.spec_types == ("draft-dflash",)  # detected from the GGUF
        assert s.info.n_max_effective == n_max
        if kind == "hybrid":
            assert s.info.rollback_target == "ring" and s.info.n_rs_seq == n_max
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert r.stats.n_drafted > 0


@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_dflash2_is_exact_and_clamped_to_its_block(dflash_setup, n_max):
    kind, target, _, d2, ref = dflash_setup
    assert d2.info.is_dflash2 and d2.info.dflash_block_size == 8
    with SpecSession(target, d2, SessionConfig(adaptive=False, spec_types="draft-dflash", n_max=n_max, n_ctx=512)) as s:
        assert s.info.is_dflash2 and s.info.block_size == 8
        assert s.info.n_max_effective == min(n_max, 7)
        if kind == "hybrid":  # the ring follows the clamped length, not the request
            assert s.info.n_rs_seq == min(n_max, 7)
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)


@pytest.mark.parametrize("version", [1, 2])
def test_dflash_with_adaptive_lengths_is_exact(dflash_setup, version):
    kind, target, d1, d2, ref = dflash_setup
    with SpecSession(target, d1 if version == 1 else d2, SessionConfig(n_max=15, n_ctx=512)) as s:
        assert s.info.adaptive and s.info.drafter_kind == "block"
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert sum(r.stats.k_histogram) == r.stats.n_steps


@pytest.mark.parametrize("schedule", [(0, 3, 0, 7), (1, 0, 0, 0, 5)])
def test_dflash_with_plain_steps_between_blocks_is_exact(dflash_setup, schedule):
    # the drafter reads every target batch, plain ones included, so it is in step when drafting resumes
    kind, target, d1, _, ref = dflash_setup
    cfg = SessionConfig(adaptive=False, n_max=7, n_ctx=512, draft_schedule=schedule)
    with SpecSession(target, d1, cfg) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.k_histogram[0] > 0 and r.stats.n_drafted > 0


def test_dflash_rejected_drafts_roll_back_on_the_ring(dflash_setup):
    kind, target, d1, _, ref = dflash_setup
    with SpecSession(target, d1, SessionConfig(adaptive=False, n_max=7, n_ctx=512, force_reject=True)) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    expected = "ring" if kind == "hybrid" else "kv"
    assert r.stats.rollback_paths == [expected]


def test_dflash_with_wrong_hidden_size_is_refused(tmp_path_factory, dense_pair):
    target_path, _ = dense_pair
    # a drafter trained for a 128-wide target, converted against a matching one, then used with a 64-wide one
    other = tmp_path_factory.mktemp("wide")
    from pyllamaspec.tools import synth
    wide_target = synth.write_target(other / "wide.gguf", synth.TargetShape(arch="qwen3", n_embd=128), seed=4)
    drafter = make_dflash(tmp_path_factory, wide_target, 128, (0,), version=1, block_size=16)
    with Model(target_path) as target, Model(drafter) as d:
        with pytest.raises(PairingError, match="n_embd: target has 64, drafter has 128"):
            SpecSession(target, d, SessionConfig(adaptive=False, n_ctx=512))


@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_mtp_is_exact_on_a_hybrid_target(mtp_target, n_max):
    with Model(mtp_target) as target:
        assert target.info.n_layer_nextn == 1
        ref = plain(target)
        with SpecSession(target, None, SessionConfig(adaptive=False, spec_types="draft-mtp", n_max=n_max, n_ctx=512)) as s:
            assert s.info.rollback_target == "ring" and s.info.n_rs_seq == min(n_max, 16)
            r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert r.stats.n_drafted > 0


@pytest.mark.parametrize("mode", ["adaptive", "schedule"])
def test_mtp_with_varying_lengths_is_exact(mtp_target, mode):
    # MTP drafts stop at the per-sequence length (patch 0003); plain steps keep its state in step with the target
    cfg = (SessionConfig(spec_types="draft-mtp", n_max=7, n_ctx=512) if mode == "adaptive" else
           SessionConfig(adaptive=False, spec_types="draft-mtp", n_max=7, n_ctx=512, draft_schedule=(2, 0, 7, 1, 0, 0, 4)))
    with Model(mtp_target) as target:
        ref = plain(target)
        with SpecSession(target, None, cfg) as s:
            assert s.info.drafter_kind == "autoregressive"
            r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    if mode == "schedule":
        assert r.stats.k_histogram[0] > 0 and r.stats.n_drafted > 0
        # drafts are as long as asked: no longer than the schedule's lengths
        assert max(i for i, n in enumerate(r.stats.k_histogram) if n) <= 7
        assert r.stats.k_histogram[2] > 0 or r.stats.k_histogram[1] > 0


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_eagle3_is_exact(request, tmp_path_factory, kind, n_max):
    from pyllamaspec.tools import synth
    fixture, n_embd, _ = TARGETS[kind]
    target_path, _ = request.getfixturevalue(fixture)
    n_layer = 2 if kind == "dense" else 4
    # EAGLE3 may also tap id n_layer (the final hidden state), through the NextN embeddings
    layers = (1, 1, 2) if kind == "dense" else (1, 2, 4)
    drafter_path = tmp_path_factory.mktemp("eagle3") / "eagle3.gguf"
    synth.write_eagle3_drafter(drafter_path, target_path, target_layers=layers, n_embd=n_embd)
    with Model(target_path) as target, Model(drafter_path) as drafter:
        assert drafter.info.arch == "eagle3" and drafter.info.target_layers == layers and n_layer >= max(layers)
        ref = plain(target)
        with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types="draft-eagle3", n_max=n_max, n_ctx=512)) as s:
            if kind == "hybrid":
                assert s.info.rollback_target == "ring" and s.info.n_rs_seq == min(n_max, 16)
            r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert r.stats.n_drafted > 0


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_eagle3_with_adaptive_and_scheduled_lengths_is_exact(request, tmp_path_factory, kind):
    from pyllamaspec.tools import synth
    fixture, n_embd, _ = TARGETS[kind]
    target_path, _ = request.getfixturevalue(fixture)
    layers = (1, 1, 2) if kind == "dense" else (1, 2, 4)
    drafter_path = tmp_path_factory.mktemp("eagle3v") / "eagle3.gguf"
    synth.write_eagle3_drafter(drafter_path, target_path, target_layers=layers, n_embd=n_embd)
    with Model(target_path) as target, Model(drafter_path) as drafter:
        ref = plain(target)
        for cfg in (SessionConfig(spec_types="draft-eagle3", n_max=7, n_ctx=512),
                    SessionConfig(adaptive=False, spec_types="draft-eagle3", n_max=7, n_ctx=512,
                                  draft_schedule=(3, 0, 0, 7, 1))):
            with SpecSession(target, drafter, cfg) as s:
                r = s.generate(PROMPT, N_PREDICT)
            assert_equal_up_to_near_tie(r.tokens, ref)
            assert_stats_consistent(r.stats)


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def dspark_setup(request, tmp_path_factory):
    from pyllamaspec.tools import synth
    fixture, n_embd, ids = TARGETS[request.param]
    target_path, _ = request.getfixturevalue(fixture)
    base = make_dflash(tmp_path_factory, target_path, n_embd, ids, version=1, block_size=8)
    d = tmp_path_factory.mktemp("dspark")
    anchor = synth.write_dspark_drafter(d / "dspark.gguf", base)
    bonus = synth.write_dspark_drafter(d / "dspark-bonus.gguf", base, sample_from_anchor=False)
    conf = synth.write_dspark_drafter(d / "dspark-conf.gguf", base, confidence_head=True)
    with Model(target_path) as target, Model(anchor) as a, Model(bonus) as b, Model(conf) as c:
        yield request.param, target, a, b, c, plain(target)


@pytest.mark.parametrize("n_max", [1, 3, 7, 15])
def test_dspark_is_exact_and_predicts_the_anchor_slot(dspark_setup, n_max):
    kind, target, dspark, _, _, ref = dspark_setup
    from pyllamaspec.ggufinfo import read_summary
    assert read_summary(dspark.path).role == "dspark" and dspark.info.dflash_block_size == 8
    with SpecSession(target, dspark, SessionConfig(adaptive=False, n_max=n_max, n_ctx=512)) as s:
        assert s.info.spec_types == ("draft-dspark",)  # detected from the Markov head
        assert s.info.n_max_effective == min(n_max, 8)  # the whole block predicts, the anchor slot included
        if kind == "hybrid":
            assert s.info.rollback_target == "ring" and s.info.n_rs_seq == min(n_max, 8)
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert r.stats.n_drafted > 0


def test_dspark_bonus_anchor_block_drafts_one_less(dspark_setup):
    _, target, _, bonus, _, ref = dspark_setup
    with SpecSession(target, bonus, SessionConfig(adaptive=False, n_max=15, n_ctx=512)) as s:
        assert s.info.n_max_effective == 7  # [anchor, 7 predictions]
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)


def test_dspark_p_min_needs_a_confidence_head(dspark_setup):
    from pyllamaspec.errors import ConfigError
    _, target, dspark, _, with_conf, ref = dspark_setup
    with pytest.raises(ConfigError, match="no confidence head"):
        SpecSession(target, dspark, SessionConfig(adaptive=False, n_max=7, n_ctx=512, p_min=0.5))
    with SpecSession(target, with_conf, SessionConfig(adaptive=False, n_max=7, n_ctx=512, p_min=0.5)) as s:
        r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)


@pytest.mark.parametrize("schedule", [(0, 0, 3), (2, 0, 0, 0, 7)])
def test_drafters_reading_the_target_process_at_their_next_draft_what_plain_steps_kept(dflash_setup, mtp_target,
                                                                                        schedule):
    # a plain step costs a DFlash or MTP drafter nothing: the rows of the steps since its last draft (the tokens
    # committed since) are processed in one pass when it drafts again (patch 0005), and the output stays exact
    kind, target, d1, _, ref = dflash_setup
    cfg = dict(adaptive=False, n_max=7, n_ctx=512, draft_schedule=schedule, trace_steps=4096)
    with Model(mtp_target) as mtp:
        mtp_ref = plain(mtp)
        runs = [(target, d1, SessionConfig(**cfg), ref), (mtp, None, SessionConfig(spec_types="draft-mtp", **cfg), mtp_ref)]
        for tgt, dft, c, expect in runs:
            with SpecSession(tgt, dft, c) as s:
                r = s.generate(PROMPT, N_PREDICT)
                steps = s.take_trace()
            assert_equal_up_to_near_tie(r.tokens, expect)
            committed_since = None  # tokens committed since the last draft (None: none yet)
            checked = 0
            for x in steps:
                k, drafted, accepted = x["k"][0], x["drafted"][0], x["accepted"][0]
                if k == 0:
                    assert x["t_draft_call"] == 0.0  # no drafter call at all in a plain step
                elif committed_since is not None:
                    assert x["catchup"][0] == committed_since
                    checked += 1
                if k > 0:
                    committed_since = 0
                if committed_since is not None:
                    committed_since += accepted + 1
            assert checked >= 2


def test_drafters_reading_the_target_serve_one_generation_after_another_as_if_new(dflash_setup, mtp_target):
    # such a drafter is kept from one generation to the next (creating it re-plans the target's graphs); each
    # prompt starts it afresh: a second prompt drafts as in a new session, and the first prompt again as the first time
    kind, target, d1, d2, ref = dflash_setup
    other = [4, 4, 6, 1, 3, 9, 9, 2]
    # a fixed length (a schedule's place would carry over from one generation to the next); the last steps of each
    # generation, capped by n_predict, are plain ones that leave kept rows behind for the next prompt to drop
    cfg = dict(adaptive=False, n_max=5, n_ctx=512)

    def drafted(r):
        return r.tokens, r.stats.n_drafted, r.stats.n_accepted, r.stats.n_steps

    with Model(mtp_target) as mtp:
        for tgt, dft, c in [(target, d1, SessionConfig(**cfg)), (target, d2, SessionConfig(**cfg)),
                            (mtp, None, SessionConfig(spec_types="draft-mtp", **cfg))]:
            with SpecSession(tgt, dft, c) as s:
                first = drafted(s.generate(PROMPT, N_PREDICT))
                second = drafted(s.generate(other, N_PREDICT))
                again = drafted(s.generate(PROMPT, N_PREDICT))
            with SpecSession(tgt, dft, c) as fresh:
                alone = drafted(fresh.generate(other, N_PREDICT))
            assert first[1] > 0
            assert again == first
            assert second == alone


def test_a_catch_up_in_passes_of_a_few_rows_drafts_as_one_pass(dflash_setup, mtp_target):
    # the rows of skipped steps are taken in at most catchup_rows per pass (on a GPU 8 by default: the vector
    # kernels and recurring graph shapes); the drafter ends in the same state, so it drafts the same tokens
    kind, target, d1, d2, ref = dflash_setup
    cfg = dict(adaptive=False, n_max=5, n_ctx=512, trace_steps=4096,
               draft_schedule=(0, 0, 0, 0, 0, 0, 0, 3, 5, 0, 0, 0, 0, 2))
    with Model(mtp_target) as mtp:
        mtp_ref = plain(mtp)
        for tgt, dft, types, expect in [(target, d1, None, ref), (target, d2, None, ref), (mtp, None, "draft-mtp", mtp_ref)]:
            seen = []
            for rows in (0, 1, 3):
                with SpecSession(tgt, dft, SessionConfig(spec_types=types, catchup_rows=rows, **cfg)) as s:
                    info = s.info
                    r = s.generate(PROMPT, N_PREDICT)
                    steps = s.take_trace()
                # 0: the device's default - on a CPU all at once (up to the drafter context's batch), on a GPU passes
                # of a few rows
                if rows:
                    assert info.catchup_rows == rows
                elif ON_GPU:
                    assert 0 < info.catchup_rows < len(PROMPT) + N_PREDICT
                else:
                    assert info.catchup_rows >= len(PROMPT) + N_PREDICT
                assert_equal_up_to_near_tie(r.tokens, expect)
                drafts = [x["draft_hash"][0] for x in steps if x["k"][0] > 0]
                assert sum(x["catchup"][0] > 3 for x in steps) >= 2  # catch-ups of more rows than a pass of 3
                seen.append((r.tokens, drafts))
            assert len(seen[0][1]) >= 4 and all(seen[0][1])
            assert len(set(seen[0][1])) > 1  # the drafts differ from step to step: they tell the drafter's states apart
            assert seen[1] == seen[0] and seen[2] == seen[0]


def test_catchup_rows_is_checked_and_refused_where_no_drafter_reads_the_target(dflash_setup):
    kind, target, d1, _, ref = dflash_setup
    with pytest.raises(ConfigError, match="catchup_rows"):
        SessionConfig(catchup_rows=-1)
    with SpecSession(target, None, SessionConfig(spec_types="ngram-simple")) as s:
        assert s.info.catchup_rows == 0  # an n-gram lookup reads no features
    with pytest.raises(ConfigError, match="catchup_rows=4: only a drafter that reads the target's features"):
        SpecSession(target, None, SessionConfig(spec_types="ngram-simple", catchup_rows=4))


def test_features_kept_on_the_targets_device_draft_what_host_copies_draft(request, tmp_path_factory, dflash_setup,
                                                                          mtp_target):
    # a drafter that reads the target's layer inputs has the target keep them on its device (512 rows a sequence,
    # patches 0014/0015) and reads them when it processes its rows: the drafter sees the same features as from the
    # host copies llama.cpp makes after every batch, so it drafts the same tokens, step for step - after plain steps,
    # across catch-ups in passes and all at once, after a prompt longer than the rows kept (it goes in chunks) and in
    # the next generation
    from pyllamaspec.tools import synth
    kind, target, d1, d2, ref = dflash_setup
    fixture, n_embd, _ = TARGETS[kind]
    layers = (1, 1, 2) if kind == "dense" else (1, 2, 4)
    eagle3 = tmp_path_factory.mktemp("eagle3ring") / "eagle3.gguf"
    synth.write_eagle3_drafter(eagle3, request.getfixturevalue(fixture)[0], target_layers=layers, n_embd=n_embd)
    long_prompt = [(7 * i + 3) % 500 + 1 for i in range(700)]  # 700 rows: chunks of at most 512 with the ring
    schedule = (0, 0, 0, 0, 3, 5, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7)
    with Model(eagle3) as e3:
        for dft, types in [(d1, None), (d2, None), (e3, "draft-eagle3")]:
            # fixed schedules: an adaptive session's choices follow its measured times, which differ run to run
            # batches of 512 rows in both: the ring's prompt goes in chunks of at most 512 rows (at least a ubatch), and
            # an EAGLE3 drafter's numbers differ a little with the rows it takes in at once; with ubatches of 1 024 the
            # ring keeps 1 024 rows and the long prompt goes in one batch in both
            for cfg in (dict(adaptive=False, n_max=7, draft_schedule=schedule, catchup_rows=3, n_batch=512),
                        dict(adaptive=False, n_max=5, draft_schedule=(2, 5, 0, 1, 0, 0, 4), n_batch=512),
                        dict(adaptive=False, n_max=5, draft_schedule=(2, 5, 0, 1, 0, 0, 4), n_batch=1024,
                             n_ubatch=1024)):
                seen = []
                for host in (False, True):
                    c = SessionConfig(spec_types=types, n_ctx=1024, trace_steps=4096, host_features=host, **cfg)
                    with SpecSession(target, dft, c) as s:
                        assert s.info.feature_rows == (0 if host else max(512, c.n_ubatch))
                        runs = []
                        for prompt in (PROMPT, long_prompt, PROMPT):
                            r = s.generate(prompt, N_PREDICT)
                            steps = s.take_trace()
                            runs.append((r.tokens, [x["draft_hash"][0] for x in steps if x["k"][0] > 0]))
                    assert_equal_up_to_near_tie(runs[0][0], ref)
                    seen.append(runs)
                ring, host_copies = seen
                assert sum(len(d) for _, d in ring) >= 6 and all(all(d) for _, d in ring)
                assert ring == host_copies, (kind, types, cfg)
    # batches of 2 048 rows (the default): the prompt still goes in chunks the ring holds, and the output is exact
    with SpecSession(target, d2, SessionConfig(n_ctx=1024, adaptive=False, n_max=3)) as s:
        assert s.info.feature_rows == 512 and s.info.n_batch > len(long_prompt)
        r = s.generate(long_prompt, 16)
    with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], margins=True, n_ctx=1024)) as s:
        ref_long = s.generate(long_prompt, 16)
    assert r.stats.n_drafted > 0
    assert_equal_up_to_near_tie(r.tokens, ref_long)
    with Model(mtp_target) as mtp, SpecSession(mtp, None, SessionConfig(spec_types="draft-mtp", n_max=3)) as s:
        assert s.info.feature_rows == 0  # MTP reads the target's last hidden state, not layer inputs
    with pytest.raises(ConfigError, match="host_features"):
        SessionConfig(host_features=1)
    # where no drafter reads layer inputs there is nothing to copy: the field is refused, not ignored
    with Model(mtp_target) as mtp:
        for model, types in ((mtp, "draft-mtp"), (target, "ngram-simple"), (target, [])):
            with pytest.raises(ConfigError, match="host_features=true: only a drafter that reads the target's layer"):
                SpecSession(model, None, SessionConfig(spec_types=types, n_max=3, host_features=True))
