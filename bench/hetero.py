"""Heterogeneity emulation: per-rank slowdown factors, optionally changing over time.

``--slowdown 1,1,1,4`` makes rank 3 four times slower: after each compute
phase the rank sleeps ``(f - 1)`` times the compute time it just measured.
The injected time is charged to the ``delay`` phase, apart from real compute
(see ALGORITHMS.md, "Heterogeneity emulation").

``--slowdown-schedule`` changes factors during training, to test how a
strategy adapts: ``"20s:3=1,2=3"`` sets rank 3's factor to 1 and rank 2's to
3 twenty seconds after the start of training (the driver's start barrier);
several changes are separated by ``;``, e.g. ``"10s:3=1;25s:3=4,0=2"``.
Times take the unit ``s`` or ``ms`` (a bare number is seconds). A rank not
named in a change keeps its factor. Every malformed spec is a ``ValueError``
with a one-line message.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def _factor(text: str, flag: str, spec: str) -> float:
    """One slowdown factor (a finite number >= 1)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {spec!r}: factor {text.strip()!r} is not a number") from None
    if not (math.isfinite(value) and value >= 1.0):
        raise ValueError(f"{flag} {spec!r}: every factor must be >= 1, got {text.strip()}")
    return value


def parse_slowdown(spec: str | None, world_size: int) -> list[float]:
    """Factors per rank from ``"1,1,1,4"`` (``None`` or empty: all 1)."""
    if not spec:
        return [1.0] * world_size
    parts = spec.split(",")
    if len(parts) != world_size:
        raise ValueError(
            f"--slowdown {spec!r} has {len(parts)} factors but the job has {world_size} ranks"
        )
    return [_factor(p, "--slowdown", spec) for p in parts]


@dataclass(frozen=True)
class SlowdownChange:
    """At ``at_s`` seconds after the start of training, set ``factors[rank]``."""

    at_s: float
    factors: dict[int, float]


def _seconds(text: str, spec: str) -> float:
    """``"20s"``, ``"250ms"`` or ``"1.5"`` -> seconds (finite, >= 0)."""
    raw = text.strip()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 1e-3
    elif raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(
            f"--slowdown-schedule {spec!r}: time {text.strip()!r} is not like 20s or 500ms"
        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"--slowdown-schedule {spec!r}: time {text.strip()!r} must be >= 0")
    return value


def _assignment(text: str, spec: str, world_size: int) -> tuple[int, float]:
    """``"3=1.5"`` -> (rank 3, factor 1.5), with the rank checked against the world."""
    rank_text, sep, factor_text = text.partition("=")
    if not sep:
        raise ValueError(f"--slowdown-schedule {spec!r}: expected RANK=FACTOR, got {text!r}")
    try:
        rank = int(rank_text)
    except ValueError:
        raise ValueError(
            f"--slowdown-schedule {spec!r}: rank {rank_text.strip()!r} is not an integer"
        ) from None
    if not 0 <= rank < world_size:
        raise ValueError(
            f"--slowdown-schedule {spec!r}: rank {rank} out of range 0..{world_size - 1}"
        )
    return rank, _factor(factor_text, "--slowdown-schedule", spec)


def parse_slowdown_schedule(spec: str | None, world_size: int) -> list[SlowdownChange]:
    """Changes of ``"20s:3=1,2=3;40s:0=2"``, sorted by time (``None``/empty: none).

    Changes at the same time apply in the order written.
    """
    if not spec or not spec.strip():
        return []
    changes = []
    for item in spec.split(";"):
        when, sep, body = item.partition(":")
        if not sep or not body.strip():
            raise ValueError(
                f"--slowdown-schedule {spec!r}: expected TIME:RANK=FACTOR[,...], got {item!r}"
            )
        factors: dict[int, float] = {}
        for text in body.split(","):
            rank, factor = _assignment(text, spec, world_size)
            if rank in factors:
                raise ValueError(
                    f"--slowdown-schedule {spec!r}: rank {rank} set twice at {when.strip()}"
                )
            factors[rank] = factor
        changes.append(SlowdownChange(_seconds(when, spec), factors))
    return sorted(changes, key=lambda c: c.at_s)


def rank_timeline(
    base: float, changes: Sequence[SlowdownChange], rank: int
) -> list[tuple[float, float]]:
    """``[(from_s, factor), ...]`` of one rank: its base factor at 0, then its changes."""
    timeline = [(0.0, base)]
    for change in changes:
        if rank in change.factors:
            timeline.append((change.at_s, change.factors[rank]))
    return timeline


def factor_at(timeline: Sequence[tuple[float, float]], t: float) -> float:
    """The factor in force ``t`` seconds after the start (the last change at or before t)."""
    factor = timeline[0][1]
    for at_s, value in timeline:
        if at_s <= t:
            factor = value
    return factor


class Slowdown:
    """Sleeps ``(factor - 1) * compute_seconds`` after each compute phase.

    With a ``timeline`` (see :func:`rank_timeline`) the factor follows it,
    on a clock that :meth:`start` sets to zero (the driver calls it right
    after the barrier that starts training; before that, the first call
    starts it).
    """

    def __init__(
        self,
        factor: float = 1.0,
        timeline: Sequence[tuple[float, float]] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.timeline = list(timeline) if timeline else [(0.0, factor)]
        self.factor = self.timeline[0][1]
        self.clock = clock
        self._t0: float | None = None

    def start(self, elapsed: float = 0.0) -> None:
        """Start the schedule's clock at ``elapsed`` seconds (0 at the start of training;
        a resumed run passes the training time already done)."""
        self._t0 = self.clock() - elapsed

    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        if self._t0 is None:
            self.start()
        return self.clock() - self._t0  # type: ignore[operator]

    def current(self) -> float:
        """The factor in force now (updates :attr:`factor`)."""
        if len(self.timeline) > 1:
            self.factor = factor_at(self.timeline, self.elapsed())
        return self.factor

    def __call__(self, compute_seconds: float) -> float:
        """Inject the delay for one compute phase; returns the seconds slept."""
        extra = (self.current() - 1.0) * compute_seconds
        if extra <= 0:
            return 0.0
        start = time.perf_counter()
        time.sleep(extra)
        return time.perf_counter() - start


def make_slowdown(
    factors: Sequence[float], changes: Sequence[SlowdownChange], rank: int
) -> Slowdown | None:
    """This rank's :class:`Slowdown`, or ``None`` if it is never slowed down."""
    timeline = rank_timeline(factors[rank], changes, rank)
    if all(f == 1.0 for _, f in timeline):
        return None
    return Slowdown(timeline=timeline)
