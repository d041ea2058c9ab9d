"""Greedy rows sampled on the device that holds the target's output layer (backend_sampling): the default on a GPU,
forced here on the CPU, where the host's argmax is the reference. The device must commit the host's tokens on
every path (plain, a draft model, DFlash, a ring rollback, several streams), leave raw logits to whoever asks for
them, and fail where the host fails."""

from __future__ import annotations

import subprocess

import pytest

from clirun import CLI
from helpers import PROMPT, STREAM_PROMPTS, arm_session

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError, GenerationError, ParamError

N = 48


@pytest.mark.parametrize("arm", ["plain", "n4", "adaptive", "dflash2", "dflash2-adaptive"])
def test_the_device_commits_the_hosts_tokens(trio, arm):
    kind, target, drafter, d2 = trio
    for ignore_eos in (False, True):
        runs = {}
        for on in (False, True):
            with arm_session(target, drafter, d2, arm, backend_sampling=on, ignore_eos=ignore_eos) as s:
                assert s.info.backend_sampling is on
                if kind == "hybrid" and arm != "plain":
                    assert s.info.rollback_target == "ring"
                runs[on] = s.generate(PROMPT, N)
        host, device = runs[False], runs[True]
        assert len(device.tokens) == N
        assert device.tokens == host.tokens, f"{kind} {arm} ignore_eos={ignore_eos}"
        if "adaptive" in arm:
            continue  # its lengths follow measured costs, which differ from run to run
        # the same verdicts step by step, not only the same text
        assert (device.stats.n_steps, device.stats.n_drafted, device.stats.n_accepted) == \
               (host.stats.n_steps, host.stats.n_drafted, host.stats.n_accepted)
    if arm in ("n4", "dflash2"):
        assert host.stats.n_drafted > 0


def test_the_device_commits_the_hosts_tokens_over_a_real_models_vocabulary(tmp_path_factory):
    # the argmax of a vocabulary of a real model's size (152 064 logits: a GPU's kernel loops over the row, where a
    # tiny model's 512 fit one pass of a block), alone and in the 9 rows of a verify, must be the host's
    from pyllamaspec.tools import synth

    path = synth.write_target(tmp_path_factory.mktemp("wide") / "wide.gguf",
                              synth.TargetShape(arch="qwen3", n_vocab=152064), seed=11)
    with Model(path) as target, Model(path) as drafter:
        for arm in ("plain", "n8"):
            runs = {}
            for on in (False, True):
                with arm_session(target, drafter, None, arm, backend_sampling=on, ignore_eos=True) as s:
                    assert s.info.backend_sampling is on
                    runs[on] = s.generate(PROMPT, N)
            assert len(runs[True].tokens) == N
            assert runs[True].tokens == runs[False].tokens, arm
            if arm == "n8":  # the drafter is the target itself: its drafts land, 9 rows a verify
                assert runs[True].stats.n_accepted > 0


def test_streams_decoded_together_sample_each_on_the_device(trio):
    _, target, drafter, _ = trio
    out = {}
    for on in (False, True):
        cfg = SessionConfig(spec_types=["draft-simple"], adaptive=False, n_max=4, n_ctx=2048, n_parallel=3,
                            backend_sampling=on)
        with SpecSession(target, drafter, cfg) as s:
            out[on] = [r.tokens for r in s.generate_batch(STREAM_PROMPTS, N)]
    assert out[True] == out[False]
    assert all(len(t) == N for t in out[True])


def run_until_idle(s, submits):
    """Submit (key, prompt, kwargs) all at once, step until every sequence ends: {key: (tokens, logprobs)}."""
    slots = {s.submit(prompt, N, **kw): key for key, prompt, kw in submits}
    tokens, logprobs = {}, {}
    left = 1
    while left:
        events, left = s.step_sequences()
        for e in events:
            key = slots[e.slot]
            tokens.setdefault(key, []).extend(e.tokens)
            if e.logprobs is not None:
                logprobs.setdefault(key, []).extend(e.logprobs)
    return tokens, logprobs


def test_a_sequence_that_asks_for_logprobs_reads_its_logits_beside_ones_sampled_on_the_device(trio):
    """In one running batch a sequence with n_probs gets its log-probabilities from the raw logits while the others
    sample on the device; slots reused by the other kind switch over. Tokens and log-probabilities are the host's."""
    _, target, drafter, _ = trio
    first = [("a", STREAM_PROMPTS[0], {"n_probs": 2}), ("b", STREAM_PROMPTS[1], {})]
    then = [("c", STREAM_PROMPTS[2], {}), ("d", STREAM_PROMPTS[1], {"n_probs": 0})]  # the slots change over both ways
    results = {}
    for on in (False, True):
        cfg = SessionConfig(spec_types=["draft-simple"], adaptive=False, n_max=4, n_ctx=2048, n_parallel=2,
                            backend_sampling=on)
        with SpecSession(target, drafter, cfg) as s:
            tokens, logprobs = run_until_idle(s, first)
            more = run_until_idle(s, then)
            results[on] = ({**tokens, **more[0]}, {**logprobs, **more[1]})
    (host_tokens, host_lp), (dev_tokens, dev_lp) = results[False], results[True]
    assert dev_tokens == host_tokens
    assert set(dev_lp) == {"a", "d"} and len(dev_lp["a"]) == len(dev_lp["d"]) == N
    for key in ("a", "d"):
        for h, d in zip(host_lp[key], dev_lp[key]):
            assert d.token == h.token and [t for t, _ in d.top] == [t for t, _ in h.top]
            assert [d.logprob, *(v for _, v in d.top)] == pytest.approx([h.logprob, *(v for _, v in h.top)], abs=1e-5)


def test_scoring_reads_every_rows_logits_in_a_session_that_samples_on_the_device(trio):
    _, target, drafter, _ = trio
    cont = [3, 9, 27, 81, 243, 7]
    margins = {}
    for on in (False, True):
        with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], adaptive=False, n_max=4,
                                                        n_ctx=512, backend_sampling=on)) as s:
            margins[on] = s.score_margins(PROMPT, cont, chunk=5)
            after = s.generate(PROMPT, 8).tokens  # the sequence samples on the device again after scoring
        margins[on] = (margins[on], after)
    assert margins[True][1] == margins[False][1]
    assert margins[True][0] == pytest.approx(margins[False][0], abs=1e-6)
    assert all(m > 0 for m in margins[True][0])


def test_what_cannot_sample_on_the_device_is_refused_when_asked_for(dense_pair):
    with pytest.raises(ParamError, match="margins"):
        SessionConfig(backend_sampling=True, margins=True)
    for shape, said in (({"temp": 0.8}, "temp=0.8"), ({"logit_bias": {5: 1.0}}, "logit_bias"),
                        ({"grammar": 'root ::= "a"'}, "grammar"), ({"repeat_penalty": 1.1}, "repeat_penalty=1.1")):
        with pytest.raises(ParamError, match=f"backend_sampling=True .*{said}") as e:
            SessionConfig(backend_sampling=True, **shape)
        assert e.value.param == "backend_sampling"
    with Model(dense_pair[0]) as target:
        # the native check, for a caller that bypasses the config's (a session's own sampling is not greedy)
        from pyllamaspec import _native
        from pyllamaspec.native_params import native_session_params
        ffi, lib = _native.load()
        p = native_session_params(ffi, SessionConfig(spec_types=[], temp=0.8, n_ctx=256))
        p.backend_sampling = 1
        out, err = ffi.new("pls_session **"), _native.ErrorBuffer(ffi)
        with target._use() as t_ptr:
            rc = lib.pls_session_open(t_ptr, ffi.NULL, p, out, err.buf, err.SIZE)
        assert rc == lib.PLS_ERR_INVALID and out[0] == ffi.NULL
        assert "backend_sampling=1" in err.text and "not sample greedily" in err.text
        # left to the default: a greedy session samples on the device where the output layer is on a GPU, a session
        # that is not greedy on the host
        on_gpu = not target.info.head_device.upper().startswith("CPU")
        for cfg, expected in ((SessionConfig(spec_types=[], temp=0.8, seed=1), False),
                              (SessionConfig(spec_types=[]), on_gpu)):
            with SpecSession(target, None, cfg) as s:
                assert s.info.backend_sampling is expected
                assert len(s.generate(PROMPT, 4).tokens) == 4


@pytest.mark.parametrize("spec", [False, True])
def test_nan_logits_sampled_on_the_device_end_the_generation_with_an_error(nan_target, dense_pair, spec):
    with Model(dense_pair[1]) as drafter:
        cfg = SessionConfig(spec_types=["draft-simple"] if spec else [], adaptive=False, n_ctx=128, backend_sampling=True)
        with SpecSession(nan_target, drafter if spec else None, cfg) as s:
            assert s.info.backend_sampling
            for _ in range(2):  # the session stays usable, and says so again
                with pytest.raises(GenerationError, match="NaN logits"):
                    s.generate(PROMPT, 8)


def test_the_command_line_takes_llama_cpps_flag_and_refuses_what_it_cannot_honour(dense_pair):
    t, _ = dense_pair
    base = [*CLI, "generate", "-m", str(t), "--spec-type", "none", "-n", "6", "-p", "hello", "--raw"]
    on = subprocess.run(base + ["-bs"], capture_output=True, text=True, timeout=300)
    off = subprocess.run(base + ["--no-backend-sampling"], capture_output=True, text=True, timeout=300)
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert on.stdout == off.stdout and on.stdout.strip()
    for extra, said in ((["--temp", "0.8"], "temp=0.8"), (["--json"], "--json")):
        bad = subprocess.run(base + ["-bs", *extra], capture_output=True, text=True, timeout=300)
        assert bad.returncode != 0 and "Traceback" not in bad.stderr
        assert "backend" in bad.stderr and said in bad.stderr
