"""Synthetic models for tests and benchmarks: random weights, real architectures and shapes, any scale.

A target's tensors come from upstream's own loader, run on the metadata alone without allocating weights, so every
tensor an arch needs exists with the right shape. They are written straight in the requested type (f32, f16, q8_0,
q4_0; norms, 1-D tensors and the like stay F32 and the LM head gets the type llama-quantize would give it), streamed
tensor by tensor on every core: nothing close to the model's size is ever held in memory. Values depend on the seed,
the tensor name and the element index only, so any thread count writes the same bytes.

A draft model is the same target plus a second, smaller noise (perturb_seed): it agrees with the target often but
not always, so partial acceptance and rollback really happen. DFlash / DFlash2 drafters get their layout and
metadata from pyllamaspec's converter (the same keys and tensors a converted checkpoint has) and random weights.
Real models' shapes are presets (``pyllamaspec synth --preset NAME``), with the drafter that pairs with them.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import native_tools
from ..atomicfile import atomic_output
from ..errors import ConfigError, ConversionError, PairingError

TYPES = ("f32", "f16", "q8_0", "q4_0")


# --------------------------------------------------------------------------------------------
# shapes and presets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetShape:
    arch: str = "qwen3"
    n_vocab: int = 512
    n_embd: int = 64
    n_layer: int = 2                   # trunk layers (NextN/MTP blocks come on top)
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128                    # 0: not written (MoE models without a dense FFN size)
    n_ctx_train: int = 4096
    full_attention_interval: int = 0   # > 0: gated-DeltaNet hybrid (qwen35 family), every Nth layer attention
    ssm_d_inner: int = 0               # value heads x value head size
    ssm_d_state: int = 0               # key/value head size
    ssm_n_group: int = 0               # key heads
    ssm_d_conv: int = 0
    n_layer_nextn: int = 0             # MTP heads
    head_dim: int = 0                  # 0: n_embd / n_head; set: written as attention.key_length / value_length
    ssm_dt_rank: int = 0               # value heads; 0: ssm_d_inner / ssm_d_state
    rope_dim: int = 0                  # hybrids: rotated dims per head; 0: head_dim / 4
    rope_sections: tuple[int, ...] = ()  # hybrids: M-RoPE sections; (): rope_dim / 2 split in three
    rope_theta: float = 1000000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False       # no output.weight: the LM head is token_embd
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0

    @property
    def n_embd_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


@dataclass(frozen=True)
class DFlashShape:
    """A DFlash (version 1) or DFlash2 (version 2) drafter, in the terms of its Hugging Face config."""

    version: int = 1
    n_embd: int = 64                   # the target's hidden size
    n_layer: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    target_layer_ids: tuple[int, ...] = (0,)  # HF ids: the output of layer id (llama.cpp taps the input of id + 1)
    block_size: int = 16
    mask_token_id: int = -1            # -1: the target's last token
    rope_theta: float = 1000000.0
    rope_yarn_factor: float = 0.0      # > 0: yarn scaling from rope_yarn_orig_ctx
    rope_yarn_orig_ctx: int = 0
    rms_eps: float = 1e-6
    n_ctx_train: int = 0               # 0: the target's
    sliding_window: int = 0            # > 0: sliding-window attention on the layers of sliding_layers (all if empty)
    sliding_layers: tuple[bool, ...] = ()
    causal: bool | None = None         # None: not written (upstream's default)
    conv_kernel_size: int = 2          # DFlash2 only, from here on
    conv_group_size: int = 16
    selector_rank: int = 16
    selector_top_k: int = 4


@dataclass(frozen=True)
class Preset:
    target: TargetShape
    drafter: DFlashShape | None = None
    stddev: float = 0.1                # default noise; realistic-scale shapes use 0.02 (activations stay in F16 range)
    source: str = ""


# Qwen3.8-27B: sglang's and NVIDIA's documentation describe it as the Qwen3.5/3.6 dense hybrid architecture
# unchanged, its GGUFs carry 64 trunk layers plus one NextN block (blk.64), and its DFlash2 drafter's config names a
# 64-layer, 5120-wide, 248320-token target; no config.json of the model itself was found, so the sizes are those of
# Qwen/Qwen3.6-27B's (model card and config: 16 x (3 gated DeltaNet + 1 gated attention), 48 V / 16 QK linear heads
# of 128, 24 Q / 4 KV heads of 256, rotary 64, FFN 17408, MTP 1, rope theta 1e7, context 262144, untied head).
_QWEN38_27B = TargetShape(
    arch="qwen35", n_vocab=248320, n_embd=5120, n_layer=64, n_head=24, n_head_kv=4, head_dim=256, n_ff=17408,
    n_ctx_train=262144, full_attention_interval=4, ssm_d_conv=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=48,
    ssm_d_inner=48 * 128, rope_dim=64, rope_sections=(11, 11, 10, 0), rope_theta=10000000.0, n_layer_nextn=1)
# z-lab/Qwen3.8-27B-DFlash2 @ 50307d4c4cde6860d4eee73e2547cd786fe8e8a4, config.json
_QWEN38_27B_DFLASH2 = DFlashShape(
    version=2, n_embd=5120, n_layer=5, n_head=32, n_head_kv=8, head_dim=128, n_ff=17408,
    target_layer_ids=(5, 19, 33, 47, 61), block_size=8, mask_token_id=248070, rope_theta=10000000.0,
    n_ctx_train=262144, sliding_window=2048, causal=False, conv_kernel_size=2, conv_group_size=16,
    selector_rank=256, selector_top_k=16)
# Qwen/Qwen3.6-35B-A3B (model card): 10 x (3 gated DeltaNet + 1 gated attention), each with an MoE of 256 experts
# (8 routed + 1 shared, 512 wide); 32 V / 16 QK linear heads of 128, 16 Q / 2 KV heads of 256, rotary 64, MTP 1
_QWEN36_35B_A3B = TargetShape(
    arch="qwen35moe", n_vocab=248320, n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256, n_ff=0,
    n_ctx_train=262144, full_attention_interval=4, ssm_d_conv=4, ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32,
    ssm_d_inner=32 * 128, rope_dim=64, rope_sections=(11, 11, 10, 0), rope_theta=10000000.0, n_layer_nextn=1,
    n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512)
# z-lab/Qwen3.6-35B-A3B-DFlash @ 42d3b34d588423cdae7ba8f53a8cf7789346a719, config.json (a later revision moved to
# 6 layers with 8 taps and sliding windows; this is the revision the field's GGUF conversions were made from)
_QWEN36_35B_A3B_DFLASH = DFlashShape(
    version=1, n_embd=2048, n_layer=8, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144,
    target_layer_ids=(1, 10, 19, 28, 37), block_size=16, mask_token_id=248070, rope_theta=10000000.0,
    rope_yarn_factor=64.0, rope_yarn_orig_ctx=4096, n_ctx_train=262144)

# scale-downs of the same archs and drafters: every metadata path and tensor kind, small enough to run in tests
_TINY_HYBRID = dict(n_vocab=512, n_embd=128, n_layer=8, n_head=4, n_head_kv=2, head_dim=64, n_ctx_train=4096,
                    full_attention_interval=4, ssm_d_conv=4, ssm_d_state=32, ssm_n_group=2, ssm_dt_rank=6,
                    ssm_d_inner=6 * 32, rope_dim=16, rope_sections=(3, 3, 2, 0), rope_theta=10000000.0,
                    n_layer_nextn=1)
_TINY_QWEN38 = TargetShape(arch="qwen35", n_ff=256, **_TINY_HYBRID)
_TINY_QWEN38_DFLASH2 = DFlashShape(
    version=2, n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=256, target_layer_ids=(1, 3, 5),
    block_size=8, rope_theta=10000000.0, sliding_window=64, causal=False, conv_kernel_size=2, conv_group_size=16,
    selector_rank=16, selector_top_k=4)
_TINY_QWEN36_MOE = TargetShape(arch="qwen35moe", n_ff=0, n_expert=16, n_expert_used=4, n_ff_exp=64, n_ff_shexp=64,
                               **_TINY_HYBRID)
_TINY_QWEN36_MOE_DFLASH = DFlashShape(
    version=1, n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=256, target_layer_ids=(1, 4, 6),
    block_size=16, rope_theta=10000000.0, rope_yarn_factor=4.0, rope_yarn_orig_ctx=1024)

_QWEN2 = "Qwen2.5 config.json (Qwen/Qwen2.5-*)"
PRESET_TABLE: dict[str, Preset] = {
    "tiny-llama": Preset(TargetShape(arch="llama")),
    "tiny-qwen3": Preset(TargetShape(arch="qwen3")),
    "tiny-qwen35": Preset(TargetShape(arch="qwen35", n_embd=128, n_head=2, n_head_kv=2, n_layer=4,
                                      full_attention_interval=2, ssm_d_inner=128, ssm_d_state=64, ssm_n_group=2,
                                      ssm_d_conv=4)),
    "tiny-qwen35-mtp": Preset(TargetShape(arch="qwen35", n_embd=128, n_head=2, n_head_kv=2, n_layer=4,
                                          full_attention_interval=2, ssm_d_inner=128, ssm_d_state=64, ssm_n_group=2,
                                          ssm_d_conv=4, n_layer_nextn=1)),
    "tiny-qwen3.8-27b": Preset(_TINY_QWEN38, _TINY_QWEN38_DFLASH2, source="scale-down of qwen3.8-27b"),
    "tiny-qwen3.6-35b-a3b": Preset(_TINY_QWEN36_MOE, _TINY_QWEN36_MOE_DFLASH, source="scale-down of qwen3.6-35b-a3b"),
    # real shapes, for speed work where real weights cannot travel
    "qwen2.5-0.5b": Preset(TargetShape(arch="qwen2", n_vocab=151936, n_embd=896, n_layer=24, n_head=14, n_head_kv=2,
                                       n_ff=4864, n_ctx_train=32768, tie_embeddings=True), stddev=0.02, source=_QWEN2),
    "qwen2.5-1.5b": Preset(TargetShape(arch="qwen2", n_vocab=151936, n_embd=1536, n_layer=28, n_head=12, n_head_kv=2,
                                       n_ff=8960, n_ctx_train=32768, tie_embeddings=True), stddev=0.02, source=_QWEN2),
    "qwen2.5-7b": Preset(TargetShape(arch="qwen2", n_vocab=152064, n_embd=3584, n_layer=28, n_head=28, n_head_kv=4,
                                     n_ff=18944, n_ctx_train=32768), stddev=0.02, source=_QWEN2),
    "qwen3.8-27b": Preset(_QWEN38_27B, _QWEN38_27B_DFLASH2, stddev=0.02,
                          source="Qwen/Qwen3.6-27B config; z-lab/Qwen3.8-27B-DFlash2 config"),
    "qwen3.6-35b-a3b": Preset(_QWEN36_35B_A3B, _QWEN36_35B_A3B_DFLASH, stddev=0.02,
                              source="Qwen/Qwen3.6-35B-A3B model card; z-lab/Qwen3.6-35B-A3B-DFlash config"),
}
PRESETS: dict[str, TargetShape] = {name: p.target for name, p in PRESET_TABLE.items()}


# --------------------------------------------------------------------------------------------
# the plan: tensors, their types and the metadata, before anything is written
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]             # ggml ne order, trailing 1s dropped
    type: str                          # ggml type name: F32, F16, Q8_0, Q4_0, Q6_K
    nbytes: int
    kind: str = "weight"               # weight ~ N(0, sd), norm ~ 1 + N(0, sd), negative ~ -|N(0, sd)|


@dataclass(frozen=True)
class SynthPlan:
    arch: str
    type: str                          # the requested type (f32, f16, q8_0, q4_0)
    tensors: tuple[PlannedTensor, ...]
    metadata: dict[str, Any] = field(repr=False)  # every key but the tokenizer's long arrays

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors)

    def tensor(self, name: str) -> PlannedTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def describe(self, label: str = "") -> str:
        a, md = self.arch, self.metadata
        lines = [f"{label or a}: arch {a}, {self.type}, {len(self.tensors)} tensors, {self.n_params / 1e9:.3f} B params, "
                 f"{self.total_bytes / 2**30:.2f} GiB of tensor data"]
        facts = [f"{k.split('.', 1)[1]} {md[k]:g}" if isinstance(md[k], float) else f"{k.split('.', 1)[1]} {md[k]}"
                 for k in sorted(md) if k.startswith(f"{a}.") and not isinstance(md[k], list)]
        lines.append("  " + ", ".join(facts))
        recurrent = md.get(f"{a}.attention.recurrent_layers")
        if isinstance(recurrent, list):
            n_trunk = md[f"{a}.block_count"] - md.get(f"{a}.nextn_predict_layers", 0)
            pattern = "".join("R" if r else "A" for r in recurrent[:n_trunk]) + "N" * (len(recurrent) - n_trunk)
            lines.append(f"  layers: {pattern} (R gated DeltaNet, A attention, N NextN/MTP)")
        for t in self.tensors:
            lines.append(f"  {t.name:<40} {str(list(t.shape)):<24} {t.type:<5} {t.nbytes / 2**20:10.2f} MiB")
        return "\n".join(lines)


def _ggml_types() -> dict[str, Any]:
    from gguf import GGMLQuantizationType as Q

    return {"F32": Q.F32, "F16": Q.F16, "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q6_K": Q.Q6_K}


def _nbytes(shape: Sequence[int], type_name: str) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[_ggml_types()[type_name]]
    return math.prod(shape) // block * size


def _block(type_name: str) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[_ggml_types()[type_name]][0]


def _keeps_f32(name: str, shape: Sequence[int]) -> bool:
    """What upstream leaves unquantized (llama-quant.cpp tensor_allows_quantization; the converter's always-F32
    list): 1-D tensors, anything not a .weight, norms, MoE routers, short convolutions, positional tables."""
    return (len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name
            or "ffn_gate_inp.weight" in name or "ffn_gate_inp_shexp" in name or "ssm_conv1d" in name
            or name in ("position_embd.weight", "token_types.weight"))


def _tensor_type(name: str, shape: Sequence[int], type: str, *, n_expert: int, head_is_embd: bool) -> str:
    """The type llama-quantize gives this tensor for `type` (llama-quant.cpp llama_tensor_get_type, without an
    importance matrix): the LM head (or the token embeddings when they are the head) Q6_K under Q4_0, attention V/K
    at Q8_0 in 8-expert models, and the block-size fallbacks."""
    if type == "f32" or _keeps_f32(name, shape):
        return "F32"
    if type == "f16":
        return "F16"
    new = {"q8_0": "Q8_0", "q4_0": "Q4_0"}[type]
    ne0 = shape[0]
    is_head = name == "output.weight" or (head_is_embd and name == "token_embd.weight")
    if is_head:
        if ne0 % 256 != 0:
            new = "Q8_0"
        elif new != "Q8_0":
            new = "Q6_K"
    elif n_expert == 8 and any(k in name for k in ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight", "attn_k.weight")):
        new = "Q8_0"
    if ne0 % _block(new) != 0:  # tensor_type_fallback
        new = "Q8_0" if new == "Q6_K" else new
        if ne0 % _block(new) != 0:
            new = "F16"
    return new


def _kind(name: str) -> str:
    if name.endswith("norm.weight"):
        return "norm"  # norms near 1 keep activations in range through many layers of a realistic-depth model
    if re.search(r"\.ssm_a(\.|$)", name):
        return "negative"  # state decay
    return "weight"


def _ne(shape: Sequence[int]) -> tuple[int, ...]:
    s = list(shape)
    while len(s) > 1 and s[-1] == 1:
        s.pop()
    return tuple(s)


# Given metadata alone, upstream's loader also creates every optional tensor an arch may have. A converted checkpoint
# has none of these: quantization sidecar scales, classifier and rope-factor tables, NextN copies of the shared
# embeddings and head, and biases where the model family has none (Qwen2 keeps its Q/K/V biases).
_NEVER = re.compile(r"\.(scale|input_scale)$|^rope_freqs\.|^cls\.|^output\.bias$|\.nextn\.(embed_tokens|shared_head_head)\.")
_NO_BIASES = {"llama": (), "qwen2": ("attn_q", "attn_k", "attn_v"), "qwen3": (), "qwen35": (), "qwen35moe": ()}
_BIAS = re.compile(r"\.(attn_q|attn_k|attn_v|attn_output|attn_qkv|ffn_gate|ffn_up|ffn_down)\.bias$")


def _as_converted(arch: str, listed: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """The loader's tensor list as upstream's converter writes the model: optional extras dropped, and fused
    expert gate/up tensors (which the converter does not write by default) as separate gate and up tensors."""
    out = []
    keep_bias = _NO_BIASES.get(arch)
    for name, ne in listed:
        if _NEVER.search(name):
            continue
        m = _BIAS.search(name)
        if m and keep_bias is not None and m.group(1) not in keep_bias:
            continue
        if name.endswith(".ffn_gate_up_exps.weight"):
            half = (ne[0], ne[1] // 2, *ne[2:])
            out += [(name.replace("gate_up_exps", "gate_exps"), half), (name.replace("gate_up_exps", "up_exps"), half)]
            continue
        out.append((name, ne))
    return out


def _target_keys(shape: TargetShape) -> list[tuple[str, Any, str]]:
    """(key, value, kind) of a target's metadata, as upstream's converter writes them for the arch."""
    a = shape.arch
    kv: list[tuple[str, Any, str]] = [
        (f"{a}.context_length", shape.n_ctx_train or 4096, "u32"),
        (f"{a}.embedding_length", shape.n_embd, "u32"),
        (f"{a}.block_count", shape.n_layer + max(0, shape.n_layer_nextn), "u32"),
        (f"{a}.attention.head_count", shape.n_head, "u32"),
        (f"{a}.attention.head_count_kv", shape.n_head_kv or shape.n_head, "u32"),
        (f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps, "f32"),
        (f"{a}.rope.freq_base", shape.rope_theta, "f32"),
    ]
    if shape.n_ff > 0:
        kv.append((f"{a}.feed_forward_length", shape.n_ff, "u32"))
    if shape.head_dim:
        kv += [(f"{a}.attention.key_length", shape.head_dim, "u32"), (f"{a}.attention.value_length", shape.head_dim, "u32")]
    if shape.n_expert:
        kv += [(f"{a}.expert_count", shape.n_expert, "u32"), (f"{a}.expert_used_count", shape.n_expert_used, "u32")]
        if shape.n_ff_exp:
            kv.append((f"{a}.expert_feed_forward_length", shape.n_ff_exp, "u32"))
        if shape.n_ff_shexp:
            kv.append((f"{a}.expert_shared_feed_forward_length", shape.n_ff_shexp, "u32"))
    if shape.n_layer_nextn > 0:
        kv.append((f"{a}.nextn_predict_layers", shape.n_layer_nextn, "u32"))
    if shape.full_attention_interval > 0:
        hd = shape.n_embd_head
        d_state = shape.ssm_d_state or 128
        d_inner = shape.ssm_d_inner or 2 * shape.n_embd
        rope_dim = shape.rope_dim or hd // 4
        sections = list(shape.rope_sections) or [rope_dim // 2 - 2 * (rope_dim // 6), rope_dim // 6, rope_dim // 6, 0]
        interval = shape.full_attention_interval
        recurrent = [(i + 1) % interval != 0 for i in range(shape.n_layer)] + [False] * shape.n_layer_nextn
        kv += [
            (f"{a}.ssm.conv_kernel", shape.ssm_d_conv or 4, "u32"),
            (f"{a}.ssm.state_size", d_state, "u32"),
            (f"{a}.ssm.group_count", shape.ssm_n_group or 2, "u32"),
            (f"{a}.ssm.time_step_rank", shape.ssm_dt_rank or d_inner // d_state, "u32"),
            (f"{a}.ssm.inner_size", d_inner, "u32"),
            (f"{a}.attention.recurrent_layers", recurrent, "bools"),
            (f"{a}.full_attention_interval", interval, "u32"),
            (f"{a}.rope.dimension_count", rope_dim, "u32"),
            (f"{a}.rope.dimension_sections", sections, "i32s"),
        ]
        if not shape.head_dim:
            kv += [(f"{a}.attention.key_length", hd, "u32"), (f"{a}.attention.value_length", hd, "u32")]
    return kv


_FTYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}  # llama_ftype


def _write_target_meta(path: Path, shape: TargetShape, type: str, name: str) -> None:
    """A GGUF of keys only: the target's metadata and upstream's test tokenizer (tok_<i>, no BOS/EOS)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch=shape.arch)
    try:
        w.add_string("general.name", name)
        w.add_uint32("general.file_type", _FTYPE[type])
        w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
        for key, value, kind in _target_keys(shape):
            if kind == "u32":
                w.add_uint32(key, int(value))
            elif kind == "f32":
                w.add_float32(key, float(value))
            elif kind == "bools":
                w.add_array(key, [bool(v) for v in value])
            else:
                w.add_key_value(key, [int(v) for v in value], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        w.add_string("tokenizer.ggml.model", "test")
        w.add_array("tokenizer.ggml.tokens", [f"tok_{i}" for i in range(shape.n_vocab)])
        w.add_array("tokenizer.ggml.scores", [0.0] * shape.n_vocab)
        w.write_header_to_file()
        w.write_kv_data_to_file()
    finally:
        w.close()
    _pad(path)


def _pad(path: Path) -> None:
    """End a keys-only GGUF on the alignment where its (empty) data section starts, as readers expect."""
    with open(path, "ab") as f:
        f.write(b"\0" * (-f.tell() % 32))


def _list_tensors(meta: Path, load_mtp: bool) -> list[tuple[str, tuple[int, ...]]]:
    return native_tools.synth_list_tensors(meta, load_mtp)


def _block_index(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def _check_shape(shape: TargetShape) -> None:
    if not isinstance(shape, TargetShape):
        raise ConfigError(f"a target shape must be a TargetShape, got {type(shape).__name__}")
    if shape.n_vocab < 8 or shape.n_embd < 8 or shape.n_layer < 1 or shape.n_head < 1:
        raise ConfigError("synthetic model: need n_vocab >= 8, n_embd >= 8, n_layer >= 1 and n_head >= 1")
    if not shape.head_dim and shape.n_embd % shape.n_head:
        raise ConfigError(f"synthetic model: n_embd {shape.n_embd} is not divisible by n_head {shape.n_head}; "
                          f"set head_dim")
    if shape.full_attention_interval < 0 or shape.n_layer_nextn < 0 or shape.n_expert < 0:
        raise ConfigError("synthetic model: full_attention_interval, n_layer_nextn and n_expert must be >= 0")
    if shape.n_expert and not 0 < shape.n_expert_used <= shape.n_expert:
        raise ConfigError(f"synthetic model: n_expert_used must be 1..{shape.n_expert}")


def _check_type(type: str) -> str:
    if type not in TYPES:
        raise ConfigError(f"type {type!r} is not one of {', '.join(TYPES)}")
    return type


def _plan_target(meta_dir: Path, shape: TargetShape, type: str, name: str) -> tuple[Path, SynthPlan]:
    from ..ggufinfo import read_summary

    _check_shape(shape)
    _check_type(type)
    meta = meta_dir / "target.meta.gguf"
    _write_target_meta(meta, shape, type, name)
    listed = _as_converted(shape.arch, [(n, _ne(ne)) for n, ne in _list_tensors(meta, shape.n_layer_nextn > 0)])
    if shape.tie_embeddings:
        listed = [(n, ne) for n, ne in listed if n != "output.weight"]
    head_is_embd = not any(n == "output.weight" for n, _ in listed)
    listed.sort(key=lambda t: (_block_index(t[0]), t[0]))
    tensors = []
    for n, ne in listed:
        ty = _tensor_type(n, ne, type, n_expert=shape.n_expert, head_is_embd=head_is_embd)
        tensors.append(PlannedTensor(n, ne, ty, _nbytes(ne, ty), _kind(n)))
    return meta, SynthPlan(shape.arch, type, tuple(tensors), read_summary(meta).metadata)


def plan_target(shape: TargetShape | str = TargetShape(), type: str = "f32") -> SynthPlan:
    """What write_target would write for `shape` (or a preset name) in `type`: tensors, types, sizes, metadata."""
    shape = PRESETS[shape] if isinstance(shape, str) and shape in PRESETS else shape
    with tempfile.TemporaryDirectory(prefix="pyllamaspec-synth-") as d:
        return _plan_target(Path(d), shape, type, "plan")[1]


# --------------------------------------------------------------------------------------------
# DFlash / DFlash2 drafters: the converter's layout and metadata, random weights
# --------------------------------------------------------------------------------------------


def _dflash_config(d: DFlashShape, n_vocab: int, n_layer_target: int, n_ctx_target: int) -> dict[str, Any]:
    """The drafter as a z-lab style config.json, which the converter reads."""
    mask = d.mask_token_id if d.mask_token_id >= 0 else n_vocab - 1
    dc: dict[str, Any] = {"mask_token_id": mask, "target_layer_ids": list(d.target_layer_ids)}
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel" if d.version == 1 else "DFlash2DraftModel"],
        "hidden_size": d.n_embd, "num_hidden_layers": d.n_layer, "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head_kv, "head_dim": d.head_dim, "intermediate_size": d.n_ff,
        "vocab_size": n_vocab, "rms_norm_eps": d.rms_eps, "hidden_act": "silu", "tie_word_embeddings": False,
        "num_target_layers": n_layer_target, "dflash_config": dc,
    }
    if d.n_ctx_train or n_ctx_target:
        cfg["max_position_embeddings"] = d.n_ctx_train or n_ctx_target
    rope: dict[str, Any] = {"rope_theta": d.rope_theta, "rope_type": "default"}
    if d.rope_yarn_factor > 0:
        rope = {"rope_theta": d.rope_theta, "rope_type": "yarn", "factor": d.rope_yarn_factor,
                "original_max_position_embeddings": d.rope_yarn_orig_ctx, "beta_fast": 32.0, "beta_slow": 1.0}
    if d.version == 1:
        cfg["block_size"] = d.block_size
        cfg["rope_theta"] = d.rope_theta
        cfg["rope_scaling"] = rope if d.rope_yarn_factor > 0 else None
    else:
        dc.update(block_size=d.block_size, conv_kernel_size=d.conv_kernel_size, conv_group_size=d.conv_group_size,
                  selector_rank=d.selector_rank, selector_top_k=d.selector_top_k)
        cfg["rope_parameters"] = rope
    if d.causal is not None:
        cfg["is_causal"] = d.causal
    if d.sliding_window > 0:
        sliding = list(d.sliding_layers) or [True] * d.n_layer
        cfg.update(use_sliding_window=True, sliding_window=d.sliding_window,
                   layer_types=["sliding_attention" if s else "full_attention" for s in sliding])
    else:
        cfg.update(use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * d.n_layer)
    return cfg


def _plan_drafter(meta_dir: Path, drafter: DFlashShape, target: Path, type: str, name: str) -> tuple[Path, SynthPlan]:
    """Layout, keys and pairing checks from the converter, against `target` (a target GGUF, or its keys alone)."""
    import gguf

    from ..ggufinfo import read_summary
    from .convert.config import parse_config
    from .convert.plan import expected_tensors
    from .convert.target import ARCH, check_pairing, read_target
    from .convert.write import write_metadata
    from .quantize import DRAFTER_KEEP

    if not isinstance(drafter, DFlashShape):
        raise ConfigError(f"a DFlash drafter shape must be a DFlashShape, got {drafter.__class__.__name__}")
    _check_type(type)
    tgt = read_target(Path(target))
    cfg_dir = meta_dir / "drafter-config"
    cfg_dir.mkdir(exist_ok=True)
    (cfg_dir / "config.json").write_text(json.dumps(_dflash_config(drafter, tgt.n_vocab, tgt.n_layer, read_summary(target).n_ctx_train or 0)), encoding="utf-8")
    try:
        spec = parse_config(cfg_dir)
        check_pairing(spec, tgt)
    except (ConversionError, PairingError) as e:
        raise ConfigError(f"DFlash drafter shape: {e}") from None
    meta = meta_dir / "drafter.meta.gguf"
    w = gguf.GGUFWriter(str(meta), arch=ARCH)
    try:
        write_metadata(w, spec, tgt, "f32", name, None, None)
        for kv in w.kv_data:
            kv.pop("general.file_type", None)
        w.add_uint32("general.file_type", _FTYPE[type])
        w.write_header_to_file()
        w.write_kv_data_to_file()
    finally:
        w.close()
    _pad(meta)
    tensors = []
    for p in expected_tensors(spec):
        if not p.required:  # embeddings, LM head and sinks: a released drafter borrows or lacks them
            continue
        ne = _ne(tuple(reversed(p.shape)))
        ty = _tensor_type(p.gguf, ne, type, n_expert=0, head_is_embd=False)
        if ty not in ("F32", "F16") and any(re.fullmatch(k, p.gguf) for k in DRAFTER_KEEP):
            ty = "F16"  # what `pyllamaspec quantize` keeps at full precision in a drafter
        tensors.append(PlannedTensor(p.gguf, ne, ty, _nbytes(ne, ty), _kind(p.gguf)))
    tensors.sort(key=lambda t: (_block_index(t.name), t.name))
    return meta, SynthPlan(ARCH, type, tuple(tensors), read_summary(meta).metadata)


def plan_preset(preset: str, type: str = "f32", n_vocab: int | None = None) -> tuple[SynthPlan, SynthPlan | None]:
    """The target's plan and, for presets with a paired DFlash drafter, the drafter's."""
    p = _preset(preset)
    with tempfile.TemporaryDirectory(prefix="pyllamaspec-synth-") as d:
        meta, target = _plan_target(Path(d), _preset_shape(p, n_vocab), type, f"pyllamaspec synthetic {preset}")
        drafter = None
        if p.drafter is not None:
            drafter = _plan_drafter(Path(d), p.drafter, meta, type, f"pyllamaspec synthetic {preset} drafter")[1]
    return target, drafter


def _preset(name: str) -> Preset:
    if name not in PRESET_TABLE:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESET_TABLE))}")
    return PRESET_TABLE[name]


def _preset_shape(p: Preset, n_vocab: int | None) -> TargetShape:
    """The preset's target shape, with another vocabulary size where one is given (a draft model must share its
    target's vocabulary: the qwen2.5-0.5b shape drafting for the qwen2.5-7b shape needs 152064 tokens)."""
    if n_vocab is None:
        return p.target
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int) or not 8 <= n_vocab <= 2**31 - 1:
        raise ConfigError(f"n_vocab={n_vocab!r} must be an integer within 8..{2**31 - 1}")
    return replace(p.target, n_vocab=n_vocab)


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------

ProgressFn = Callable[[int, int], Any]  # (bytes done, bytes total); a true return value cancels


def _check_noise(seed: int, stddev: float, perturb_seed: int, perturb_stddev: float, n_threads: int | None) -> None:
    for what, v in (("seed", seed), ("perturb_seed", perturb_seed)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
            raise ConfigError(f"{what}={v!r} must be an integer within 0..{2**32 - 1}")
    for what, v in (("stddev", stddev), ("perturb_stddev", perturb_stddev)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{what} must be a number, got {v!r}")
    if not math.isfinite(stddev) or stddev <= 0:
        raise ConfigError(f"stddev must be a finite number > 0, got {stddev}")
    if perturb_seed and (not math.isfinite(perturb_stddev) or perturb_stddev <= 0):
        raise ConfigError(f"perturb_stddev must be a finite number > 0 with a perturb seed, got {perturb_stddev}")
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or not 0 <= n_threads <= 4096):
        raise ConfigError(f"n_threads must be 0 (every core) .. 4096, got {n_threads!r}")


def _check_outputs(paths: Sequence[Path], force: bool) -> None:
    for p in paths:
        if p.is_dir():
            raise ConfigError(f"output '{p}' is a directory; give a file name")
        if p.exists() and not force:
            raise ConfigError(f"output '{p}' already exists; pass --force (force=True) to overwrite it")
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise ConfigError("the target and the drafter cannot be written to the same file")


def _write(path: Path, meta: Path, plan: SynthPlan, *, seed: int, stddev: float, perturb_seed: int,
           perturb_stddev: float, n_threads: int | None, force: bool, progress: ProgressFn | None) -> Path:
    types = _ggml_types()
    tensors = [native_tools.SynthTensor(t.name, tuple(t.shape), int(types[t.type]), t.kind) for t in plan.tensors]
    with atomic_output(path, force=force, error=ConfigError) as tmp:
        native_tools.synth_write(meta, tensors, tmp, seed=seed, stddev=stddev, perturb_seed=perturb_seed,
                                 perturb_stddev=perturb_stddev, n_threads=n_threads, progress=progress)
    return path


def write_target(path: str | os.PathLike, shape: TargetShape = TargetShape(), *, seed: int = 1, stddev: float = 0.1,
                 perturb_seed: int = 0, perturb_stddev: float = 0.0, type: str | None = None, f16: bool = False,
                 n_threads: int | None = None, force: bool = False, progress: ProgressFn | None = None,
                 name: str | None = None) -> Path:
    """Write a random model of `shape` in `type` (f32, f16, q8_0, q4_0; f16=True is type="f16"); with
    perturb_seed, a noisy copy of the same model (a draft model). Streams tensor by tensor on n_threads threads
    (None: every core). An existing file is replaced only with force=True; nothing is visible at `path` until the
    file is complete. `progress(done, total)` is called as data is written; a true return value cancels."""
    type = _resolve_type(type, f16)
    _check_noise(seed, stddev, perturb_seed, perturb_stddev, n_threads)
    path = Path(path)
    _check_outputs([path], force)
    with tempfile.TemporaryDirectory(prefix="pyllamaspec-synth-") as d:
        meta, plan = _plan_target(Path(d), shape, type, name or f"pyllamaspec synthetic {shape.arch}")
        return _write(path, meta, plan, seed=seed, stddev=stddev, perturb_seed=perturb_seed,
                      perturb_stddev=perturb_stddev, n_threads=n_threads, force=force, progress=progress)


def write_dflash_drafter(path: str | os.PathLike, target: str | os.PathLike, shape: DFlashShape, *, seed: int = 1,
                         stddev: float = 0.1, type: str = "f32", n_threads: int | None = None, force: bool = False,
                         progress: ProgressFn | None = None, name: str | None = None) -> Path:
    """A random DFlash / DFlash2 drafter of `shape` for the target GGUF `target` (its tokenizer, checked against
    its sizes), laid out and labelled as pyllamaspec's converter lays out a real checkpoint."""
    _check_type(type)
    _check_noise(seed, stddev, 0, 0.0, n_threads)
    path = Path(path)
    _check_outputs([path], force)
    with tempfile.TemporaryDirectory(prefix="pyllamaspec-synth-") as d:
        meta, plan = _plan_drafter(Path(d), shape, Path(target), type,
                                   name or f"pyllamaspec synthetic dflash{'2' if shape.version == 2 else ''}")
        return _write(path, meta, plan, seed=seed, stddev=stddev, perturb_seed=0, perturb_stddev=0.0,
                      n_threads=n_threads, force=force, progress=progress)


def write_pair(directory: str | os.PathLike, shape: TargetShape = TargetShape(), *, seed: int = 1,
               stddev: float = 0.1, drafter_shape: TargetShape | DFlashShape | None = None,
               perturb_stddev: float = 0.01, type: str = "f32", n_threads: int | None = None,
               force: bool = False) -> tuple[Path, Path]:
    """A target and a draft model that agrees with it often: the target's weights plus noise (same shape), a
    smaller random model (a TargetShape), or a DFlash / DFlash2 drafter of the target (a DFlashShape)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = d / f"target-{shape.arch}.gguf"
    if isinstance(drafter_shape, DFlashShape):
        drafter = d / f"drafter-dflash{'2' if drafter_shape.version == 2 else ''}.gguf"
    else:
        drafter = d / f"drafter-{(drafter_shape or shape).arch}.gguf"
    _check_outputs([target, drafter], force)
    write_target(target, shape, seed=seed, stddev=stddev, type=type, n_threads=n_threads, force=force)
    if drafter_shape is None:
        write_target(drafter, shape, seed=seed, stddev=stddev, perturb_seed=seed + 1000, perturb_stddev=perturb_stddev,
                     type=type, n_threads=n_threads, force=force)
    elif isinstance(drafter_shape, DFlashShape):
        write_dflash_drafter(drafter, target, drafter_shape, seed=seed + 7, stddev=stddev, type=type,
                             n_threads=n_threads, force=force)
    else:
        write_target(drafter, drafter_shape, seed=seed + 7, stddev=stddev, type=type, n_threads=n_threads, force=force)
    return target, drafter


def write_preset(out: str | os.PathLike, preset: str, *, drafter_out: str | os.PathLike | None = None,
                 type: str = "f32", seed: int = 1, stddev: float | None = None, perturb_seed: int = 0,
                 perturb_stddev: float = 0.01, n_threads: int | None = None, force: bool = False,
                 progress: ProgressFn | None = None, n_vocab: int | None = None) -> tuple[Path, Path | None]:
    """A preset's target and, with drafter_out, its drafter: the paired DFlash drafter where the preset has one,
    else the target plus a second noise (seed + 1000). stddev None: the preset's default; n_vocab None: the
    preset's vocabulary size."""
    p = _preset(preset)
    shape = _preset_shape(p, n_vocab)
    sd = p.stddev if stddev is None else stddev
    _check_type(type)
    _check_noise(seed, sd, perturb_seed, perturb_stddev, n_threads)
    out = Path(out)
    _check_outputs([out] + ([Path(drafter_out)] if drafter_out is not None else []), force)
    write_target(out, shape, seed=seed, stddev=sd, perturb_seed=perturb_seed, perturb_stddev=perturb_stddev,
                 type=type, n_threads=n_threads, force=force, progress=progress, name=f"pyllamaspec synthetic {preset}")
    if drafter_out is None:
        return out, None
    drafter_out = Path(drafter_out)
    if p.drafter is not None:
        write_dflash_drafter(drafter_out, out, p.drafter, seed=seed + 7, stddev=sd, type=type, n_threads=n_threads,
                             force=force, progress=progress, name=f"pyllamaspec synthetic {preset} drafter")
    else:
        write_target(drafter_out, shape, seed=seed, stddev=sd, perturb_seed=seed + 1000,
                     perturb_stddev=perturb_stddev, type=type, n_threads=n_threads, force=force, progress=progress,
                     name=f"pyllamaspec synthetic {preset} drafter")
    return out, drafter_out


def _resolve_type(type: str | None, f16: bool) -> str:
    if type is None:
        return "f16" if f16 else "f32"
    _check_type(type)
    if f16 and type != "f16":
        raise ConfigError(f"f16=True asks for f16 weights but type is {type!r}; pass one of them")
    return type


# --------------------------------------------------------------------------------------------
# EAGLE3 and DSpark drafters (small, written with gguf's writer)
# --------------------------------------------------------------------------------------------


def write_eagle3_drafter(path: str | os.PathLike, target: str | os.PathLike, *, target_layers: tuple[int, ...],
                         n_embd: int, n_head: int = 4, n_head_kv: int = 2, n_ff: int | None = None,
                         seed: int = 1, stddev: float = 0.1, force: bool = False) -> Path:
    """A random EAGLE3 drafter (arch eagle3: fc over 3 tapped target layers + one decoder layer) that borrows
    the target's embeddings and LM head, with the target's tokenizer. target_layers are GGUF ids (HF + 1)."""
    import numpy as np

    from ..ggufinfo import read_summary, tokenizer_kv

    summary = read_summary(target)
    if len(target_layers) != 3:
        raise ConfigError("an EAGLE3 drafter taps exactly 3 target layers")
    n_embd_tgt = summary.n_embd
    n_ff = n_ff or 2 * n_embd
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    weight = _random_weight(rng, stddev)

    def norm(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * stddev).astype(np.float32)

    tensors = {
        "fc.weight": weight(n_embd, 3 * n_embd_tgt),
        "output_norm.weight": norm(n_embd),
        "blk.0.attn_norm.weight": norm(n_embd),
        "blk.0.attn_norm_2.weight": norm(n_embd),
        "blk.0.attn_q.weight": weight(n_head * head_dim, 2 * n_embd),
        "blk.0.attn_k.weight": weight(n_head_kv * head_dim, 2 * n_embd),
        "blk.0.attn_v.weight": weight(n_head_kv * head_dim, 2 * n_embd),
        "blk.0.attn_output.weight": weight(n_embd, n_head * head_dim),
        "blk.0.ffn_norm.weight": norm(n_embd),
        "blk.0.ffn_gate.weight": weight(n_ff, n_embd),
        "blk.0.ffn_up.weight": weight(n_ff, n_embd),
        "blk.0.ffn_down.weight": weight(n_embd, n_ff),
    }
    target_tokenizer = tokenizer_kv(target)

    def fill(w) -> None:
        a = "eagle3"
        w.add_string("general.name", "pyllamaspec synthetic eagle3")
        w.add_uint32(f"{a}.context_length", summary.n_ctx_train or 4096)
        w.add_uint32(f"{a}.embedding_length", n_embd)
        w.add_uint32(f"{a}.block_count", 1)
        w.add_uint32(f"{a}.feed_forward_length", n_ff)
        w.add_uint32(f"{a}.attention.head_count", n_head)
        w.add_uint32(f"{a}.attention.head_count_kv", n_head_kv)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_float32(f"{a}.rope.freq_base", 1000000.0)
        w.add_array(f"{a}.target_layers", list(target_layers))
        w.add_uint32(f"{a}.target_hidden_size", n_embd_tgt)
        for key, value, vtype, sub in target_tokenizer:
            w.add_key_value(key, value, vtype, sub_type=sub)
        for name, data in tensors.items():
            w.add_tensor(name, data)

    return _write_gguf(path, "eagle3", fill, force=force)


def _write_gguf(path: str | os.PathLike, arch: str, fill: Callable[[Any], None], *, force: bool = False) -> Path:
    """Write a GGUF atomically: fill(writer) adds the keys and tensors, this writes them out."""
    import gguf

    path = Path(path)
    _check_outputs([path], force)
    with atomic_output(path, force=force, error=ConfigError) as tmp:
        w = gguf.GGUFWriter(tmp, arch=arch)
        try:
            fill(w)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()
    return path


def _random_weight(rng: Any, stddev: float) -> Callable[[int, int], Any]:
    import numpy as np

    def weight(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) = ggml {cols, rows}
        return (rng.standard_normal((rows, cols)) * stddev).astype(np.float32)

    return weight


def write_dspark_drafter(path: str | os.PathLike, dflash_drafter: str | os.PathLike, *, rank: int = 8,
                         sample_from_anchor: bool = True, confidence_head: bool = False, seed: int = 1,
                         stddev: float = 0.1, force: bool = False) -> Path:
    """A DSpark drafter: a DFlash drafter GGUF with a random Markov head (markov_w1 [rank, n_vocab],
    markov_w2 [rank, n_vocab]) and, optionally, a confidence head, as upstream's converter lays them out."""
    import gguf
    import numpy as np

    src = gguf.GGUFReader(dflash_drafter)
    arch = src.fields["general.architecture"].contents() if "general.architecture" in src.fields else None
    if arch != "dflash":
        raise ConfigError(f"{dflash_drafter}: arch {arch!r}, a DSpark drafter is built on a dflash GGUF")
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    n_embd = int(src.fields["dflash.embedding_length"].contents())
    weight = _random_weight(np.random.default_rng(seed), stddev)
    extra = {"markov_w1.weight": weight(n_vocab, rank), "markov_w2.weight": weight(n_vocab, rank)}
    if confidence_head:
        extra["conf_proj.weight"] = weight(1, n_embd + rank)
        extra["conf_proj.bias"] = np.zeros(1, dtype=np.float32)
    def fill(w) -> None:
        for key, field_ in src.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            sub = field_.types[-1] if field_.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, field_.contents(), field_.types[0], sub_type=sub)
        w.add_bool("dflash.sample_from_anchor", sample_from_anchor)
        w.add_bool("dflash.has_confidence_head", confidence_head)
        for t in src.tensors:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        for name, data in extra.items():
            w.add_tensor(name, data)

    return _write_gguf(path, "dflash", fill, force=force)
