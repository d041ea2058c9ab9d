"""Synthetic models for tests and benchmarks: random weights, real architectures and shapes.

Targets are built by upstream's own loader from metadata alone (so every tensor an arch needs exists,
with the right shape), filled with seeded noise and saved as GGUF. A draft model is the same target
plus a second, smaller noise: it agrees with the target often but not always, so partial acceptance and
rollback really happen. Shapes of real models are presets (e.g. 'qwen2.5-1.5b').
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .. import _native
from ..atomicfile import atomic_output
from ..errors import ConfigError, ModelLoadError


@dataclass(frozen=True)
class TargetShape:
    arch: str = "qwen3"
    n_vocab: int = 512
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096
    full_attention_interval: int = 0   # > 0: gated-DeltaNet hybrid (qwen35)
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_d_conv: int = 0
    n_layer_nextn: int = 0             # MTP heads


PRESETS = {
    "tiny-llama": TargetShape(arch="llama"),
    "tiny-qwen3": TargetShape(arch="qwen3"),
    "tiny-qwen35": TargetShape(arch="qwen35", n_embd=128, n_head=2, n_head_kv=2, n_layer=4, full_attention_interval=2,
                               ssm_d_inner=128, ssm_d_state=64, ssm_n_group=2, ssm_d_conv=4),
    "tiny-qwen35-mtp": TargetShape(arch="qwen35", n_embd=128, n_head=2, n_head_kv=2, n_layer=4, full_attention_interval=2,
                                   ssm_d_inner=128, ssm_d_state=64, ssm_n_group=2, ssm_d_conv=4, n_layer_nextn=1),
    # real shapes (Qwen2.5-Coder 1.5B / 0.5B), for speed work where real weights cannot travel
    "qwen2.5-1.5b": TargetShape(arch="qwen2", n_vocab=151936, n_embd=1536, n_layer=28, n_head=12, n_head_kv=2,
                                n_ff=8960, n_ctx_train=32768),
    "qwen2.5-0.5b": TargetShape(arch="qwen2", n_vocab=151936, n_embd=896, n_layer=24, n_head=14, n_head_kv=2,
                                n_ff=4864, n_ctx_train=32768),
}


def write_target(path: str | os.PathLike, shape: TargetShape = TargetShape(), *, seed: int = 1, stddev: float = 0.1,
                 perturb_seed: int = 0, perturb_stddev: float = 0.0, f16: bool = False) -> Path:
    """Write a random model of `shape`; with perturb_seed, a noisy copy of the same model (a draft model).
    Weights are F32, or F16 through upstream's quantizer when f16 is set."""
    for name, value in (("seed", seed), ("perturb_seed", perturb_seed)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
            raise ConfigError(f"{name}={value!r} must be an integer within 0..{2 ** 32 - 1}")
    for name, value in (("stddev", stddev), ("perturb_stddev", perturb_stddev)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name}={value!r} must be a finite number >= 0")
    ffi, lib = _native.load()
    p = ffi.new("pls_synth_params *")
    arch = ffi.new("char[]", shape.arch.encode())
    p.arch = arch
    for k, v in asdict(shape).items():
        if k != "arch":
            setattr(p, k, v)
    p.seed, p.stddev = seed, stddev
    p.perturb_seed, p.perturb_stddev = perturb_seed, perturb_stddev
    path = Path(path)
    err = _native.ErrorBuffer(ffi)
    with atomic_output(path, force=True, error=ModelLoadError) as tmp:
        if lib.pls_synth_model(p, str(tmp).encode(), err.buf, err.SIZE) != 0:
            raise ModelLoadError(err.text)
        if f16:
            from .quantize import quantize
            f32 = tmp.with_name(tmp.name + ".f32")
            os.replace(tmp, f32)
            try:
                quantize(f32, tmp, "F16", force=True)
            finally:
                f32.unlink()
    return path


def write_pair(directory: str | os.PathLike, shape: TargetShape = TargetShape(), *, seed: int = 1,
               stddev: float = 0.1, drafter_shape: TargetShape | None = None,
               perturb_stddev: float = 0.01) -> tuple[Path, Path]:
    """A target and a draft model that agrees with it often: the target's weights plus noise (same shape),
    or a smaller random model when drafter_shape is given."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = write_target(d / f"target-{shape.arch}.gguf", shape, seed=seed, stddev=stddev)
    if drafter_shape is None:
        drafter = write_target(d / f"drafter-{shape.arch}.gguf", shape, seed=seed, stddev=stddev,
                               perturb_seed=seed + 1000, perturb_stddev=perturb_stddev)
    else:
        drafter = write_target(d / f"drafter-{drafter_shape.arch}.gguf", drafter_shape, seed=seed + 7, stddev=stddev)
    return target, drafter


def write_eagle3_drafter(path: str | os.PathLike, target: str | os.PathLike, *, target_layers: tuple[int, ...],
                         n_embd: int, n_head: int = 4, n_head_kv: int = 2, n_ff: int | None = None,
                         seed: int = 1, stddev: float = 0.1) -> Path:
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

    return _write_gguf(path, "eagle3", fill)


def _write_gguf(path: str | os.PathLike, arch: str, fill: Callable[[Any], None]) -> Path:
    """Write a GGUF atomically: fill(writer) adds the keys and tensors, this writes them out."""
    import gguf

    path = Path(path)
    with atomic_output(path, force=True, error=ModelLoadError) as tmp:
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
                         stddev: float = 0.1) -> Path:
    """A DSpark drafter: a DFlash drafter GGUF with a random Markov head (markov_w1 [rank, n_vocab],
    markov_w2 [rank, n_vocab]) and, optionally, a confidence head, as upstream's converter lays them out."""
    import numpy as np

    from ..ggufinfo import open_gguf

    src = open_gguf(dflash_drafter)
    arch = src.values.get("general.architecture")
    if arch != "dflash":
        raise ConfigError(f"{dflash_drafter}: arch {arch!r}, a DSpark drafter is built on a dflash GGUF")
    n_vocab = src.array_lengths["tokenizer.ggml.tokens"]
    n_embd = int(src.values["dflash.embedding_length"])
    weight = _random_weight(np.random.default_rng(seed), stddev)
    extra = {"markov_w1.weight": weight(n_vocab, rank), "markov_w2.weight": weight(n_vocab, rank)}
    if confidence_head:
        extra["conf_proj.weight"] = weight(1, n_embd + rank)
        extra["conf_proj.bias"] = np.zeros(1, dtype=np.float32)
    def fill(w) -> None:
        for key, value, vtype, sub in src.kv_items():
            if key != "general.architecture":
                w.add_key_value(key, value, vtype, sub_type=sub)
        w.add_bool("dflash.sample_from_anchor", sample_from_anchor)
        w.add_bool("dflash.has_confidence_head", confidence_head)
        for t in src.tensor_views():
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        for name, data in extra.items():
            w.add_tensor(name, data)

    return _write_gguf(path, "dflash", fill)
