"""Writers (convert, quantize, synth, model downloads) write a temp file beside the output and publish it
with a rename, so a failed or interrupted run leaves nothing behind and never clobbers an existing file.

A writer holds a shared lock on its temp file while it writes. A run that was killed outright (SIGKILL, power
loss) cannot remove its temp file; the next writer of the same output removes such leftovers: files of exactly
our temp-file name pattern for that output that nobody holds locked and that have not changed for a while.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Type

from .errors import PyllamaspecError


def _fsync_path(path: Path, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the rename is still atomic
    finally:
        os.close(fd)


STALE_AFTER_S = 10.0  # a live writer locks its temp file at once; this covers the instant in between


def _partial_pattern(out: Path) -> re.Pattern:
    return re.compile(r"\." + re.escape(out.name) + r"\.[0-9a-f]{12}\.partial")


def remove_stale_partials(out: str | os.PathLike, stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temp files that killed runs left for `out` (never anything of another name); returns them."""
    out = Path(out)
    out_dir = out.parent if str(out.parent) else Path(".")
    pattern = _partial_pattern(out)
    removed = []
    try:
        names = [e.name for e in os.scandir(out_dir) if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return removed
    for name in names:
        path = out_dir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a writer holds it
            if time.time() - os.fstat(fd).st_mtime < stale_after_s:
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue  # locked, already gone, or no locking here: leave it
        finally:
            os.close(fd)
    return removed


@contextmanager
def atomic_output(out: str | os.PathLike, *, force: bool = False,
                  error: Type[PyllamaspecError] = PyllamaspecError) -> Iterator[Path]:
    """Yield a fresh temp path in out's directory. When the block ends without an exception the file is
    synced and published as `out` (replacing an existing file only with force=True); otherwise removed."""
    out = Path(out)
    out_dir = out.parent if str(out.parent) else Path(".")
    if not out_dir.is_dir():
        raise error(f"output directory '{out_dir}' does not exist")
    if out.is_dir():
        raise error(f"output '{out}' is a directory; give a file name")
    try:
        mode = os.lstat(out).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "a device or other special file"
        raise error(f"output '{out}' is {what}, not a regular file; refusing to replace it (give a file name)")
    if out.exists() and not force:
        raise error(f"output '{out}' already exists; pass --force to overwrite it")
    remove_stale_partials(out)
    tmp = out_dir / f".{out.name}.{secrets.token_hex(6)}.partial"
    try:
        lock_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, as open() would
    except OSError as e:
        raise error(f"cannot create a file in '{out_dir}': {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)  # held until the file is published or removed
        except OSError:
            pass  # no locking on this filesystem: then no leftover here is ever taken for stale either
        yield tmp
        _fsync_path(tmp)
        if force:
            try:
                mode = os.lstat(out).st_mode
            except OSError:
                mode = None
            if mode is not None and not stat.S_ISREG(mode):  # appeared while writing
                raise error(f"output '{out}' became a non-regular file while writing; refusing to replace it")
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)  # atomic, and never clobbers a file that appeared meanwhile
            except FileExistsError:
                raise error(f"output '{out}' appeared while writing; pass --force to overwrite it") from None
            except OSError:  # no hard links here (some filesystems): fall back to a rename
                os.replace(tmp, out)
            else:
                os.unlink(tmp)
        _fsync_path(out_dir, directory=True)
    finally:
        try:
            if tmp.exists():
                tmp.unlink()
        finally:
            os.close(lock_fd)
