"""The progress line of a long simulation: what SimGrid has done so far, on stderr.

A simulation at thousands of ranks spends minutes inside SimGrid (``syncbench
simulate --np 16384`` takes minutes on a laptop) and used to print nothing
until its summary. :class:`Ticker` is called after every communication phase
(``run.simulate``'s ``on_phase``) and, once the simulation has run
:data:`FIRST_S` seconds, prints at most one line every :data:`EVERY_S`
seconds: the time so far, the phases and flows SimGrid has simulated and their
rate. It gives no time left: phases are cached, so the first steps cost
nearly all of it, and how many distinct phases a strategy needs is known only
once it has asked for them. Short simulations print nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

#: Seconds of silence before the first line (a simulation that ends sooner prints none).
FIRST_S = 5.0
#: Seconds between two lines.
EVERY_S = 10.0


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``: a duration for a person."""
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Ticker:
    """Progress of one simulation (module docstring); call it with the ``Network``."""

    def __init__(self, prog: str, what: str, stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, first_s: float = FIRST_S,
                 every_s: float = EVERY_S) -> None:
        self.prog, self.what = prog, what
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.first_s, self.every_s = first_s, every_s
        self.start = clock()
        self.last: float | None = None
        self.lines = 0

    def __call__(self, network: Any) -> None:
        now = self.clock()
        elapsed = now - self.start
        if elapsed < self.first_s or (self.last is not None and now - self.last < self.every_s):
            return
        self.last = now
        self.lines += 1
        rate = network.flows / elapsed if elapsed > 0 else 0.0
        print(f"{self.prog}: {self.what}: {_duration(elapsed)} so far, {network.phases} "
              f"phases and {network.flows:,} flows simulated ({rate:,.0f} flows/s)",
              file=self.stream, flush=True)
