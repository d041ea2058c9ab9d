"""Text read from files the user names (chat templates): only regular files, only up to a size cap, only
UTF-8. A device (/dev/zero), a FIFO or a directory is refused before a byte is read, so it cannot block or
fill memory."""

from __future__ import annotations

import os
import stat

from .errors import ConfigError

MAX_TEMPLATE_BYTES = 1 * 2**20  # the largest chat templates in the wild are ~20 KB


def read_text_file(path: str | os.PathLike, what: str, max_bytes: int, flag: str = "") -> str:
    """The UTF-8 text of the regular file `path`, at most max_bytes long; ConfigError naming `what` otherwise."""
    where = f"{what} {os.fsdecode(path)!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError(f"{where} is {kind}: {flag or 'give'} a text file")
        if st.st_size > max_bytes:
            raise ConfigError(f"{where} is {st.st_size} bytes, more than the {max_bytes} a {what} may have")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise ConfigError(f"{where} is more than the {max_bytes} bytes a {what} may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text (byte {e.start})") from None


def check_text(text: str, what: str) -> str:
    """`text` when it is valid Unicode; ConfigError naming `what` when it holds bytes that were not UTF-8 (the
    command line keeps them as lone surrogates) or a lone surrogate."""
    encode_text(text, what)
    return text


def encode_text(text: str, what: str) -> bytes:
    """UTF-8 of `text`; a lone surrogate (bytes that were not UTF-8 on the command line, or an unpaired
    \\ud800-\\udfff escape) is a ConfigError naming `what` and where, not a UnicodeEncodeError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        if 0xDC80 <= ord(bad) <= 0xDCFF:  # how Python keeps a byte that was not UTF-8 (surrogateescape)
            detail = f"byte 0x{ord(bad) - 0xDC00:02x} at character {e.start} is not UTF-8"
        else:
            detail = f"a lone surrogate U+{ord(bad):04X} at character {e.start} is not text"
        raise ConfigError(f"{what} is not valid Unicode: {detail}") from None
