"""What a GGUF declares about itself (GGUFSummary), read from its header alone, never the weights."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import gguf

from ..errors import ModelLoadError
from .reader import GGUFFile, open_gguf

# Arrays left out of GGUFSummary.metadata: one entry per vocabulary token is too big to carry around.
VOCAB_ARRAY_KEYS = frozenset(
    {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"}
)

# llm_arch_is_hybrid() in the vendored llama.cpp (src/llama-arch.cpp): attention mixed with recurrent layers.
HYBRID_ARCHS = frozenset(
    {
        "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
        "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
        "deepseek4", "minimax-01",
    }
)

# Bit OR'ed into general.file_type when llama.cpp guessed it (LLAMA_FTYPE_GUESSED).
FTYPE_GUESSED_FLAG = 1024


@dataclass(frozen=True)
class GGUFSummary:
    """What a GGUF file declares about itself, enough to describe it and to judge a target/drafter pair.

    read_summary() fills every field from a file; a summary of a model that is not a GGUF yet (a checkpoint
    being converted, a Hugging Face target directory) sets what it knows and leaves the rest at the defaults.
    """

    path: str
    size_bytes: int
    arch: str
    name: str | None = None
    n_vocab: int | None = None
    n_embd: int | None = None
    n_layer: int | None = None  # <arch>.block_count, MTP (nextn) blocks included
    n_ctx_train: int | None = None
    file_type: str | None = None  # llama ftype name, e.g. "Q8_0", "Q4_K_M", "BF16"
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type name -> number of tensors
    tensors: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # name -> (ne shape, type)
    tokenizer_model: str | None = None
    tokenizer_pre: str | None = None
    mask_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    block_size: int | None = None  # <arch>.block_size (DFlash)
    target_layers: tuple[int, ...] = ()  # <arch>.target_layers (DFlash: HF layer id + 1; EAGLE3)
    target_hidden_size: int | None = None  # <arch>.target_hidden_size (EAGLE3)
    swa_window: int | None = None
    swa_pattern: tuple[bool, ...] = ()  # per-layer form only; upstream's scalar period form stays in metadata
    causal: bool | None = None
    is_dflash2: bool = False
    is_dspark: bool = False
    n_layer_nextn: int = 0
    is_hybrid: bool = False
    has_output_head: bool = False
    has_token_embd: bool = False
    role: str = "target"  # "target" | "dflash" | "dflash2" | "dspark" | "eagle3" | "mtp-target"
    vocab_fingerprint: str | None = None  # see reader.token_fingerprint(); None without a token list
    metadata: dict[str, Any] = field(default_factory=dict)  # every key/value except the long arrays

    @property
    def n_layer_main(self) -> int | None:
        """Layers a drafter can tap: upstream's n_layer(), i.e. block_count less the MTP blocks."""
        return None if self.n_layer is None else self.n_layer - self.n_layer_nextn

    @property
    def unknown_tensor_types(self) -> dict[str, str]:
        """Tensors whose ggml type the installed gguf package does not know: name -> 'TYPE_<id>'."""
        return {name: type_name for name, (_, type_name) in self.tensors.items() if type_name.startswith("TYPE_")}

    def arch_value(self, suffix: str) -> Any:
        """The value of ``<arch>.<suffix>``, or None."""
        return self.metadata.get(f"{self.arch}.{suffix}")


def read_summary(path: str | os.PathLike[str]) -> GGUFSummary:
    """Summarise the GGUF at ``path`` from its header alone.

    Raises ModelLoadError, saying what to do, if the file is missing, not a regular file, unreadable, not a
    GGUF, of an unsupported GGUF version, corrupt, or shorter than its tensor table says.
    """
    return summarise(open_gguf(path))


def summarise(file: GGUFFile) -> GGUFSummary:
    values = file.values
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{file.path} has no general.architecture key: it is not a llama.cpp model GGUF.")

    def arch_value(suffix: str) -> Any:
        return values.get(f"{arch}.{suffix}")

    for key, kind in _EXPECTED_TYPES.items():
        _check_type(file, key.replace("{arch}", arch), kind)

    tensors = {t.name: (t.shape, t.type_name) for t in file.tensors}
    n_vocab = arch_value("vocab_size")
    if n_vocab is None and "tokenizer.ggml.tokens" in file.array_lengths:
        n_vocab = file.array_lengths["tokenizer.ggml.tokens"]

    nextn_blocks = {name.split(".")[1] for name in tensors if name.startswith("blk.") and ".nextn." in name}
    n_layer_nextn = arch_value("nextn_predict_layers") or len(nextn_blocks)
    is_dflash2 = arch == "dflash" and "selector_hidden.weight" in tensors
    is_dspark = arch == "dflash" and "markov_w1.weight" in tensors
    swa_pattern = arch_value("attention.sliding_window_pattern")
    metadata = {k: v for k, v in values.items() if k not in VOCAB_ARRAY_KEYS}

    return GGUFSummary(
        path=file.path,
        size_bytes=file.size_bytes,
        arch=arch,
        name=values.get("general.name"),
        n_vocab=n_vocab,
        n_embd=arch_value("embedding_length"),
        n_layer=arch_value("block_count"),
        n_ctx_train=arch_value("context_length"),
        file_type=_file_type_name(values.get("general.file_type")),
        tensor_types=dict(Counter(type_name for _, type_name in tensors.values())),
        tensors=tensors,
        tokenizer_model=values.get("tokenizer.ggml.model"),
        tokenizer_pre=values.get("tokenizer.ggml.pre"),
        mask_token_id=values.get("tokenizer.ggml.mask_token_id"),
        bos_token_id=values.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=values.get("tokenizer.ggml.eos_token_id"),
        block_size=arch_value("block_size"),
        target_layers=tuple(arch_value("target_layers") or ()),
        target_hidden_size=arch_value("target_hidden_size"),
        swa_window=arch_value("attention.sliding_window"),
        swa_pattern=tuple(bool(v) for v in swa_pattern) if isinstance(swa_pattern, list) else (),
        causal=arch_value("attention.causal"),
        is_dflash2=is_dflash2,
        is_dspark=is_dspark,
        n_layer_nextn=n_layer_nextn,
        is_hybrid=arch in HYBRID_ARCHS
        or arch_value("full_attention_interval") is not None
        or any(key.startswith(f"{arch}.ssm.") for key in values),
        has_output_head="output.weight" in tensors,
        has_token_embd="token_embd.weight" in tensors,
        role=role_of(arch, is_dflash2, is_dspark, n_layer_nextn),
        vocab_fingerprint=file.token_fingerprint(),
        metadata=metadata,
    )


# what the keys this package reads must hold; another type is a corrupt file or a broken converter, said as such
# (never a TypeError later). "{arch}" is the file's architecture.
_EXPECTED_TYPES = {
    "general.name": "str", "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str",
    "tokenizer.ggml.mask_token_id": "int", "tokenizer.ggml.bos_token_id": "int", "tokenizer.ggml.eos_token_id": "int",
    "{arch}.vocab_size": "int", "{arch}.embedding_length": "int", "{arch}.block_count": "int",
    "{arch}.context_length": "int", "{arch}.nextn_predict_layers": "int", "{arch}.block_size": "int",
    "{arch}.target_hidden_size": "int", "{arch}.attention.sliding_window": "int",
    "{arch}.target_layers": "int array", "{arch}.attention.causal": "bool",
    "{arch}.attention.sliding_window_pattern": "bool array or int",
}
_EXPECTED_WORDS = {
    "str": "a string (STRING)", "int": "an integer (UINT32, INT32 or another integer type)", "bool": "a BOOL",
    "int array": "an ARRAY of integers", "bool array or int": "an ARRAY of BOOL (or an integer period)",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return _is_int(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int array":
        return isinstance(value, list) and all(_is_int(v) for v in value)
    if kind == "bool array or int":
        return _is_int(value) or (isinstance(value, list) and all(isinstance(v, (bool, int)) for v in value))
    raise AssertionError(kind)


def _check_type(file: GGUFFile, key: str, kind: str) -> None:
    if key not in file.values:
        if key in file.array_lengths and kind in ("str", "int", "bool"):  # a long array where a scalar belongs
            raise ModelLoadError(_wrong_type_message(file, key, kind, None))
        return
    if not _type_ok(file.values[key], kind):
        raise ModelLoadError(_wrong_type_message(file, key, kind, file.values[key]))


def _wrong_type_message(file: GGUFFile, key: str, kind: str, value: Any) -> str:
    value_type, item_type = file.value_type(key)
    found = value_type.name + (f" of {item_type.name}" if item_type is not None else "")
    shown = "" if value is None else f" ({value!r:.60})" if not isinstance(value, list) else ""
    return (f"{file.path}: metadata key '{key}' is {found}{shown}, expected {_EXPECTED_WORDS[kind]}. The file is "
            "corrupt or was written by a broken converter: convert it again.")


def _file_type_name(raw: Any) -> str | None:
    if not isinstance(raw, int):
        return None
    try:
        name = gguf.LlamaFileType(raw & ~FTYPE_GUESSED_FLAG).name
    except ValueError:
        return f"FTYPE_{raw}"  # newer than the installed gguf package
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def role_of(arch: str, is_dflash2: bool = False, is_dspark: bool = False, n_layer_nextn: int = 0) -> str:
    if arch == "dflash":
        return "dspark" if is_dspark else "dflash2" if is_dflash2 else "dflash"
    if arch == "eagle3":
        return "eagle3"
    return "mtp-target" if n_layer_nextn > 0 else "target"
