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


def _cli(*argv, timeout=120):
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


def test_thread_counts_are_range_checked_before_the_quantizer_runs(q8_pair, tmp_path):
    import numpy as np

    d, t8, _ = q8_pair
    out = tmp_path / "t.gguf"
    r = _cli("quantize", str(t8), str(out), "--allow-requantize", "-t", "2147483647")
    assert r.returncode == 2, r.stderr
    assert "threads=2147483647 must be within 0..512" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr and not out.exists()
    for bad, words in ((-1, "within 0..512"), (2 ** 40, "within 0..512"), (1.5, "integer"), (True, "integer"),
                       ("4", "integer")):
        with pytest.raises(QuantizeError, match=words):
            quantize(t8, out, "Q4_0", threads=bad, allow_requantize=True)
    with pytest.raises(QuantizeError, match="must be a str"):
        quantize(t8, out, None, allow_requantize=True)  # type: ignore[arg-type]
    # numpy integers are integers; and the process is still usable
    r = quantize(t8, out, "Q4_0", threads=np.int64(2), allow_requantize=True)
    assert r["bytes_out"] > 0 and read_summary(out).file_type == "Q4_0"


def test_a_device_node_or_symlink_is_never_replaced(q8_pair, tmp_path):
    import os
    import stat as stat_mod

    d, t8, _ = q8_pair
    with pytest.raises(QuantizeError, match="not a regular file; refusing"):
        quantize(t8, "/dev/null", "Q4_0", allow_requantize=True, force=True)
    assert stat_mod.S_ISCHR(os.stat("/dev/null").st_mode)
    kept = tmp_path / "kept.gguf"
    kept.write_bytes(b"keep me")
    link = tmp_path / "link.gguf"
    link.symlink_to(kept)
    with pytest.raises(QuantizeError, match="symbolic link, not a regular file"):
        quantize(t8, link, "Q4_0", allow_requantize=True, force=True)
    assert link.is_symlink() and kept.read_bytes() == b"keep me"
    r = _cli("quantize", str(t8), "/dev/null", "--allow-requantize", "--force")
    assert r.returncode == 2 and "refusing to replace it" in r.stderr


def test_a_full_disk_is_reported_with_the_os_reason_and_keeps_the_old_file(q8_pair, tmp_path):
    d, t8, _ = q8_pair
    mnt = tmp_path / "small"
    mnt.mkdir()
    size = t8.stat().st_size // 4 + 64 * 1024  # room for the old file, not for the new one beside it
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        old = mnt / "out.gguf"
        old.write_bytes(b"old model " * 100)
        with pytest.raises(QuantizeError) as e:
            quantize(t8, old, "Q4_0", allow_requantize=True, force=True)
        msg = str(e.value)
        assert "No space left on device" in msg and str(mnt) in msg
        assert old.read_bytes() == b"old model " * 100  # intact
        assert sorted(p.name for p in mnt.iterdir()) == ["out.gguf"]  # no temp file left
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
