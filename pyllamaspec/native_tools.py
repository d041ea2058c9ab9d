"""The library's calls that are not about models and sessions, typed: its log level, the quantizer, and the
writer of synthetic models. The tools and the command line call these, never the binding."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Sequence

from . import _native
from .errors import ConfigError, ModelLoadError


def set_log_level(level: int) -> None:
    """llama.cpp's log lines on stderr: 0 errors only, 1 warnings, 2 info, 3 debug."""
    _ffi, lib = _native.load()
    lib.pls_set_log_level(max(0, min(3, int(level))))


# a quantizer message that is a bare I/O stream failure (C++ streams say 'basic_ios::clear'), to which the OS's reason
# is added
IO_FAILURE_WORDS = ("basic_ios", "ios_base", "failed to write", "failed to open", "write error", "i/o error",
                    "no space", "errno")


def quantize(input_path: str | os.PathLike, output_path: str | os.PathLike, *, ftype: int, threads: int,
             allow_requantize: bool, overrides: str | None,
             progress: Callable[[int, int], None] | None = None) -> tuple[int, str]:
    """Requantize a GGUF (pls_quantize). progress(done, total) is called per tensor. Returns the status and the
    library's message (empty on success): the quantizer runs in a child process that reports both."""
    ffi, lib = _native.load()

    @ffi.callback("void(void *, int32_t, int32_t)")
    def on_progress(_user, done, total):
        if progress is not None:
            progress(int(done), int(total))

    err = _native.ErrorBuffer(ffi)
    rc = lib.pls_quantize(os.fsencode(input_path), os.fsencode(output_path), ftype, threads, int(allow_requantize),
                          overrides.encode() if overrides else ffi.NULL, on_progress, ffi.NULL, err.buf, err.SIZE)
    os_errno = ffi.errno  # what the operating system said last in the quantizer (a failed write's reason)
    text = err.text if rc != 0 else ""
    if rc != 0 and os_errno and any(k in text.lower() for k in IO_FAILURE_WORDS):
        text += f" [os: {os.strerror(os_errno)}]"
    return rc, text


def synth_list_tensors(meta_path: str | os.PathLike, load_mtp: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors (name, shape) llama.cpp would load for a keys-only GGUF."""
    ffi, lib = _native.load()
    err = _native.ErrorBuffer(ffi)
    size = 1 << 20
    for _ in range(2):
        buf = ffi.new("char[]", size)
        n = lib.pls_synth_list_tensors(os.fsencode(meta_path), int(load_mtp), buf, size, err.buf, err.SIZE)
        if n == -1:
            raise ConfigError(err.text)
        if n >= 0:
            return [(t["name"], tuple(t["ne"])) for t in json.loads(ffi.string(buf, n).decode())]
        size = -n + 1
    raise ConfigError("synthetic model: the tensor list did not fit its buffer")  # pragma: no cover


@dataclass(frozen=True)
class SynthTensor:
    """One tensor of a synthetic model: its shape, its ggml type id, and what its values are (weight, norm,
    negative)."""

    name: str
    shape: Sequence[int]
    type_id: int
    kind: str


def synth_write(meta_path: str | os.PathLike, tensors: Sequence[SynthTensor], out_path: str | os.PathLike, *,
                seed: int, stddev: float, perturb_seed: int, perturb_stddev: float, n_threads: int | None,
                progress: Callable[[int, int], bool] | None = None) -> None:
    """Write a synthetic GGUF (pls_synth_write): the keys of meta_path and the tensors filled with seeded noise.
    progress(done, total) returning true cancels (ConfigError); an exception it raises stops the write and is
    raised here; a failure of the library is a ModelLoadError."""
    ffi, lib = _native.load()
    kinds = {"weight": lib.PLS_SYNTH_WEIGHT, "norm": lib.PLS_SYNTH_NORM, "negative": lib.PLS_SYNTH_NEGATIVE}
    arr = ffi.new("pls_synth_tensor[]", len(tensors))
    names = [ffi.new("char[]", t.name.encode()) for t in tensors]
    for i, t in enumerate(tensors):
        arr[i].name = names[i]
        ne = list(t.shape) + [1] * (4 - len(t.shape))
        for d in range(4):
            arr[i].ne[d] = ne[d]
        arr[i].type = int(t.type_id)
        arr[i].kind = kinds[t.kind]
    p = ffi.new("pls_synth_params *")
    p.seed, p.stddev, p.perturb_seed, p.perturb_stddev = seed, stddev, perturb_seed, perturb_stddev
    p.n_threads = n_threads or 0
    raised: list[BaseException] = []

    def on_progress(_ud, done, total):
        if progress is not None and progress(int(done), int(total)):
            return 1
        return 0

    def on_error(exc_type, exc, tb):
        raised.append(exc)
        return 1  # cancel: an exception (Ctrl-C included) stops the write

    cb = ffi.callback("pls_synth_progress_cb", on_progress, onerror=on_error)
    err = _native.ErrorBuffer(ffi)
    rc = lib.pls_synth_write(os.fsencode(meta_path), arr, len(tensors), p, os.fsencode(out_path), cb, ffi.NULL,
                             err.buf, err.SIZE)
    if raised:
        raise raised[0]
    if rc == -2:
        raise ConfigError("synthetic model: cancelled")
    if rc != 0:
        raise ModelLoadError(err.text)
