"""Synthetic DFlash / DFlash2 drafter checkpoints and tiny target GGUFs, for tests and benchmarks.

``write_dflash_checkpoint`` writes a directory laid out like z-lab's Hugging Face releases
(``config.json`` with ``architectures`` / ``dflash_config`` + safetensors, optionally sharded with
``model.safetensors.index.json``), with random weights from a seeded numpy RNG. Tensor names and
shapes are those of the reference ``DFlashDraftModel`` / ``DFlash2DraftModel`` (no ``model.``
prefix, no embeddings or LM head unless asked for).

``write_target_gguf`` writes a small target GGUF (``qwen3`` by default, loadable by llama.cpp, or
only the metadata of another arch such as ``qwen35``) with a byte-level BPE tokenizer. Make the
drafter match it with ``hidden == n_embd``, ``vocab == target vocab`` and target layer ids below
``n_layer``.

No PyTorch: BF16 safetensors are written by hand (numpy has no bfloat16); F32 ones go through
``safetensors.numpy``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["write_dflash_checkpoint", "write_target_gguf", "f32_to_bf16_bits", "bf16_bits_to_f32", "byte_tokens",
           "rewrite_gguf"]


# ------------------------------------------------------------------------------------------
# bf16 helpers
# ------------------------------------------------------------------------------------------


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------------------------------------
# safetensors writing
# ------------------------------------------------------------------------------------------


def _write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], dtype: str) -> None:
    """Write ``tensors`` (float32 arrays) as F32 or BF16 safetensors."""
    if dtype == "f32":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
        return
    if dtype != "bf16":
        raise ValueError(f"dtype must be 'bf16' or 'f32', got {dtype!r}")
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name in sorted(tensors):
        raw = f32_to_bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)  # safetensors pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)


# ------------------------------------------------------------------------------------------
# drafter checkpoints
# ------------------------------------------------------------------------------------------


def _deep_update(dst: dict, src: Mapping) -> dict:
    for k, v in src.items():
        if v is _DELETE:
            dst.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v
    return dst


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


_DELETE = _Delete()
DELETE = _DELETE  # use as a value in config_overrides to remove a key


def write_dflash_checkpoint(
    dir: str | Path,
    *,
    version: int = 1,
    hidden: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    vocab: int = 288,
    target_layer_ids: Sequence[int] = (0, 2),
    num_target_layers: int | None = 4,
    block_size: int | None = None,
    mask_token_id: int | None = None,
    swa_window: int | None = None,
    layer_types: Sequence[str] | None = None,
    swa_in_dflash_config: bool = False,
    with_embeddings: bool = False,
    with_head: bool = False,
    dtype: str = "bf16",
    seed: int = 0,
    sharded: bool = False,
    name_prefix: str = "",
    interleaved_rope: bool = False,
    conv_kernel_size: int = 2,
    conv_group_size: int = 16,
    selector_rank: int = 16,
    selector_top_k: int = 4,
    rope_theta: float = 1_000_000.0,
    rms_norm_eps: float = 1e-6,
    config_overrides: Mapping[str, Any] | None = None,
    omit: Iterable[str] = (),
    shape_overrides: Mapping[str, Sequence[int]] | None = None,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write a synthetic DFlash (``version=1``) or DFlash2 (``version=2``) checkpoint into ``dir``.

    Defaults: block_size 16 (v1) / 8 (v2), mask_token_id ``vocab - 1``. ``swa_window`` turns on
    sliding-window attention the HF way (``use_sliding_window`` + ``sliding_window`` +
    ``layer_types``, all sliding unless ``layer_types`` is given) or, with
    ``swa_in_dflash_config``, the ``dflash_config.use_swa`` / ``swa_window_size`` way.
    ``omit``, ``shape_overrides`` (by tensor name, without ``name_prefix``), ``extra_tensors`` and
    ``config_overrides`` (deep-merged; ``DELETE`` removes a key) make broken checkpoints for
    tests. Returns the directory.
    """
    if version not in (1, 2):
        raise ValueError("version must be 1 or 2")
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    if block_size is None:
        block_size = 16 if version == 1 else 8
    if mask_token_id is None:
        mask_token_id = vocab - 1
    rng = np.random.default_rng(seed)

    def mat(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    def norm(n: int) -> np.ndarray:
        return np.float32(1.0) + rng.standard_normal(n, dtype=np.float32) * np.float32(0.05)

    h, hd, nh, nkv, ff = hidden, head_dim, n_heads, n_kv_heads, intermediate
    t: dict[str, np.ndarray] = {}
    if with_embeddings:
        t["embed_tokens.weight"] = mat(vocab, h)
    t["fc.weight"] = mat(h, len(target_layer_ids) * h)
    t["hidden_norm.weight"] = norm(h)
    for i in range(n_layers):
        p = f"layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = mat(nh * hd, h)
        t[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, nh * hd)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "mlp.gate_proj.weight"] = mat(ff, h)
        t[p + "mlp.up_proj.weight"] = mat(ff, h)
        t[p + "mlp.down_proj.weight"] = mat(h, ff)
        if version == 2:
            proj = 2 * conv_kernel_size * (h // conv_group_size)
            t[p + "attention_conv.base_kernel"] = mat(2, conv_kernel_size, h)
            t[p + "attention_conv.kernel_projection.weight"] = mat(proj, h)
            t[p + "mlp_conv.base_kernel"] = mat(2, conv_kernel_size, h)
            t[p + "mlp_conv.kernel_projection.weight"] = mat(proj, h)
    if version == 2:
        # as published: the codebooks are nn.Embedding weights saved without the ".weight" suffix
        t["candidate_selector.predecessor_codebook"] = mat(vocab, selector_rank)
        t["candidate_selector.successor_codebook"] = mat(vocab, selector_rank)
        t["candidate_selector.hidden_projection.weight"] = mat(selector_rank, h)
    t["norm.weight"] = norm(h)
    if with_head:
        t["lm_head.weight"] = mat(vocab, h)

    for name in omit:
        if name not in t:
            raise KeyError(f"omit: no tensor {name!r}")
        del t[name]
    for name, shape in (shape_overrides or {}).items():
        if name not in t:
            raise KeyError(f"shape_overrides: no tensor {name!r}")
        t[name] = mat(*shape)
    for name, arr in (extra_tensors or {}).items():
        t[name] = np.asarray(arr, dtype=np.float32)
    t = {name_prefix + k: v for k, v in t.items()}

    # ---- config.json, shaped like z-lab's ----
    dflash_config: dict[str, Any] = {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)}
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel" if version == 1 else "DFlash2DraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel" if version == 1 else "dflash.DFlash2DraftModel"},
        "bos_token_id": vocab - 4 if vocab > 4 else 0,
        "eos_token_id": vocab - 4 if vocab > 4 else 0,
        "dtype": "bfloat16" if dtype == "bf16" else "float32",
        "head_dim": hd,
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": ff,
        "max_position_embeddings": 40960,
        "max_window_layers": n_layers,
        "model_type": "qwen3",
        "num_attention_heads": nh,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": nkv,
        "rms_norm_eps": rms_norm_eps,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": vocab,
        "dflash_config": dflash_config,
    }
    if num_target_layers is not None:
        cfg["num_target_layers"] = num_target_layers
    if version == 1:
        cfg["block_size"] = block_size  # v1 releases carry it at the top level
        cfg["rope_scaling"] = None
        cfg["rope_theta"] = rope_theta
    else:
        dflash_config.update(
            block_size=block_size,
            conv_group_size=conv_group_size,
            conv_kernel_size=conv_kernel_size,
            selector_rank=selector_rank,
            selector_top_k=selector_top_k,
            final_logit_softcapping=20.0,
            output_multiplier=0.25,
        )
        cfg["is_causal"] = False
        cfg["rope_parameters"] = {"rope_theta": rope_theta, "rope_type": "default"}
    if swa_window is not None and swa_in_dflash_config:
        dflash_config.update(use_swa=True, swa_window_size=swa_window)
        cfg.update(use_sliding_window=False, sliding_window=None)
        cfg["layer_types"] = list(layer_types) if layer_types is not None else ["full_attention"] * n_layers
    elif swa_window is not None:
        cfg.update(use_sliding_window=True, sliding_window=swa_window)
        cfg["layer_types"] = list(layer_types) if layer_types is not None else ["sliding_attention"] * n_layers
    else:
        cfg.update(use_sliding_window=False, sliding_window=None)
        cfg["layer_types"] = list(layer_types) if layer_types is not None else ["full_attention"] * n_layers
    if interleaved_rope:
        cfg["rope_is_neox_style"] = False
    if config_overrides:
        _deep_update(cfg, config_overrides)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    # ---- weights ----
    if sharded:
        names = sorted(t)
        half = (len(names) + 1) // 2
        parts = [names[:half], names[half:]]
        weight_map = {}
        total = 0
        for k, part in enumerate(parts):
            fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
            _write_safetensors(d / fname, {n: t[n] for n in part}, dtype)
            for n in part:
                weight_map[n] = fname
                total += t[n].size * (2 if dtype == "bf16" else 4)
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n", encoding="utf-8"
        )
    else:
        _write_safetensors(d / "model.safetensors", t, dtype)
    return d


# ------------------------------------------------------------------------------------------
# target GGUFs
# ------------------------------------------------------------------------------------------


def byte_tokens() -> list[str]:
    """GPT-2's byte -> printable unicode mapping, as the 256 byte-level BPE base tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def write_target_gguf(
    path: str | Path,
    *,
    arch: str = "qwen3",
    n_embd: int = 64,
    n_layer: int = 4,
    vocab: int = 288,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_ff: int = 128,
    nextn_predict_layers: int = 0,
    mrope: bool | None = None,
    tensors: bool | None = None,
    name: str = "synthetic-target",
    n_pad: int = 1,
    seed: int = 0,
    chat_template: str | None = CHATML_TEMPLATE,
) -> Path:
    """Write a tiny target GGUF with a byte-level BPE (``gpt2``) tokenizer of ``vocab`` tokens.

    Token ids: 0..255 the byte tokens, then two-letter merged tokens (with their merges), then the
    special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (control), then ``n_pad``
    ``[PAD<i>]`` tokens (unused; the last one is a natural DFlash mask token, as in Qwen3).
    ``tensors`` defaults to True for ``qwen3`` (a complete, loadable qwen3 model) and False for
    other arches (metadata only: enough for pairing checks). ``mrope`` (default: True for
    ``qwen35``/``qwen35moe``) writes ``{arch}.rope.dimension_sections``. ``chat_template`` goes into
    ``tokenizer.chat_template`` (None: the model has none).
    """
    import gguf

    p = Path(path)
    n_merged = vocab - 256 - len(SPECIAL_TOKENS) - n_pad
    if n_merged < 0 or n_merged > 26 * 26:
        raise ValueError(f"vocab must be in {256 + len(SPECIAL_TOKENS) + n_pad}..{256 + 26 * 26 + len(SPECIAL_TOKENS) + n_pad}")
    if mrope is None:
        mrope = arch in ("qwen35", "qwen35moe")
    if tensors is None:
        tensors = arch == "qwen3"

    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [(a, b) for a in letters for b in letters][:n_merged]
    tokens = byte_tokens() + [a + b for a, b in pairs] + list(SPECIAL_TOKENS) + [f"[PAD{256 + n_merged + len(SPECIAL_TOKENS) + i}]" for i in range(n_pad)]
    assert len(tokens) == vocab
    toktypes = [1] * (256 + n_merged) + [3] * len(SPECIAL_TOKENS) + [5] * n_pad  # NORMAL, CONTROL, UNUSED
    merges = [f"{a} {b}" for a, b in pairs]
    eot = 256 + n_merged

    w = gguf.GGUFWriter(p, arch=arch)
    w.add_type("model")
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer + nextn_predict_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if nextn_predict_layers:
        w.add_uint32(f"{arch}.nextn_predict_layers", nextn_predict_layers)
    if mrope:
        w.add_rope_dimension_sections([head_dim // 4, head_dim // 8, head_dim // 8, 0])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    if merges:
        w.add_token_merges(merges)
    w.add_eos_token_id(eot + 2)
    w.add_bos_token_id(eot)
    w.add_pad_token_id(eot)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    if tensors:
        rng = np.random.default_rng(seed)

        def mat(*shape: int) -> np.ndarray:
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

        def ones(n: int) -> np.ndarray:
            return np.ones(n, dtype=np.float32)

        w.add_tensor("token_embd.weight", mat(vocab, n_embd))
        for i in range(n_layer):
            b = f"blk.{i}."
            w.add_tensor(b + "attn_norm.weight", ones(n_embd))
            w.add_tensor(b + "attn_q.weight", mat(n_head * head_dim, n_embd))
            w.add_tensor(b + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
            w.add_tensor(b + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
            w.add_tensor(b + "attn_output.weight", mat(n_embd, n_head * head_dim))
            w.add_tensor(b + "attn_q_norm.weight", ones(head_dim))
            w.add_tensor(b + "attn_k_norm.weight", ones(head_dim))
            w.add_tensor(b + "ffn_norm.weight", ones(n_embd))
            w.add_tensor(b + "ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(b + "ffn_up.weight", mat(n_ff, n_embd))
            w.add_tensor(b + "ffn_down.weight", mat(n_embd, n_ff))
        w.add_tensor("output_norm.weight", ones(n_embd))
        w.add_tensor("output.weight", mat(vocab, n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


def write_target_hf_dir(
    path: str | Path,
    *,
    model_type: str = "qwen3",
    n_embd: int = 64,
    n_layer: int = 4,
    vocab: int = 288,
    n_pad: int = 1,
    mtp_layers: int = 0,
    mrope: bool = False,
    text_config: bool = False,
) -> Path:
    """A Hugging Face model directory (config.json, tokenizer.json, tokenizer_config.json, no weights) whose
    tokenizer is the one write_target_gguf writes with the same vocab and n_pad: the ``[PAD<i>]`` ids are left
    out of tokenizer.json and covered by vocab_size, as in Qwen checkpoints."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    n_merged = vocab - 256 - len(SPECIAL_TOKENS) - n_pad
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [(a, b) for a in letters for b in letters][:n_merged]
    base = byte_tokens() + [a + b for a, b in pairs]
    eot = 256 + n_merged
    added = [{"id": eot + i, "content": t, "special": True} for i, t in enumerate(SPECIAL_TOKENS)]
    tokenizer = {
        "version": "1.0",
        "added_tokens": added,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": False}]},
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(base)},
                  "merges": [[a, b] for a, b in pairs]},
    }
    (d / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": SPECIAL_TOKENS[2], "pad_token": SPECIAL_TOKENS[0], "add_bos_token": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    }), encoding="utf-8")
    sizes = {"model_type": model_type, "hidden_size": n_embd, "num_hidden_layers": n_layer, "vocab_size": vocab}
    if mtp_layers:
        sizes["mtp_num_hidden_layers"] = mtp_layers
    if mrope:
        sizes["rope_parameters"] = {"mrope_section": [11, 11, 10], "rope_theta": 1e7}
    config = {"architectures": ["Qwen3ForCausalLM"], "eos_token_id": eot + 2}
    if text_config:
        config.update(model_type=model_type.removesuffix("_text"), text_config=sizes)
    else:
        config.update(sizes)
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return d


# ------------------------------------------------------------------------------------------
# GGUF copies with changed metadata
# ------------------------------------------------------------------------------------------


def rewrite_gguf(src: str | Path, dst: str | Path, set_kv: Mapping[str, Any] | None = None,
                 add_kv: Mapping[str, tuple[Any, Any, Any]] | None = None,
                 set_tensors: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None) -> Path:
    """Copy a GGUF with the values of ``set_kv`` replaced (each keeps its type), the keys of ``add_kv`` added as
    ``key: (value, GGUFValueType, element type or None)``, and the data of the tensors in ``set_tensors``
    replaced by what each function returns for it (same dtype and shape); other tensors untouched."""
    import gguf

    from pyllamaspec.ggufinfo import open_gguf

    source = open_gguf(src)
    arch = source.values["general.architecture"]
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, value, vtype, sub in source.kv_items():
        if key == "general.architecture" or (vtype == gguf.GGUFValueType.ARRAY and not value):
            continue  # the writer adds the arch, and cannot write an empty array
        writer.add_key_value(key, (set_kv or {}).get(key, value), vtype, sub_type=sub)
    for key, (value, vtype, sub) in (add_kv or {}).items():
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in source.tensor_views():
        data = t.data
        if set_tensors and t.name in set_tensors:
            data = np.asarray(set_tensors[t.name](np.array(data)), dtype=data.dtype).reshape(data.shape)
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)
