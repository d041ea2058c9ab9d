"""The one GGUF reader of the package: gguf.GGUFReader over a read-only memory map, header only.

Everything that reads a GGUF's metadata goes through open_gguf(): the header summary and pairing checks,
the token fingerprint, and the tokenizer key/values that convert and the synthetic drafters copy.

GGUFReader is used as it is, with two adjustments made in a subclass:

* arrays longer than MAX_DECODED_ARRAY_LEN (a vocabulary's tokens, scores, merges) are kept as one byte
  span instead of a numpy view per element. GGUFReader's views cost seconds on a 150k-token vocabulary;
  a span costs one pass over the lengths. Such arrays are decoded only when asked for (array()).
* the tensor table is read without building per-tensor data views, so a file is described even when a
  tensor has a type the installed gguf package does not know yet (tensor_views() builds them on request
  and refuses such a type then). Reads are bounds-checked, so a truncated file is named as such.

A model argument that is not a regular file (a directory, a FIFO, a device) is refused before anything
opens it, so nothing ever blocks on it.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType

from ..errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS

# Arrays longer than this stay undecoded byte spans until asked for.
MAX_DECODED_ARRAY_LEN = 4096
MAX_TENSOR_BYTES = 2 ** 46  # 64 TiB: a larger tensor is a corrupt shape, not a model

_SCALAR_DTYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "u1", GGUFValueType.INT8: "i1", GGUFValueType.UINT16: "u2", GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4", GGUFValueType.INT32: "i4", GGUFValueType.FLOAT32: "f4", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "u8", GGUFValueType.INT64: "i8", GGUFValueType.FLOAT64: "f8",
}


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    shape: tuple[int, ...]  # GGUF ne order: fastest dimension first
    type_id: int
    offset: int  # absolute offset of the data in the file
    n_bytes: int | None  # None: a type the installed gguf package does not know

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.type_id)

    @property
    def type_known(self) -> bool:
        return self.n_bytes is not None


def ggml_type_name(type_id: int) -> str:
    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"TYPE_{type_id}"  # newer than the installed gguf package


def gguf_package_version() -> str:
    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover - a source checkout of gguf
        return "unknown"


class _Truncated(Exception):
    """The header claims more bytes than the file has (`end`: the offset a read needed)."""

    def __init__(self, end: int = 0) -> None:
        super().__init__(end)
        self.end = end


class _Corrupt(Exception):
    """The header holds a value no valid GGUF can have."""


class _Incomplete(Exception):
    """The file ends before the data its tensor table describes."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


def _implausible(end: int, size: int) -> bool:
    """Whether a header that needs bytes up to `end` of a file of `size` is corrupt rather than cut short: no
    interrupted copy explains a count or length that reaches that far past the end (a header is never larger
    than the part of a file a cut could have lost, plus its longest array)."""
    return end > 2 * size + 2 ** 20


def _value_type(raw: int) -> GGUFValueType:
    try:
        return GGUFValueType(int(raw))
    except ValueError:
        raise _Corrupt(f"unknown value type {int(raw)}") from None


class _Reader(gguf.GGUFReader):
    """GGUFReader with bounds-checked reads, long arrays kept as spans and a lazily built tensor list."""

    def __init__(self, path: str) -> None:
        self.tensor_infos: list[TensorInfo] = []
        self._tensor_fields: list[gguf.ReaderField] = []
        super().__init__(path, "r")

    @property
    def struct_order(self) -> str:
        return "<" if self.endianess == gguf.GGUFEndian.LITTLE else ">"

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        count = int(count)
        end = int(offset) + np.dtype(dtype).itemsize * count
        if offset < 0 or count < 0 or end > len(self.data):
            raise _Truncated(end)
        return super()._get(offset, dtype, count, override_order)

    # the smallest a key/value (key length, one byte of key, type, a u8) and a tensor entry (name length, a
    # byte of name, n_dims, one dim, type, offset) can be: a count the rest of the file cannot hold is corrupt
    _MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 1 + 4 + 1, 8 + 1 + 4 + 8 + 4 + 8

    def _build_fields(self, offs: int, count: int) -> int:
        if _implausible(offs + int(count) * self._MIN_KV_BYTES, len(self.data)):
            raise _Corrupt(f"the header claims {int(count)} key/values, more than a file of {len(self.data)} bytes "
                           "could hold")
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int):
        if _implausible(offs + int(count) * self._MIN_TENSOR_BYTES, len(self.data)):
            raise _Corrupt(f"the header claims {int(count)} tensors, more than a file of {len(self.data)} bytes "
                           "could hold")
        return super()._build_tensor_info(offs, count)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list[GGUFValueType]]:
        value_type = _value_type(raw_type)
        if value_type == GGUFValueType.ARRAY:
            raw_item_type = self._get(orig_offs, np.uint32)
            length = self._get(orig_offs + 4, np.uint64)
            count = int(length[0])
            if count > MAX_DECODED_ARRAY_LEN:
                item_type = _value_type(raw_item_type[0])
                start = orig_offs + 12
                end = self._skip(start, item_type, count)
                span = self._get(start, np.uint8, end - start)
                return end - orig_offs, [raw_item_type, length, span], [], [value_type, item_type]
        return super()._get_field_parts(orig_offs, raw_type)

    def _skip(self, start: int, item_type: GGUFValueType, count: int) -> int:
        """Offset just past ``count`` items of ``item_type`` from ``start``."""
        if item_type == GGUFValueType.STRING:
            unpack = struct.Struct(self.struct_order + "Q").unpack_from
            data, size, pos = self.data, len(self.data), start
            for _ in range(count):
                if pos + 8 > size:
                    raise _Truncated(pos + 8)
                pos += 8 + unpack(data, pos)[0]
            if pos > size:
                raise _Truncated(pos)
            return pos
        if item_type not in _SCALAR_DTYPES:
            raise _Corrupt(f"an array of {item_type.name} with {count} items")
        end = start + count * np.dtype(_SCALAR_DTYPES[item_type]).itemsize
        if end > len(self.data):
            raise _Truncated(end)
        return end

    def _build_tensors(self, start_offs: int, fields: list[gguf.ReaderField]) -> None:
        """Only the table: sizes where the type is known, and the bytes the file must hold for them."""
        infos, seen, needed = [], set(), start_offs
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            if name in seen:
                raise _Corrupt(f"tensor {name!r} appears twice")
            seen.add(name)
            shape = tuple(int(d) for d in dims)
            if len(shape) > MAX_DIMS:
                raise _Corrupt(f"tensor {name!r} has {len(shape)} dimensions")
            type_id = int(raw_dtype[0])
            try:
                block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
                n_bytes = math.prod(shape) * type_size // block_size
            except (ValueError, KeyError):
                n_bytes = None
            if n_bytes is not None and n_bytes > MAX_TENSOR_BYTES:
                raise _Corrupt(f"tensor {name!r} of shape {shape} would hold {n_bytes} bytes")
            if int(offset[0]) % int(self.alignment):
                raise _Corrupt(f"tensor {name!r} starts at offset {int(offset[0])}, not a multiple of the file's "
                               f"alignment {int(self.alignment)}")
            info = TensorInfo(name, shape, type_id, start_offs + int(offset[0]), n_bytes)
            # a type unknown to the gguf package has an unknown size: its start is still a lower bound
            needed = max(needed, info.offset + (n_bytes or 0))
            infos.append(info)
        placed = sorted((t for t in infos if t.n_bytes is not None), key=lambda t: t.offset)
        align = int(self.alignment)
        for a, b in zip(placed, placed[1:]):
            if a.offset + a.n_bytes > b.offset:
                raise _Corrupt(f"tensors {a.name!r} and {b.name!r} overlap in the file")
            # writers pack tensor data back to back, each padded to the alignment: a gap is a corrupt offset
            if b.offset - (a.offset + a.n_bytes) >= align and len(placed) == len(infos):
                raise _Corrupt(f"tensor {b.name!r} starts {b.offset - a.offset - a.n_bytes} bytes after the end of "
                               f"{a.name!r}: a corrupt offset")
        if placed and len(placed) == len(infos) and placed[0].offset - start_offs >= align:
            raise _Corrupt(f"the first tensor, {placed[0].name!r}, starts at data offset "
                           f"{placed[0].offset - start_offs}, not 0: a corrupt offset")
        if len(self.data) < needed:
            raise _Incomplete(needed)
        self.tensor_infos, self._tensor_fields = infos, fields

    def build_tensor_views(self) -> list[gguf.ReaderTensor]:
        super()._build_tensors(self.data_offset, self._tensor_fields)
        return self.tensors


class GGUFFile:
    """A GGUF's header: key/values, long arrays on request, the tensor table. Open it with open_gguf()."""

    def __init__(self, path: str, reader: _Reader) -> None:
        self.path = path
        self._reader = reader
        self.size_bytes = len(reader.data)
        self.tensors: list[TensorInfo] = reader.tensor_infos
        self.values: dict[str, Any] = {}  # decoded scalars and short arrays (strings as str)
        self.array_lengths: dict[str, int] = {}  # every array, decoded or not
        self._fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        for key, field in self._fields.items():
            if field.types and field.types[0] == GGUFValueType.ARRAY:
                self.array_lengths[key] = int(field.parts[4][0])
                if not self._is_span(field):
                    self.values[key] = self._decode(field, text=True)
            else:
                self.values[key] = self._decode(field, text=True)

    @staticmethod
    def _is_span(field: gguf.ReaderField) -> bool:
        return field.types[0] == GGUFValueType.ARRAY and not field.data and int(field.parts[4][0]) > 0

    @property
    def keys(self) -> list[str]:
        return list(self._fields)

    def value_type(self, key: str) -> tuple[GGUFValueType, GGUFValueType | None]:
        """(type, element type of an array or None)."""
        types = self._fields[key].types
        return types[0], (types[-1] if types[0] == GGUFValueType.ARRAY and len(types) > 1 else None)

    def array(self, key: str, *, text: bool = True) -> list[Any] | None:
        """Every element of an array key (strings as str, or as bytes with text=False); None if absent."""
        field = self._fields.get(key)
        if field is None or field.types[0] != GGUFValueType.ARRAY:
            return None
        return self._decode(field, text=text)

    def raw_value(self, key: str) -> Any:
        """A value as a GGUF writer takes it back: strings as bytes, so they copy exactly."""
        return self._decode(self._fields[key], text=False)

    def kv_items(self, prefix: str = "") -> Iterator[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
        """(key, raw value, type, element type) of every key starting with prefix, in file order: what
        gguf.GGUFWriter.add_key_value takes to copy them."""
        for key in self._fields:
            if key.startswith(prefix):
                value_type, item_type = self.value_type(key)
                yield key, self.raw_value(key), value_type, item_type

    def tokenizer_kv(self, leave_out: tuple[str, ...] = ()) -> list[tuple[str, Any, GGUFValueType,
                                                                           GGUFValueType | None]]:
        """Every tokenizer.* key/value (but those in leave_out), ready for gguf.GGUFWriter.add_key_value:
        strings as bytes, so they copy exactly. Empty arrays are left out (a GGUF writer cannot write one)."""
        return [(key, value, vtype, sub) for key, value, vtype, sub in self.kv_items("tokenizer.")
                if key not in leave_out and not (vtype == GGUFValueType.ARRAY and not value)]

    def token_fingerprint(self, start: int = 0, stop: int | None = None) -> str | None:
        """sha256 of tokens [start, stop) of tokenizer.ggml.tokens as serialised in the file (each token's u64
        length, then its bytes): no decoding, and two lists whose joined text agrees cannot collide. None if
        the file has no token list."""
        field = self._fields.get("tokenizer.ggml.tokens")
        if field is None or field.types[-1] != GGUFValueType.STRING:
            return None
        count = int(field.parts[4][0])
        stop = count if stop is None else min(stop, count)
        start = min(max(start, 0), stop)
        if self._is_span(field):
            first = self._reader._skip(self._span_start(field), GGUFValueType.STRING, start)
            last = self._reader._skip(first, GGUFValueType.STRING, stop - start)
            return hashlib.sha256(self._reader.data[first:last].tobytes()).hexdigest()
        digest = hashlib.sha256()
        for idx in field.data[start:stop]:
            digest.update(field.parts[idx - 1].tobytes())
            digest.update(field.parts[idx].tobytes())
        return digest.hexdigest()

    def tensor_views(self) -> list[gguf.ReaderTensor]:
        """gguf.ReaderTensor (with a data view) per tensor. Refuses a type the gguf package does not know."""
        unknown = [t for t in self.tensors if not t.type_known]
        if unknown:
            raise ModelLoadError(unknown_type_message(self.path, {t.name: t.type_name for t in unknown}))
        return self._reader.build_tensor_views()

    # -- decoding ------------------------------------------------------------------------------

    def _span_start(self, field: gguf.ReaderField) -> int:
        # the span follows the key, the value type (u32), the element type (u32) and the count (u64)
        key_len = int(field.parts[0][0])
        return field.offset + 8 + key_len + 4 + 4 + 8

    def _decode(self, field: gguf.ReaderField, text: bool) -> Any:
        def string(raw: np.ndarray) -> Any:
            data = raw.tobytes()
            return data.decode("utf-8", "replace") if text else data

        value_type = field.types[0]
        if value_type == GGUFValueType.STRING:
            return string(field.parts[-1])
        if value_type != GGUFValueType.ARRAY:
            return field.parts[-1].tolist()[0]
        if not self._is_span(field):
            item_type = field.types[-1] if len(field.types) > 1 else None
            if item_type == GGUFValueType.STRING:
                return [string(field.parts[i]) for i in field.data]
            return [field.parts[i].tolist()[0] for i in field.data]
        item_type, count, start = field.types[-1], int(field.parts[4][0]), self._span_start(field)
        data, order = self._reader.data, self._reader.struct_order
        if item_type == GGUFValueType.STRING:
            unpack, pos, out = struct.Struct(order + "Q").unpack_from, start, []
            for _ in range(count):
                n = unpack(data, pos)[0]
                raw = data[pos + 8:pos + 8 + n].tobytes()
                out.append(raw.decode("utf-8", "replace") if text else raw)
                pos += 8 + n
            return out
        dtype = np.dtype(_SCALAR_DTYPES[item_type]).newbyteorder(order)
        return np.frombuffer(data, dtype=dtype, count=count, offset=start).tolist()


def check_model_file(path: str | os.PathLike[str]) -> str:
    """Refuse, before anything opens it, a path that is missing or not a regular file (a directory, a FIFO,
    a socket, a device): opening a FIFO would block until someone writes to it. Returns the path as str."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file (the model does not exist at this path). Check the path, or "
                             f"fetch the model with `pyllamaspec download`.") from None
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror or err}). Check its permissions.") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"{path} is a directory; pass the .gguf file inside it.")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise ModelLoadError(f"{path} is {kind}, not a regular file: pass a .gguf model file.")
    return path


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """The GGUF at ``path``, its header parsed.

    Raises ModelLoadError, saying what to do, if the file is missing, not a regular file, unreadable, not a
    GGUF, of an unsupported GGUF version, corrupt, or shorter than its tensor table says.
    """
    path = check_model_file(path)
    try:
        with open(path, "rb") as file:
            head = file.read(64)
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror or err}). Check its permissions.") from err
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(_not_gguf_message(path, head))
    if len(head) >= 8:
        (version_le,) = struct.unpack_from("<I", head, 4)
        # a version whose low 16 bits are zero was written on a host of the other byte order
        file_version = struct.unpack_from(">I", head, 4)[0] if version_le & 0xFFFF == 0 else version_le
        if file_version not in SUPPORTED_VERSIONS:
            raise ModelLoadError(
                f"{path}: GGUF version {file_version} is not supported (only "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}); re-convert the model with a current llama.cpp converter.")
    try:
        reader = _Reader(path)
    except _Truncated as err:
        size = os.path.getsize(path)
        if _implausible(err.end, size):
            raise ModelLoadError(
                f"{path} has a corrupt GGUF header: a count or length in it reaches byte {err.end}, but the file has "
                f"{size} bytes (damage, not an interrupted download). Fetch or convert it again.") from err
        raise ModelLoadError(f"{path} is truncated inside its header ({size} bytes): the download or copy was "
                             f"interrupted. Fetch it again.") from err
    except _Incomplete as err:
        size = os.path.getsize(path)
        raise ModelLoadError(
            f"{path} is truncated: it has {size} bytes but its tensors need {err.needed} "
            f"({100 * size // err.needed}% present). The download or copy was interrupted; fetch it again.") from err
    except (_Corrupt, ValueError, KeyError, IndexError, OverflowError) as err:
        raise ModelLoadError(f"{path} has a corrupt GGUF header ({err}). Fetch or convert it again.") from err
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror or err}). Check its permissions.") from err
    return GGUFFile(path, reader)


def token_fingerprint(path: str | os.PathLike[str], start: int = 0, stop: int | None = None) -> str | None:
    """GGUFFile.token_fingerprint of the file at ``path``."""
    return open_gguf(path).token_fingerprint(start, stop)


def tokenizer_kv(path: str | os.PathLike[str], *, leave_out: tuple[str, ...] = ()
                 ) -> list[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """GGUFFile.tokenizer_kv of the file at ``path``."""
    return open_gguf(path).tokenizer_kv(leave_out)


def unknown_type_message(path: str, tensors: dict[str, str]) -> str:
    """What to do about tensors (name -> 'TYPE_<id>') of a type the installed gguf package does not know."""
    shown = ", ".join(f"{name} ({type_name})" for name, type_name in list(tensors.items())[:3])
    more = f" and {len(tensors) - 3} more" if len(tensors) > 3 else ""
    return (f"{path}: tensor {shown}{more} has a ggml type the installed gguf package ({gguf_package_version()}) "
            f"does not know: upgrade it (pip install -U gguf), or re-quantize the model to a common type.")


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
