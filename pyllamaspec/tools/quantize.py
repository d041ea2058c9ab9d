"""`pyllamaspec quantize`: requantize a GGUF through upstream's quantizer, drafter-aware and atomic.

The quantizer runs in a child process: upstream's quantizer cannot be stopped part-way, but a process can, so
Ctrl-C or SIGTERM ends a quantization at once and the partial output is removed.
"""

from __future__ import annotations

import errno
import json
import operator
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .. import native_tools
from ..atomicfile import atomic_output
from ..config import MAX_THREADS
from ..errors import PyllamaspecError, QuantizeError

# llama_ftype values by upstream's names (llama.h); the common ones plus the k-quants
FTYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
    "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
    "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32, "MXFP4_MOE": 38,
}

# Tensors a drafter needs at full precision: DFlash2's selector codebooks and gate, DSpark's Markov head,
# the reduced-vocab map. Upstream has no drafter-specific rules, so we pin them to F16 (maps stay as they are:
# the quantizer leaves integer tensors alone).
DRAFTER_KEEP = ("selector_predecessor\\.weight", "selector_successor\\.weight", "selector_hidden\\.weight",
                "markov_w1\\.weight", "markov_w2\\.weight", "conf_proj\\.weight", "fc\\.weight")


def drafter_overrides(arch: str | None) -> str | None:
    if arch != "dflash":
        return None
    return ",".join(f"^{p}$=F16" for p in DRAFTER_KEEP)


ProgressFn = Callable[[int, int], None]  # (tensors done, tensors in all)


def quantize(path_in: str | os.PathLike, path_out: str | os.PathLike, ftype: str = "Q4_0", *, threads: int = 0,
             allow_requantize: bool = False, force: bool = False, progress: ProgressFn | None = None) -> dict:
    """Requantize into a temp file beside path_out and rename; the input is never touched.

    The quantizer runs in a child process, which any thread may start; a KeyboardInterrupt (or any exception)
    in the caller ends it and removes the partial output. progress, if given, is called on the calling thread
    with (tensors done, tensors in all)."""
    src, dst = Path(path_in), Path(path_out)
    if not isinstance(ftype, str):
        raise QuantizeError(f"type must be a str such as 'Q4_0', not {type(ftype).__name__}")
    name = ftype.upper()
    if name not in FTYPES:
        raise QuantizeError(f"unknown type '{ftype}'; known: {', '.join(FTYPES)}")
    threads = _count(threads, "threads")
    if not 0 <= threads <= MAX_THREADS:
        raise QuantizeError(f"threads={threads} must be within 0..{MAX_THREADS} (0: every core)")
    if not src.is_file():
        raise QuantizeError(f"input '{src}' does not exist or is not a regular file")
    if dst.exists() and dst.resolve() == src.resolve():
        raise QuantizeError("output and input are the same file; quantize never overwrites its input")
    from ..ggufinfo import read_summary  # metadata only, no weights

    arch = read_summary(src).arch
    overrides = drafter_overrides(arch)
    t0 = time.perf_counter()
    with atomic_output(dst, force=force, error=QuantizeError) as tmp:
        request = {"input": str(src), "output": str(tmp), "ftype": FTYPES[name], "threads": threads,
                   "allow_requantize": bool(allow_requantize), "overrides": overrides}
        msg = _run_worker(request, progress)
        if msg is not None:
            msg = _with_os_reason(msg, tmp)
            if "requantizing" in msg and not allow_requantize:
                msg += " (the input is already quantized: pass --allow-requantize)"
            raise QuantizeError(msg)
    return {"input": str(src), "output": str(dst), "type": name, "bytes_in": src.stat().st_size,
            "bytes_out": dst.stat().st_size, "seconds": time.perf_counter() - t0, "drafter_overrides": overrides}


def _count(value, name: str) -> int:
    """An int (numpy integers too, not bools) as a Python int; QuantizeError otherwise."""
    if isinstance(value, bool):
        raise QuantizeError(f"{name}={value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise QuantizeError(f"{name}={value!r} must be an integer") from None


_IO_FAILURE = native_tools.IO_FAILURE_WORDS
LOW_SPACE_BYTES = 1 << 20


def _with_os_reason(msg: str, tmp: Path) -> str:
    """The quantizer's message, with what the operating system said when it is a bare I/O stream failure
    (C++ streams say 'basic_ios::clear'): the errno the child saw, and whether the disk is full."""
    if not any(k in msg.lower() for k in _IO_FAILURE):
        return msg
    directory = tmp.parent
    reasons = []
    m = re.search(r"\[os: (.*?)\]", msg)
    if m:
        reasons.append(m.group(1))
        msg = msg.replace(m.group(0), "").strip()
    try:
        st = os.statvfs(directory)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if free is not None and free < LOW_SPACE_BYTES and not any("space" in r.lower() for r in reasons):
        reasons.insert(0, os.strerror(errno.ENOSPC))
    where = f"writing into {directory}"
    if free is not None:
        where += f" ({free} bytes free)"
    return f"{where} failed: {'; '.join(reasons) or 'an I/O error'} (the quantizer said: {msg})"


def _run_worker(request: dict, progress: ProgressFn | None) -> str | None:
    """Quantize in a child process; None on success, else the quantizer's error message."""
    read_fd, write_fd = os.pipe()
    request = {**request, "fd": write_fd, "parent": os.getpid()}
    # the child imports this very package, wherever it was imported from: its root goes ahead of the working
    # directory, which `python -c` puts first on sys.path (a source checkout there has no native library)
    package_root = str(Path(__file__).resolve().parents[len(__name__.split(".")) - 1])
    code = f"import sys; sys.path.insert(0, {package_root!r}); import {__name__} as m; m._worker_main()"
    proc = None
    result = None
    try:
        try:
            with _signals_deferred():  # until `proc` is set, nothing could end the child
                proc = subprocess.Popen(
                    [sys.executable, "-c", code, json.dumps(request)],
                    pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=2,  # none of it on our stdout
                    start_new_session=True)  # the terminal's Ctrl-C is ours to act on, not the child's
        except OSError as e:
            raise QuantizeError(f"cannot start the quantizer process: {e.strerror or e}") from None
        finally:
            os.close(write_fd)
        for msg in _messages(read_fd):
            if "done" in msg:
                if progress is not None:
                    progress(msg["done"], msg["total"])
            else:
                result = msg
        status = _wait(proc)
    finally:
        if proc is not None and proc.poll() is None:  # interrupted (or failed) here: end the child now
            proc.kill()
            proc.wait()
        os.close(read_fd)
    if result is None:
        return f"the quantizer process {_how_it_ended(status)} before it finished"
    return None if result.get("rc") == 0 else (result.get("error") or "quantization failed")


# Waits are sliced: a signal that another thread of this process (a BLAS pool, say) received does not interrupt
# a blocking read in the main thread, so the main thread looks for pending handlers at least this often.
WAIT_SLICE_S = 0.2


def _messages(fd: int):
    """The child's JSON lines, until it closes the pipe."""
    pending = b""
    while True:
        if not select.select([fd], [], [], WAIT_SLICE_S)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait(timeout=WAIT_SLICE_S)
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def _signals_deferred():
    """SIGINT/SIGTERM that arrive in the block are acted on (by their handlers) when it ends. An exception raised
    inside Popen after its fork loses the child's pid, so nothing could end that child."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread only: this thread's Popen cannot be interrupted
        return
    caught: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):  # ignored or default-action signals need no deferring
            previous[sig] = handler
            signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            previous[sig](sig, None)


def _how_it_ended(status: int) -> str:
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"


def _die_with_parent(parent: int) -> None:
    """A killed parent takes the quantizer with it (Linux); elsewhere the parent's own cleanup has to do."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _worker_main() -> None:
    """The child process: one quantization, reported as JSON lines on the pipe the parent gave."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    req = json.loads(sys.argv[-1])
    _die_with_parent(req["parent"])
    with os.fdopen(req["fd"], "w", encoding="utf-8", buffering=1) as out:
        def on_progress(done: int, total: int) -> None:
            out.write(json.dumps({"done": done, "total": total}) + "\n")

        try:
            rc, error = native_tools.quantize(req["input"], req["output"], ftype=req["ftype"], threads=req["threads"],
                                              allow_requantize=req["allow_requantize"], overrides=req["overrides"],
                                              progress=on_progress)
        except PyllamaspecError as e:  # the library cannot be loaded
            out.write(json.dumps({"rc": -1, "error": str(e)}) + "\n")
            return
        out.write(json.dumps({"rc": rc, "error": error}) + "\n")

