"""convert with the target given as a Hugging Face model directory (config.json + tokenizer.json, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from ckptfactory import write_dflash_checkpoint, write_target_gguf, write_target_hf_dir
from pyllamaspec.tools import convert as cv
from pyllamaspec.tools.convert.target import read_target
from pyllamaspec.errors import ConversionError, PairingError


def tokenizer_fields(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    out = {}
    for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        f = r.fields[name]
        out[name] = [bytes(f.parts[i]) for i in f.data]
    f = r.fields["tokenizer.ggml.token_type"]
    out["tokenizer.ggml.token_type"] = [int(f.parts[i][0]) for i in f.data]
    for name in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        f = r.fields[name]
        out[name] = bytes(f.parts[f.data[0]]).decode()
    for name in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id"):
        f = r.fields[name]
        out[name] = int(f.parts[f.data[0]][0])
    return out


def test_hf_directory_gives_the_same_tokenizer_as_the_gguf_target(tmp_path):
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    from_gguf = cv.convert_dflash(ckpt, write_target_gguf(tmp_path / "target.gguf"), tmp_path / "a.gguf")
    hf = write_target_hf_dir(tmp_path / "Qwen3-tiny")
    from_hf = cv.convert_dflash(ckpt, hf, tmp_path / "b.gguf")
    a, b = tokenizer_fields(from_gguf), tokenizer_fields(from_hf)
    assert a == b
    assert b["tokenizer.ggml.model"] == "gpt2" and b["tokenizer.ggml.pre"] == "qwen2"
    assert b["tokenizer.ggml.token_type"][-1] == 5 and b["tokenizer.ggml.tokens"][-1] == b"[PAD287]"
    # the weights do not depend on where the tokenizer came from
    ta = {t.name: t.data.tobytes() for t in gguf.GGUFReader(from_gguf).tensors}
    tb = {t.name: t.data.tobytes() for t in gguf.GGUFReader(from_hf).tensors}
    assert ta == tb


def test_hf_directory_target_pairing_is_checked(tmp_path):
    hf = write_target_hf_dir(tmp_path / "wide", n_embd=128)
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    with pytest.raises(PairingError, match="hidden_size"):
        cv.convert_dflash(ckpt, hf, tmp_path / "out.gguf")
    shallow = write_target_hf_dir(tmp_path / "shallow", n_layer=2)  # trained on a 4-layer target
    with pytest.raises(PairingError, match="n_layer 2"):
        cv.convert_dflash(ckpt, shallow, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_qwen35_text_config_mrope_and_mtp_layers(tmp_path):
    hf = write_target_hf_dir(tmp_path / "q35", model_type="qwen3_5_text", mtp_layers=1, mrope=True, text_config=True)
    t = read_target(hf)
    assert (t.arch, t.n_embd, t.n_layer, t.block_count, t.uses_mrope) == ("qwen35", 64, 4, 5, True)
    out = cv.convert_dflash(write_dflash_checkpoint(tmp_path / "ckpt"), hf, tmp_path / "d.gguf")
    r = gguf.GGUFReader(out)
    f = r.fields["dflash.rope.dimension_sections"]
    assert [int(f.parts[i][0]) for i in f.data][1:] == [0, 0, 0]  # degenerate sections for an M-RoPE target
    assert bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode() == "qwen35"


@pytest.mark.parametrize("change,needle", [
    (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
    (lambda d: (d / "config.json").write_text("{not json"), "cannot read"),
    (lambda d: _edit(d / "config.json", model_type="t5"), "model_type 't5'"),
    (lambda d: _edit(d / "config.json", hidden_size=0), "hidden_size must be a positive integer"),
    (lambda d: _edit(d / "config.json", vocab_size=100), "vocab_size is 100"),
    (lambda d: _edit_model(d, type="Unigram"), "not byte-level BPE"),
])
def test_bad_hf_directory_is_named(tmp_path, change, needle):
    hf = write_target_hf_dir(tmp_path / "hf")
    change(hf)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConversionError, match=needle):
        cv.convert_dflash(write_dflash_checkpoint(tmp_path / "ckpt"), hf, out / "d.gguf")
    assert list(out.iterdir()) == []


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="without config.json"):
        cv.convert_dflash(write_dflash_checkpoint(tmp_path / "ckpt"), tmp_path / "empty", tmp_path / "d.gguf")


def _edit(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def _edit_model(d: Path, **fields) -> None:
    data = json.loads((d / "tokenizer.json").read_text())
    data["model"].update(fields)
    (d / "tokenizer.json").write_text(json.dumps(data))


def test_drafter_converted_against_a_directory_runs_exactly(tmp_path, dense_pair):
    """End to end: the synthetic dense target's sizes as an HF directory, the drafter then run with its GGUF."""
    from pyllamaspec import Model, SessionConfig, SpecSession

    from helpers import N_PREDICT, PROMPT, assert_equal_up_to_near_tie, plain

    target_path, _ = dense_pair
    with Model(target_path) as target:
        info = target.info
        hf = write_target_hf_dir(tmp_path / "dense-hf", n_embd=info.n_embd, n_layer=info.n_layer,
                                 vocab=info.n_vocab)
        ckpt = write_dflash_checkpoint(tmp_path / "ckpt", hidden=info.n_embd, n_layers=1, n_heads=4, n_kv_heads=2,
                                       head_dim=info.n_embd // 4, intermediate=2 * info.n_embd, vocab=info.n_vocab,
                                       target_layer_ids=(0,), num_target_layers=None,
                                       mask_token_id=info.n_vocab - 1, dtype="f32", seed=11, block_size=16)
        drafter_path = cv.convert_dflash(ckpt, hf, tmp_path / "drafter.gguf", outtype="f32")
        ref = plain(target)
        with Model(drafter_path) as drafter, SpecSession(target, drafter, SessionConfig(adaptive=False, n_max=7, n_ctx=512)) as s:
            r = s.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert r.stats.n_drafted > 0


def test_hf_directory_of_an_arch_without_layer_inputs_is_refused(tmp_path):
    hf = write_target_hf_dir(tmp_path / "qwen2", model_type="qwen2")
    with pytest.raises(PairingError, match="qwen2 target does not hand over layer inputs"):
        cv.convert_dflash(write_dflash_checkpoint(tmp_path / "ckpt"), hf, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
