"""The progress line of a long simulation: what SimGrid has done so far, on stderr.

A simulation at thousands of ranks spends minutes inside SimGrid (``syncbench
simulate --np 16384`` takes minutes on a laptop) and used to print nothing
until its summary. :class:`Ticker` is called after every communication phase
(``run.simulate``'s ``on_phase``) and whenever the strategy starts a step further
than any before (:class:`~.timeline.LocalTimes`), and, once the simulation has
run :data:`FIRST_S` seconds, prints at most one line every :data:`EVERY_S`
seconds: the time so far, the phases and flows SimGrid has simulated and their
rate, and, given the steps in all, the step reached and the time left.

The time left is an estimate only where one can be made honestly
(:func:`estimate_left`): phases are cached, so a new (uncached) phase costs
nearly all of the time and a step over cached phases nearly none, and how many
distinct phases a strategy needs is known only once it has asked for them.
So the estimate is the pace of the steps simulated since the last new phase,
times the steps left; until a step has been simulated after the last new phase
(and again after each new one) the line says "estimate unknown". A phase that
first appears later (a period that grows, another message size) makes the
estimate unknown again. Short simulations print nothing.
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


def estimate_left(since_s: float, steps_since: int, steps_left: int) -> float | None:
    """Seconds left: the pace of the ``steps_since`` steps simulated in the ``since_s``
    seconds since the last new phase, times ``steps_left``; None (unknown) before a step
    has been simulated since that phase (module docstring)."""
    if steps_since < 1 or since_s < 0:
        return None
    return since_s / steps_since * max(0, steps_left)


class Ticker:
    """Progress of one simulation (module docstring); call it with the ``Network`` and the
    step reached. ``total_steps``: the steps per rank in all (None: no step count or
    estimate in the line)."""

    def __init__(self, prog: str, what: str, stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, first_s: float = FIRST_S,
                 every_s: float = EVERY_S, total_steps: int | None = None) -> None:
        self.prog, self.what = prog, what
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.first_s, self.every_s = first_s, every_s
        self.total_steps = total_steps
        self.start = clock()
        self.last: float | None = None
        self.lines = 0
        self.steps = 0  # the furthest step reached
        #: Distinct phases seen, and (clock, steps) when the last new one was seen.
        self.phases = 0
        self.mark = (self.start, 0)

    def __call__(self, network: Any, steps: int | None = None) -> None:
        now = self.clock()
        if steps is not None and steps > self.steps:
            self.steps = steps
        if network.phases != self.phases:  # a new phase: the pace so far says nothing
            self.phases, self.mark = network.phases, (now, self.steps)
        elapsed = now - self.start
        if elapsed < self.first_s or (self.last is not None and now - self.last < self.every_s):
            return
        self.last = now
        self.lines += 1
        rate = network.flows / elapsed if elapsed > 0 else 0.0
        line = (f"{self.prog}: {self.what}: {_duration(elapsed)} so far, {network.phases} "
                f"phases and {network.flows:,} flows simulated ({rate:,.0f} flows/s)")
        if self.total_steps:
            left = estimate_left(now - self.mark[0], self.steps - self.mark[1],
                                 self.total_steps - self.steps)
            line += (f"; step {self.steps:,} of {self.total_steps:,}, "
                     + ("estimate unknown" if left is None else f"about {_duration(left)} left"))
        print(line, file=self.stream, flush=True)
