"""The tensor plan: every tensor a drafter of this config must have, with the shape the config implies and its
GGUF name and type, checked against the checkpoint before anything is written; and the per-tensor encoding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConversionError
from .checkpoint import TensorRef, to_f32
from .config import DrafterSpec


@dataclass
class Planned:
    hf: str
    gguf: str
    shape: tuple[int, ...]  # numpy order
    required: bool
    why: str  # where the expected shape comes from
    permute_rope: bool = False


ROPE_PERMUTE = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight")

IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")


def expected_tensors(spec: DrafterSpec) -> list[Planned]:
    h, hd, nh, nkv, ff, v = spec.hidden, spec.head_dim, spec.n_heads, spec.n_kv_heads, spec.intermediate, spec.vocab
    n_in = len(spec.target_layer_ids) * h
    plan = [
        Planned("embed_tokens.weight", "token_embd.weight", (v, h), False, f"vocab_size={v}, hidden_size={h}"),
        Planned("fc.weight", "fc.weight", (h, n_in), True,
                 f"hidden_size={h}, len(target_layer_ids)*hidden_size={len(spec.target_layer_ids)}*{h}"),
        Planned("hidden_norm.weight", "enc.output_norm.weight", (h,), True, f"hidden_size={h}"),
    ]
    if spec.version == 2:
        r = spec.selector_rank
        plan += [
            Planned("candidate_selector.predecessor_codebook.weight", "selector_predecessor.weight", (v, r), True,
                     f"vocab_size={v}, selector_rank={r}"),
            Planned("candidate_selector.successor_codebook.weight", "selector_successor.weight", (v, r), True,
                     f"vocab_size={v}, selector_rank={r}"),
            Planned("candidate_selector.hidden_projection.weight", "selector_hidden.weight", (r, h), True,
                     f"selector_rank={r}, hidden_size={h}"),
        ]
    for i in range(spec.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        plan += [
            Planned(p + "input_layernorm.weight", b + "attn_norm.weight", (h,), True, f"hidden_size={h}"),
            Planned(p + "self_attn.q_proj.weight", b + "attn_q.weight", (nh * hd, h), True,
                     f"num_attention_heads*head_dim={nh}*{hd}, hidden_size={h}", not spec.rope_neox),
            Planned(p + "self_attn.k_proj.weight", b + "attn_k.weight", (nkv * hd, h), True,
                     f"num_key_value_heads*head_dim={nkv}*{hd}, hidden_size={h}", not spec.rope_neox),
            Planned(p + "self_attn.v_proj.weight", b + "attn_v.weight", (nkv * hd, h), True,
                     f"num_key_value_heads*head_dim={nkv}*{hd}, hidden_size={h}"),
            Planned(p + "self_attn.o_proj.weight", b + "attn_output.weight", (h, nh * hd), True,
                     f"hidden_size={h}, num_attention_heads*head_dim={nh}*{hd}"),
            Planned(p + "self_attn.q_norm.weight", b + "attn_q_norm.weight", (hd,), True, f"head_dim={hd}", not spec.rope_neox),
            Planned(p + "self_attn.k_norm.weight", b + "attn_k_norm.weight", (hd,), True, f"head_dim={hd}", not spec.rope_neox),
            Planned(p + "self_attn.sinks.weight", b + "attn_sinks.weight", (nh,), False, f"num_attention_heads={nh}"),
            Planned(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", (h,), True, f"hidden_size={h}"),
            Planned(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", (ff, h), True, f"intermediate_size={ff}, hidden_size={h}"),
            Planned(p + "mlp.up_proj.weight", b + "ffn_up.weight", (ff, h), True, f"intermediate_size={ff}, hidden_size={h}"),
            Planned(p + "mlp.down_proj.weight", b + "ffn_down.weight", (h, ff), True, f"hidden_size={h}, intermediate_size={ff}"),
        ]
        if spec.version == 2:
            k, g = spec.conv_kernel, spec.conv_group
            proj = 2 * k * (h // g)
            why_b = f"(2, conv_kernel_size={k}, hidden_size={h})"
            why_p = f"2*conv_kernel_size*(hidden_size/conv_group_size)=2*{k}*({h}/{g}), hidden_size={h}"
            plan += [
                Planned(p + "attention_conv.base_kernel", b + "attn_conv_base", (2, k, h), True, why_b),
                Planned(p + "attention_conv.kernel_projection.weight", b + "attn_conv_proj.weight", (proj, h), True, why_p),
                Planned(p + "mlp_conv.base_kernel", b + "ffn_conv_base", (2, k, h), True, why_b),
                Planned(p + "mlp_conv.kernel_projection.weight", b + "ffn_conv_proj.weight", (proj, h), True, why_p),
            ]
    plan += [
        Planned("norm.weight", "output_norm.weight", (h,), True, f"hidden_size={h}"),
        Planned("lm_head.weight", "output.weight", (v, h), False, f"vocab_size={v}, hidden_size={h}"),
    ]
    return plan


def plan_tensors(spec: DrafterSpec, refs: dict[str, TensorRef]) -> list[tuple[Planned, TensorRef]]:
    plan = expected_tensors(spec)
    known = {p.hf for p in plan}
    unexpected = sorted(n for n in refs if n not in known and not n.endswith(IGNORED_SUFFIXES))
    if unexpected:
        shown = ", ".join(f"{n} {list(refs[n].shape)}" for n in unexpected[:5])
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise ConversionError(
            f"checkpoint has tensors a {spec.hf_arch} with this config does not have: {shown}{more}"
        )
    out = []
    for p in plan:
        ref = refs.get(p.hf)
        if ref is None:
            if p.required:
                raise ConversionError(
                    f"tensor {p.hf} is missing from the checkpoint (expected shape {list(p.shape)} from {p.why})"
                )
            continue
        if ref.shape != p.shape:
            raise ConversionError(
                f"tensor {p.hf} has shape {list(ref.shape)} in {ref.file.name}, but the config implies "
                f"{list(p.shape)} ({p.why})"
            )
        out.append((p, ref))
    return out


def qtype_for(gguf_name: str, shape: tuple[int, ...], outtype: str) -> Any:
    """Upstream's rule: 1-D tensors, *_norm.weight and anything not ending in .weight stay F32."""
    from gguf import GGMLQuantizationType as Q

    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return Q.F32
    if outtype == "f32":
        return Q.F32
    if outtype == "f16":
        return Q.F16
    if outtype == "bf16":
        return Q.BF16
    # q8_0: upstream falls back to F16 where the row is not a multiple of the block size
    block = 32
    return Q.Q8_0 if shape[-1] % block == 0 else Q.F16


def nbytes_of(shape: tuple[int, ...], qtype: Any) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size



def rope_to_neox(arr: np.ndarray, head_dim: int) -> np.ndarray:
    """Interleaved rope layout -> NeoX: per head, the even dims first, then the odd ones."""
    shape = arr.shape
    return np.ascontiguousarray(arr.reshape(-1, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2)).reshape(shape)


def encode(arr: np.ndarray, src_dtype: str, qtype: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    if qtype == Q.BF16 and src_dtype == "BF16":
        return np.ascontiguousarray(arr)  # bit-exact pass-through
    f = to_f32(arr, src_dtype)
    if qtype == Q.F32:
        return np.ascontiguousarray(f, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(f.astype(np.float16))
    return quants.quantize(np.ascontiguousarray(f), qtype)
