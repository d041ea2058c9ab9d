"""Writers (convert, quantize, synth, model downloads) write a temp file beside the output and publish it
with a rename, so a failed or interrupted run leaves nothing behind and never clobbers an existing file."""

from __future__ import annotations

import os
import secrets
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
    if out.exists() and not force:
        raise error(f"output '{out}' already exists; pass --force to overwrite it")
    tmp = out_dir / f".{out.name}.{secrets.token_hex(6)}.partial"
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # 0o666 & ~umask, as open() would
    except OSError as e:
        raise error(f"cannot create a file in '{out_dir}': {e.strerror or e}") from None
    try:
        yield tmp
        _fsync_path(tmp)
        if force:
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
        if tmp.exists():
            tmp.unlink()
