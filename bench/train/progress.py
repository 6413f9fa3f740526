"""The progress line on rank 0: percent, samples/s, loss, ETA.

Quiet when stdout is not a terminal unless asked (``--progress always``);
then it prints a plain line every few seconds instead of redrawing one.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Throttled progress reporting for a loop with a known amount of work."""

    def __init__(self, total: int, mode: str = "auto", stream: TextIO | None = None,
                 unit: str = "samples") -> None:
        self.stream = stream or sys.stdout
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = mode == "always" or (mode == "auto" and tty)
        self.redraw = tty
        self.total = max(total, 1)
        self.unit = unit
        self.start = time.perf_counter()
        self._last = 0.0
        self._interval = 0.25 if tty else 5.0

    def update(self, done: int, loss: float, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        pct = 100.0 * min(done, self.total) / self.total
        line = (f"[{pct:5.1f}%] {done}/{self.total} {self.unit}  {rate:9.1f} {self.unit}/s  "
                f"loss {loss:7.4f}  ETA {eta:6.1f}s")
        if self.redraw:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.redraw:
            self.stream.write("\n")
            self.stream.flush()
