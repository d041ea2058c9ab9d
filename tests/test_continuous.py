"""Continuous batching: sequences join and leave a running batch, each exact on its own.

A sequence submitted while others generate has its prompt processed in chunks inside the same target batches
as their verify rows; its output must equal its own plain run (the near-tie rule of the session tests).
"""

from __future__ import annotations

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError, ContextOverflowError, SessionBusyError

from helpers import assert_equal_up_to_near_tie as assert_near
from helpers import solo as solo_run

PROMPTS = [[1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7], [4, 4, 8, 15, 16, 23, 42], [7, 3, 3, 7, 1, 2], [9, 8, 7, 6, 5, 4, 3, 2, 1],
           [2, 4, 6, 8, 10, 12, 14], [11, 13, 17, 19, 23]]
N_PREDICT = 40


def solo(target, prompt, n_predict=N_PREDICT):
    return solo_run(target, prompt, n_predict)


def run_until_idle(s, outputs, finished, submit_at=None, max_steps=10_000):
    """Step the batch; submit_at maps step index -> list of (key, prompt, kwargs) to submit then."""
    slots = {}
    step = 0
    pending = dict(submit_at or {})
    while True:
        for key, prompt, kw in pending.pop(step, []):
            slots[s.submit(prompt, **kw)] = key
        events, left = s.step_sequences()
        for e in events:
            key = slots[e.slot]
            outputs.setdefault(key, []).extend(e.tokens)
            if e.finish_reason is not None:
                finished[key] = e.finish_reason
                del slots[e.slot]
        step += 1
        if left == 0 and not pending:
            return step
        assert step < max_steps


@pytest.fixture(scope="module")
def models(dense_pair):
    t, d = dense_pair
    with Model(t) as target, Model(d) as drafter:
        yield target, drafter, {i: solo(target, p) for i, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("spec", ["draft-simple", "ngram-mod", "plain"])
def test_sequences_joining_a_running_batch_stay_exact(models, spec):
    target, drafter, refs = models
    cfg = SessionConfig(adaptive=False, spec_types=[] if spec == "plain" else [spec], n_max=4, n_ctx=2048,
                        n_parallel=4, ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=4)
    with SpecSession(target, drafter if spec == "draft-simple" else None, cfg) as s:
        outputs, finished = {}, {}
        # two at once, one a few steps later, then three more as slots free up
        plan = {0: [(0, PROMPTS[0], {"n_predict": N_PREDICT}), (1, PROMPTS[1], {"n_predict": N_PREDICT})],
                3: [(2, PROMPTS[2], {"n_predict": N_PREDICT})],
                9: [(3, PROMPTS[3], {"n_predict": N_PREDICT})]}
        run_until_idle(s, outputs, finished, plan)
        plan = {0: [(4, PROMPTS[4], {"n_predict": N_PREDICT})], 2: [(5, PROMPTS[5], {"n_predict": N_PREDICT})]}
        run_until_idle(s, outputs, finished, plan)
    assert sorted(finished) == list(range(6)) and set(finished.values()) == {"length"}
    for key, tokens in outputs.items():
        assert_near(tokens, refs[key])


def test_a_long_prompt_is_processed_in_chunks_beside_running_sequences(models):
    target, drafter, refs = models
    long_prompt = (PROMPTS[0] * 30)[:300]
    ref_long = solo(target, long_prompt)
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=2048, n_parallel=2,
                        n_batch=64, n_ubatch=64)
    with SpecSession(target, drafter, cfg) as s:
        first = s.submit(PROMPTS[1], n_predict=N_PREDICT)
        early = []
        for _ in range(2):
            early += [t for e in s.step_sequences()[0] for t in e.tokens]
        second = s.submit(long_prompt, n_predict=N_PREDICT)
        outputs, prompt_done, finished = {first: early, second: []}, {second: 0}, {}
        left = 1
        steps_with_both = 0
        while left:
            events, left = s.step_sequences()
            slots = {e.slot for e in events}
            steps_with_both += {first, second} <= slots
            for e in events:
                outputs[e.slot].extend(e.tokens)
                prompt_done[e.slot] = prompt_done.get(e.slot, 0) + e.n_prompt
                if e.finish_reason:
                    finished[e.slot] = e.finish_reason
    assert prompt_done[second] == len(long_prompt) - 1       # all but the last token, over several steps
    assert steps_with_both >= 2                              # chunks rode along with the other's verify steps
    assert_near(outputs[first], refs[1])
    assert_near(outputs[second], ref_long)


def test_cancel_frees_the_slot_at_once(models):
    target, drafter, refs = models
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=1024, n_parallel=2)
    with SpecSession(target, drafter, cfg) as s:
        a = s.submit(PROMPTS[0], n_predict=-1)
        b = s.submit(PROMPTS[1], n_predict=N_PREDICT)
        with pytest.raises(SessionBusyError, match="slots are taken"):
            s.submit(PROMPTS[2])
        for _ in range(3):
            s.step_sequences()
        assert s.cancel(a)
        events, _ = s.step_sequences()
        assert {e.slot: e.finish_reason for e in events}[a] == "stopped"
        c = s.submit(PROMPTS[2], n_predict=N_PREDICT)          # the freed slot takes the next sequence
        assert c == a
        outputs, finished = {}, {}
        while True:
            events, left = s.step_sequences()
            for e in events:
                outputs.setdefault(e.slot, []).extend(e.tokens)
                if e.finish_reason:
                    finished[e.slot] = e.finish_reason
            if not left:
                break
        assert finished == {b: "length", c: "length"}
        assert_near(outputs[c], refs[2])
        assert not s.cancel(c)  # nothing there any more


def test_each_sequence_has_its_own_settings(models):
    target, drafter, _ = models
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=1024, n_parallel=3)
    with SpecSession(target, drafter, cfg) as s:
        short = s.submit(PROMPTS[0], n_predict=5)
        hot1 = s.submit(PROMPTS[0], n_predict=30, temp=1.0, top_k=8, top_p=1.0, min_p=0.0, seed=1)
        hot2 = s.submit(PROMPTS[0], n_predict=30, temp=1.0, top_k=8, top_p=1.0, min_p=0.0, seed=2)
        outputs, drafted = {}, {}
        left = 3
        while left:
            events, left = s.step_sequences()
            for e in events:
                outputs.setdefault(e.slot, []).extend(e.tokens)
                drafted[e.slot] = drafted.get(e.slot, 0) + e.n_drafted
    assert len(outputs[short]) == 5 and len(outputs[hot1]) == 30 == len(outputs[hot2])
    assert outputs[hot1] != outputs[hot2]              # different seeds, different samples
    assert drafted[hot1] > 0


def test_modes_do_not_mix_and_bad_sequences_are_refused(models):
    target, drafter, _ = models
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=256, n_parallel=2)
    with SpecSession(target, drafter, cfg) as s:
        with pytest.raises(ContextOverflowError):
            s.submit([1 + i % 400 for i in range(600)])   # over the context
        with pytest.raises(ConfigError):
            s.submit([1, 2, 10_000_000])
        with pytest.raises(ConfigError):
            s.submit(PROMPTS[0], temp=float("nan"))
        slot = s.submit(PROMPTS[0], n_predict=8)
        s.step_sequences()
        with pytest.raises(SessionBusyError):
            s.generate(PROMPTS[1], 4)                     # a begin-style generation would drop the running batch
        while s.step_sequences()[1]:
            pass
        assert s.generate(PROMPTS[1], 4).finish_reason == "length"   # idle again: the other mode is free
        assert not s.cancel(slot)


def test_every_slot_is_free_for_submit_after_a_begin_style_generation(models):
    target, drafter, refs = models
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=512, n_parallel=2)
    with SpecSession(target, drafter, cfg) as s:
        for _ in range(2):   # begin-style, then continuous, twice: the slots change hands both ways
            first = s.generate_batch([PROMPTS[0], PROMPTS[1]], N_PREDICT)
            for i, r in enumerate(first):
                assert_near(r.tokens, refs[i])
            outputs, finished = {}, {}
            run_until_idle(s, outputs, finished, {0: [(2, PROMPTS[2], {"n_predict": N_PREDICT}),
                                                      (3, PROMPTS[3], {"n_predict": N_PREDICT})]})
            assert finished == {2: "length", 3: "length"}
            for key in (2, 3):
                assert_near(outputs[key], refs[key])


def run_one(s, prompt, n_predict):
    """Submit one sequence and step until it ends: (its slot, tokens, prompt tokens processed)."""
    slot = s.submit(prompt, n_predict=n_predict)
    tokens, processed = [], 0
    left = 1
    while left:
        events, left = s.step_sequences()
        for e in events:
            assert e.slot == slot
            tokens.extend(e.tokens)
            processed += e.n_prompt
    return slot, tokens, processed


@pytest.mark.parametrize("spec", ["plain", "draft-simple", "ngram-mod"])
def test_a_prompt_that_starts_like_a_finished_sequence_is_not_processed_again(models, spec):
    # a chat's next turn: the last prompt, its answer, a new question - only the new part is processed, and the
    # output is the one a fresh slot gives
    target, drafter, refs = models
    cfg = SessionConfig(adaptive=False, spec_types=[] if spec == "plain" else [spec], n_max=4, n_ctx=1024,
                        n_parallel=2, ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=4, cost_cache=False)
    first = PROMPTS[0]
    with SpecSession(target, drafter if spec == "draft-simple" else None, cfg) as s:
        slot, answer, processed = run_one(s, first, N_PREDICT)
        assert processed == len(first) - 1
        assert_near(answer, refs[0])
        follow = first + answer[:12] + [3, 1, 4, 1, 5]
        slot2, tokens, processed = run_one(s, follow, N_PREDICT)
        assert slot2 == slot  # the slot that holds the prefix
        assert processed == len(follow) - 1 - (len(first) + 12)
        assert_near(tokens, solo(target, follow))
        # a prompt sharing nothing takes the other, empty slot and is processed whole; then one that shares a part
        slot3, tokens, processed = run_one(s, PROMPTS[3], N_PREDICT)
        assert slot3 != slot and processed == len(PROMPTS[3]) - 1
        assert_near(tokens, refs[3])
        part = follow[:7] + [2, 2, 2, 9]
        slot4, tokens, processed = run_one(s, part, N_PREDICT)
        assert slot4 == slot and processed == len(part) - 1 - 7
        assert_near(tokens, solo(target, part))


def step_until_done(s, slots, keep_running):
    """Step until every slot in `slots` has ended; the sequence in keep_running must still be going then.
    Returns each slot's tokens and the prompt tokens it processed."""
    tokens = {k: [] for k in slots}
    processed = dict.fromkeys(slots, 0)
    ended = set()
    while ended != set(slots):
        events, _ = s.step_sequences()
        for e in events:
            assert e.slot != keep_running or e.finish_reason is None
            if e.slot in tokens:
                tokens[e.slot].extend(e.tokens)
                processed[e.slot] += e.n_prompt
                if e.finish_reason is not None:
                    ended.add(e.slot)
    return tokens, processed


@pytest.mark.parametrize("spec", ["plain", "draft-simple", "ngram-mod"])
def test_sequences_sent_one_prompt_together_process_it_once(models, spec):
    # n choices of one prompt (or clients sending the same one at once): the first sequence processes it, the others
    # wait for that and copy its memory - the target's, and the draft model's, which then catches up on nothing
    target, drafter, _ = models
    prompt = (PROMPTS[0] + PROMPTS[3]) * 2
    cfg = SessionConfig(adaptive=False, spec_types=[] if spec == "plain" else [spec], n_max=4, n_ctx=2048,
                        n_parallel=3, ngram_mod_n_match=2, ngram_mod_n_min=1, ngram_mod_n_max=4, cost_cache=False,
                        trace_steps=4096)
    with SpecSession(target, drafter if spec == "draft-simple" else None, cfg) as s:
        slots = [s.submit(prompt, n_predict=N_PREDICT) for _ in range(3)]
        out, processed = step_until_done(s, slots, keep_running=None)
        assert sorted(processed.values()) == [0, 0, len(prompt) - 1]
        ref = solo(target, prompt)
        for k in slots:
            assert_near(out[k], ref)
        if spec == "draft-simple":
            caught_up = [c for step in s.take_trace() for c in step["catchup"]]
            assert max(caught_up) == 0  # no stream's draft model had the prompt to read before its first draft


def test_a_sequence_waiting_for_a_prompt_can_be_cancelled(models):
    # the second of two sequences of one prompt waits in the queue while the first processes it; cancelled there, it
    # ends with the next step and frees its slot, and the first is unaffected
    target, _, _ = models
    prompt = (PROMPTS[0] + PROMPTS[3]) * 2
    cfg = SessionConfig(spec_types=[], n_ctx=2048, n_parallel=2, n_batch=64, n_ubatch=64, cost_cache=False)
    with SpecSession(target, None, cfg) as s:
        a, b = s.submit(prompt, n_predict=N_PREDICT), s.submit(prompt, n_predict=N_PREDICT)
        # a processes its prompt; b, which would have had the batch's other 23 rows for its own, waits
        events, left = s.step_sequences()
        assert left == 2 and [e.slot for e in events] == [a]
        tokens = list(events[0].tokens)
        s.cancel(b)
        events, left = s.step_sequences()
        ended = [e for e in events if e.slot == b]
        assert len(ended) == 1 and ended[0].finish_reason is not None and ended[0].tokens == []
        assert left == 1
        tokens += [t for e in events if e.slot == a for t in e.tokens]
        out, _ = step_until_done(s, [a], keep_running=None)
        assert_near(tokens + out[a], solo(target, prompt))
        assert {s.submit(prompt, n_predict=2), s.submit(PROMPTS[1], n_predict=2)} == {a, b}  # both slots free again


def test_a_prompt_continuing_a_running_sequence_copies_what_it_committed(models):
    # a client sends the text another sequence is still generating, and more: only the new part is processed
    target, drafter, _ = models
    cfg = SessionConfig(adaptive=False, spec_types=["draft-simple"], n_max=4, n_ctx=2048, n_parallel=2,
                        cost_cache=False)
    with SpecSession(target, drafter, cfg) as s:
        first = s.submit(PROMPTS[0] * 2, n_predict=200)
        answer = []
        while len(answer) < 12:
            events, left = s.step_sequences()
            assert left == 1
            answer += [t for e in events for t in e.tokens]
        follow = PROMPTS[0] * 2 + answer[:10] + [3, 1, 4]
        second = s.submit(follow, n_predict=N_PREDICT)
        assert second != first
        out, processed = step_until_done(s, [second], keep_running=first)
        s.cancel(first)
        assert processed[second] == len(follow) - 1 - (len(PROMPTS[0]) * 2 + 10)
        assert_near(out[second], solo(target, follow))


def test_a_target_whose_memory_cannot_be_cut_processes_each_prompt(hybrid_pair):
    # a recurrent target keeps no prefix (its state is the whole past): each sequence processes its prompt, and
    # none waits for another
    t, _ = hybrid_pair
    prompt = (PROMPTS[0] + PROMPTS[3]) * 2
    with Model(t) as target:
        cfg = SessionConfig(spec_types=[], n_ctx=2048, n_parallel=2, cost_cache=False)
        with SpecSession(target, None, cfg) as s:
            slots = [s.submit(prompt, n_predict=12) for _ in range(2)]
            out, processed = step_until_done(s, slots, keep_running=None)
            assert processed == dict.fromkeys(slots, len(prompt) - 1)
            assert_near(out[slots[0]], solo(target, prompt, 12))
            assert_near(out[slots[1]], solo(target, prompt, 12))


def test_new_sequences_take_slots_beside_the_running_ones(models):
    # a batch reaches the model in one pass only over consecutive slots (each slot is a KV stream; llama.cpp splits
    # a batch at every gap), so a new sequence goes beside the running ones - unless a slot remembers a much
    # longer prefix of its prompt (a long chat's next turn)
    target, _, _ = models
    long_prompt = [(i * 7) % 500 + 1 for i in range(300)]
    cfg = SessionConfig(spec_types=[], n_ctx=4096, n_parallel=4, cost_cache=False)
    with SpecSession(target, None, cfg) as s:
        # four fresh sequences fill the slots in order; the first three end, the fourth keeps running in slot 3
        assert [s.submit(p, n_predict=n) for p, n in ((long_prompt, 3), (PROMPTS[1], 3), (PROMPTS[2], 3),
                                                      (PROMPTS[3], 300))] == [0, 1, 2, 3]
        step_until_done(s, [0, 1, 2], keep_running=3)
        # slot 1 remembers 7 tokens of this prompt, but slot 2 is beside the running one: the prompt is processed
        # whole there
        short_turn = PROMPTS[1] + [1, 2, 3]
        assert s.submit(short_turn, n_predict=N_PREDICT) == 2
        # slot 0 remembers 300 tokens of this one: worth the gap
        long_turn = long_prompt + [5, 6, 7]
        assert s.submit(long_turn, n_predict=N_PREDICT) == 0
        out, processed = step_until_done(s, [0, 2], keep_running=3)
        s.cancel(3)
        assert processed == {2: len(short_turn) - 1, 0: len(long_turn) - 1 - len(long_prompt)}
        assert_near(out[2], solo(target, short_turn))
        assert_near(out[0], solo(target, long_turn))


def test_sequences_joining_together_share_one_run_of_slots(models):
    # after sequences of different lengths have ended, the slots holding least are 2 and then 0; two new
    # sequences go beside each other all the same
    target, _, refs = models
    cfg = SessionConfig(spec_types=[], n_ctx=2048, n_parallel=4, cost_cache=False)
    with SpecSession(target, None, cfg) as s:
        outputs, finished = {}, {}
        run_until_idle(s, outputs, finished,
                       {0: [(k, PROMPTS[k], {"n_predict": n}) for k, n in enumerate((2, 30, 3, 30))]})
        a = s.submit(PROMPTS[4], n_predict=N_PREDICT)
        b = s.submit(PROMPTS[5], n_predict=N_PREDICT)
        assert a == 2 and abs(a - b) == 1
        out, _ = step_until_done(s, [a, b], keep_running=None)
        assert_near(out[a], refs[4])
        assert_near(out[b], refs[5])
