"""Read a GGUF file's metadata cheaply: header, key/values and tensor table, never the weights.

The header is parsed straight from a read-only memory map instead of through ``gguf.GGUFReader``
for two reasons: GGUFReader builds a numpy view per token string (seconds on a 150k-token vocab)
and refuses any tensor type newer than the installed gguf package (e.g. Q2_0, which the vendored
llama.cpp loads). The gguf package still supplies the type tables.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gguf

from .errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# Arrays left out of GGUFSummary.metadata: one entry per vocabulary token is too big to carry around.
VOCAB_ARRAY_KEYS = frozenset(
    {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"}
)
# Any other array longer than this (e.g. a sentencepiece precompiled_charsmap) is left out too.
MAX_METADATA_ARRAY_LEN = 4096

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

_SCALAR_FORMATS: dict[gguf.GGUFValueType, str] = {
    gguf.GGUFValueType.UINT8: "B",
    gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H",
    gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I",
    gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f",
    gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q",
    gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class GGUFSummary:
    """What a GGUF file declares about itself, enough to describe it and to judge a target/drafter pair."""

    path: str
    size_bytes: int
    arch: str
    name: str | None
    n_vocab: int | None
    n_embd: int | None
    n_layer: int | None  # <arch>.block_count, MTP (nextn) blocks included
    n_ctx_train: int | None
    file_type: str | None  # llama ftype name, e.g. "Q8_0", "Q4_K_M", "BF16"
    tensor_types: dict[str, int]  # ggml type name -> number of tensors
    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape in GGUF ne order, ggml type name)
    tokenizer_model: str | None
    tokenizer_pre: str | None
    mask_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None
    block_size: int | None  # <arch>.block_size (DFlash)
    target_layers: tuple[int, ...]  # <arch>.target_layers (DFlash: HF layer id + 1; EAGLE3)
    target_hidden_size: int | None  # <arch>.target_hidden_size (EAGLE3)
    swa_window: int | None
    swa_pattern: tuple[bool, ...]  # per-layer form only; upstream's scalar period form stays in metadata
    causal: bool | None
    is_dflash2: bool
    is_dspark: bool
    n_layer_nextn: int
    is_hybrid: bool
    has_output_head: bool
    has_token_embd: bool
    role: str  # "target" | "dflash" | "dflash2" | "dspark" | "eagle3" | "mtp-target"
    vocab_fingerprint: str | None  # see token_fingerprint(); None without a token list
    metadata: dict[str, Any]  # every key/value except the per-token arrays and other long arrays

    @property
    def n_layer_main(self) -> int | None:
        """Layers a drafter can tap: upstream's n_layer(), i.e. block_count less the MTP blocks."""
        return None if self.n_layer is None else self.n_layer - self.n_layer_nextn

    def arch_value(self, suffix: str) -> Any:
        """The value of ``<arch>.<suffix>``, or None."""
        return self.metadata.get(f"{self.arch}.{suffix}")


@dataclass(frozen=True)
class _ArraySpan:
    """A key's array that was skipped over rather than decoded: where its elements lie in the file."""

    element_type: gguf.GGUFValueType
    count: int
    start: int  # offset of the first element
    end: int  # offset just past the last element


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # relative to the start of the data section


@dataclass(frozen=True)
class _Header:
    values: dict[str, Any]  # decoded scalars and short arrays
    arrays: dict[str, _ArraySpan]  # long arrays, not decoded
    tensors: list[_TensorInfo]
    data_offset: int
    endian: str  # struct byte-order prefix of the file


class _Truncated(Exception):
    """The header claims more bytes than the file has."""


class _Corrupt(Exception):
    """The header holds a value no valid GGUF can have."""


class _Cursor:
    """Sequential, bounds-checked reads from the mapped file."""

    def __init__(self, buf: mmap.mmap, endian: str) -> None:
        self.buf = buf
        self.pos = 0
        self.endian = endian
        self._u64 = struct.Struct(endian + "Q")

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        if self.pos + length > len(self.buf):
            raise _Truncated
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` length-prefixed strings without decoding them."""
        buf, pos, size, unpack = self.buf, self.pos, len(self.buf), self._u64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            pos += 8 + unpack(buf, pos)[0]
        if pos > size:
            raise _Truncated
        self.pos = pos


def read_summary(path: str | os.PathLike[str]) -> GGUFSummary:
    """Summarise the GGUF at ``path`` from its header alone.

    Raises ModelLoadError, saying what to do, if the file is missing, unreadable, not a GGUF,
    of an unsupported GGUF version, corrupt, or shorter than its tensor table says.
    """
    path = os.fspath(path)
    with _map_gguf(path) as buf:
        header = _parse_header(path, buf)
        _check_complete(path, header, len(buf))
        fingerprint = _fingerprint_tokens(buf, header, 0, None)
        return _summarise(path, len(buf), header, fingerprint)


def token_fingerprint(path: str | os.PathLike[str], start: int = 0, stop: int | None = None) -> str | None:
    """sha256 of tokens ``[start, stop)`` of the file's token list, as serialised in the file.

    Hashing the serialised form (each token's u64 length, then its bytes) needs no decoding and
    cannot confuse two lists whose joined text happens to agree. None if the file has no token list.
    """
    path = os.fspath(path)
    with _map_gguf(path) as buf:
        return _fingerprint_tokens(buf, _parse_header(path, buf), start, stop)


@contextmanager
def _map_gguf(path: str) -> Iterator[mmap.mmap]:
    """The file, mapped read-only once its magic is checked: pages are read only where the header is."""
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file. Check the path, or fetch the model with `pyllamaspec download`.")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a directory; pass the .gguf file inside it.")
    try:
        file = open(path, "rb")
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror or err}). Check its permissions.") from err
    with file:
        head = file.read(64)
        if head[:4] != GGUF_MAGIC:
            raise ModelLoadError(_not_gguf_message(path, head))
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield buf


def _not_gguf_message(path: str, head: bytes) -> str:
    if not head:
        return f"{path} is empty: the download or copy did not complete. Fetch it again."
    if head.startswith(b"version https://git-lfs"):
        return (
            f"{path} is a Git LFS pointer, not the model: fetch the real file "
            "(`git lfs pull` in the clone, or `pyllamaspec download`)."
        )
    if len(head) < len(GGUF_MAGIC) and GGUF_MAGIC.startswith(head):
        return f"{path} is truncated ({len(head)} bytes): fetch it again."
    if len(head) > 8 and head[8:9] == b"{":
        return f"{path} looks like a safetensors checkpoint, not a GGUF: convert it to GGUF first."
    return f"{path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF'). Point at a .gguf model file."


def _parse_header(path: str, buf: mmap.mmap) -> _Header:
    try:
        # A version whose low 16 bits are zero was written on a host of the other byte order.
        (version,) = struct.unpack_from("<I", buf, 4)
        endian = ">" if version & 0xFFFF == 0 else "<"
        cursor = _Cursor(buf, endian)
        cursor.pos = 4
        version = cursor.scalar("I")
        if version not in SUPPORTED_VERSIONS:
            raise ModelLoadError(
                f"{path}: GGUF version {version} is not supported (only {', '.join(map(str, SUPPORTED_VERSIONS))}); "
                "re-convert the model with a current llama.cpp converter."
            )
        tensor_count = cursor.scalar("Q")
        kv_count = cursor.scalar("Q")
        values: dict[str, Any] = {}
        arrays: dict[str, _ArraySpan] = {}
        for _ in range(kv_count):
            key = cursor.string()
            value_type = _value_type(cursor.scalar("I"))
            if value_type == gguf.GGUFValueType.ARRAY:
                _read_array(cursor, key, values, arrays)
            else:
                values[key] = _read_value(cursor, value_type)
        tensors = [_read_tensor_info(cursor) for _ in range(tensor_count)]
        alignment = values.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise _Corrupt(f"general.alignment is {alignment!r}, not a power of two")
        data_offset = -(-cursor.pos // alignment) * alignment
    except (_Truncated, struct.error) as err:
        raise ModelLoadError(
            f"{path} is truncated inside its header ({len(buf)} bytes): the download or copy was interrupted. "
            "Fetch it again."
        ) from err
    except _Corrupt as err:
        raise ModelLoadError(f"{path} has a corrupt GGUF header ({err}). Fetch or convert it again.") from err
    return _Header(values, arrays, tensors, data_offset, endian)


def _value_type(raw: int) -> gguf.GGUFValueType:
    try:
        return gguf.GGUFValueType(raw)
    except ValueError:
        raise _Corrupt(f"unknown value type {raw}") from None


def _read_value(cursor: _Cursor, value_type: gguf.GGUFValueType) -> Any:
    if value_type == gguf.GGUFValueType.STRING:
        return cursor.string()
    return cursor.scalar(_SCALAR_FORMATS[value_type])


def _read_array(cursor: _Cursor, key: str, values: dict[str, Any], arrays: dict[str, _ArraySpan]) -> None:
    element_type = _value_type(cursor.scalar("I"))
    if element_type == gguf.GGUFValueType.ARRAY:
        raise _Corrupt(f"{key} is an array of arrays")
    count = cursor.scalar("Q")
    start = cursor.pos
    if key in VOCAB_ARRAY_KEYS or count > MAX_METADATA_ARRAY_LEN:
        if element_type == gguf.GGUFValueType.STRING:
            cursor.skip_strings(count)
        else:
            end = start + count * struct.calcsize(_SCALAR_FORMATS[element_type])
            if end > len(cursor.buf):
                raise _Truncated
            cursor.pos = end
        arrays[key] = _ArraySpan(element_type, count, start, cursor.pos)
    else:
        values[key] = [_read_value(cursor, element_type) for _ in range(count)]


def _read_tensor_info(cursor: _Cursor) -> _TensorInfo:
    name = cursor.string()
    n_dims = cursor.scalar("I")
    if n_dims > MAX_DIMS:
        raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
    shape = tuple(cursor.scalar("Q") for _ in range(n_dims))
    type_id = cursor.scalar("I")
    offset = cursor.scalar("Q")
    return _TensorInfo(name, shape, type_id, offset)


def _type_name(type_id: int) -> str:
    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"TYPE_{type_id}"  # newer than the installed gguf package


def _tensor_nbytes(tensor: _TensorInfo) -> int | None:
    try:
        block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.type_id)]
    except (ValueError, KeyError):
        return None
    n_elements = 1
    for dim in tensor.shape:
        n_elements *= dim
    return n_elements * type_size // block_size


def _check_complete(path: str, header: _Header, file_size: int) -> None:
    """Refuse a file that ends before its last tensor's data (an interrupted download)."""
    needed = header.data_offset
    for tensor in header.tensors:
        # a type unknown to the gguf package has an unknown size: its start is still a lower bound
        needed = max(needed, header.data_offset + tensor.offset + (_tensor_nbytes(tensor) or 0))
    if file_size < needed:
        raise ModelLoadError(
            f"{path} is truncated: it has {file_size} bytes but its tensors need {needed} "
            f"({100 * file_size // needed}% present). The download or copy was interrupted; fetch it again."
        )


def _fingerprint_tokens(buf: mmap.mmap, header: _Header, start: int, stop: int | None) -> str | None:
    span = header.arrays.get("tokenizer.ggml.tokens")
    if span is None:
        return None
    stop = span.count if stop is None else min(stop, span.count)
    cursor = _Cursor(buf, header.endian)
    cursor.pos = span.start
    cursor.skip_strings(min(start, stop))
    first = cursor.pos
    cursor.skip_strings(max(stop - start, 0))
    return hashlib.sha256(buf[first : cursor.pos]).hexdigest()


def _summarise(path: str, size_bytes: int, header: _Header, vocab_fingerprint: str | None) -> GGUFSummary:
    values = header.values
    arch = values.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path} has no general.architecture key: it is not a llama.cpp model GGUF.")

    def arch_value(suffix: str) -> Any:
        return values.get(f"{arch}.{suffix}")

    tensors = {t.name: (t.shape, _type_name(t.type_id)) for t in header.tensors}
    n_vocab = arch_value("vocab_size")
    if n_vocab is None and "tokenizer.ggml.tokens" in header.arrays:
        n_vocab = header.arrays["tokenizer.ggml.tokens"].count

    nextn_blocks = {name.split(".")[1] for name in tensors if name.startswith("blk.") and ".nextn." in name}
    n_layer_nextn = arch_value("nextn_predict_layers") or len(nextn_blocks)
    is_dflash2 = arch == "dflash" and "selector_hidden.weight" in tensors
    is_dspark = arch == "dflash" and "markov_w1.weight" in tensors
    swa_pattern = arch_value("attention.sliding_window_pattern")

    return GGUFSummary(
        path=path,
        size_bytes=size_bytes,
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
        role=_role(arch, is_dflash2, is_dspark, n_layer_nextn),
        vocab_fingerprint=vocab_fingerprint,
        metadata=values,
    )


def _file_type_name(raw: Any) -> str | None:
    if not isinstance(raw, int):
        return None
    try:
        name = gguf.LlamaFileType(raw & ~FTYPE_GUESSED_FLAG).name
    except ValueError:
        return f"FTYPE_{raw}"  # newer than the installed gguf package
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _role(arch: str, is_dflash2: bool, is_dspark: bool, n_layer_nextn: int) -> str:
    if arch == "dflash":
        return "dspark" if is_dspark else "dflash2" if is_dflash2 else "dflash"
    if arch == "eagle3":
        return "eagle3"
    return "mtp-target" if n_layer_nextn > 0 else "target"
