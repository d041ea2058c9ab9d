"""An exclusive, per-device advisory lock that benchmark runs take so that two of them never share a device.

Why not ``flock(fd)`` on an inherited descriptor: a lock that belongs to an open file description lives as long
as *any* process holds a descriptor for it. A server started from the harness inherited the descriptor, outlived
the harness, and held the lock forever. So the lock file is opened with ``O_CLOEXEC`` (an exec'd child never sees
it) and the lock is an open-file-description lock (``F_OFD_SETLK``), which - unlike classic POSIX ``F_SETLK``
locks - is not dropped when some unrelated descriptor for the same file is closed elsewhere in this process.
A plain ``fork()`` without exec still duplicates the descriptor; an at-fork hook closes it in the child, which
leaves the parent's lock untouched (the description stays referenced by the parent) and means the child can
never keep it alive. Where OFD locks are unavailable the same descriptor is ``flock``ed instead; both kinds share
the descriptor-lifetime semantics the hooks rely on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Literal

from pyllamaspec.errors import PyllamaspecError

LockMode = Literal["wait", "refuse"]

DEFAULT_LOCK_DIR = Path("/tmp/pyllamaspec-locks")
"""Machine-wide on purpose: the device is shared by every user, so a per-user runtime dir would miss contention."""

LOCK_DIR_ENV = "PYLLAMASPEC_LOCK_DIR"

# Polling rather than F_OFD_SETLKW: a blocking wait cannot be bounded without signals, which a library must not use.
DEFAULT_POLL_INTERVAL_S = 0.2

# Descriptors of the locks this process holds; closed in forked children (see module docstring).
_held_descriptors: set[int] = set()


def _close_held_descriptors_in_child() -> None:
    for descriptor in _held_descriptors:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _held_descriptors.clear()


os.register_at_fork(after_in_child=_close_held_descriptors_in_child)


class LockBusyError(PyllamaspecError):
    """The device lock is held by another process (refused at once, or still held when the wait timed out)."""

    def __init__(self, path: Path, holder: dict | None, waited_s: float | None):
        self.path = path
        self.holder = holder
        self.waited_s = waited_s
        who = "another process"
        if holder and holder.get("pid"):
            cmdline = " ".join(str(holder.get("cmdline", "?")).split())  # one line, whatever the holder's argv held
            cmdline = cmdline if len(cmdline) <= 160 else cmdline[:157] + "..."
            who = f"pid {holder['pid']} ({cmdline}, since {holder.get('acquired_at', '?')})"
        waited = f" after waiting {waited_s:.0f} s" if waited_s is not None else ""
        super().__init__(
            f"device lock {path} is held by {who}{waited}; wait for it (--lock wait), stop that process, "
            f"or run without the lock (--lock none) and accept that figures may be contaminated"
        )

    @property
    def holder_pid(self) -> int | None:
        return self.holder.get("pid") if self.holder else None


def default_lock_dir() -> Path:
    configured = os.environ.get(LOCK_DIR_ENV)
    return Path(configured) if configured else DEFAULT_LOCK_DIR


def lock_path_for(device: str, lock_dir: Path | None = None) -> Path:
    """The lock file of a device; the name is reduced to characters that are safe in a file name."""
    safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", device).strip("_") or "default"
    return (lock_dir or default_lock_dir()) / f"{safe_name}.lock"


def _ensure_lock_dir(lock_dir: Path) -> None:
    try:
        lock_dir.mkdir(parents=True)
    except FileExistsError:
        return
    # world-writable and sticky like /tmp, so every user can create (but not delete others') lock files
    os.chmod(lock_dir, 0o1777)


def _open_lock_file(path: Path) -> int:
    """Open (creating if needed) the lock file for writing, close-on-exec.

    Opening without O_CREAT first matters: with fs.protected_regular, O_CREAT on another user's file in a sticky
    world-writable directory fails even though the file exists and is writable.
    """
    flags = os.O_RDWR | os.O_CLOEXEC
    while True:
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        try:
            descriptor = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another process created it between our two opens
        os.fchmod(descriptor, 0o666)  # the umask would otherwise keep other users out of a shared device's lock
        return descriptor


def _flock_struct(lock_type: int) -> bytes:
    # struct flock {short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid;} with native alignment;
    # the trailing pad covers the struct's tail padding. l_pid must be 0 for OFD locks; l_len 0 means "whole file".
    return struct.pack("@hhqqi4x", lock_type, os.SEEK_SET, 0, 0, 0)


def _try_lock(descriptor: int) -> bool:
    """Take the exclusive lock without blocking; False if another open file description holds it."""
    if hasattr(fcntl, "F_OFD_SETLK"):
        try:
            fcntl.fcntl(descriptor, fcntl.F_OFD_SETLK, _flock_struct(fcntl.F_WRLCK))
            return True
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EACCES):
                return False
            if error.errno != errno.EINVAL:  # EINVAL: kernel without OFD locks (< 3.15); use flock below
                raise
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def read_holder(path: Path) -> dict | None:
    """The diagnostics the current holder wrote into the lock file, or None if absent or unreadable."""
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def _holder_record(device: str) -> bytes:
    try:
        cmdline = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = " ".join(sys.argv)
    record = {
        "pid": os.getpid(),
        "cmdline": cmdline.strip(),
        "host": socket.gethostname(),
        "device": device,
        "acquired_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return json.dumps(record).encode()


class DeviceLock:
    """Exclusive advisory lock on one device; a context manager.

    mode "wait" polls until the lock is free or ``timeout_s`` passes (None waits forever); mode "refuse" fails at
    once. Both raise LockBusyError naming the holder recorded in the lock file.
    """

    def __init__(
        self,
        device: str,
        mode: LockMode = "wait",
        timeout_s: float | None = 900.0,
        lock_dir: Path | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    ):
        if mode not in ("wait", "refuse"):
            raise ValueError(f"lock mode must be 'wait' or 'refuse', not {mode!r}")
        self.device = device
        self.mode = mode
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.path = lock_path_for(device, lock_dir)
        self._descriptor: int | None = None
        self._owner_pid: int | None = None
        self.waited_s: float = 0.0

    @property
    def held(self) -> bool:
        return self._descriptor is not None and self._owner_pid == os.getpid()

    def acquire(self) -> DeviceLock:
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this DeviceLock")
        _ensure_lock_dir(self.path.parent)
        descriptor = _open_lock_file(self.path)
        started = time.monotonic()
        try:
            while not _try_lock(descriptor):
                waited = time.monotonic() - started
                if self.mode == "refuse":
                    raise LockBusyError(self.path, read_holder(self.path), None)
                if self.timeout_s is not None and waited >= self.timeout_s:
                    raise LockBusyError(self.path, read_holder(self.path), waited)
                time.sleep(self.poll_interval_s)
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, _holder_record(self.device), 0)
        except BaseException:
            os.close(descriptor)  # the only reference to this description, so any lock we got goes with it
            raise
        self.waited_s = time.monotonic() - started
        self._descriptor = descriptor
        self._owner_pid = os.getpid()
        _held_descriptors.add(descriptor)
        return self

    def release(self) -> None:
        """Release the lock; a no-op when not held, or in a forked child (whose copy the fork hook closed)."""
        if not self.held:
            return
        descriptor = self._descriptor
        _held_descriptors.discard(descriptor)
        self._descriptor = None
        try:
            os.ftruncate(descriptor, 0)  # clear the holder record while still holding, so no one reads it stale
        finally:
            os.close(descriptor)  # closing the last reference releases both OFD and flock locks

    def describe(self) -> dict:
        """What the report records about this lock."""
        return {"device": self.device, "path": str(self.path), "mode": self.mode,
                "held": self.held, "waited_s": round(self.waited_s, 3)}

    def __enter__(self) -> DeviceLock:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()
