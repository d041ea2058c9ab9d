"""Progress of long tool runs (model fetches, quantize, convert, bench) on stderr, never on stdout.

On a terminal one line is redrawn in place; otherwise (a log file, a pipe, CI) a plain line is written at each
quarter of the work and one at the end, so logs stay short. Nothing is written when disabled.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

MIB = 2 ** 20


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class Progress:
    """Work of a known total (or of an unknown one: total=None), reported as it advances.

    unit "B" shows bytes as MiB; any other unit is a count ("12/40 tensors"). Use as a context manager, or call
    close() at the end; update() takes the absolute amount done, advance() adds to it.
    """

    REDRAW_S = 0.1
    QUARTERS = (25, 50, 75)

    def __init__(self, label: str, total: int | None = None, *, unit: str = "", enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and _is_tty(self.stream)
        self.done = 0
        self.note = ""
        self._t0 = time.monotonic()
        self._last_draw = 0.0
        self._width = 0
        self._quarters_left = list(self.QUARTERS)
        self._closed = False

    # -- reporting --------------------------------------------------------------------------

    def update(self, done: int, total: int | None = None, note: str | None = None) -> None:
        if total is not None:
            self.total = total
        self.done = max(self.done, done)  # never backwards
        if note is not None:
            self.note = note
        if not self.enabled or self._closed:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= self.REDRAW_S:
                self._last_draw = now
                self._draw(self._line())
            return
        pct = self.percent
        if pct is None:
            return
        passed = [q for q in self._quarters_left if pct >= q]
        if passed and pct < 100:
            self._quarters_left = [q for q in self._quarters_left if q > pct]
            self._write(self._line() + "\n")

    def advance(self, n: int = 1, note: str | None = None) -> None:
        self.update(self.done + n, note=note)

    def close(self, message: str | None = None) -> None:
        """End the report: the final state (or message) on its own line."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self.tty:
            self._draw(message if message is not None else self._line())
            self._write("\n")
        elif message is not None or self.done:
            self._write((message if message is not None else self._line()) + "\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self.tty and not self._closed:
            self._closed = True
            self._write("\n")  # leave the partial line; the error goes below it

    # -- formatting -------------------------------------------------------------------------

    @property
    def percent(self) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.total)

    def _amount(self, n: int) -> str:
        return f"{n / MIB:.1f}" if self.unit == "B" else str(n)

    def _line(self) -> str:
        unit = "MiB" if self.unit == "B" else self.unit
        unit = f" {unit}" if unit else ""
        if self.total:
            text = f"{self.label}: {self.percent:.0f}% ({self._amount(self.done)}/{self._amount(self.total)}{unit})"
        else:
            text = f"{self.label}: {self._amount(self.done)}{unit}"
        elapsed = time.monotonic() - self._t0
        if self.unit == "B" and elapsed > 1 and self.done:
            text += f" {self.done / MIB / elapsed:.1f} MiB/s"
        if self.note:
            text += f" {self.note}"
        return text

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self._write("\r" + text + " " * pad)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must not fail the work itself
            self.enabled = False
