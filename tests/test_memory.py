"""The per-device memory estimate that refuses impossible configurations before anything is allocated."""

from __future__ import annotations

import pytest

from pyllamaspec import SessionConfig
from pyllamaspec.tools import synth
from pyllamaspec.errors import MemoryBudgetError
from pyllamaspec.memory import DeviceMemory, MemoryEstimate, check_fits, estimate_memory, max_parallel


def total_need(estimate: MemoryEstimate) -> DeviceMemory:
    """All devices together (the KV cache sits on a GPU when there is one, on the host otherwise)."""
    return DeviceMemory("all", 0, 0, *(sum(getattr(d, f) for d in estimate.devices)
                                       for f in ("model", "context", "compute")))


def test_context_and_ring_are_counted(hybrid_pair):
    target, _ = hybrid_pair
    small = total_need(estimate_memory(target, session_config=SessionConfig(adaptive=False, spec_types=[], n_ctx=256)))
    large = total_need(estimate_memory(target, session_config=SessionConfig(adaptive=False, spec_types=[], n_ctx=8192)))
    assert small.model > 0 and large.context > small.context  # KV grows with the context
    no_ring = total_need(estimate_memory(target, session_config=SessionConfig(adaptive=False, spec_types="ngram-mod", n_max=16,
                                                                             n_rs_seq=0, n_ctx=256)))
    ring = total_need(estimate_memory(target, session_config=SessionConfig(adaptive=False, spec_types="ngram-mod", n_max=16,
                                                                          n_rs_seq=16, n_ctx=256)))
    assert ring.context > no_ring.context  # 16 snapshot planes of recurrent state


def test_drafter_weights_are_counted(dense_pair):
    target, drafter = dense_pair
    alone = total_need(estimate_memory(target, session_config=SessionConfig(adaptive=False, spec_types=[], n_ctx=256)))
    both = total_need(estimate_memory(target, drafter, session_config=SessionConfig(adaptive=False, spec_types="draft-simple",
                                                                                   n_ctx=256)))
    assert both.need > alone.need


def test_the_features_a_drafter_reads_are_counted_where_the_target_keeps_them(dense_pair, tmp_path_factory):
    # a DFlash or EAGLE3 drafter reads the target's layer inputs, which the target keeps for it on the layers' devices
    # (here the host): 513 rows of n_embd floats per layer read and per sequence, a layer read twice kept once.
    # EAGLE3's read of the output layer's input is the nextn embeddings, which no ring keeps; with host_features
    # nothing is kept, and a draft model reads no features
    from helpers import ON_GPU, TARGETS, make_dflash

    from pyllamaspec import Model
    _, n_embd, ids = TARGETS["dense"]
    target, draft_model = dense_pair
    dflash = make_dflash(tmp_path_factory, target, n_embd, ids, version=1, block_size=16)
    eagle3 = tmp_path_factory.mktemp("eagle3mem") / "eagle3.gguf"
    with Model(target) as t, Model(dflash) as d:
        n_layer, dflash_layers = t.info.n_layer, set(d.info.target_layers)
        assert t.info.n_embd == n_embd and dflash_layers
    synth.write_eagle3_drafter(eagle3, target, target_layers=(0, 0, n_layer), n_embd=n_embd)

    def context(drafter, n_parallel, **kw):
        cfg = SessionConfig(**{**dict(adaptive=False, n_max=4, n_ctx=256, n_parallel=n_parallel), **kw})
        return total_need(estimate_memory(target, drafter, session_config=cfg)).context

    def by_device(**kw):
        cfg = SessionConfig(adaptive=False, n_max=4, n_ctx=256, **kw)
        return {d.name: d.context for d in estimate_memory(target, dflash, session_config=cfg).devices}

    # on the device that holds the target's layers: the host here, the GPU where there is one
    kept_on, copied = by_device(), by_device(host_features=True)
    grew = [name for name in kept_on if kept_on[name] != copied.get(name, 0)]
    assert grew == (["Host"] if not ON_GPU else [n for n in kept_on if n != "Host"][:1]), (kept_on, copied)
    row = n_embd * 4
    for n_parallel in (1, 3):
        kept = context(dflash, n_parallel) - context(dflash, n_parallel, host_features=True)
        assert kept == len(dflash_layers) * 513 * row * n_parallel
        kept = (context(eagle3, n_parallel, spec_types="draft-eagle3")
                - context(eagle3, n_parallel, spec_types="draft-eagle3", host_features=True))
        assert kept == 513 * row * n_parallel  # layer 0, once
        assert context(draft_model, n_parallel) == context(draft_model, n_parallel, host_features=True)
    # at least a ubatch's rows: a prompt goes in the ubatches it would go in with host copies
    big = dict(n_ubatch=1024, n_batch=1024, n_ctx=2048)
    assert context(dflash, 1, **big) - context(dflash, 1, host_features=True, **big) == len(dflash_layers) * 1025 * row


def test_a_gpu_short_of_memory_is_refused_with_numbers():
    gib = 2 ** 30
    estimate = MemoryEstimate(devices=(
        DeviceMemory("ROCm0", free=15 * gib, total=16 * gib, model=14 * gib, context=2 * gib, compute=gib // 2),
        DeviceMemory("Host", free=gib, total=2 * gib, model=20 * gib, context=0, compute=0)), drafter_approximate=False)
    with pytest.raises(MemoryBudgetError, match=r"ROCm0 needs 16896 MiB .* has 15360 MiB free"):
        estimate.check()
    fits = MemoryEstimate(devices=(estimate.devices[0].__class__("ROCm0", 15 * gib, 16 * gib, 10 * gib, gib, gib),
                                   estimate.devices[1]), drafter_approximate=False)
    fits.check(host_available=64 * gib)  # weights in host memory are mmap'ed: only KV and compute must be resident


def test_a_kv_cache_larger_than_host_memory_is_refused():
    gib = 2 ** 30
    estimate = MemoryEstimate(devices=(DeviceMemory("Host", free=0, total=0, model=4 * gib, context=60 * gib,
                                                    compute=gib),), drafter_approximate=False)
    with pytest.raises(MemoryBudgetError, match="host memory: the KV cache and compute buffers need 62464 MiB"):
        estimate.check(host_available=24 * gib)
    estimate.check(host_available=80 * gib)


def ring_room(hybrid_pair):
    """A hybrid target, a config whose slots each keep a snapshot ring, the estimate for one slot, and a host budget
    between what one slot and four slots need."""
    from pyllamaspec.buildinfo import info
    if set(info().get("backends", [])) - {"cpu"}:
        pytest.skip("the context sits in GPU memory in a GPU build; host_available does not bound it there")
    target, _ = hybrid_pair
    cfg = SessionConfig(adaptive=False, spec_types="ngram-mod", n_max=8, n_rs_seq=8, n_ctx=512)
    one = total_need(estimate_memory(target, session_config=cfg))
    four = total_need(estimate_memory(target, session_config=cfg.replace(n_parallel=4)))
    assert four.context > one.context  # each slot keeps its own snapshot planes
    room = one.context + one.compute + 512 * 2 ** 20 + (four.context + four.compute - one.context - one.compute) // 2
    return target, cfg, one, room


def test_max_parallel_is_the_slot_count_that_fits(hybrid_pair):
    target, cfg, one, room = ring_room(hybrid_pair)
    n = max_parallel(target, session_config=cfg, host_available=room)
    assert 1 <= n < 4
    estimate_memory(target, session_config=cfg.replace(n_parallel=n)).check(host_available=room)
    with pytest.raises(MemoryBudgetError):
        estimate_memory(target, session_config=cfg.replace(n_parallel=n + 1)).check(host_available=room)
    assert max_parallel(target, session_config=cfg, host_available=one.context) == 0  # not even one


def test_too_many_sequences_are_refused_with_the_count_that_fits(hybrid_pair):
    target, cfg, one, room = ring_room(hybrid_pair)
    fit = max_parallel(target, session_config=cfg, host_available=room)
    with pytest.raises(MemoryBudgetError, match=rf"at most {fit} of the 4 sequences fit .*-np {fit}\)"):
        check_fits(target, session_config=cfg.replace(n_parallel=4), host_available=room)
    check_fits(target, session_config=cfg.replace(n_parallel=fit), host_available=room)
    with pytest.raises(MemoryBudgetError, match="not even one of the 4 sequences fits"):
        check_fits(target, session_config=cfg.replace(n_parallel=4), host_available=one.context)
    with pytest.raises(MemoryBudgetError) as single:  # one sequence: nothing to suggest about the count
        check_fits(target, session_config=cfg, host_available=one.context)
    assert "sequences" not in str(single.value)


def test_dense_target_keeps_no_ring_and_no_ring_limit(dense_pair):
    target, _ = dense_pair
    # a micro-batch too small for a 16-deep ring is fine on a target without recurrent state, as in a session
    e = estimate_memory(target, session_config=SessionConfig(spec_types="ngram-mod", n_max=7, n_rs_seq=16,
                                                             n_ubatch=8, n_batch=8, n_ctx=256))
    assert total_need(e).context > 0


def test_estimate_refuses_a_fifo_before_the_loader_opens_it(tmp_path):
    import os

    from pyllamaspec.errors import ModelLoadError

    os.mkfifo(tmp_path / "target.gguf")
    with pytest.raises(ModelLoadError, match="is a FIFO"):
        estimate_memory(tmp_path / "target.gguf")


def test_the_refusal_names_its_safety_margin():
    gib, mib = 2 ** 30, 2 ** 20
    # the need alone fits (15.5 of 16 GiB free); with the 512 MiB margin it does not
    gpu = MemoryEstimate(devices=(DeviceMemory("CUDA0", free=16 * gib, total=16 * gib, model=15 * gib + 128 * mib,
                                               context=gib // 4, compute=gib // 4),), drafter_approximate=False)
    with pytest.raises(MemoryBudgetError, match=r"512 MiB are kept free as a safety margin.*--no-memory-check"):
        gpu.check()
    gpu.check(headroom=0)
    host = MemoryEstimate(devices=(DeviceMemory("Host", free=0, total=0, model=0, context=gib, compute=0),),
                          drafter_approximate=False)
    with pytest.raises(MemoryBudgetError, match=r"plus a safety margin of 256 MiB, but 1100 MiB are available"):
        host.check(headroom=256 * mib, host_available=1100 * mib)
