"""The drafter checkpoint's config.json: every size and setting the GGUF needs, validated before anything
is read or written (DFlash / DFlash2 as z-lab publishes them)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import MAX_DRAFT
from ...errors import ConversionError
from ...ggufinfo.pairing import DFLASH_DEFAULT_BLOCK_SIZE, DFLASH_MIN_BLOCK_SIZE

DFLASH_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")

BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = DFLASH_MIN_BLOCK_SIZE, MAX_DRAFT


@dataclass
class DrafterSpec:
    hf_arch: str
    version: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    head_dim_explicit: bool
    intermediate: int
    vocab: int
    rms_eps: float
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    ctx_len: int | None = None
    rope_theta: float | None = None
    rope_theta_swa: float | None = None
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    rope_mrope_section: list[int] | None = None
    rope_dim_count: int | None = None
    rope_neox: bool = True
    hidden_act: str | None = None
    causal: bool | None = None
    swa_window: int | None = None
    swa_pattern: list[bool] | None = None
    value_scale: float | None = None
    logit_scale: float | None = None
    softcap: float | None = None
    embedding_scale: float | None = None
    num_target_layers: int | None = None
    conv_kernel: int | None = None
    conv_group: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    name_or_path: str | None = None


def as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise ConversionError(f"config field {what} must be an integer, got {value!r}")
    return int(value)


def as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConversionError(f"config field {what} must be a finite number, got {value!r}")
    return float(value)


def _read_config_json(drafter_dir: Path) -> dict:
    """config.json as one object (a text_config's fields over the top level's)."""
    cfg_path = drafter_dir / "config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"drafter directory {str(drafter_dir)!r} has no config.json")
    try:
        hp = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConversionError(f"cannot read {str(cfg_path)!r}: {e}") from None
    if not isinstance(hp, dict):
        raise ConversionError(f"{str(cfg_path)!r} is not a JSON object")
    if isinstance(hp.get("text_config"), dict):
        hp = {**hp, **hp["text_config"]}
    return hp


def _dflash_architecture(hp: dict) -> tuple[str, dict]:
    """The HF architecture this converter handles, and the dflash_config object ({} when absent)."""
    archs = hp.get("architectures") or []
    hf_arch = next((a for a in archs if a in DFLASH_ARCHITECTURES), None)
    if hf_arch is None:
        raise ConversionError(
            f"config.json architectures is {archs!r}; this converter handles {list(DFLASH_ARCHITECTURES)} checkpoints only"
        )
    dc = hp.get("dflash_config")
    if dc is None:
        dc = {}
    if not isinstance(dc, dict):
        raise ConversionError(f"config field dflash_config must be an object, got {dc!r}")
    return hf_arch, dc


def _required(hp: dict, key: str) -> Any:
    if hp.get(key) is None:
        raise ConversionError(f"config.json has no {key!r}")
    return hp[key]


def _draft_value(hp: dict, dc: dict, key: str, default: Any = None) -> Any:
    """dflash_config first, then the top level (as the reference model reads it)."""
    if dc.get(key) is not None:
        return dc[key]
    if hp.get(key) is not None:
        return hp[key]
    return default


def _attention_sizes(hp: dict) -> tuple[int, int, int, int, int, bool]:
    """(hidden, n_layers, n_heads, n_kv_heads, head_dim, head_dim given explicitly), checked."""
    hidden = as_int(_required(hp, "hidden_size"), "hidden_size")
    n_layers = as_int(_required(hp, "num_hidden_layers"), "num_hidden_layers")
    n_heads = as_int(_required(hp, "num_attention_heads"), "num_attention_heads")
    n_kv_heads = as_int(hp.get("num_key_value_heads") or n_heads, "num_key_value_heads")
    head_dim_explicit = hp.get("head_dim") is not None
    if hidden <= 0 or n_layers <= 0 or n_heads <= 0 or n_kv_heads <= 0:
        raise ConversionError(
            f"config sizes must be positive: hidden_size={hidden}, num_hidden_layers={n_layers}, "
            f"num_attention_heads={n_heads}, num_key_value_heads={n_kv_heads}"
        )
    head_dim = as_int(hp["head_dim"], "head_dim") if head_dim_explicit else hidden // n_heads
    if n_heads % n_kv_heads != 0:
        raise ConversionError(
            f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
        )
    if head_dim <= 0 or head_dim % 2:
        raise ConversionError(f"config field head_dim must be a positive even number, got {head_dim}")
    return hidden, n_layers, n_heads, n_kv_heads, head_dim, head_dim_explicit


def _block_fields(hp: dict, dc: dict) -> tuple[list[int], int, int]:
    """(target layer ids, mask token id, block size), checked."""
    ids = _draft_value(hp, dc, "target_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise ConversionError(f"config field dflash_config.target_layer_ids must be a non-empty list, got {ids!r}")
    target_layer_ids = [as_int(v, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(ids)]

    mask = dc.get("mask_token_id", hp.get("mask_token_id"))
    if mask is None:
        raise ConversionError("config field dflash_config.mask_token_id is missing; the drafter needs its mask token id")
    mask_token_id = as_int(mask, "dflash_config.mask_token_id")
    if mask_token_id < 0:
        raise ConversionError(f"config field dflash_config.mask_token_id must be >= 0, got {mask_token_id}")

    block_size = as_int(dc.get("block_size", hp.get("block_size", DFLASH_DEFAULT_BLOCK_SIZE)), "dflash_config.block_size")
    if not BLOCK_SIZE_MIN <= block_size <= BLOCK_SIZE_MAX:
        raise ConversionError(
            f"config field dflash_config.block_size is {block_size}; expected {BLOCK_SIZE_MIN}..{BLOCK_SIZE_MAX}"
        )
    return target_layer_ids, mask_token_id, block_size


def parse_config(drafter_dir: Path) -> DrafterSpec:
    """A DFlash drafter's config.json, read as upstream's converter reads it: the sizes and the block, then the
    context length, rope, activation, sliding window, output scales and DFlash2's selector, each checked."""
    hp = _read_config_json(drafter_dir)
    hf_arch, dc = _dflash_architecture(hp)
    hidden, n_layers, n_heads, n_kv_heads, head_dim, head_dim_explicit = _attention_sizes(hp)
    rms_eps = hp.get("rms_norm_eps", hp.get("norm_eps"))
    if rms_eps is None:
        raise ConversionError("config.json has no 'rms_norm_eps' (llama.cpp needs the RMS norm epsilon)")
    target_layer_ids, mask_token_id, block_size = _block_fields(hp, dc)

    spec = DrafterSpec(
        hf_arch=hf_arch,
        version=2 if (hf_arch == "DFlash2DraftModel" or "conv_kernel_size" in dc) else 1,
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_explicit=head_dim_explicit,
        intermediate=as_int(_required(hp, "intermediate_size"), "intermediate_size"),
        vocab=as_int(_required(hp, "vocab_size"), "vocab_size"),
        rms_eps=as_float(rms_eps, "rms_norm_eps"),
        target_layer_ids=target_layer_ids,
        block_size=block_size,
        mask_token_id=mask_token_id,
        name_or_path=hp.get("_name_or_path") if isinstance(hp.get("_name_or_path"), str) else None,
    )
    if spec.intermediate <= 0 or spec.vocab <= 0:
        raise ConversionError(
            f"config sizes must be positive: intermediate_size={spec.intermediate}, vocab_size={spec.vocab}"
        )
    _read_context_length(spec, hp)
    _read_rope(spec, hp, head_dim)
    _read_activation(spec, hp, dc)
    _read_sliding_window(spec, hp, dc, n_layers)
    _read_output_scales(spec, hp, dc)
    if spec.version == 2:
        _read_dflash2_selector(spec, hp, dc, hidden)
    return spec


def _read_context_length(spec: DrafterSpec, hp: dict) -> None:
    for key in ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length"):
        if hp.get(key) is not None:
            spec.ctx_len = as_int(hp[key], key)
            break


def _read_rope(spec: DrafterSpec, hp: dict, head_dim: int) -> None:
    # rope, mirroring upstream TextModel: rope_parameters (or rope_scaling), top-level theta mirrored in
    rope = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    if not isinstance(rope, dict):
        raise ConversionError(f"config field rope_parameters must be an object, got {rope!r}")
    rope = dict(rope)
    rp = rope.get("full_attention", rope)
    theta = rp.get("rope_theta")
    if theta is None and "full_attention" not in rope:
        for key in ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"):
            if hp.get(key) is not None:
                theta = hp[key]
                break
    if theta is not None:
        spec.rope_theta = as_float(theta, "rope_theta")
    swa_theta = (rope.get("sliding_attention") or {}).get("rope_theta") if isinstance(rope.get("sliding_attention"), dict) else None
    if swa_theta is None and "sliding_attention" not in rope and "full_attention" not in rope:
        for key in ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"):
            if hp.get(key) is not None:
                swa_theta = hp[key]
                break
    if swa_theta is not None:
        spec.rope_theta_swa = as_float(swa_theta, "local rope_theta")
    rope_type = rp.get("rope_type", rp.get("type"))
    factor = rp.get("factor")
    if rope_type == "linear" and factor is not None:
        spec.rope_scaling = {"type": "linear", "factor": as_float(factor, "rope factor")}
    elif rope_type == "yarn" and factor is not None:
        orig = rp.get("original_max_position_embeddings", hp.get("original_max_position_embeddings"))
        if orig is None:
            raise ConversionError("yarn rope scaling needs rope_parameters.original_max_position_embeddings")
        spec.rope_scaling = {"type": "yarn", "factor": as_float(factor, "rope factor"), "orig_ctx": as_int(orig, "original_max_position_embeddings")}
        for src, dst in (("extrapolation_factor", "ext_factor"), ("attention_factor", "attn_factor"), ("attn_factor", "attn_factor"),
                         ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
            if rp.get(src) is not None and dst not in spec.rope_scaling:
                spec.rope_scaling[dst] = as_float(rp[src], f"rope {src}")
    elif rope_type in ("su", "longrope"):
        spec.rope_scaling = {"type": "longrope"}
    if isinstance(rope.get("mrope_section"), list):
        sec = [as_int(v, "mrope_section") for v in rope["mrope_section"]]
        spec.rope_mrope_section = (sec + [0, 0, 0, 0])[:4]
    partial = rope.get("partial_rotary_factor", hp.get("partial_rotary_factor"))
    if partial is not None:
        spec.rope_dim_count = int(head_dim * as_float(partial, "partial_rotary_factor"))
    neox = hp.get("rope_is_neox_style", True)
    spec.rope_neox = bool(neox)


def _read_activation(spec: DrafterSpec, hp: dict, dc: dict) -> None:
    act = hp.get("hidden_act", hp.get("hidden_activation"))
    if act is not None:
        if act not in ("silu", "gelu", "gelu_pytorch_tanh"):
            raise ConversionError(f"config field hidden_act is {act!r}; llama.cpp's dflash supports silu, gelu, gelu_pytorch_tanh")
        spec.hidden_act = act

    causal = hp.get("is_causal")
    if causal is None:
        causal = dc.get("causal")
    if causal is not None:
        spec.causal = bool(causal)


def _read_sliding_window(spec: DrafterSpec, hp: dict, dc: dict, n_layers: int) -> None:
    # sliding window, as upstream: HF use_sliding_window or dflash_config.use_swa, window from
    # dflash_config.swa_window_size or sliding_window, pattern all-true for use_swa else from layer_types
    use_swa = bool(dc.get("use_swa", False))
    use_sw = bool(hp.get("use_sliding_window", False)) or use_swa
    window = dc.get("swa_window_size") or hp.get("sliding_window")
    if use_sw and window:
        spec.swa_window = as_int(window, "sliding_window")
        if spec.swa_window <= 0:
            raise ConversionError(f"config field sliding_window must be positive, got {spec.swa_window}")
        if use_swa:
            spec.swa_pattern = [True] * n_layers
        else:
            layer_types = hp.get("layer_types")
            if layer_types is None:
                # what transformers' Qwen3Config derives when layer_types is absent
                mwl = as_int(hp.get("max_window_layers", 28), "max_window_layers")
                layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(n_layers)]
            if not isinstance(layer_types, list) or len(layer_types) != n_layers:
                raise ConversionError(
                    f"config field layer_types has {len(layer_types) if isinstance(layer_types, list) else layer_types!r} "
                    f"entries; num_hidden_layers is {n_layers}"
                )
            spec.swa_pattern = [lt == "sliding_attention" for lt in layer_types]


def _read_output_scales(spec: DrafterSpec, hp: dict, dc: dict) -> None:
    if dc.get("attention_value_scale") is not None:
        spec.value_scale = as_float(dc["attention_value_scale"], "dflash_config.attention_value_scale")
    om = dc.get("output_multiplier", hp.get("output_multiplier"))
    if om is not None:
        spec.logit_scale = as_float(om, "output_multiplier")
    sc = dc.get("final_logit_softcapping", hp.get("final_logit_softcapping"))
    if sc is not None and as_float(sc, "final_logit_softcapping") > 0:
        spec.softcap = float(sc)
    es = dc.get("input_embedding_scale", hp.get("input_embedding_scale"))
    if es is not None:
        spec.embedding_scale = as_float(es, "input_embedding_scale")
    if hp.get("num_target_layers") is not None:
        spec.num_target_layers = as_int(hp["num_target_layers"], "num_target_layers")


def _read_dflash2_selector(spec: DrafterSpec, hp: dict, dc: dict, hidden: int) -> None:
    """DFlash2's grouped convolution and selector sizes."""
    vals = {}
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        v = _draft_value(hp, dc, key)
        if v is None:
            raise ConversionError(f"DFlash2 config field dflash_config.{key} is missing")
        vals[key] = as_int(v, f"dflash_config.{key}")
        if vals[key] <= 0:
            raise ConversionError(f"DFlash2 config field dflash_config.{key} must be positive, got {vals[key]}")
    spec.conv_kernel = vals["conv_kernel_size"]
    spec.conv_group = vals["conv_group_size"]
    spec.selector_rank = vals["selector_rank"]
    spec.selector_top_k = vals["selector_top_k"]
    if hidden % spec.conv_group != 0:
        raise ConversionError(
            f"DFlash2 dflash_config.conv_group_size {spec.conv_group} does not divide hidden_size {hidden}"
        )
    need = spec.selector_top_k * (spec.selector_top_k + 1)
    if hidden < need:
        raise ConversionError(
            f"DFlash2 hidden_size {hidden} is smaller than selector_top_k*(selector_top_k+1) = "
            f"{spec.selector_top_k}*{spec.selector_top_k + 1} = {need}"
        )
