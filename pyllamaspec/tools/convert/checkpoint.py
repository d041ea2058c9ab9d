"""The drafter checkpoint's weights: safetensors headers (one file or an index of shards), checked against the
safetensors library, and tensors read as numpy arrays. Pickle checkpoints are refused: loading one can run code."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ConversionError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


@dataclass
class TensorRef:
    name: str  # normalized HF name (no "model." prefix)
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in file
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorRef]:
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
    out: dict[str, TensorRef] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"safetensors file {str(path)!r}: corrupt entry for tensor {name!r}") from None
        if dtype not in ST_DTYPES:
            raise ConversionError(
                f"tensor {name!r} in {path.name} has dtype {dtype}; only F32, F16 and BF16 checkpoints are supported"
            )
        nbytes = math.prod(shape) * ST_DTYPES[dtype][1]
        if end - begin != nbytes or begin < 0 or base + end > size:
            raise ConversionError(
                f"safetensors file {str(path)!r}: tensor {name!r} data ({begin}..{end}) does not match its "
                f"shape {list(shape)} {dtype} or lies past the end of the file (truncated download?)"
            )
        out[name] = TensorRef(name, path, dtype, shape, base + begin, nbytes)
    return out


def cross_check_with_safetensors(path: Path, refs: dict[str, TensorRef]) -> None:
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


def normalize_hf_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    if name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"):
        name += ".weight"
    if name.endswith(".sinks"):
        name += ".weight"
    return name


def inventory(drafter_dir: Path) -> tuple[dict[str, TensorRef], list[Path]]:
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

    refs: dict[str, TensorRef] = {}
    for f in files:
        header = read_safetensors_header(f)
        cross_check_with_safetensors(f, header)
        for raw_name, ref in header.items():
            if wm is not None and wm.get(raw_name) not in (None, f.name):
                continue  # the index says this copy is not the one to use
            name = normalize_hf_name(raw_name)
            if name in refs:
                raise ConversionError(
                    f"tensor {raw_name!r} appears twice in the checkpoint ({refs[name].file.name} and {f.name})"
                )
            ref.name = name
            refs[name] = ref
    if wm is not None:
        for raw_name, shard in wm.items():
            if normalize_hf_name(raw_name) not in refs:
                raise ConversionError(f"{index.name} maps tensor {raw_name!r} to {shard!r}, which does not contain it")
    return refs, files



def load(ref: TensorRef) -> np.ndarray:
    dt, _ = ST_DTYPES[ref.dtype]
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


def to_f32(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32, copy=False)
