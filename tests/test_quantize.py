"""`pyllamaspec quantize`: requantization through upstream's quantizer, drafter-aware and atomic."""

from __future__ import annotations

import subprocess
import sys

import pytest
from clirun import CLI

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.tools import synth
from pyllamaspec.tools.convert import convert_dflash
from pyllamaspec.errors import QuantizeError
from pyllamaspec.ggufinfo import read_summary
from pyllamaspec.tools.quantize import quantize

from ckptfactory import write_dflash_checkpoint

SHAPE = synth.TargetShape(arch="qwen3", n_vocab=512, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512)
PROMPT = [1, 5, 9, 2, 7, 3]


@pytest.fixture(scope="module")
def q8_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant")
    t32, d32 = synth.write_pair(d, SHAPE, seed=21)
    t8 = d / "target-q8.gguf"
    quantize(t32, t8, "Q8_0")
    return d, t8, d32


def test_requantizing_needs_allow_requantize_and_leaves_nothing(q8_pair):
    d, t8, _ = q8_pair
    before = sorted(p.name for p in d.iterdir())
    with pytest.raises(QuantizeError, match="allow-requantize"):
        quantize(t8, d / "target-q4.gguf", "Q4_0")
    assert sorted(p.name for p in d.iterdir()) == before  # no output, no temp file


def test_q8_to_q4_shrinks_and_still_runs(q8_pair):
    d, t8, d32 = q8_pair
    out = d / "target-q4-ok.gguf"
    r = quantize(t8, out, "Q4_0", allow_requantize=True)
    assert r["bytes_out"] < 0.75 * r["bytes_in"]
    assert read_summary(out).file_type == "Q4_0"
    with Model(out) as target, Model(d32) as drafter:
        with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types="draft-simple", n_max=4, n_ctx=256)) as s:
            res = s.generate(PROMPT, 16)
    assert len(res.tokens) == 16 and res.stats.n_drafted > 0


def test_never_overwrites_its_input_or_an_existing_file(q8_pair):
    d, t8, _ = q8_pair
    data = t8.read_bytes()
    with pytest.raises(QuantizeError, match="never overwrites its input"):
        quantize(t8, t8, "Q4_0", allow_requantize=True, force=True)
    other = d / "exists.gguf"
    other.write_bytes(b"keep me")
    with pytest.raises(QuantizeError, match="--force"):
        quantize(t8, other, "Q4_0", allow_requantize=True)
    assert other.read_bytes() == b"keep me" and t8.read_bytes() == data


def test_unknown_type_is_refused(q8_pair):
    _, t8, _ = q8_pair
    with pytest.raises(QuantizeError, match="unknown type"):
        quantize(t8, t8.with_name("x.gguf"), "Q3_FANCY")


def test_dflash2_drafter_keeps_its_selector_at_full_precision(tmp_path, dense_pair):
    target_path, _ = dense_pair
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, hidden=64, n_layers=1, n_heads=4, n_kv_heads=2,
                                   head_dim=16, intermediate=128, vocab=512, target_layer_ids=(0,),
                                   num_target_layers=None, mask_token_id=511, dtype="f32", block_size=8,
                                   conv_group_size=16, selector_rank=32, selector_top_k=4)
    # rows of 64: Q8_0/Q4_0 apply (block 32), so every 2-D weight is a candidate for quantization
    f16 = convert_dflash(ckpt, target_path, tmp_path / "d2-f16.gguf", outtype="f16")
    q4 = tmp_path / "d2-q4.gguf"
    r = quantize(f16, q4, "Q4_0")
    assert r["drafter_overrides"]
    tensors = read_summary(q4).tensors
    for name in ("selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight", "fc.weight"):
        assert tensors[name][1] == "F16", f"{name} was quantized to {tensors[name][1]}"
    assert tensors["blk.0.attn_q.weight"][1] == "Q4_0"
    with Model(target_path) as target, Model(q4) as drafter:
        with SpecSession(target, drafter, SessionConfig(adaptive=False, n_max=7, n_ctx=256)) as s:
            assert s.info.is_dflash2
            assert len(s.generate(PROMPT, 16).tokens) == 16


def test_cli_reports_sizes(q8_pair, tmp_path):
    _, t8, _ = q8_pair
    out = subprocess.run([*CLI, "quantize", str(t8), str(tmp_path / "c.gguf"), "--type", "Q4_0",
                          "--allow-requantize"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "MiB ->" in out.stderr and (tmp_path / "c.gguf").exists()
    bad = subprocess.run([*CLI, "quantize", str(t8), str(tmp_path / "c.gguf")], capture_output=True,
                         text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "error" in bad.stderr


def test_synthetic_models_can_be_written_at_f16(tmp_path):
    path = synth.write_target(tmp_path / "t16.gguf", SHAPE, seed=5, f16=True)
    assert read_summary(path).file_type == "F16"
    assert [p.name for p in tmp_path.iterdir()] == ["t16.gguf"]  # no F32 intermediate left behind
    with Model(path) as m:
        assert m.info.n_embd == SHAPE.n_embd
