"""`pyllamaspec synth`: streaming writer in every type, determinism, atomic output, bad input, the real presets'
plans against the published models' facts, and their scale-downs running sessions exactly."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest
from clirun import CLI

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.tools import synth
from pyllamaspec.errors import ConfigError
from pyllamaspec.ggufinfo import read_summary
from pyllamaspec.tools.quantize import quantize

from helpers import N_PREDICT, PROMPT, assert_equal_up_to_near_tie, assert_stats_consistent, plain

# spans several writer chunks (token_embd alone is 2M values) and has rows of 256 (Q6_K-able head)
WIDE = synth.TargetShape(arch="qwen3", n_vocab=8192, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512)


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tensor_bytes(path) -> dict[str, tuple[str, bytes]]:
    import gguf

    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).tobytes())) for t in r.tensors}


def run_cli(*args, cwd=None):
    return subprocess.run([*CLI, "synth", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


# ---------------------------------------------------------------------------------------------------------------
# every type: loads, generates, a perturbed drafter agrees often but not always
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen35"])
@pytest.mark.parametrize("wtype", synth.TYPES)
def test_every_type_loads_and_a_perturbed_drafter_is_exact(tmp_path, preset, wtype):
    t, d = synth.write_preset(tmp_path / "t.gguf", preset, drafter_out=tmp_path / "d.gguf", type=wtype, seed=3)
    s = read_summary(t)
    expect = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}[wtype]
    assert s.file_type == expect and s.tensor_types.get(expect, 0) > 0
    assert s.tensors["output_norm.weight"][1] == "F32"
    plan = synth.plan_target(preset, wtype)
    assert {n: (list(sh), ty) for n, (sh, ty) in s.tensors.items()} == {
        p.name: (list(p.shape), p.type) for p in plan.tensors}
    with Model(t) as target, Model(d) as drafter:
        ref = plain(target)
        assert len(ref.tokens) == N_PREDICT
        with SpecSession(target, drafter, SessionConfig(adaptive=False, spec_types="draft-simple", n_max=4, n_ctx=512)) as sess:
            r = sess.generate(PROMPT, N_PREDICT)
    assert_equal_up_to_near_tie(r.tokens, ref)
    assert_stats_consistent(r.stats)
    assert 0 < r.stats.n_accepted < r.stats.n_drafted  # a noisy copy: partial acceptance, real rollbacks


def test_f16_flag_is_an_alias_of_type_f16(tmp_path):
    a = synth.write_target(tmp_path / "a.gguf", synth.TargetShape(), seed=2, f16=True)
    b = synth.write_target(tmp_path / "b.gguf", synth.TargetShape(), seed=2, type="f16")
    assert sha(a) == sha(b)
    with pytest.raises(ConfigError, match="f16=True"):
        synth.write_target(tmp_path / "c.gguf", synth.TargetShape(), f16=True, type="q8_0")


# ---------------------------------------------------------------------------------------------------------------
# the same bytes as upstream's quantizer makes from the F32 model
# ---------------------------------------------------------------------------------------------------------------

QUANT_SHAPES = {
    "dense-untied": WIDE,
    "dense-tied": synth.TargetShape(arch="qwen2", n_vocab=1024, n_embd=256, n_layer=2, n_head=4, n_head_kv=2,
                                    n_ff=512, tie_embeddings=True),
    "hybrid": synth.PRESETS["tiny-qwen3.8-27b"],
    "moe": synth.PRESETS["tiny-qwen3.6-35b-a3b"],
    "moe-8-experts": dataclasses.replace(synth.PRESETS["tiny-qwen3.6-35b-a3b"], n_expert=8, n_expert_used=2),
}


@pytest.mark.parametrize("kind", sorted(QUANT_SHAPES))
def test_direct_types_equal_llama_quantize_of_the_f32_model(tmp_path, kind):
    shape = QUANT_SHAPES[kind]
    f32 = synth.write_target(tmp_path / "f32.gguf", shape, seed=4)
    for wtype, ftype in (("f16", "F16"), ("q8_0", "Q8_0"), ("q4_0", "Q4_0")):
        direct = synth.write_target(tmp_path / f"{wtype}.gguf", shape, seed=4, type=wtype)
        requant = tmp_path / f"{wtype}-quantize.gguf"
        quantize(f32, requant, ftype)
        a, b = tensor_bytes(direct), tensor_bytes(requant)
        assert {n: ty for n, (ty, _) in a.items()} == {n: ty for n, (ty, _) in b.items()}, wtype
        assert a == b, f"{wtype}: tensor data differs from llama-quantize's"
    head = tensor_bytes(tmp_path / "q4_0.gguf")["token_embd.weight" if shape.tie_embeddings else "output.weight"][0]
    assert head == ("Q6_K" if shape.n_embd % 256 == 0 else "Q8_0")


def test_drafter_types_equal_pyllamaspec_quantize_of_the_f32_drafter(tmp_path):
    p = synth.PRESET_TABLE["tiny-qwen3.8-27b"]
    t = synth.write_target(tmp_path / "t.gguf", p.target, seed=6)
    f32 = synth.write_dflash_drafter(tmp_path / "d32.gguf", t, p.drafter, seed=8)
    direct = synth.write_dflash_drafter(tmp_path / "d4.gguf", t, p.drafter, seed=8, type="q4_0")
    quantize(f32, tmp_path / "d4-quantize.gguf", "Q4_0")
    a, b = tensor_bytes(direct), tensor_bytes(tmp_path / "d4-quantize.gguf")
    assert a == b
    assert a["selector_predecessor.weight"][0] == "F16" and a["blk.0.attn_q.weight"][0] == "Q4_0"


# ---------------------------------------------------------------------------------------------------------------
# determinism, atomic output, refusals
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wtype", ["f16", "q4_0"])
def test_same_bytes_whatever_the_thread_count(tmp_path, wtype):
    paths = [synth.write_target(tmp_path / f"t{n}.gguf", WIDE, seed=11, type=wtype, n_threads=n, perturb_seed=5,
                                perturb_stddev=0.01) for n in (1, 2, 3)]
    assert len({sha(p) for p in paths}) == 1
    other_seed = synth.write_target(tmp_path / "s.gguf", WIDE, seed=12, type=wtype, n_threads=2)
    unperturbed = synth.write_target(tmp_path / "u.gguf", WIDE, seed=11, type=wtype, n_threads=2)
    assert len({sha(paths[0]), sha(other_seed), sha(unperturbed)}) == 3


def test_values_follow_their_kind(tmp_path):
    path = synth.write_target(tmp_path / "t.gguf", synth.PRESETS["tiny-qwen3.8-27b"], seed=3, stddev=0.05)
    data = {n: np.frombuffer(raw, dtype=np.float32) for n, (_, raw) in tensor_bytes(path).items()}
    norm, weight, decay = data["blk.0.attn_norm.weight"], data["blk.0.ffn_up.weight"], data["blk.0.ssm_a"]
    assert abs(norm.mean() - 1) < 0.02 and 0.03 < norm.std() < 0.07
    assert abs(weight.mean()) < 0.005 and weight.std() == pytest.approx(0.05, rel=0.05)
    assert (decay <= 0).all()


def test_output_is_never_partially_visible_and_cancel_leaves_nothing(tmp_path):
    out = tmp_path / "t.gguf"
    seen = []

    def watch(done, total):
        seen.append((out.exists(), sorted(p.name for p in tmp_path.iterdir()), done, total))

    synth.write_target(out, WIDE, type="q8_0", progress=watch)
    assert len(seen) > 1 and not any(exists for exists, *_ in seen)
    assert all(len(names) == 1 and names[0].startswith(".t.gguf.") and names[0].endswith(".partial")
               for _, names, *_ in seen)
    assert seen[-1][2] == seen[-1][3] and all(a[2] < b[2] for a, b in zip(seen, seen[1:]))
    assert [p.name for p in tmp_path.iterdir()] == ["t.gguf"]

    with pytest.raises(ConfigError, match="cancelled"):
        synth.write_target(tmp_path / "c.gguf", WIDE, progress=lambda done, total: done > 0)

    def interrupt(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        synth.write_target(tmp_path / "k.gguf", WIDE, progress=interrupt)
    assert [p.name for p in tmp_path.iterdir()] == ["t.gguf"]


def test_an_existing_file_is_refused_without_force(tmp_path):
    out = tmp_path / "t.gguf"
    synth.write_target(out, synth.TargetShape(), seed=1)
    before = sha(out)
    with pytest.raises(ConfigError, match="already exists.*--force"):
        synth.write_target(out, synth.TargetShape(), seed=2)
    assert sha(out) == before
    synth.write_target(out, synth.TargetShape(), seed=2, force=True)
    assert sha(out) != before

    cli = run_cli(out, "--seed", 3)
    assert cli.returncode == 2 and "already exists" in cli.stderr and "Traceback" not in cli.stderr
    assert sha(out) != before  # untouched by the refused run
    # a pair is checked before either file is written
    drafter = tmp_path / "d.gguf"
    drafter.write_bytes(b"keep")
    cli = run_cli(tmp_path / "new.gguf", "--drafter", drafter)
    assert cli.returncode == 2 and "already exists" in cli.stderr
    assert not (tmp_path / "new.gguf").exists() and drafter.read_bytes() == b"keep"
    assert run_cli(tmp_path / "new.gguf", "--drafter", drafter, "--force").returncode == 0
    assert read_summary(drafter).arch == "qwen3"


@pytest.mark.parametrize("stddev", ["nan", "inf", "-inf", "0", "-0.1"])
def test_bad_stddev_is_refused(tmp_path, stddev):
    with pytest.raises(ConfigError, match="stddev"):
        synth.write_target(tmp_path / "t.gguf", synth.TargetShape(), stddev=float(stddev))
    cli = run_cli(tmp_path / "t.gguf", "--stddev", stddev)
    assert cli.returncode == 2 and "stddev" in cli.stderr and "Traceback" not in cli.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"perturb_seed": 3, "perturb_stddev": 0.0}, "perturb_stddev"),
    ({"perturb_seed": 3, "perturb_stddev": float("nan")}, "perturb_stddev"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**32}, "seed"),
    ({"type": "q5_k"}, "type"),
    ({"n_threads": -2}, "n_threads"),
])
def test_bad_values_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        synth.write_target(tmp_path / "t.gguf", synth.TargetShape(), **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_bad_shapes_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="divisible"):
        synth.write_target(tmp_path / "t.gguf", synth.TargetShape(n_embd=66))
    bad_taps = synth.DFlashShape(n_embd=64, target_layer_ids=(5,))
    t = synth.write_target(tmp_path / "t.gguf", synth.TargetShape())
    with pytest.raises(ConfigError, match="target_layer_ids"):
        synth.write_dflash_drafter(tmp_path / "d.gguf", t, bad_taps)
    with pytest.raises(ConfigError, match="hidden_size"):
        synth.write_dflash_drafter(tmp_path / "d.gguf", t, synth.DFlashShape(n_embd=128))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.gguf"]


def test_every_flag_has_help():
    from pyllamaspec.cli.app import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction").choices["synth"]
    flags = [a for a in sub._actions if a.dest != "help"]
    assert {a.dest for a in flags} >= {"out", "preset", "type", "f16", "drafter", "seed", "stddev", "perturb_seed",
                                       "perturb_stddev", "threads", "force", "dry_run"}
    assert all(a.help for a in flags), [a.dest for a in flags if not a.help]


# ---------------------------------------------------------------------------------------------------------------
# the real presets: plans against the published models' facts, nothing written
# ---------------------------------------------------------------------------------------------------------------


def roles(plan) -> set[str]:
    """Tensor names with the block index replaced by the block's role (recurrent, attention layer, NextN)."""
    md, a = plan.metadata, plan.arch
    n_trunk = md[f"{a}.block_count"] - md.get(f"{a}.nextn_predict_layers", 0)
    recurrent = md.get(f"{a}.attention.recurrent_layers") or []
    out = set()
    for t in plan.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            i = int(parts[1])
            parts[1] = "nextn" if i >= n_trunk else ("recurrent" if i < len(recurrent) and recurrent[i] else "layer")
        out.add(".".join(parts))
    return out


def test_qwen38_27b_and_its_dflash2_drafter_plan():
    target, drafter = synth.plan_preset("qwen3.8-27b", "q4_0")
    md, a = target.metadata, "qwen35"
    assert target.arch == a
    assert md[f"{a}.block_count"] == 65 and md[f"{a}.nextn_predict_layers"] == 1
    assert md[f"{a}.embedding_length"] == 5120 and md[f"{a}.feed_forward_length"] == 17408
    assert md[f"{a}.attention.head_count"] == 24 and md[f"{a}.attention.head_count_kv"] == 4
    assert md[f"{a}.attention.key_length"] == 256 and md[f"{a}.rope.dimension_count"] == 64
    assert md[f"{a}.rope.dimension_sections"] == [11, 11, 10, 0] and md[f"{a}.rope.freq_base"] == 1e7
    assert md[f"{a}.context_length"] == 262144 and md[f"{a}.full_attention_interval"] == 4
    # 16 x (3 gated DeltaNet + 1 attention), the MTP block is attention
    assert md[f"{a}.attention.recurrent_layers"] == [i % 4 != 3 for i in range(64)] + [False]
    assert (md[f"{a}.ssm.group_count"], md[f"{a}.ssm.time_step_rank"], md[f"{a}.ssm.state_size"],
            md[f"{a}.ssm.inner_size"], md[f"{a}.ssm.conv_kernel"]) == (16, 48, 128, 6144, 4)
    t = target.tensor
    assert t("token_embd.weight").shape == (5120, 248320) and t("token_embd.weight").type == "Q4_0"
    assert t("output.weight").shape == (5120, 248320) and t("output.weight").type == "Q6_K"
    assert t("blk.0.attn_qkv.weight").shape == (5120, 2 * 16 * 128 + 6144)
    assert t("blk.0.attn_gate.weight").shape == (5120, 6144)
    assert t("blk.0.ssm_conv1d.weight").shape == (4, 10240) and t("blk.0.ssm_conv1d.weight").type == "F32"
    assert t("blk.0.ssm_a").shape == (48,) and t("blk.0.ssm_a").kind == "negative"
    assert t("blk.3.attn_q.weight").shape == (5120, 2 * 24 * 256) and t("blk.3.attn_k.weight").shape == (5120, 1024)
    assert t("blk.63.ffn_down.weight").shape == (17408, 5120)
    assert t("blk.64.nextn.eh_proj.weight").shape == (10240, 5120)
    assert all(x.type == "F32" for x in target.tensors if x.name.endswith("norm.weight"))
    assert not any(".bias" in x.name and "ssm_dt" not in x.name for x in target.tensors)
    assert 26.5e9 < target.n_params < 28.5e9  # 27.8B with the vision tower, which a text GGUF leaves out
    assert 14 * 2**30 < target.total_bytes < 17 * 2**30

    dm = drafter.metadata
    assert drafter.arch == "dflash"
    assert dm["dflash.block_size"] == 8 and dm["dflash.block_count"] == 5 and dm["dflash.embedding_length"] == 5120
    assert dm["dflash.target_layers"] == [6, 20, 34, 48, 62]  # HF ids 5, 19, 33, 47, 61
    assert (dm["dflash.selector_top_k"], dm["dflash.selector_rank"]) == (16, 256)
    assert (dm["dflash.conv_kernel_size"], dm["dflash.conv_group_size"]) == (2, 16)
    assert dm["dflash.attention.sliding_window"] == 2048 and dm["dflash.attention.causal"] is False
    assert dm["tokenizer.ggml.mask_token_id"] == 248070
    d = drafter.tensor
    assert d("fc.weight").shape == (5 * 5120, 5120) and d("fc.weight").type == "F16"
    assert d("selector_predecessor.weight").shape == (256, 248320)
    assert d("blk.4.attn_conv_proj.weight").shape == (5120, 2 * 2 * 5120 // 16)
    assert d("blk.0.attn_conv_base").type == "F32"
    assert not any(x.name in ("token_embd.weight", "output.weight") for x in drafter.tensors)
    assert 1.5e9 < drafter.n_params < 2.5e9


def test_qwen36_35b_a3b_and_its_dflash_drafter_plan():
    target, drafter = synth.plan_preset("qwen3.6-35b-a3b", "q8_0")
    md, a = target.metadata, "qwen35moe"
    assert md[f"{a}.block_count"] == 41 and md[f"{a}.embedding_length"] == 2048
    assert md[f"{a}.expert_count"] == 256 and md[f"{a}.expert_used_count"] == 8
    assert md[f"{a}.expert_feed_forward_length"] == 512 and md[f"{a}.expert_shared_feed_forward_length"] == 512
    assert md[f"{a}.attention.head_count"] == 16 and md[f"{a}.attention.head_count_kv"] == 2
    assert md[f"{a}.attention.recurrent_layers"] == [i % 4 != 3 for i in range(40)] + [False]
    assert (md[f"{a}.ssm.group_count"], md[f"{a}.ssm.time_step_rank"]) == (16, 32)
    assert f"{a}.feed_forward_length" not in md
    t = target.tensor
    assert t("blk.0.ffn_gate_exps.weight").shape == (2048, 512, 256)
    assert t("blk.0.ffn_down_exps.weight").shape == (512, 2048, 256) and t("blk.0.ffn_down_exps.weight").type == "Q8_0"
    assert t("blk.0.ffn_gate_inp.weight").shape == (2048, 256) and t("blk.0.ffn_gate_inp.weight").type == "F32"
    assert t("blk.0.ffn_up_shexp.weight").shape == (2048, 512)
    assert t("output.weight").type == "Q8_0"
    assert not any("gate_up_exps" in x.name for x in target.tensors)
    assert 34e9 < target.n_params < 36e9

    dm = drafter.metadata
    assert dm["dflash.block_size"] == 16 and dm["dflash.block_count"] == 8
    assert dm["dflash.target_layers"] == [2, 11, 20, 29, 38]
    assert "dflash.selector_top_k" not in dm and dm["dflash.rope.scaling.type"] == "yarn"
    assert drafter.tensor("fc.weight").shape == (5 * 2048, 2048)
    assert drafter.tensor("blk.7.ffn_up.weight").shape == (2048, 6144)
    assert drafter.tensor("blk.0.attn_k.weight").shape == (2048, 4 * 128)


def test_qwen25_presets_plan():
    p7, _ = synth.plan_preset("qwen2.5-7b", "q4_0")
    assert p7.metadata["qwen2.block_count"] == 28 and p7.metadata["qwen2.embedding_length"] == 3584
    assert p7.tensor("token_embd.weight").shape == (3584, 152064) and p7.tensor("output.weight").type == "Q6_K"
    assert p7.tensor("blk.0.attn_q.bias").shape == (3584,) and p7.tensor("blk.0.attn_k.weight").shape == (3584, 512)
    assert p7.tensor("blk.0.ffn_up.weight").shape == (3584, 18944)
    assert 7.0e9 < p7.n_params < 7.8e9
    p15, _ = synth.plan_preset("qwen2.5-1.5b", "q4_0")
    assert "output.weight" not in {t.name for t in p15.tensors}  # tied: the head is token_embd
    assert p15.tensor("token_embd.weight").type == "Q6_K"
    assert 1.4e9 < p15.n_params < 1.6e9
    p05, _ = synth.plan_preset("qwen2.5-0.5b", "q4_0")
    assert p05.tensor("token_embd.weight").type == "Q8_0"  # rows of 896: not a Q6_K block multiple


def test_a_drafter_shape_can_take_its_targets_vocabulary(tmp_path):
    # the qwen2.5-0.5b shape drafting for the qwen2.5-7b shape: one vocabulary, as upstream's server requires
    p05, _ = synth.plan_preset("qwen2.5-0.5b", "q4_0", n_vocab=152064)
    assert p05.tensor("token_embd.weight").shape == (896, 152064)
    assert synth.plan_preset("qwen2.5-0.5b", "q4_0")[0].tensor("token_embd.weight").shape == (896, 151936)
    t, _ = synth.write_preset(tmp_path / "t.gguf", "tiny-qwen3", n_vocab=600)
    with Model(t) as m:
        assert m.info.n_vocab == 600
    for bad in (7, 0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="n_vocab"):
            synth.write_preset(tmp_path / "bad.gguf", "tiny-qwen3", n_vocab=bad)
    cli = run_cli(tmp_path / "bad.gguf", "--n-vocab", 4)
    assert cli.returncode == 2 and "n_vocab" in cli.stderr and "Traceback" not in cli.stderr
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("big, tiny", [("qwen3.8-27b", "tiny-qwen3.8-27b"), ("qwen3.6-35b-a3b", "tiny-qwen3.6-35b-a3b")])
def test_scale_downs_have_the_real_presets_layout(big, tiny):
    (bt, bd), (tt, td) = synth.plan_preset(big, "q8_0"), synth.plan_preset(tiny, "q8_0")
    assert roles(bt) == roles(tt)
    assert roles(bd) == roles(td)
    for key in ("full_attention_interval", "nextn_predict_layers"):
        assert bt.metadata[f"{bt.arch}.{key}"] == tt.metadata[f"{tt.arch}.{key}"]
    assert bd.metadata["dflash.block_size"] == td.metadata["dflash.block_size"]
    assert ("dflash.selector_top_k" in bd.metadata) == ("dflash.selector_top_k" in td.metadata)


def test_dry_run_writes_nothing_and_prints_the_plan(tmp_path):
    cli = run_cli(tmp_path / "t.gguf", "--preset", "qwen3.8-27b", "--type", "q4_0", "--drafter", tmp_path / "d.gguf",
                  "--dry-run")
    assert cli.returncode == 0, cli.stderr
    assert list(tmp_path.iterdir()) == []
    assert "arch qwen35, q4_0" in cli.stdout and "arch dflash, q4_0" in cli.stdout
    assert "RRRARRRA" in cli.stdout and "output.weight" in cli.stdout and "Q6_K" in cli.stdout


# ---------------------------------------------------------------------------------------------------------------
# the scale-downs run sessions exactly with their drafters
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset, version, block", [("tiny-qwen3.8-27b", 2, 8), ("tiny-qwen3.6-35b-a3b", 1, 16)])
@pytest.mark.parametrize("wtype", ["f32", "q8_0"])
def test_scale_down_pairs_are_exact(tmp_path, preset, version, block, wtype):
    t, d = synth.write_preset(tmp_path / "t.gguf", preset, drafter_out=tmp_path / "d.gguf", type=wtype, seed=5)
    p = synth.PRESET_TABLE[preset]
    with Model(t) as target, Model(d) as drafter:
        assert target.info.arch == p.target.arch and target.info.n_layer_nextn == 1
        assert drafter.info.arch == "dflash" and drafter.info.dflash_block_size == block
        assert drafter.info.is_dflash2 == (version == 2)
        assert drafter.info.target_layers == tuple(i + 1 for i in p.drafter.target_layer_ids)
        ref = plain(target)
        for n_max in (3, block - 1):
            with SpecSession(target, drafter, SessionConfig(adaptive=False, n_max=n_max, n_ctx=512)) as s:
                assert s.info.spec_types == ("draft-dflash",) and s.info.rollback_target == "ring"
                r = s.generate(PROMPT, N_PREDICT)
            assert_equal_up_to_near_tie(r.tokens, ref)
            assert_stats_consistent(r.stats)
            assert r.stats.n_drafted > 0


def test_the_default_weight_type_is_the_one_help_and_readme_name():
    from pathlib import Path

    from pyllamaspec.cli.app import build_parser
    from pyllamaspec.tools.synth import _resolve_type

    default = _resolve_type(None, False)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["synth"]
    help_text = next(a.help for a in sub._actions if "--type" in a.option_strings)
    assert f"(default: {default}," in help_text
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert f"`synth` writes **{default} by default**" in readme
