"""Heterogeneity emulation: per-rank slowdown factors, optionally changing over time.

``--slowdown 1,1,1,4`` makes rank 3 four times slower: after each compute
phase the rank spends ``(f - 1)`` times a *reference* compute time, the
running median of its last :data:`REFERENCE_WINDOW` compute phases (one
step's noise does not move it). The injected time is charged to the
``delay`` phase, apart from real compute (see ALGORITHMS.md,
"Heterogeneity emulation"). ``--slowdown-schedule`` changes factors during
training, to test how a strategy adapts (:func:`parse_slowdown_schedule`).

How the rank spends it (``--slowdown-mode``) decides whether the emulated
straggler gives anything away to the other ranks:

* ``work``: repeats forward/backward passes of a private copy of the model
  (:class:`ModelWork`), occupying its core, caches and memory bandwidth as a
  slower processor would; the training trajectory is untouched.
* ``spin``: busy-waits to the deadline (occupies the core, not the caches).
* ``sleep``: sleeps to the deadline; it frees the core, so it is fair only
  when every rank has a node to itself.
* ``auto`` (the default): ``work`` when two or more ranks share a node,
  ``sleep`` only when none do (:func:`resolve_mode`).

In every mode time spent past a deadline is taken off the next delay only
(:class:`Slowdown`). During the delay the rank keeps driving MPI progress of
its outstanding requests (:attr:`Slowdown.progress`): a slower processor runs
the same layers and polls between them, and MPI progresses nonblocking
collectives only inside MPI calls, so a delay that never enters MPI would
stall the other ranks' reductions behind the straggler.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Values of ``--slowdown-mode``; ``auto`` resolves to one of the others.
SLOWDOWN_MODES = ("auto", "work", "spin", "sleep")
#: Compute phases in the running median the delay is scaled from.
REFERENCE_WINDOW = 31
#: ``spin`` and ``sleep`` call the progress hook at most this often (seconds).
PROGRESS_INTERVAL_S = 2e-4


def parse_factor(text: str, flag: str, spec: str) -> float:
    """One slowdown factor (a finite number >= 1); ``flag`` and ``spec`` name it in errors."""
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
    return [parse_factor(p, "--slowdown", spec) for p in parts]


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
    return rank, parse_factor(factor_text, "--slowdown-schedule", spec)


def parse_slowdown_schedule(spec: str | None, world_size: int) -> list[SlowdownChange]:
    """Changes of ``"20s:3=1,2=3;40s:0=2"``, sorted by time (``None``/empty: none).

    ``"20s:3=1,2=3"`` sets rank 3's factor to 1 and rank 2's to 3 twenty seconds
    after the start of training (the driver's start barrier); several changes
    are separated by ``;``, e.g. ``"10s:3=1;25s:3=4,0=2"``. Times take the unit
    ``s`` or ``ms`` (a bare number is seconds). A rank not named in a change
    keeps its factor. Changes at the same time apply in the order written.
    Every malformed spec is a ``ValueError`` with a one-line message.
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


def resolve_mode(mode: str, ranks_per_node: int) -> str:
    """The mode ``auto`` stands for: ``work`` if some node runs 2+ ranks, else ``sleep``.

    ``ranks_per_node`` is the largest number of ranks on one node (ranks with
    one host name, the run file's ``ranks_per_node`` at its largest), so every
    rank of a run resolves to the same mode; other modes pass through.
    """
    if mode not in SLOWDOWN_MODES:
        raise ValueError(f"--slowdown-mode must be one of {', '.join(SLOWDOWN_MODES)}, "
                         f"got {mode!r}")
    if mode != "auto":
        return mode
    return "work" if ranks_per_node > 1 else "sleep"


class _Deadline(Exception):
    """Raised between layers of a ``work`` pass once its deadline has passed."""


class ModelWork:
    """``work`` mode: forward/backward passes of a private model copy, up to a deadline.

    ``model`` must be a separate instance of the training model (same
    architecture, backend and dtype, its own flat buffers): the rank does
    the same kind of work as its compute phase without touching the real
    parameters, gradients, optimizer state or any generator the run uses.
    The scratch batch (``batch_size`` inputs and labels) comes from a
    private seeded generator. A pass is cut short between layers once the
    deadline has passed (GPU work is synchronized before each check), so a
    deadline is overshot by at most one layer.
    """

    def __init__(self, model: Any, batch_size: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        backend = model.backend
        if hasattr(model, "scratch_batch"):  # a language model: token windows
            x, y = model.scratch_batch(rng, batch_size)
        else:
            x = rng.standard_normal((batch_size, *model.input_shape))
            y = rng.integers(0, model.num_classes, size=batch_size)
        self.model = model
        self.x = backend.asarray(x, dtype=model.dtype)
        self.y = backend.asarray(y)
        self._sync = backend.synchronize if backend.is_gpu else None
        self.passes = 0
        #: Called between layers (MPI progress), as the training compute does.
        self.progress: Callable[[], None] | None = None

    def __call__(self, deadline: float, clock: Callable[[], float] = time.perf_counter) -> None:
        """Work until ``clock() >= deadline``."""
        sync, progress = self._sync, self.progress

        def check(_offset: int | None = None) -> None:
            if sync is not None:
                sync()
            if progress is not None:
                progress()
            if clock() >= deadline:
                raise _Deadline

        try:
            while True:
                check()
                self.model.loss_and_grad(self.x, self.y, on_grads_ready=check, poll=check)
                self.passes += 1
        except _Deadline:
            pass


def spin_until(
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[], None] | None = None,
) -> None:
    """``spin`` mode: busy-wait until ``clock() >= deadline``.

    ``progress`` is called about every :data:`PROGRESS_INTERVAL_S`.
    """
    next_poll = clock()
    while (now := clock()) < deadline:
        if progress is not None and now >= next_poll:
            progress()
            next_poll = now + PROGRESS_INTERVAL_S


def sleep_until(
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[], None] | None = None,
) -> None:
    """``sleep`` mode: sleep until ``clock() >= deadline`` (again if woken early).

    With ``progress`` the sleep is cut into slices of :data:`PROGRESS_INTERVAL_S`
    with a call in between.
    """
    while True:
        if progress is not None:
            progress()
        left = deadline - clock()
        if left <= 0:
            return
        time.sleep(min(left, PROGRESS_INTERVAL_S) if progress is not None else left)


class Slowdown:
    """Spends ``(factor - 1) * reference`` after each compute phase, ``mode`` deciding how.

    The reference is the running median of this rank's last
    :data:`REFERENCE_WINDOW` compute phases (including the current one).
    Time spent past a step's deadline (a sleep's wake-up latency, the tail of a
    pass in ``work``) is a debt taken off the next delay, so the mean delay
    matches the asked-for one. Only off the next: the part of a long overshoot
    (the rank preempted by another job across its deadline) that the next delay
    cannot absorb is forgiven, or the straggler would run at full speed for
    several steps to pay it back, a burstiness no slow processor has.

    With a ``timeline`` (see :func:`rank_timeline`) the factor follows it,
    on a clock that :meth:`start` sets to zero (the driver calls it right
    after the barrier that starts training; before that, the first call
    starts it). ``clock`` drives only the schedule; delays are measured
    with ``time.perf_counter``.
    """

    def __init__(
        self,
        factor: float = 1.0,
        timeline: Sequence[tuple[float, float]] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        mode: str = "sleep",
        work: Callable[[float], None] | None = None,
        window: int = REFERENCE_WINDOW,
    ) -> None:
        if mode not in SLOWDOWN_MODES[1:]:
            raise ValueError(f"Slowdown mode must be work, spin or sleep, got {mode!r}")
        if mode == "work" and work is None:
            raise ValueError("Slowdown mode 'work' needs a work callable (see ModelWork)")
        self.timeline = list(timeline) if timeline else [(0.0, factor)]
        self.factor = self.timeline[0][1]
        self.clock = clock
        self.mode = mode
        self._work = work
        #: MPI progress hook called during the delay (set by the driver); see the module doc.
        self.progress: Callable[[], None] | None = None
        self._recent: deque[float] = deque(maxlen=max(1, window))
        self._t0: float | None = None
        #: Seconds the last delay overshot its deadline, taken off the next one.
        self.debt = 0.0
        self._reference_sum = 0.0
        self._reference_count = 0

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

    def reference(self) -> float:
        """The running median of the recent compute phases (0 before the first)."""
        return float(statistics.median(self._recent)) if self._recent else 0.0

    @property
    def mean_reference(self) -> float:
        """Mean of the references the delays were scaled from (NaN before any delay)."""
        if not self._reference_count:
            return float("nan")
        return self._reference_sum / self._reference_count

    def __call__(self, compute_seconds: float) -> float:
        """Inject the delay for one compute phase; returns the seconds spent."""
        self._recent.append(float(compute_seconds))
        factor = self.current()
        if factor <= 1.0:
            self.debt = 0.0
            return 0.0
        reference = self.reference()
        self._reference_sum += reference
        self._reference_count += 1
        target = (factor - 1.0) * reference - self.debt
        self.debt = 0.0  # repaid now; what this step cannot absorb is forgiven
        if target <= 0:
            return 0.0
        start = time.perf_counter()
        deadline = start + target
        if self.mode == "work":
            if hasattr(self._work, "progress"):
                self._work.progress = self.progress  # type: ignore[union-attr]
            self._work(deadline)  # type: ignore[misc]
        elif self.mode == "spin":
            spin_until(deadline, progress=self.progress)
        else:
            sleep_until(deadline, progress=self.progress)
        spent = time.perf_counter() - start
        self.debt = max(0.0, spent - target)
        return spent


def make_slowdown(
    factors: Sequence[float],
    changes: Sequence[SlowdownChange],
    rank: int,
    mode: str = "sleep",
    work: Callable[[], Callable[[float], None]] | None = None,
) -> Slowdown | None:
    """This rank's :class:`Slowdown`, or ``None`` if it is never slowed down.

    ``mode`` is already resolved (:func:`resolve_mode`); for ``work``,
    ``work()`` builds the work callable (only on ranks that are slowed).
    """
    timeline = rank_timeline(factors[rank], changes, rank)
    if all(f == 1.0 for _, f in timeline):
        return None
    if mode == "work" and work is None:
        raise ValueError("--slowdown-mode work needs a model to repeat")
    return Slowdown(timeline=timeline, mode=mode, work=work() if mode == "work" else None)
