"""Writing the drafter GGUF: its metadata (upstream DFlashModel's keys, the target's tokenizer, provenance)
and, tensor by tensor, the weights the plan encodes. The caller writes into a temp file (atomicfile)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import ConversionError
from . import plan
from .checkpoint import TensorRef, load
from .config import DrafterSpec
from .plan import Planned
from .target import ARCH, Target

_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_CACHE_RE = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})(?:/|$)")


def _converter_version() -> str:
    from ... import __version__

    return __version__



def provenance(drafter_dir: Path, spec: DrafterSpec, repo: str | None, revision: str | None) -> tuple[str | None, str | None]:
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


def write_metadata(w: Any, spec: DrafterSpec, tgt: Target, outtype: str, name: str,
                    repo: str | None, revision: str | None) -> None:
    import gguf

    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    _write_general(w, name, repo, revision)
    _write_text_model_hparams(w, spec, int(ftype))
    _write_dflash_hparams(w, spec, tgt)
    # tokenizer, copied from the target; the mask token comes from the drafter
    for key, value, vtype, sub in tgt.tokenizer_kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)

    w.add_string("pyllamaspec.target.name", tgt.name)
    w.add_string("pyllamaspec.target.fingerprint", tgt.fingerprint)
    w.add_string("pyllamaspec.converter.version", _converter_version())
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)


def _write_general(w: Any, name: str, repo: str | None, revision: str | None) -> None:
    w.add_string("general.type", "model")
    w.add_string("general.name", name)
    if repo:
        w.add_string("general.source.repo", repo)
        if _HF_REPO_RE.match(repo):
            w.add_string("general.source.url", f"https://huggingface.co/{repo}")
    if revision:
        w.add_string("general.source.revision", revision)


def _write_text_model_hparams(w: Any, spec: DrafterSpec, ftype: int) -> None:
    """The generic hyperparameters (upstream TextModel.set_gguf_parameters)."""
    a = ARCH
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
    w.add_uint32("general.file_type", ftype)
    if spec.hidden_act in ("gelu", "gelu_pytorch_tanh"):
        # upstream's DFlashModel never writes this (silu is llama.cpp's default); a gelu drafter would
        # otherwise run with the wrong activation
        w.add_string(f"{a}.hidden_activation", spec.hidden_act)


def _write_dflash_hparams(w: Any, spec: DrafterSpec, tgt: Target) -> None:
    """DFlash's own hyperparameters (upstream DFlashModel.set_gguf_parameters)."""
    a = ARCH
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


def input_paths(drafter_dir: Path, files: list[Path], target: Path) -> set[Path]:
    paths = {target.resolve()}
    for p in [drafter_dir / "config.json", drafter_dir / "model.safetensors.index.json", *files]:
        paths.add(p.resolve())
    return paths


ProgressFn = Callable[[int, int, str], None]


ProgressFn = Callable[[int, int, str], None]


def write_gguf(path: Path, spec: DrafterSpec, tgt: Target, outtype: str, name: str, repo: str | None,
               revision: str | None, planned: list[tuple[Planned, TensorRef, Any, int]],
               progress: ProgressFn | None = None) -> None:
    """The whole drafter GGUF at ``path``: header, metadata, tensor table, then each tensor as the plan says."""
    import gguf

    writer = gguf.GGUFWriter(path, arch=ARCH)
    try:
        write_metadata(writer, spec, tgt, outtype, name, repo, revision)
        for p, ref, qtype, nbytes in planned:
            writer.add_tensor_info(p.gguf, p.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (p, ref, qtype, nbytes) in enumerate(planned):
            if progress is not None:
                progress(i, len(planned), p.gguf)
            arr = load(ref)
            if p.permute_rope:
                arr = plan.rope_to_neox(arr, spec.head_dim)
            data = plan.encode(arr, ref.dtype, qtype)
            if data.nbytes != nbytes:
                raise ConversionError(f"internal error: {p.gguf} encoded to {data.nbytes} bytes, expected {nbytes}")
            writer.write_tensor_data(data)
            del arr, data
    finally:
        writer.close()
