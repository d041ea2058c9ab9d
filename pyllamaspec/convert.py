"""Convert a DFlash / DFlash2 drafter checkpoint into a GGUF that llama.cpp loads as arch ``dflash``.

``pyllamaspec convert DRAFTER_DIR --target TARGET -o OUT.gguf [--outtype bf16|f16|f32|q8_0]``

The drafter directory is a Hugging Face checkpoint as z-lab publishes it: ``config.json`` with
``architectures`` ``["DFlashDraftModel"]`` or ``["DFlash2DraftModel"]`` and a ``dflash_config``
dict, plus safetensors weights (one file, or shards with ``model.safetensors.index.json``). Such
checkpoints usually carry neither token embeddings nor an LM head: llama.cpp then borrows the
target's at run time.

The metadata keys and tensor names are the ones upstream llama.cpp's own converter
(``conversion/qwen.py``, class ``DFlashModel``) writes, so the output is interchangeable with an
upstream conversion; on top of those we record provenance under ``general.source.*`` and
``pyllamaspec.*``. The tokenizer (every ``tokenizer.*`` key) is copied from the target GGUF; a target given
as a Hugging Face model directory has its sizes read from config.json and its tokenizer rebuilt from
tokenizer.json (``pyllamaspec.hftarget``).

Everything that can be checked is checked before the first byte is written: the config, the
drafter/target pairing (hidden size, vocab, target layer ids, mask token) and the complete tensor
inventory with shapes derived from the config. The output is written to a temporary file in the
output directory, fsync'ed and renamed into place; on any failure the temporary file is removed.

Pure numpy: no PyTorch, and pickle checkpoints (``*.bin``, ``*.pt``, ``*.pth``) are refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pyllamaspec.errors import ConversionError, PairingError, PyllamaspecError
from pyllamaspec.atomicfile import atomic_output
from pyllamaspec.hftarget import is_hf_model_dir, read_hf_target
from pyllamaspec.pairing import FINAL_LAYER_INPUT_ARCHS

__all__ = [
    "ARCH",
    "OUTTYPES",
    "convert_dflash",
    "target_fingerprint",
    "target_fingerprint_of",
    "register",
    "run",
    "main",
]

ARCH = "dflash"
OUTTYPES = ("bf16", "f16", "f32", "q8_0")

DFLASH_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")

BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = 2, 64

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

_ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}

_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_CACHE_RE = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})(?:/|$)")



def _converter_version() -> str:
    try:
        import pyllamaspec

        v = getattr(pyllamaspec, "__version__", None)
        if v:
            return str(v)
    except Exception:
        pass
    try:
        from importlib.metadata import version

        return version("pyllamaspec")
    except Exception:
        return "0+unknown"


# --------------------------------------------------------------------------------------------
# the target (GGUF)
# --------------------------------------------------------------------------------------------


def target_fingerprint(vocab_fingerprint: str, n_embd: int, n_layer: int) -> str:
    """sha256 (hex) identifying a target for pairing: its vocabulary, n_embd and n_layer.

    ``vocab_fingerprint`` is ``pyllamaspec.ggufmeta`` 's token fingerprint of the target (sha256
    over the serialised ``tokenizer.ggml.tokens`` array: each token's u64 length then its bytes),
    ``n_embd`` is ``{arch}.embedding_length`` and ``n_layer`` is ``{arch}.block_count`` as stored
    (MTP/nextn blocks included). The fingerprint is sha256 over
    ``"pyllamaspec.target.v1\0<vocab_fingerprint>\0<n_embd>\0<n_layer>"`` (decimal numbers), so
    ``target_fingerprint_of(read_summary(target))`` recomputes what the converter wrote.
    """
    text = f"pyllamaspec.target.v1\0{vocab_fingerprint}\0{int(n_embd)}\0{int(n_layer)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def target_fingerprint_of(summary: Any) -> str | None:
    """``target_fingerprint`` of a ``ggufmeta.GGUFSummary``; None if it lacks a token list or sizes."""
    if summary.vocab_fingerprint is None or summary.n_embd is None or summary.n_layer is None:
        return None
    return target_fingerprint(summary.vocab_fingerprint, summary.n_embd, summary.n_layer)


@dataclass
class _Target:
    path: Path
    arch: str
    name: str
    n_embd: int
    block_count: int  # as stored ({arch}.block_count), nextn layers included
    n_layer: int  # block_count - nextn_predict_layers: the layers hidden states can be tapped from
    n_vocab: int  # number of tokens in tokenizer.ggml.tokens
    taps_final: bool  # the target graph exposes the input of layer n_layer (the last layer's output)
    uses_mrope: bool
    fingerprint: str
    tokenizer_kv: list[tuple[str, Any, Any, Any]] = field(default_factory=list)  # key, value, vtype, sub_type


class _KVReader:
    """Bounds-checked little-endian reads from a mapped GGUF header."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> ConversionError:
        return ConversionError(f"target GGUF {str(self.path)!r} has a corrupt or truncated header ({what})")

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"read past the end at offset {self.pos}")
        p = self.pos
        self.pos += n
        return p

    def u32(self) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8))[0]

    def raw_string(self) -> bytes:
        n = self.u64()
        p = self.take(n)
        return bytes(self.buf[p : p + n])


def _scalar_formats() -> dict[Any, str]:
    from gguf import GGUFValueType as T

    return {T.UINT8: "<u1", T.INT8: "<i1", T.UINT16: "<u2", T.INT16: "<i2", T.UINT32: "<u4", T.INT32: "<i4",
            T.FLOAT32: "<f4", T.BOOL: "?", T.UINT64: "<u8", T.INT64: "<i8", T.FLOAT64: "<f8"}


def read_tokenizer_kv(path: Path) -> tuple[list[tuple[str, Any, Any, Any]], int]:
    """Every ``tokenizer.*`` key/value of a GGUF (strings as bytes, so they copy exactly) and the
    token count. Only the KV section is parsed: the tensor table may hold types newer than the
    installed gguf package knows."""
    import mmap

    from gguf import GGUFValueType as T

    fmts = _scalar_formats()
    out: list[tuple[str, Any, Any, Any]] = []
    n_tokens = -1
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ConversionError(f"cannot read target {str(path)!r}: {e.strerror or e}") from None
    with f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _KVReader(buf, path)
        if bytes(buf[r.take(4) : 4]) != b"GGUF":
            raise r.fail("bad magic")
        version = r.u32()
        if version not in (2, 3):
            raise ConversionError(
                f"target GGUF {str(path)!r} has version {version} (byte-swapped or too old); only little-endian GGUF v2/v3 is supported"
            )
        r.u64()  # tensor count
        n_kv = r.u64()

        def value(vtype: int, keep: bool) -> tuple[Any, Any]:
            try:
                vt = T(vtype)
            except ValueError:
                raise r.fail(f"unknown value type {vtype}") from None
            if vt == T.STRING:
                s = r.raw_string()
                return s, None
            if vt == T.ARRAY:
                try:
                    sub = T(r.u32())
                except ValueError:
                    raise r.fail("unknown array element type") from None
                count = r.u64()
                if sub == T.STRING:
                    items = [r.raw_string() for _ in range(count)]
                    return (items if keep else None), sub
                if sub == T.ARRAY:
                    raise r.fail("array of arrays")
                dt = np.dtype(fmts[sub])
                p = r.take(count * dt.itemsize)
                return (np.frombuffer(buf, dtype=dt, count=count, offset=p).tolist() if keep else None), sub
            dt = np.dtype(fmts[vt])
            p = r.take(dt.itemsize)
            return np.frombuffer(buf, dtype=dt, count=1, offset=p).tolist()[0], None

        for _ in range(n_kv):
            try:
                key = r.raw_string().decode("utf-8")
            except UnicodeDecodeError:
                raise r.fail("key is not UTF-8") from None
            vtype = r.u32()
            keep = key.startswith("tokenizer.")
            val, sub = value(vtype, keep)
            if not keep:
                continue
            if key == "tokenizer.ggml.tokens":
                n_tokens = len(val) if isinstance(val, list) else -1
            if key == "tokenizer.ggml.mask_token_id":
                continue  # the drafter's mask token replaces it
            if isinstance(val, list) and not val:
                continue  # GGUF cannot hold an empty array
            out.append((key, val, T(vtype), sub))
    return out, n_tokens


def _read_target(path: Path) -> _Target:
    """What the conversion needs from the target GGUF: sizes via ggufmeta.read_summary, the
    tokenizer key/values via a KV-only parse."""
    path = Path(path)
    if path.is_dir():
        if is_hf_model_dir(path):
            return _hf_target(path)
        raise ConversionError(f"target {str(path)!r} is a directory without config.json: pass a GGUF file or a "
                              f"Hugging Face model directory")
    from pyllamaspec.ggufmeta import read_summary

    try:
        s = read_summary(path)
    except PyllamaspecError as e:
        raise ConversionError(f"target: {e}") from None
    if s.role in ("dflash", "dflash2", "dspark", "eagle3") or s.arch in ("dflash", "eagle3"):
        raise ConversionError(f"target {str(path)!r} is itself a drafter ({s.role}); pass the target model's GGUF")
    if s.n_embd is None or s.n_layer is None:
        raise ConversionError(f"target GGUF {str(path)!r} lacks {s.arch}.embedding_length / {s.arch}.block_count")
    if s.vocab_fingerprint is None:
        raise ConversionError(
            f"target GGUF {str(path)!r} has no tokenizer (tokenizer.ggml.tokens); the drafter GGUF needs the target's tokenizer"
        )
    tokenizer_kv, n_tokens = read_tokenizer_kv(path)
    if n_tokens <= 0:
        raise ConversionError(f"target GGUF {str(path)!r} has an empty or malformed tokenizer.ggml.tokens")
    return _Target(
        path=path,
        arch=s.arch,
        name=s.name or path.stem,
        n_embd=int(s.n_embd),
        block_count=int(s.n_layer),
        n_layer=int(s.n_layer) - int(s.n_layer_nextn or 0),
        n_vocab=n_tokens,
        taps_final=s.arch in FINAL_LAYER_INPUT_ARCHS,
        uses_mrope=f"{s.arch}.rope.dimension_sections" in s.metadata,
        fingerprint=target_fingerprint(s.vocab_fingerprint, s.n_embd, s.n_layer),
        tokenizer_kv=tokenizer_kv,
    )


def _hf_target(path: Path) -> _Target:
    t = read_hf_target(path)
    block_count = t.n_layer + t.n_layer_nextn  # what a GGUF of this target would store
    return _Target(
        path=path,
        arch=t.arch,
        name=t.name,
        n_embd=t.n_embd,
        block_count=block_count,
        n_layer=t.n_layer,
        n_vocab=len(t.tokens),
        taps_final=t.arch in FINAL_LAYER_INPUT_ARCHS,
        uses_mrope=t.uses_mrope,
        fingerprint=target_fingerprint(t.vocab_fingerprint, t.n_embd, block_count),
        tokenizer_kv=t.tokenizer_kv,
    )


# --------------------------------------------------------------------------------------------
# the drafter config
# --------------------------------------------------------------------------------------------


@dataclass
class _Spec:
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


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise ConversionError(f"config field {what} must be an integer, got {value!r}")
    return int(value)


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConversionError(f"config field {what} must be a finite number, got {value!r}")
    return float(value)


def _parse_config(drafter_dir: Path) -> _Spec:
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

    def req(key: str) -> Any:
        if hp.get(key) is None:
            raise ConversionError(f"config.json has no {key!r}")
        return hp[key]

    def draft(key: str, default: Any = None) -> Any:
        """dflash_config first, then the top level (as the reference model reads it)."""
        if dc.get(key) is not None:
            return dc[key]
        if hp.get(key) is not None:
            return hp[key]
        return default

    hidden = _as_int(req("hidden_size"), "hidden_size")
    n_layers = _as_int(req("num_hidden_layers"), "num_hidden_layers")
    n_heads = _as_int(req("num_attention_heads"), "num_attention_heads")
    n_kv_heads = _as_int(hp.get("num_key_value_heads") or n_heads, "num_key_value_heads")
    head_dim_explicit = hp.get("head_dim") is not None
    if hidden <= 0 or n_layers <= 0 or n_heads <= 0 or n_kv_heads <= 0:
        raise ConversionError(
            f"config sizes must be positive: hidden_size={hidden}, num_hidden_layers={n_layers}, "
            f"num_attention_heads={n_heads}, num_key_value_heads={n_kv_heads}"
        )
    head_dim = _as_int(hp["head_dim"], "head_dim") if head_dim_explicit else hidden // n_heads
    if n_heads % n_kv_heads != 0:
        raise ConversionError(
            f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
        )
    if head_dim <= 0 or head_dim % 2:
        raise ConversionError(f"config field head_dim must be a positive even number, got {head_dim}")

    rms_eps = hp.get("rms_norm_eps", hp.get("norm_eps"))
    if rms_eps is None:
        raise ConversionError("config.json has no 'rms_norm_eps' (llama.cpp needs the RMS norm epsilon)")

    ids = draft("target_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise ConversionError(f"config field dflash_config.target_layer_ids must be a non-empty list, got {ids!r}")
    target_layer_ids = [_as_int(v, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(ids)]

    mask = dc.get("mask_token_id", hp.get("mask_token_id"))
    if mask is None:
        raise ConversionError("config field dflash_config.mask_token_id is missing; the drafter needs its mask token id")
    mask_token_id = _as_int(mask, "dflash_config.mask_token_id")
    if mask_token_id < 0:
        raise ConversionError(f"config field dflash_config.mask_token_id must be >= 0, got {mask_token_id}")

    block_size = _as_int(dc.get("block_size", hp.get("block_size", 16)), "dflash_config.block_size")
    if not BLOCK_SIZE_MIN <= block_size <= BLOCK_SIZE_MAX:
        raise ConversionError(
            f"config field dflash_config.block_size is {block_size}; expected {BLOCK_SIZE_MIN}..{BLOCK_SIZE_MAX}"
        )

    spec = _Spec(
        hf_arch=hf_arch,
        version=2 if (hf_arch == "DFlash2DraftModel" or "conv_kernel_size" in dc) else 1,
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_explicit=head_dim_explicit,
        intermediate=_as_int(req("intermediate_size"), "intermediate_size"),
        vocab=_as_int(req("vocab_size"), "vocab_size"),
        rms_eps=_as_float(rms_eps, "rms_norm_eps"),
        target_layer_ids=target_layer_ids,
        block_size=block_size,
        mask_token_id=mask_token_id,
        name_or_path=hp.get("_name_or_path") if isinstance(hp.get("_name_or_path"), str) else None,
    )
    if spec.intermediate <= 0 or spec.vocab <= 0:
        raise ConversionError(
            f"config sizes must be positive: intermediate_size={spec.intermediate}, vocab_size={spec.vocab}"
        )

    for key in ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length"):
        if hp.get(key) is not None:
            spec.ctx_len = _as_int(hp[key], key)
            break

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
        spec.rope_theta = _as_float(theta, "rope_theta")
    swa_theta = (rope.get("sliding_attention") or {}).get("rope_theta") if isinstance(rope.get("sliding_attention"), dict) else None
    if swa_theta is None and "sliding_attention" not in rope and "full_attention" not in rope:
        for key in ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"):
            if hp.get(key) is not None:
                swa_theta = hp[key]
                break
    if swa_theta is not None:
        spec.rope_theta_swa = _as_float(swa_theta, "local rope_theta")
    rope_type = rp.get("rope_type", rp.get("type"))
    factor = rp.get("factor")
    if rope_type == "linear" and factor is not None:
        spec.rope_scaling = {"type": "linear", "factor": _as_float(factor, "rope factor")}
    elif rope_type == "yarn" and factor is not None:
        orig = rp.get("original_max_position_embeddings", hp.get("original_max_position_embeddings"))
        if orig is None:
            raise ConversionError("yarn rope scaling needs rope_parameters.original_max_position_embeddings")
        spec.rope_scaling = {"type": "yarn", "factor": _as_float(factor, "rope factor"), "orig_ctx": _as_int(orig, "original_max_position_embeddings")}
        for src, dst in (("extrapolation_factor", "ext_factor"), ("attention_factor", "attn_factor"), ("attn_factor", "attn_factor"),
                         ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
            if rp.get(src) is not None and dst not in spec.rope_scaling:
                spec.rope_scaling[dst] = _as_float(rp[src], f"rope {src}")
    elif rope_type in ("su", "longrope"):
        spec.rope_scaling = {"type": "longrope"}
    if isinstance(rope.get("mrope_section"), list):
        sec = [_as_int(v, "mrope_section") for v in rope["mrope_section"]]
        spec.rope_mrope_section = (sec + [0, 0, 0, 0])[:4]
    partial = rope.get("partial_rotary_factor", hp.get("partial_rotary_factor"))
    if partial is not None:
        spec.rope_dim_count = int(head_dim * _as_float(partial, "partial_rotary_factor"))
    neox = hp.get("rope_is_neox_style", True)
    spec.rope_neox = bool(neox)

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

    # sliding window, as upstream: HF use_sliding_window or dflash_config.use_swa, window from
    # dflash_config.swa_window_size or sliding_window, pattern all-true for use_swa else from layer_types
    use_swa = bool(dc.get("use_swa", False))
    use_sw = bool(hp.get("use_sliding_window", False)) or use_swa
    window = dc.get("swa_window_size") or hp.get("sliding_window")
    if use_sw and window:
        spec.swa_window = _as_int(window, "sliding_window")
        if spec.swa_window <= 0:
            raise ConversionError(f"config field sliding_window must be positive, got {spec.swa_window}")
        if use_swa:
            spec.swa_pattern = [True] * n_layers
        else:
            layer_types = hp.get("layer_types")
            if layer_types is None:
                # what transformers' Qwen3Config derives when layer_types is absent
                mwl = _as_int(hp.get("max_window_layers", 28), "max_window_layers")
                layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(n_layers)]
            if not isinstance(layer_types, list) or len(layer_types) != n_layers:
                raise ConversionError(
                    f"config field layer_types has {len(layer_types) if isinstance(layer_types, list) else layer_types!r} "
                    f"entries; num_hidden_layers is {n_layers}"
                )
            spec.swa_pattern = [lt == "sliding_attention" for lt in layer_types]

    if dc.get("attention_value_scale") is not None:
        spec.value_scale = _as_float(dc["attention_value_scale"], "dflash_config.attention_value_scale")
    om = dc.get("output_multiplier", hp.get("output_multiplier"))
    if om is not None:
        spec.logit_scale = _as_float(om, "output_multiplier")
    sc = dc.get("final_logit_softcapping", hp.get("final_logit_softcapping"))
    if sc is not None and _as_float(sc, "final_logit_softcapping") > 0:
        spec.softcap = float(sc)
    es = dc.get("input_embedding_scale", hp.get("input_embedding_scale"))
    if es is not None:
        spec.embedding_scale = _as_float(es, "input_embedding_scale")
    if hp.get("num_target_layers") is not None:
        spec.num_target_layers = _as_int(hp["num_target_layers"], "num_target_layers")

    if spec.version == 2:
        vals = {}
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            v = draft(key)
            if v is None:
                raise ConversionError(f"DFlash2 config field dflash_config.{key} is missing")
            vals[key] = _as_int(v, f"dflash_config.{key}")
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
    return spec


# --------------------------------------------------------------------------------------------
# pairing (checked against the target before anything is written)
# --------------------------------------------------------------------------------------------


def _check_pairing(spec: _Spec, tgt: _Target) -> None:
    who = f"target {tgt.path.name!r} ({tgt.arch})"
    if spec.hidden != tgt.n_embd:
        raise PairingError(f"hidden_size: drafter config has {spec.hidden}, {who} has n_embd {tgt.n_embd}")
    if spec.vocab != tgt.n_vocab:
        raise PairingError(f"vocab_size: drafter config has {spec.vocab}, {who} tokenizer has {tgt.n_vocab} tokens")
    if spec.mask_token_id >= tgt.n_vocab:
        raise PairingError(
            f"dflash_config.mask_token_id {spec.mask_token_id} is outside the vocabulary: {who} has {tgt.n_vocab} tokens"
        )
    if spec.num_target_layers is not None and spec.num_target_layers != tgt.n_layer:
        raise PairingError(
            f"num_target_layers: drafter was trained on a {spec.num_target_layers}-layer target, {who} has n_layer {tgt.n_layer}"
        )
    # HF id i is the output of layer i = the input of layer i+1, which must be a recorded layer input
    limit = tgt.n_layer if tgt.taps_final else tgt.n_layer - 1
    for i, lid in enumerate(spec.target_layer_ids):
        if lid < 0 or lid >= limit:
            why = (
                f"valid ids are 0..{limit - 1} (n_layer {tgt.n_layer}; llama.cpp taps the input of layer id+1"
                + (")" if tgt.taps_final else f", and a {tgt.arch} graph records layer inputs below n_layer only)")
            )
            raise PairingError(f"dflash_config.target_layer_ids[{i}] = {lid} is out of range for {who}: {why}")


# --------------------------------------------------------------------------------------------
# the checkpoint (safetensors)
# --------------------------------------------------------------------------------------------


@dataclass
class _TensorRef:
    name: str  # normalized HF name (no "model." prefix)
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in file
    nbytes: int


def _read_safetensors_header(path: Path) -> dict[str, _TensorRef]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConversionError(f"safetensors file {str(path)!r} is truncated (no header)")
            (hlen,) = struct.unpack("<Q", raw)
            if hlen > min(size - 8, 256 << 20):
                raise ConversionError(f"safetensors file {str(path)!r} has a corrupt header length {hlen}")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except OSError as e:
        raise ConversionError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConversionError(f"safetensors file {str(path)!r} has a corrupt header: {e}") from None
    if not isinstance(header, dict):
        raise ConversionError(f"safetensors file {str(path)!r} has a corrupt header")
    base = 8 + hlen
    out: dict[str, _TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"safetensors file {str(path)!r}: corrupt entry for tensor {name!r}") from None
        if dtype not in _ST_DTYPES:
            raise ConversionError(
                f"tensor {name!r} in {path.name} has dtype {dtype}; only F32, F16 and BF16 checkpoints are supported"
            )
        nbytes = math.prod(shape) * _ST_DTYPES[dtype][1]
        if end - begin != nbytes or begin < 0 or base + end > size:
            raise ConversionError(
                f"safetensors file {str(path)!r}: tensor {name!r} data ({begin}..{end}) does not match its "
                f"shape {list(shape)} {dtype} or lies past the end of the file (truncated download?)"
            )
        out[name] = _TensorRef(name, path, dtype, shape, base + begin, nbytes)
    return out


def _cross_check_with_safetensors(path: Path, refs: dict[str, _TensorRef]) -> None:
    """Let the safetensors library validate the header too (it is stricter about layout)."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - declared dependency
        return
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = set(f.keys())
            for name in keys:
                sl = f.get_slice(name)
                ref = refs.get(name)
                if ref is None or tuple(sl.get_shape()) != ref.shape or sl.get_dtype() != ref.dtype:
                    raise ConversionError(f"safetensors file {str(path)!r}: inconsistent header for {name!r}")
    except ConversionError:
        raise
    except Exception as e:
        raise ConversionError(f"safetensors file {str(path)!r} is invalid: {e}") from None
    if keys != set(refs):
        raise ConversionError(f"safetensors file {str(path)!r}: inconsistent tensor list")


def _normalize_hf_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    if name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"):
        name += ".weight"
    if name.endswith(".sinks"):
        name += ".weight"
    return name


def _inventory(drafter_dir: Path) -> tuple[dict[str, _TensorRef], list[Path]]:
    """All tensors of the checkpoint (normalized names) and the files they come from."""
    index = drafter_dir / "model.safetensors.index.json"
    st_files = sorted(p for p in drafter_dir.glob("*.safetensors") if p.is_file())
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({drafter_dir / v for v in wm.values()})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConversionError(f"cannot read {str(index)!r}: {e}") from None
        for f in files:
            if not f.is_file():
                raise ConversionError(f"{index.name} lists shard {f.name!r}, which is missing from {str(drafter_dir)!r}")
    else:
        wm = None
        files = st_files
    if not files:
        pickles = sorted(p.name for p in drafter_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ConversionError(
                f"drafter {str(drafter_dir)!r} has only pickle weights ({', '.join(pickles[:4])}); pickle checkpoints "
                f"are refused (loading them can run arbitrary code): use the safetensors release of this drafter"
            )
        raise ConversionError(f"drafter directory {str(drafter_dir)!r} has no *.safetensors weights")
    if (drafter_dir / "mask_embedding.pt").exists():
        raise ConversionError(
            f"drafter {str(drafter_dir)!r} ships mask_embedding.pt (a pickle, patched into the target's embeddings by "
            f"upstream's converter); this converter does not support that layout"
        )

    refs: dict[str, _TensorRef] = {}
    for f in files:
        header = _read_safetensors_header(f)
        _cross_check_with_safetensors(f, header)
        for raw_name, ref in header.items():
            if wm is not None and wm.get(raw_name) not in (None, f.name):
                continue  # the index says this copy is not the one to use
            name = _normalize_hf_name(raw_name)
            if name in refs:
                raise ConversionError(
                    f"tensor {raw_name!r} appears twice in the checkpoint ({refs[name].file.name} and {f.name})"
                )
            ref.name = name
            refs[name] = ref
    if wm is not None:
        for raw_name, shard in wm.items():
            if _normalize_hf_name(raw_name) not in refs:
                raise ConversionError(f"{index.name} maps tensor {raw_name!r} to {shard!r}, which does not contain it")
    return refs, files


# --------------------------------------------------------------------------------------------
# the tensor plan
# --------------------------------------------------------------------------------------------


@dataclass
class _Planned:
    hf: str
    gguf: str
    shape: tuple[int, ...]  # numpy order
    required: bool
    why: str  # where the expected shape comes from
    permute_rope: bool = False


_ROPE_PERMUTE = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight")

_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")


def _expected(spec: _Spec) -> list[_Planned]:
    h, hd, nh, nkv, ff, v = spec.hidden, spec.head_dim, spec.n_heads, spec.n_kv_heads, spec.intermediate, spec.vocab
    n_in = len(spec.target_layer_ids) * h
    plan = [
        _Planned("embed_tokens.weight", "token_embd.weight", (v, h), False, f"vocab_size={v}, hidden_size={h}"),
        _Planned("fc.weight", "fc.weight", (h, n_in), True,
                 f"hidden_size={h}, len(target_layer_ids)*hidden_size={len(spec.target_layer_ids)}*{h}"),
        _Planned("hidden_norm.weight", "enc.output_norm.weight", (h,), True, f"hidden_size={h}"),
    ]
    if spec.version == 2:
        r = spec.selector_rank
        plan += [
            _Planned("candidate_selector.predecessor_codebook.weight", "selector_predecessor.weight", (v, r), True,
                     f"vocab_size={v}, selector_rank={r}"),
            _Planned("candidate_selector.successor_codebook.weight", "selector_successor.weight", (v, r), True,
                     f"vocab_size={v}, selector_rank={r}"),
            _Planned("candidate_selector.hidden_projection.weight", "selector_hidden.weight", (r, h), True,
                     f"selector_rank={r}, hidden_size={h}"),
        ]
    for i in range(spec.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        plan += [
            _Planned(p + "input_layernorm.weight", b + "attn_norm.weight", (h,), True, f"hidden_size={h}"),
            _Planned(p + "self_attn.q_proj.weight", b + "attn_q.weight", (nh * hd, h), True,
                     f"num_attention_heads*head_dim={nh}*{hd}, hidden_size={h}", not spec.rope_neox),
            _Planned(p + "self_attn.k_proj.weight", b + "attn_k.weight", (nkv * hd, h), True,
                     f"num_key_value_heads*head_dim={nkv}*{hd}, hidden_size={h}", not spec.rope_neox),
            _Planned(p + "self_attn.v_proj.weight", b + "attn_v.weight", (nkv * hd, h), True,
                     f"num_key_value_heads*head_dim={nkv}*{hd}, hidden_size={h}"),
            _Planned(p + "self_attn.o_proj.weight", b + "attn_output.weight", (h, nh * hd), True,
                     f"hidden_size={h}, num_attention_heads*head_dim={nh}*{hd}"),
            _Planned(p + "self_attn.q_norm.weight", b + "attn_q_norm.weight", (hd,), True, f"head_dim={hd}", not spec.rope_neox),
            _Planned(p + "self_attn.k_norm.weight", b + "attn_k_norm.weight", (hd,), True, f"head_dim={hd}", not spec.rope_neox),
            _Planned(p + "self_attn.sinks.weight", b + "attn_sinks.weight", (nh,), False, f"num_attention_heads={nh}"),
            _Planned(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", (h,), True, f"hidden_size={h}"),
            _Planned(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", (ff, h), True, f"intermediate_size={ff}, hidden_size={h}"),
            _Planned(p + "mlp.up_proj.weight", b + "ffn_up.weight", (ff, h), True, f"intermediate_size={ff}, hidden_size={h}"),
            _Planned(p + "mlp.down_proj.weight", b + "ffn_down.weight", (h, ff), True, f"hidden_size={h}, intermediate_size={ff}"),
        ]
        if spec.version == 2:
            k, g = spec.conv_kernel, spec.conv_group
            proj = 2 * k * (h // g)
            why_b = f"(2, conv_kernel_size={k}, hidden_size={h})"
            why_p = f"2*conv_kernel_size*(hidden_size/conv_group_size)=2*{k}*({h}/{g}), hidden_size={h}"
            plan += [
                _Planned(p + "attention_conv.base_kernel", b + "attn_conv_base", (2, k, h), True, why_b),
                _Planned(p + "attention_conv.kernel_projection.weight", b + "attn_conv_proj.weight", (proj, h), True, why_p),
                _Planned(p + "mlp_conv.base_kernel", b + "ffn_conv_base", (2, k, h), True, why_b),
                _Planned(p + "mlp_conv.kernel_projection.weight", b + "ffn_conv_proj.weight", (proj, h), True, why_p),
            ]
    plan += [
        _Planned("norm.weight", "output_norm.weight", (h,), True, f"hidden_size={h}"),
        _Planned("lm_head.weight", "output.weight", (v, h), False, f"vocab_size={v}, hidden_size={h}"),
    ]
    return plan


def _check_tensors(spec: _Spec, refs: dict[str, _TensorRef]) -> list[tuple[_Planned, _TensorRef]]:
    plan = _expected(spec)
    known = {p.hf for p in plan}
    unexpected = sorted(n for n in refs if n not in known and not n.endswith(_IGNORED_SUFFIXES))
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


def _qtype_for(gguf_name: str, shape: tuple[int, ...], outtype: str) -> Any:
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


def _nbytes(shape: tuple[int, ...], qtype: Any) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


def _load(ref: _TensorRef) -> np.ndarray:
    dt, _ = _ST_DTYPES[ref.dtype]
    count = math.prod(ref.shape)
    try:
        with open(ref.file, "rb") as f:
            f.seek(ref.offset)
            arr = np.fromfile(f, dtype=np.dtype(dt), count=count)
    except OSError as e:
        raise ConversionError(f"cannot read tensor {ref.name} from {str(ref.file)!r}: {e.strerror or e}") from None
    if arr.size != count:
        raise ConversionError(f"tensor {ref.name} in {str(ref.file)!r} is truncated")
    return arr.reshape(ref.shape)


def _to_f32(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32, copy=False)


def _rope_to_neox(arr: np.ndarray, head_dim: int) -> np.ndarray:
    """Interleaved rope layout -> NeoX: per head, the even dims first, then the odd ones."""
    shape = arr.shape
    return np.ascontiguousarray(arr.reshape(-1, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2)).reshape(shape)


def _encode(arr: np.ndarray, src_dtype: str, qtype: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    if qtype == Q.BF16 and src_dtype == "BF16":
        return np.ascontiguousarray(arr)  # bit-exact pass-through
    f = _to_f32(arr, src_dtype)
    if qtype == Q.F32:
        return np.ascontiguousarray(f, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(f.astype(np.float16))
    return quants.quantize(np.ascontiguousarray(f), qtype)


# --------------------------------------------------------------------------------------------
# provenance
# --------------------------------------------------------------------------------------------


def _provenance(drafter_dir: Path, spec: _Spec, repo: str | None, revision: str | None) -> tuple[str | None, str | None]:
    m = _HF_CACHE_RE.search(drafter_dir.resolve().as_posix() + "/")
    if m:
        repo = repo or f"{m['org']}/{m['name']}"
        revision = revision or m["rev"]
    if repo is None and spec.name_or_path and _HF_REPO_RE.match(spec.name_or_path) and not Path(spec.name_or_path).exists():
        repo = spec.name_or_path
    if revision is None:
        # hf_hub_download(local_dir=...) leaves .cache/huggingface/download/<file>.metadata: commit hash first
        meta = drafter_dir / ".cache" / "huggingface" / "download" / "config.json.metadata"
        try:
            first = meta.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError, UnicodeDecodeError):
            first = ""
        if re.fullmatch(r"[0-9a-f]{40}", first):
            revision = first
    return repo, revision


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _write_metadata(w: Any, spec: _Spec, tgt: _Target, outtype: str, name: str,
                    repo: str | None, revision: str | None) -> None:
    import gguf

    a = ARCH
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]

    w.add_string("general.type", "model")
    w.add_string("general.name", name)
    if repo:
        w.add_string("general.source.repo", repo)
        if _HF_REPO_RE.match(repo):
            w.add_string("general.source.url", f"https://huggingface.co/{repo}")
    if revision:
        w.add_string("general.source.revision", revision)

    # generic hparams (upstream TextModel.set_gguf_parameters)
    w.add_uint32(f"{a}.block_count", spec.n_layers)
    if spec.ctx_len is not None:
        w.add_uint32(f"{a}.context_length", spec.ctx_len)
    w.add_uint32(f"{a}.embedding_length", spec.hidden)
    w.add_uint32(f"{a}.feed_forward_length", spec.intermediate)
    w.add_uint32(f"{a}.attention.head_count", spec.n_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_kv_heads)
    if spec.rope_scaling:
        rs = spec.rope_scaling
        w.add_string(f"{a}.rope.scaling.type", rs["type"])
        if "factor" in rs:
            w.add_float32(f"{a}.rope.scaling.factor", rs["factor"])
        if "orig_ctx" in rs:
            w.add_uint32(f"{a}.rope.scaling.original_context_length", rs["orig_ctx"])
        for k in ("ext_factor", "attn_factor", "beta_fast", "beta_slow"):
            if k in rs:
                w.add_float32(f"{a}.rope.scaling.yarn_{k}", rs[k])
    if spec.rope_theta is not None:
        w.add_float32(f"{a}.rope.freq_base", spec.rope_theta)
    if spec.rope_theta_swa is not None:
        w.add_float32(f"{a}.rope.freq_base_swa", spec.rope_theta_swa)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    if spec.head_dim_explicit:
        w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
        w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_uint32("general.file_type", int(ftype))
    if spec.hidden_act in ("gelu", "gelu_pytorch_tanh"):
        # upstream's DFlashModel never writes this (silu is llama.cpp's default); a gelu drafter would
        # otherwise run with the wrong activation
        w.add_string(f"{a}.hidden_activation", spec.hidden_act)

    # DFlash specifics (upstream DFlashModel.set_gguf_parameters)
    if spec.rope_dim_count is not None:
        w.add_uint32(f"{a}.rope.dimension_count", spec.rope_dim_count)
    if spec.value_scale is not None:
        w.add_float32(f"{a}.attention.value_scale", spec.value_scale)
    w.add_uint32(f"{a}.block_size", spec.block_size)
    if spec.version == 2:
        w.add_uint32(f"{a}.conv_kernel_size", spec.conv_kernel)
        w.add_uint32(f"{a}.conv_group_size", spec.conv_group)
        w.add_uint32(f"{a}.selector_rank", spec.selector_rank)
        w.add_uint32(f"{a}.selector_top_k", spec.selector_top_k)
    if spec.logit_scale is not None:
        w.add_float32(f"{a}.logit_scale", spec.logit_scale)
    if spec.softcap is not None:
        w.add_float32(f"{a}.final_logit_softcapping", spec.softcap)
    if spec.embedding_scale is not None:
        w.add_float32(f"{a}.embedding_scale", spec.embedding_scale)
    # HF ids name the layer whose OUTPUT is tapped; llama.cpp taps the INPUT of layer id+1
    w.add_array(f"{a}.target_layers", [i + 1 for i in spec.target_layer_ids])
    if spec.swa_window is not None and spec.swa_pattern:
        w.add_uint32(f"{a}.attention.sliding_window", spec.swa_window)
        w.add_array(f"{a}.attention.sliding_window_pattern", list(spec.swa_pattern))
    if spec.causal is not None:
        w.add_bool(f"{a}.attention.causal", spec.causal)
    if tgt.uses_mrope:
        # M-RoPE target: the draft ropes on the temporal dim only -> degenerate sections
        w.add_array(f"{a}.rope.dimension_sections", [spec.head_dim // 2, 0, 0, 0])
    elif spec.rope_mrope_section is not None:
        w.add_array(f"{a}.rope.dimension_sections", spec.rope_mrope_section)

    # tokenizer, copied from the target; the mask token comes from the drafter
    for key, value, vtype, sub in tgt.tokenizer_kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)

    w.add_string("pyllamaspec.target.name", tgt.name)
    w.add_string("pyllamaspec.target.fingerprint", tgt.fingerprint)
    w.add_string("pyllamaspec.converter.version", _converter_version())
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)


def _input_paths(drafter_dir: Path, files: list[Path], target: Path) -> set[Path]:
    paths = {target.resolve()}
    for p in [drafter_dir / "config.json", drafter_dir / "model.safetensors.index.json", *files]:
        paths.add(p.resolve())
    return paths


ProgressFn = Callable[[int, int, str], None]


def convert_dflash(
    drafter_dir: str | os.PathLike[str],
    target: str | os.PathLike[str],
    out: str | os.PathLike[str],
    outtype: str = "bf16",
    *,
    force: bool = False,
    source_repo: str | None = None,
    source_revision: str | None = None,
    name: str | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Convert a DFlash / DFlash2 drafter checkpoint directory into a ``dflash`` GGUF at ``out``.

    ``target`` is the target model's GGUF (tokenizer and pairing come from it). Raises
    :class:`ConversionError` for anything wrong with the checkpoint or the output path and
    :class:`PairingError` when the drafter does not fit the target; in both cases nothing is
    written. Returns the output path.
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    drafter_dir = Path(drafter_dir)
    target = Path(target)
    out = Path(out)
    if not drafter_dir.is_dir():
        raise ConversionError(f"drafter directory {str(drafter_dir)!r} does not exist or is not a directory")

    # --- everything that can be checked, before writing anything ---
    spec = _parse_config(drafter_dir)
    refs, files = _inventory(drafter_dir)
    tgt = _read_target(target)
    _check_pairing(spec, tgt)
    planned = _check_tensors(spec, refs)

    if out.is_dir():
        raise ConversionError(f"output {str(out)!r} is a directory; pass a file name (-o OUT.gguf)")
    inputs = _input_paths(drafter_dir, files, target)
    if out.resolve() in inputs or (out.exists() and any(os.path.exists(p) and os.path.samefile(out, p) for p in inputs)):
        raise ConversionError(f"output {str(out)!r} is one of the inputs; refusing to overwrite it")
    if out.exists() and not force:
        raise ConversionError(f"output {str(out)!r} already exists; pass --force to overwrite it")

    repo, revision = _provenance(drafter_dir, spec, source_repo, source_revision)
    if name is None:
        name = repo.split("/")[-1] if repo else drafter_dir.resolve().name

    plan = []
    for p, ref in planned:
        qtype = _qtype_for(p.gguf, p.shape, outtype)
        plan.append((p, ref, qtype, _nbytes(p.shape, qtype)))

    # --- write to a temp file next to the output, then rename ---
    import gguf

    writer = None
    with atomic_output(out, force=force, error=ConversionError) as tmp:
        try:
            writer = gguf.GGUFWriter(tmp, arch=ARCH)
            _write_metadata(writer, spec, tgt, outtype, name, repo, revision)
            for p, ref, qtype, nbytes in plan:
                writer.add_tensor_info(p.gguf, p.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for i, (p, ref, qtype, nbytes) in enumerate(plan):
                if progress is not None:
                    progress(i, len(plan), p.gguf)
                arr = _load(ref)
                if p.permute_rope:
                    arr = _rope_to_neox(arr, spec.head_dim)
                data = _encode(arr, ref.dtype, qtype)
                if data.nbytes != nbytes:
                    raise ConversionError(f"internal error: {p.gguf} encoded to {data.nbytes} bytes, expected {nbytes}")
                writer.write_tensor_data(data)
                del arr, data
        finally:
            if writer is not None:
                writer.close()
    if progress is not None:
        progress(len(plan), len(plan), "")
    return out


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("drafter_dir", help="DFlash/DFlash2 drafter checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--target", required=True,
                   help="the target: its GGUF, or its Hugging Face model directory (config.json + tokenizer.json); "
                        "tokenizer and pairing come from it")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, help="output GGUF path")
    p.add_argument("--outtype", choices=OUTTYPES, default="bf16", help="weight type of the 2-D tensors (default: bf16)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--source-repo", default=None, help="HF repo id the drafter came from (provenance)")
    p.add_argument("--source-revision", default=None, help="HF revision (commit) the drafter came from (provenance)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "convert",
        help="convert a DFlash/DFlash2 drafter checkpoint to a dflash GGUF",
        description="Convert a DFlash / DFlash2 drafter checkpoint (safetensors) into a GGUF that llama.cpp "
        "loads as arch 'dflash', with the tokenizer of TARGET. Pairing is validated before anything is written.",
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``convert`` from parsed arguments; errors become one line on stderr and exit status 2."""
    from .progress import Progress

    quiet = bool(getattr(args, "quiet", False))
    bar = Progress("converting", unit="tensors", enabled=not quiet)

    def progress(i: int, n: int, name: str) -> None:
        bar.update(i, n, note=name)

    try:
        with bar:  # a failure ends the progress line before the error is printed
            out = convert_dflash(
                args.drafter_dir,
                args.target,
                args.out,
                outtype=getattr(args, "outtype", "bf16") or "bf16",
                force=bool(getattr(args, "force", False)),
                source_repo=getattr(args, "source_repo", None),
                source_revision=getattr(args, "source_revision", None),
                progress=progress,
            )
    except KeyboardInterrupt:
        sys.stderr.write("\npyllamaspec convert: interrupted; nothing written\n")
        return 130
    except PyllamaspecError as e:
        _one_line_error(str(e))
        return 2
    except OSError as e:
        _one_line_error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        return 2
    except Exception as e:  # an unforeseen failure still ends as one line, unless debugging
        if os.environ.get("PYLLAMASPEC_DEBUG"):
            raise
        _one_line_error(f"internal error: {type(e).__name__}: {e} (set PYLLAMASPEC_DEBUG=1 for a traceback)")
        return 2
    if not quiet:
        size = out.stat().st_size
        print(f"wrote {out} ({size / 2**20:.1f} MiB)")
    return 0


def _one_line_error(msg: str) -> None:
    msg = " ".join(str(msg).split())
    sys.stderr.write(f"pyllamaspec convert: error: {msg}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m pyllamaspec.convert DRAFTER_DIR --target T.gguf -o OUT.gguf``."""
    p = argparse.ArgumentParser(prog="pyllamaspec convert", description="Convert a DFlash/DFlash2 drafter to a dflash GGUF")
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
