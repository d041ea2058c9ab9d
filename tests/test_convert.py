"""pyllamaspec convert: DFlash / DFlash2 safetensors checkpoints -> dflash GGUF.

Everything here is synthetic and tiny (hidden 64, vocab 288) and needs no native library.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from clirun import CLI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckptfactory import (  # noqa: E402
    DELETE,
    bf16_bits_to_f32,
    write_dflash_checkpoint,
    write_target_gguf,
)

from pyllamaspec.cli import convert as convert_cmd  # noqa: E402
from pyllamaspec.cli.app import run_command  # noqa: E402
from pyllamaspec.tools import convert as cv  # noqa: E402
from pyllamaspec.tools.convert import plan as cv_plan  # noqa: E402
from pyllamaspec.errors import ConversionError, PairingError  # noqa: E402
from pyllamaspec.ggufinfo import read_summary  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]

# the default synthetic pair: target qwen3 n_embd 64, 4 layers, 288 tokens; drafter ids (0, 2)
HIDDEN, VOCAB, N_LAYER_TGT = 64, 288, 4

V1_LAYER_KEYS = [
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight",
]
V2_LAYER_KEYS = ["attn_conv_base", "attn_conv_proj.weight", "ffn_conv_base", "ffn_conv_proj.weight"]

# HF name (as the factory writes it) -> GGUF name, per layer
HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
}
HF_TO_GGUF_GLOBAL = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
    "candidate_selector.successor_codebook": "selector_successor.weight",
    "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
}


def gguf_name(hf: str) -> str:
    if hf.startswith("model."):
        hf = hf[len("model."):]
    if hf in HF_TO_GGUF_GLOBAL:
        return HF_TO_GGUF_GLOBAL[hf]
    _, i, rest = hf.split(".", 2)
    return f"blk.{i}.{HF_TO_GGUF_LAYER[rest]}"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def read_st(d: Path) -> dict[str, np.ndarray]:
    """All tensors of a (possibly sharded) checkpoint as float32, read from the raw safetensors bytes."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            blob = raw[8 + n + a : 8 + n + b]
            if info["dtype"] == "BF16":
                arr = bf16_bits_to_f32(np.frombuffer(blob, dtype="<u2"))
            else:
                arr = np.frombuffer(blob, dtype="<f4")
            out[name] = arr.reshape(info["shape"])
    return out


def read_st_bf16_bits(d: Path, name: str) -> np.ndarray:
    f = d / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    info = json.loads(raw[8 : 8 + n])[name]
    assert info["dtype"] == "BF16"
    a, b = info["data_offsets"]
    return np.frombuffer(raw[8 + n + a : 8 + n + b], dtype="<u2").reshape(info["shape"])


class Out:
    """A converted GGUF, read back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.kv = {k: f.contents() for k, f in self.reader.fields.items() if not k.startswith("GGUF.")}
        self.tensors = {t.name: t for t in self.reader.tensors}

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy (HF) order shape."""
        return tuple(int(x) for x in reversed(self.tensors[name].shape))

    def type(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def f32(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).reshape(self.shape(name))


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


@pytest.fixture()
def target(tmp_path: Path) -> Path:
    return write_target_gguf(tmp_path / "target.gguf")


@pytest.fixture()
def outdir(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def convert(ckpt: Path, target: Path, outdir: Path, name: str = "drafter.gguf", **kw) -> Out:
    out = cv.convert_dflash(ckpt, target, outdir / name, **kw)
    assert out == outdir / name
    assert listing(outdir) == [name], "only the output may be left in the output directory"
    return Out(out)


def expect_failure(exc_type, fn, *needles: str, outdir: Path, before: list[str] | None = None):
    with pytest.raises(exc_type) as ei:
        fn()
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in error message: {msg}"
    assert listing(outdir) == (before or []), "a failed conversion must leave nothing behind"
    return msg


def expected_v1_names(n_layers: int) -> set[str]:
    names = {"fc.weight", "enc.output_norm.weight", "output_norm.weight"}
    for i in range(n_layers):
        names |= {f"blk.{i}.{k}" for k in V1_LAYER_KEYS}
    return names


def expected_v2_names(n_layers: int) -> set[str]:
    names = expected_v1_names(n_layers) | {"selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight"}
    for i in range(n_layers):
        names |= {f"blk.{i}.{k}" for k in V2_LAYER_KEYS}
    return names


# --------------------------------------------------------------------------------------------
# DFlash v1
# --------------------------------------------------------------------------------------------


def test_v1_metadata_tensors_tokenizer_provenance(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", target_layer_ids=[0, 1, 2], mask_token_id=287)
    o = convert(ckpt, target, outdir)
    kv = o.kv

    assert kv["general.architecture"] == "dflash"
    assert kv["general.type"] == "model"
    assert kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    assert kv["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    assert kv["dflash.block_count"] == 2
    assert kv["dflash.context_length"] == 40960
    assert kv["dflash.embedding_length"] == HIDDEN
    assert kv["dflash.feed_forward_length"] == 128
    assert kv["dflash.attention.head_count"] == 4
    assert kv["dflash.attention.head_count_kv"] == 2
    assert kv["dflash.attention.key_length"] == 16
    assert kv["dflash.attention.value_length"] == 16
    assert kv["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert kv["dflash.rope.freq_base"] == pytest.approx(1e6)
    assert kv["dflash.block_size"] == 16
    assert kv["dflash.target_layers"] == [1, 2, 3], "HF ids are shifted by +1 (llama.cpp taps layer inputs)"
    assert kv["tokenizer.ggml.mask_token_id"] == 287

    # exactly the keys upstream writes for this config (plus ours), nothing else
    non_tok = {k for k in kv if not k.startswith("tokenizer.")}
    assert non_tok == {
        "general.architecture", "general.type", "general.name", "general.file_type", "general.quantization_version",
        "dflash.block_count", "dflash.context_length", "dflash.embedding_length", "dflash.feed_forward_length",
        "dflash.attention.head_count", "dflash.attention.head_count_kv", "dflash.attention.key_length",
        "dflash.attention.value_length", "dflash.attention.layer_norm_rms_epsilon", "dflash.rope.freq_base",
        "dflash.block_size", "dflash.target_layers",
        "pyllamaspec.target.name", "pyllamaspec.target.fingerprint", "pyllamaspec.converter.version",
    }

    # tensors: names, shapes (numpy order = HF order), types (norms F32, matrices bf16)
    assert set(o.tensors) == expected_v1_names(2)
    src = read_st(ckpt)
    for hf, arr in src.items():
        g = gguf_name(hf)
        assert o.shape(g) == arr.shape, g
        assert o.type(g) == ("F32" if arr.ndim == 1 else "BF16"), g
    assert o.shape("fc.weight") == (HIDDEN, 3 * HIDDEN)
    # bf16 -> bf16 is bit exact
    bits = read_st_bf16_bits(ckpt, "layers.1.mlp.down_proj.weight")
    got = o.tensors["blk.1.ffn_down.weight"].data.view(np.uint16).reshape(bits.shape)
    np.testing.assert_array_equal(got, bits)
    np.testing.assert_array_equal(o.f32("enc.output_norm.weight"), src["hidden_norm.weight"])

    # tokenizer: every tokenizer.* key of the target, identical (mask token replaced by the drafter's)
    t = gguf.GGUFReader(target)
    tkeys = {k for k in t.fields if k.startswith("tokenizer.")}
    assert tkeys <= set(kv)
    for k in tkeys:
        assert kv[k] == t.fields[k].contents(), k
        assert o.reader.fields[k].types == t.fields[k].types, f"{k}: value type must be preserved"
    assert len(kv["tokenizer.ggml.tokens"]) == VOCAB
    assert kv["tokenizer.ggml.model"] == "gpt2"

    # provenance
    assert kv["pyllamaspec.target.name"] == "synthetic-target"
    assert kv["pyllamaspec.target.fingerprint"] == cv.target_fingerprint_of(read_summary(target))
    assert len(kv["pyllamaspec.target.fingerprint"]) == 64
    assert kv["pyllamaspec.converter.version"]
    assert kv["general.name"] == "ckpt"

    # ggufinfo sees a dflash drafter
    s = read_summary(o.path)
    assert (s.role, s.target_layers, s.block_size, s.mask_token_id) == ("dflash", (1, 2, 3), 16, 287)


def test_fingerprint_depends_on_vocab_and_sizes(tmp_path: Path) -> None:
    a = read_summary(write_target_gguf(tmp_path / "a.gguf"))
    b = read_summary(write_target_gguf(tmp_path / "b.gguf", n_layer=5))
    c = read_summary(write_target_gguf(tmp_path / "c.gguf", vocab=289))
    d = read_summary(write_target_gguf(tmp_path / "d.gguf", seed=7))  # other weights, same vocab and sizes
    fa, fb, fc, fd = (cv.target_fingerprint_of(s) for s in (a, b, c, d))
    assert fa != fb and fa != fc
    assert fa == fd


def test_v1_f32_sharded_swa_layer_types(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(
        tmp_path / "ckpt", dtype="f32", sharded=True, swa_window=32,
        layer_types=["sliding_attention", "full_attention"],
    )
    assert (ckpt / "model.safetensors.index.json").is_file()
    assert len(list(ckpt.glob("*.safetensors"))) == 2
    o = convert(ckpt, target, outdir, outtype="f32")
    assert o.kv["dflash.attention.sliding_window"] == 32
    assert o.kv["dflash.attention.sliding_window_pattern"] == [True, False]
    assert o.kv["general.file_type"] == gguf.LlamaFileType.ALL_F32
    assert set(o.tensors) == expected_v1_names(2)
    src = read_st(ckpt)
    for hf, arr in src.items():
        g = gguf_name(hf)
        assert o.type(g) == "F32"
        np.testing.assert_array_equal(o.f32(g), arr, err_msg=g)


def test_v1_use_swa_in_dflash_config_gives_all_true_pattern(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", n_layers=3, swa_window=128, swa_in_dflash_config=True)
    o = convert(ckpt, target, outdir)
    assert o.kv["dflash.attention.sliding_window"] == 128
    assert o.kv["dflash.attention.sliding_window_pattern"] == [True, True, True]
    assert o.kv["dflash.block_count"] == 3


def test_layer_types_without_sliding_window_writes_no_swa_keys(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", layer_types=["sliding_attention", "full_attention"])
    o = convert(ckpt, target, outdir)
    assert "dflash.attention.sliding_window" not in o.kv
    assert "dflash.attention.sliding_window_pattern" not in o.kv


def test_v1_causal_and_scales_from_config(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(
        tmp_path / "ckpt",
        config_overrides={"dflash_config": {"causal": True, "output_multiplier": 0.5, "final_logit_softcapping": 30.0,
                                            "input_embedding_scale": 8.0, "block_size": 10},
                          "block_size": DELETE},
    )
    o = convert(ckpt, target, outdir)
    assert o.kv["dflash.attention.causal"] is True
    assert o.kv["dflash.logit_scale"] == pytest.approx(0.5)
    assert o.kv["dflash.final_logit_softcapping"] == pytest.approx(30.0)
    assert o.kv["dflash.embedding_scale"] == pytest.approx(8.0)
    assert o.kv["dflash.block_size"] == 10


def test_rope_scaling_partial_rotary_and_activation_keys(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(
        tmp_path / "ckpt",
        config_overrides={"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                           "beta_fast": 32.0},
                          "partial_rotary_factor": 0.5, "hidden_act": "gelu_pytorch_tanh"},
    )
    kv = convert(ckpt, target, outdir).kv
    assert kv["dflash.rope.scaling.type"] == "yarn"
    assert kv["dflash.rope.scaling.factor"] == pytest.approx(4.0)
    assert kv["dflash.rope.scaling.original_context_length"] == 32768
    assert kv["dflash.rope.scaling.yarn_beta_fast"] == pytest.approx(32.0)
    assert kv["dflash.rope.dimension_count"] == 8
    assert kv["dflash.hidden_activation"] == "gelu_pytorch_tanh"


def test_unsupported_activation_is_refused(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", config_overrides={"hidden_act": "relu2"})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "hidden_act", "relu2", outdir=outdir)


def test_block_size_defaults_to_16(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", config_overrides={"block_size": DELETE})
    assert convert(ckpt, target, outdir).kv["dflash.block_size"] == 16


def test_model_prefixed_names_and_embeddings_and_head(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", name_prefix="model.", with_embeddings=True, with_head=True)
    o = convert(ckpt, target, outdir)
    assert set(o.tensors) == expected_v1_names(2) | {"token_embd.weight", "output.weight"}
    assert o.shape("token_embd.weight") == (VOCAB, HIDDEN)
    assert o.shape("output.weight") == (VOCAB, HIDDEN)
    src = read_st(ckpt)
    np.testing.assert_array_equal(o.f32("output.weight"), src["model.lm_head.weight"])


def test_outtype_f16(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", dtype="f32")
    o = convert(ckpt, target, outdir, outtype="f16")
    assert o.kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    assert o.type("blk.0.attn_q.weight") == "F16"
    assert o.type("blk.0.attn_norm.weight") == "F32"
    src = read_st(ckpt)
    np.testing.assert_allclose(o.f32("fc.weight"), src["fc.weight"], rtol=1e-3, atol=1e-6)


def test_interleaved_rope_is_permuted_to_neox(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", dtype="f32", interleaved_rope=True)
    o = convert(ckpt, target, outdir, outtype="f32")
    src = read_st(ckpt)
    hd = 16
    perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # per head: even dims, then odd dims
    q = src["layers.0.self_attn.q_proj.weight"].reshape(4, hd, HIDDEN)[:, perm, :].reshape(4 * hd, HIDDEN)
    k = src["layers.0.self_attn.k_proj.weight"].reshape(2, hd, HIDDEN)[:, perm, :].reshape(2 * hd, HIDDEN)
    np.testing.assert_array_equal(o.f32("blk.0.attn_q.weight"), q)
    np.testing.assert_array_equal(o.f32("blk.0.attn_k.weight"), k)
    np.testing.assert_array_equal(o.f32("blk.0.attn_q_norm.weight"), src["layers.0.self_attn.q_norm.weight"][perm])
    np.testing.assert_array_equal(o.f32("blk.0.attn_k_norm.weight"), src["layers.0.self_attn.k_norm.weight"][perm])
    # v and o are not roped: untouched
    np.testing.assert_array_equal(o.f32("blk.0.attn_v.weight"), src["layers.0.self_attn.v_proj.weight"])
    np.testing.assert_array_equal(o.f32("blk.0.attn_output.weight"), src["layers.0.self_attn.o_proj.weight"])


# --------------------------------------------------------------------------------------------
# DFlash2
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sharded,swa", [(False, None), (True, 2048)])
def test_v2_metadata_and_tensors(tmp_path: Path, target: Path, outdir: Path, sharded: bool, swa: int | None) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, sharded=sharded, swa_window=swa)
    o = convert(ckpt, target, outdir)
    kv = o.kv
    assert kv["dflash.block_size"] == 8
    assert kv["dflash.conv_kernel_size"] == 2
    assert kv["dflash.conv_group_size"] == 16
    assert kv["dflash.selector_rank"] == 16
    assert kv["dflash.selector_top_k"] == 4
    assert kv["dflash.attention.causal"] is False
    assert kv["dflash.logit_scale"] == pytest.approx(0.25)
    assert kv["dflash.final_logit_softcapping"] == pytest.approx(20.0)
    assert kv["dflash.target_layers"] == [1, 3]
    if swa:
        assert kv["dflash.attention.sliding_window"] == swa
        assert kv["dflash.attention.sliding_window_pattern"] == [True, True]
    else:
        assert "dflash.attention.sliding_window" not in kv
        assert "dflash.attention.sliding_window_pattern" not in kv

    assert set(o.tensors) == expected_v2_names(2)
    # shapes in ggml order as llama.cpp's dflash loader creates them (src/models/dflash.cpp)
    ne = {n: tuple(int(x) for x in t.shape) for n, t in o.tensors.items()}
    proj = 2 * 2 * (HIDDEN // 16)
    assert ne["blk.0.attn_conv_base"] == (HIDDEN, 2, 2)
    assert ne["blk.1.ffn_conv_base"] == (HIDDEN, 2, 2)
    assert ne["blk.0.attn_conv_proj.weight"] == (HIDDEN, proj)
    assert ne["blk.1.ffn_conv_proj.weight"] == (HIDDEN, proj)
    assert ne["selector_predecessor.weight"] == (16, VOCAB)
    assert ne["selector_successor.weight"] == (16, VOCAB)
    assert ne["selector_hidden.weight"] == (HIDDEN, 16)
    assert ne["fc.weight"] == (2 * HIDDEN, HIDDEN)
    assert o.type("blk.0.attn_conv_base") == "F32"  # not a .weight: stays F32 as upstream
    assert o.type("selector_predecessor.weight") == "BF16"
    src = read_st(ckpt)
    np.testing.assert_array_equal(o.f32("blk.1.attn_conv_base"), src["layers.1.attention_conv.base_kernel"])
    np.testing.assert_array_equal(o.f32("selector_successor.weight"), src["candidate_selector.successor_codebook"])
    assert read_summary(o.path).role == "dflash2"


def test_v2_q8_0_with_embeddings_and_head(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, with_embeddings=True, with_head=True, sharded=True, dtype="f32")
    o = convert(ckpt, target, outdir, outtype="q8_0")
    assert o.kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert {"token_embd.weight", "output.weight"} <= set(o.tensors)
    assert o.type("token_embd.weight") == "Q8_0"
    assert o.type("blk.0.attn_q.weight") == "Q8_0"
    assert o.type("blk.0.ffn_norm.weight") == "F32"
    assert o.type("blk.0.ffn_conv_base") == "F32"
    # rows of 16 (selector rank) are not a multiple of the Q8_0 block: upstream falls back to F16
    assert o.type("selector_predecessor.weight") == "F16"
    src = read_st(ckpt)
    np.testing.assert_allclose(o.f32("blk.0.ffn_up.weight"), src["layers.0.mlp.up_proj.weight"], atol=2e-3)


def test_v2_conv_settings_at_top_level_are_accepted(tmp_path: Path, target: Path, outdir: Path) -> None:
    over = {"dflash_config": {k: DELETE for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")},
            "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 4}
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, config_overrides=over)
    o = convert(ckpt, target, outdir)
    assert o.kv["dflash.selector_top_k"] == 4


# --------------------------------------------------------------------------------------------
# targets: M-RoPE, MTP layers, layer ids
# --------------------------------------------------------------------------------------------


def test_mrope_target_gets_degenerate_sections(tmp_path: Path, outdir: Path) -> None:
    tgt = write_target_gguf(tmp_path / "q35.gguf", arch="qwen35")
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    o = convert(ckpt, tgt, outdir)
    assert o.kv["dflash.rope.dimension_sections"] == [8, 0, 0, 0]


def test_plain_target_has_no_rope_sections(tmp_path: Path, target: Path, outdir: Path) -> None:
    o = convert(write_dflash_checkpoint(tmp_path / "ckpt"), target, outdir)
    assert "dflash.rope.dimension_sections" not in o.kv


def test_mtp_blocks_do_not_count_as_tappable_layers(tmp_path: Path, outdir: Path) -> None:
    # block_count 5 = 4 main layers + 1 MTP block
    tgt = write_target_gguf(tmp_path / "q35.gguf", arch="qwen35", n_layer=4, nextn_predict_layers=1)
    ok = write_dflash_checkpoint(tmp_path / "ok", target_layer_ids=[0, 2], num_target_layers=4)
    convert(ok, tgt, outdir)
    (outdir / "drafter.gguf").unlink()
    bad = write_dflash_checkpoint(tmp_path / "bad", target_layer_ids=[0, 3], num_target_layers=4)
    expect_failure(PairingError, lambda: cv.convert_dflash(bad, tgt, outdir / "x.gguf"),
                   "target_layer_ids[1] = 3", "n_layer 4", outdir=outdir)


@pytest.mark.parametrize("arch", ["qwen3", "qwen35"])
def test_last_layer_id_is_refused(tmp_path: Path, outdir: Path, arch: str) -> None:
    # HF id n_layer-1 would be tapped as the input of layer n_layer, which these graphs never record
    tgt = write_target_gguf(tmp_path / "t.gguf", arch=arch)
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", target_layer_ids=[0, N_LAYER_TGT - 1])
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, tgt, outdir / "x.gguf"),
                   "target_layer_ids[1] = 3", "n_layer 4", "0..2", outdir=outdir)
    ok = write_dflash_checkpoint(tmp_path / "ok", target_layer_ids=[0, N_LAYER_TGT - 2])
    assert convert(ok, tgt, outdir).kv["dflash.target_layers"] == [1, 3]


def test_final_tap_arch_allows_last_layer_id(tmp_path: Path, outdir: Path) -> None:
    tgt = write_target_gguf(tmp_path / "t.gguf", arch="nemotron_h")
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", target_layer_ids=[0, N_LAYER_TGT - 1])
    assert convert(ckpt, tgt, outdir).kv["dflash.target_layers"] == [1, 4]


# --------------------------------------------------------------------------------------------
# refused conversions: a clear error naming the field and both values, and nothing written
# --------------------------------------------------------------------------------------------


def test_bad_layer_id(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", target_layer_ids=[0, 7])
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "target_layer_ids[1] = 7", "n_layer 4", outdir=outdir)
    neg = write_dflash_checkpoint(tmp_path / "neg", target_layer_ids=[-1, 1])
    expect_failure(PairingError, lambda: cv.convert_dflash(neg, target, outdir / "x.gguf"),
                   "target_layer_ids[0] = -1", outdir=outdir)


def test_hidden_size_mismatch(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", hidden=128, intermediate=256)
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "hidden_size", "128", "n_embd 64", outdir=outdir)


def test_vocab_mismatch(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", vocab=300, mask_token_id=10)
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "vocab_size", "300", "288", outdir=outdir)


def test_mask_token_outside_vocab(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", mask_token_id=VOCAB)
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "mask_token_id 288", "288 tokens", outdir=outdir)


def test_num_target_layers_mismatch(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", num_target_layers=36)
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "num_target_layers", "36", "n_layer 4", outdir=outdir)


def test_missing_tensor(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", omit=["layers.1.mlp.up_proj.weight"])
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "layers.1.mlp.up_proj.weight", "missing", "[128, 64]", outdir=outdir)


def test_missing_v2_tensor(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, omit=["candidate_selector.hidden_projection.weight"])
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "candidate_selector.hidden_projection.weight", "missing", outdir=outdir)


def test_misshaped_tensor(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", shape_overrides={"layers.0.self_attn.k_proj.weight": (48, 64)})
    msg = expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                         "layers.0.self_attn.k_proj.weight", "[48, 64]", "[32, 64]", outdir=outdir)
    assert "num_key_value_heads" in msg


def test_misshaped_fc_names_target_layer_count(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", shape_overrides={"fc.weight": (64, 192)})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "fc.weight", "[64, 192]", "[64, 128]", "len(target_layer_ids)", outdir=outdir)


def test_misshaped_conv_base(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, shape_overrides={"layers.0.mlp_conv.base_kernel": (2, 3, 64)})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "layers.0.mlp_conv.base_kernel", "[2, 3, 64]", "[2, 2, 64]", outdir=outdir)


def test_unexpected_tensor(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", extra_tensors={"layers.0.self_attn.q_proj.bias": np.zeros(64)})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "layers.0.self_attn.q_proj.bias", outdir=outdir)


def test_pickle_only_checkpoint(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "pickle", "pytorch_model.bin", outdir=outdir)


def test_no_weights_at_all(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "no *.safetensors", outdir=outdir)


def test_missing_shard(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", sharded=True)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "model-00002-of-00002.safetensors", "missing", outdir=outdir)


def test_truncated_safetensors(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "model.safetensors", outdir=outdir)


@pytest.mark.parametrize("bs", [1, 65])
def test_block_size_out_of_range(tmp_path: Path, target: Path, outdir: Path, bs: int) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", block_size=bs)
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "block_size", str(bs), "2..64", outdir=outdir)


def test_v2_group_size_must_divide_hidden(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, conv_group_size=16,
                                   config_overrides={"dflash_config": {"conv_group_size": 24}})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "conv_group_size 24", "hidden_size 64", outdir=outdir)


def test_v2_top_k_lattice_too_big(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2, selector_top_k=8)  # 8*9 = 72 > 64
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "hidden_size 64", "selector_top_k", "72", outdir=outdir)


def test_missing_mask_token(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", config_overrides={"dflash_config": {"mask_token_id": DELETE}})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "mask_token_id", outdir=outdir)


def test_not_a_dflash_checkpoint(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", config_overrides={"architectures": ["Qwen3ForCausalLM"]})
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                   "Qwen3ForCausalLM", "DFlashDraftModel", outdir=outdir)


def test_drafter_as_target_is_refused(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    drafter = cv.convert_dflash(ckpt, target, tmp_path / "drafter.gguf")
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, drafter, outdir / "x.gguf"),
                   "itself a drafter", outdir=outdir)


def test_target_not_gguf(tmp_path: Path, outdir: Path) -> None:
    bogus = tmp_path / "t.gguf"
    bogus.write_bytes(b"\x00" * 64)
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, bogus, outdir / "x.gguf"),
                   "not a GGUF", outdir=outdir)


# --------------------------------------------------------------------------------------------
# output handling
# --------------------------------------------------------------------------------------------


def test_existing_output_needs_force(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    out = outdir / "drafter.gguf"
    out.write_bytes(b"precious")
    expect_failure(ConversionError, lambda: cv.convert_dflash(ckpt, target, out),
                   "already exists", "--force", outdir=outdir, before=["drafter.gguf"])
    assert out.read_bytes() == b"precious"
    cv.convert_dflash(ckpt, target, out, force=True)
    assert listing(outdir) == ["drafter.gguf"]
    assert Out(out).kv["general.architecture"] == "dflash"


def test_output_equal_to_an_input_is_refused_even_with_force(tmp_path: Path, target: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    before_t = target.read_bytes()
    with pytest.raises(ConversionError, match="one of the inputs"):
        cv.convert_dflash(ckpt, target, target, force=True)
    assert target.read_bytes() == before_t
    shard = ckpt / "model.safetensors"
    before_s = shard.read_bytes()
    with pytest.raises(ConversionError, match="one of the inputs"):
        cv.convert_dflash(ckpt, target, ckpt / "." / "model.safetensors", force=True)
    assert shard.read_bytes() == before_s
    assert sorted(os.listdir(ckpt)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "target.gguf"]


def test_output_directory_must_exist(tmp_path: Path, target: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ConversionError, match="does not exist"):
        cv.convert_dflash(ckpt, target, tmp_path / "nope" / "x.gguf")


def test_failure_while_writing_leaves_nothing(tmp_path: Path, target: Path, outdir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    real = cv_plan.encode
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(cv_plan, "encode", flaky)
    with pytest.raises(OSError):
        cv.convert_dflash(ckpt, target, outdir / "x.gguf")
    assert calls["n"] == 5
    assert listing(outdir) == []


def test_failure_while_writing_keeps_old_output(tmp_path: Path, target: Path, outdir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    out = outdir / "drafter.gguf"
    out.write_bytes(b"old")

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(cv_plan, "encode", boom)
    with pytest.raises(RuntimeError):
        cv.convert_dflash(ckpt, target, out, force=True)
    assert listing(outdir) == ["drafter.gguf"]
    assert out.read_bytes() == b"old"


def test_provenance_from_hf_cache_path_and_flags(tmp_path: Path, target: Path, outdir: Path) -> None:
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "models--z-lab--Qwen3-8B-DFlash-b16" / "snapshots" / rev
    ckpt = write_dflash_checkpoint(snap)
    o = convert(ckpt, target, outdir)
    assert o.kv["general.source.repo"] == "z-lab/Qwen3-8B-DFlash-b16"
    assert o.kv["general.source.revision"] == rev
    assert o.kv["general.source.url"] == "https://huggingface.co/z-lab/Qwen3-8B-DFlash-b16"
    assert o.kv["general.name"] == "Qwen3-8B-DFlash-b16"
    (outdir / "drafter.gguf").unlink()
    plain = write_dflash_checkpoint(tmp_path / "plain", config_overrides={"_name_or_path": "z-lab/Some-DFlash"})
    o3 = convert(plain, target, outdir)
    assert o3.kv["general.source.repo"] == "z-lab/Some-DFlash"
    assert "general.source.revision" not in o3.kv
    (outdir / "drafter.gguf").unlink()
    o4 = cv.convert_dflash(plain, target, outdir / "d.gguf", source_repo="incoai/Other", source_revision="abc123")
    kv = Out(o4).kv
    assert (kv["general.source.repo"], kv["general.source.revision"]) == ("incoai/Other", "abc123")
    (outdir / "d.gguf").unlink()
    # a --local-dir download: huggingface_hub's metadata file carries the commit
    meta = plain / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text(f"{rev}\n\"etag\"\n1700000000.0\n")
    assert convert(plain, target, outdir).kv["general.source.revision"] == rev


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _ns(ckpt: Path, target: Path, out: Path, **kw) -> argparse.Namespace:
    d = dict(drafter_dir=str(ckpt), target=str(target), out=str(out), outtype="bf16", force=False,
             source_repo=None, source_revision=None, quiet=False, func=convert_cmd.run)
    d.update(kw)
    return argparse.Namespace(**d)


def test_cli_run_success_and_failure(tmp_path: Path, target: Path, outdir: Path, capsys: pytest.CaptureFixture) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    assert run_command(_ns(ckpt, target, outdir / "d.gguf")) == 0
    assert (outdir / "d.gguf").is_file()
    assert "d.gguf" in capsys.readouterr().out

    bad = write_dflash_checkpoint(tmp_path / "bad", hidden=128, intermediate=256)
    assert run_command(_ns(bad, target, outdir / "e.gguf")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("pyllamaspec: error: ") and "hidden_size" in err
    assert listing(outdir) == ["d.gguf"]

    # existing output without --force: exit 2, file untouched
    before = (outdir / "d.gguf").read_bytes()
    assert run_command(_ns(ckpt, target, outdir / "d.gguf")) == 2
    assert "--force" in capsys.readouterr().err
    assert (outdir / "d.gguf").read_bytes() == before


def test_cli_register_subparser(tmp_path: Path, target: Path, outdir: Path) -> None:
    parser = argparse.ArgumentParser(prog="pyllamaspec")
    sub = parser.add_subparsers(dest="command", required=True)
    convert_cmd.register(sub)
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2)
    args = parser.parse_args(["convert", str(ckpt), "--target", str(target), "-o", str(outdir / "d.gguf"),
                              "--outtype", "q8_0", "--source-repo", "z-lab/X", "-q"])
    assert args.func is convert_cmd.run
    assert args.func(args) == 0
    kv = Out(outdir / "d.gguf").kv
    assert kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert kv["general.source.repo"] == "z-lab/X"
    with pytest.raises(SystemExit):
        parser.parse_args(["convert", str(ckpt), "--target", str(target), "-o", "x.gguf", "--outtype", "q4_0"])


def test_cli_module_entry_point_subprocess(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", mask_token_id=999)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(
        [*CLI, "convert", str(ckpt), "--target", str(target), "-o",
         str(outdir / "d.gguf")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("pyllamaspec: error: ") and "mask_token_id 999" in p.stderr
    assert listing(outdir) == []


# --------------------------------------------------------------------------------------------
# the factory itself
# --------------------------------------------------------------------------------------------


def test_factory_bf16_files_are_valid_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", version=2)
    with safe_open(str(ckpt / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        sl = f.get_slice("fc.weight")
        assert sl.get_dtype() == "BF16"
        assert sl.get_shape() == [64, 128]
    assert "candidate_selector.predecessor_codebook" in keys
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert cfg["dflash_config"]["target_layer_ids"] == [0, 2]
    assert cfg["dflash_config"]["block_size"] == 8


def test_factory_target_has_byte_level_vocab(tmp_path: Path) -> None:
    s = read_summary(write_target_gguf(tmp_path / "t.gguf", vocab=300))
    assert (s.arch, s.n_vocab, s.n_embd, s.n_layer, s.tokenizer_model) == ("qwen3", 300, 64, 4, "gpt2")
    assert s.has_output_head and s.role == "target"


def test_target_arch_without_layer_inputs_is_refused(tmp_path: Path, outdir: Path) -> None:
    # the pairing verdict's table of archs that hand over layer inputs: qwen2 graphs do not
    tgt = write_target_gguf(tmp_path / "q2.gguf", arch="qwen2")
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt")
    expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, tgt, outdir / "x.gguf"),
                   "qwen2", "does not hand over layer inputs", outdir=outdir)


def test_every_pairing_problem_is_named_at_once(tmp_path: Path, target: Path, outdir: Path) -> None:
    ckpt = write_dflash_checkpoint(tmp_path / "ckpt", vocab=300, mask_token_id=299, target_layer_ids=[0, 7])
    msg = expect_failure(PairingError, lambda: cv.convert_dflash(ckpt, target, outdir / "x.gguf"),
                         "vocab_size", "target_layer_ids[1] = 7", "mask_token_id 299", outdir=outdir)
    assert "\n" not in msg
