"""The command line's one voice: the program name and the format of its error and warning lines."""

from __future__ import annotations

import sys

PROG = "pyllamaspec"


def error_line(message: object) -> str:
    return f"{PROG}: error: {message}"


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)
