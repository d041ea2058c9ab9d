"""One pairing verdict: for every pair of a corpus of synthetic models, check_pair() refuses exactly when the
native session refuses to open (its own checks reached through the raw binding, the Python pre-check bypassed)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pyllamaspec import Model, SessionConfig, _native
from pyllamaspec.ggufinfo import check_pair, open_gguf, read_summary
from pyllamaspec.native_params import native_session_params
from pyllamaspec.tools import synth

from ckptfactory import rewrite_gguf
from helpers import make_dflash


@dataclass(frozen=True)
class Case:
    target: str
    drafter: str | None
    spec_types: tuple[str, ...] | None = None  # None: detected from the drafter
    n_max: int = 3
    field: str | None = None  # the problem check_pair names; None: the pair runs


CORPUS = [
    Case("dense", "perturbed"),
    Case("dense", "perturbed", n_max=64),
    Case("dense", "other-vocab", field="n_vocab"),
    Case("dense", "renamed-token", field="tokens"),
    Case("dense", "narrow"),  # a draft model's own width does not matter
    Case("dense", "dflash"),
    Case("dense", "dflash-wide", field="n_embd"),
    Case("dense", "dflash-bad-layer", field="target_layers"),
    Case("dense", "dflash-mask-outside", field="mask_token_id"),
    Case("dense", "dflash", n_max=-5, field="n_max"),
    Case("dense", "dflash", n_max=65, field="n_max"),
    Case("hybrid", "dflash-hybrid"),
    Case("hybrid", "dflash-hybrid-last-layer", field="target_layers"),
    Case("qwen2", "dflash", field="arch"),
    Case("dense", "eagle3", ("draft-eagle3",)),
    Case("dense", "eagle3-wide", ("draft-eagle3",), field="n_embd"),
    Case("dense", "eagle3-bad-layer", ("draft-eagle3",), field="target_layers"),
    Case("dense", None, ("draft-mtp",), field="n_layer_nextn"),
    Case("mtp", None, ("draft-mtp",)),
    Case("dense", None, ("ngram-mod",)),
    Case("dense", None, ("draft-simple",), field="spec_types"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, dense_pair, hybrid_pair, mtp_target):
    d = tmp_path_factory.mktemp("parity")
    dense, perturbed = dense_pair
    hybrid, _ = hybrid_pair
    wide_target = synth.write_target(d / "wide.gguf", synth.TargetShape(arch="qwen3", n_embd=128), seed=4)
    dflash = make_dflash(tmp_path_factory, dense, 64, (0,), version=1, block_size=16)
    dflash_hybrid = make_dflash(tmp_path_factory, hybrid, 128, (0, 2), version=1, block_size=16)
    tokens = open_gguf(perturbed).array("tokenizer.ggml.tokens", text=False)
    paths = {
        "dense": dense, "hybrid": hybrid, "mtp": mtp_target, "perturbed": perturbed,
        "qwen2": synth.write_target(d / "qwen2.gguf", synth.TargetShape(arch="qwen2"), seed=3),
        "other-vocab": synth.write_target(d / "vocab.gguf", synth.TargetShape(arch="qwen3", n_vocab=1024), seed=3),
        "renamed-token": rewrite_gguf(perturbed, d / "renamed.gguf", {
            "tokenizer.ggml.tokens": [*tokens[:100], b"renamed", *tokens[101:]]}),
        "narrow": synth.write_target(d / "narrow.gguf", synth.TargetShape(arch="qwen3", n_embd=32), seed=3),
        "dflash": dflash,
        "dflash-wide": make_dflash(tmp_path_factory, wide_target, 128, (0,), version=1, block_size=16),
        # dense has 2 layers: only the input of layer 1 can be handed over
        "dflash-bad-layer": rewrite_gguf(dflash, d / "bad-layer.gguf", {"dflash.target_layers": [2]}),
        "dflash-mask-outside": rewrite_gguf(dflash, d / "mask.gguf", {"tokenizer.ggml.mask_token_id": 512}),
        "dflash-hybrid": dflash_hybrid,
        # qwen35 does not hand over the input of layer n_layer (4)
        "dflash-hybrid-last-layer": rewrite_gguf(dflash_hybrid, d / "last.gguf", {"dflash.target_layers": [1, 4]}),
        "eagle3": synth.write_eagle3_drafter(d / "e3.gguf", dense, target_layers=(1, 1, 2), n_embd=64),
        "eagle3-wide": synth.write_eagle3_drafter(d / "e3w.gguf", dense, target_layers=(1, 1, 2), n_embd=128),
        "eagle3-bad-layer": synth.write_eagle3_drafter(d / "e3b.gguf", dense, target_layers=(1, 1, 3), n_embd=64),
    }
    models = {name: Model(path) for name, path in paths.items()}
    yield paths, models
    for model in models.values():
        model.close()


def native_refusal(target: Model, drafter: Model | None, spec_types: tuple[str, ...], n_max: int) -> str | None:
    """Open a session through the raw binding (no Python pairing check): None if it opens, else its message."""
    ffi, lib = _native.load()
    config = SessionConfig(spec_types=spec_types, n_ctx=512, n_batch=512, n_ubatch=512,
                           n_max=min(max(n_max, 0), _native.MAX_DRAFT))
    params = native_session_params(ffi, config)
    params.n_max = n_max  # out-of-range values too: the native check is what is compared
    err = _native.ErrorBuffer(ffi)
    slot = ffi.new("pls_session **")
    with target._use() as t_ptr:
        if drafter is not None:
            with drafter._use() as d_ptr:
                rc = lib.pls_session_open(t_ptr, d_ptr, params, slot, err.buf, err.SIZE)
        else:
            rc = lib.pls_session_open(t_ptr, ffi.NULL, params, slot, err.buf, err.SIZE)
    if rc != lib.PLS_OK:
        assert slot[0] == ffi.NULL
        return err.text
    lib.pls_session_close(slot[0])
    return None


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: f"{c.target}+{c.drafter}:{','.join(c.spec_types or ())}"
                                                      f":n{c.n_max}")
def test_check_pair_refuses_exactly_what_the_native_session_refuses(corpus, case: Case) -> None:
    paths, models = corpus
    target_summary = read_summary(paths[case.target])
    drafter_summary = read_summary(paths[case.drafter]) if case.drafter else None
    report = check_pair(target_summary, drafter_summary, case.spec_types, case.n_max)
    refusal = native_refusal(models[case.target], models[case.drafter] if case.drafter else None,
                             report.spec_types, case.n_max)

    assert report.ok == (refusal is None), f"check_pair: {report.problems}; native: {refusal}"
    assert report.ok == (case.field is None)
    if case.field is not None:
        assert case.field in [p.field for p in report.problems]
