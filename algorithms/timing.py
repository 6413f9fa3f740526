"""Per-step phase timers.

A step's wall time is split into the phases of the run-file schema
(``data``, ``compute``, ``comm``, ``wait``, ``update``, ``delay``, ``codec``). Phases
nest: entering ``comm`` inside ``compute`` (a ``Test`` poll between layers)
pauses ``compute``, so every second is charged to exactly one phase and the
phases of a step add up to its duration. The clock is ``time.monotonic``
(``CLOCK_MONOTONIC``), the run's clock, on which the driver stamps ``t_start``.

The ``compute`` phase also has its CPU time (:attr:`PhaseTimer.compute_cpu_s`, the
training thread's ``CLOCK_THREAD_CPUTIME_ID``, which the scheduler accounts to the
nanosecond, not at the tick): on a node held to a CPU quota a step's compute holds the
quota's freezes, and its CPU time is what the rank's own CPU did apart from them. So do
the ``comm`` and ``wait`` phases together (:attr:`PhaseTimer.sync_cpu_s`: how much of a
wait in MPI the rank spent on the CPU, polling, which a quota charges as it charges
compute) and the whole step (:meth:`PhaseTimer.step_cpu_s`, from :meth:`PhaseTimer.reset`).

On the GPU, kernels are queued and run later: :attr:`PhaseTimer.device_sync`
(the backend's stream synchronization, set by the driver on the GPU backend;
None on the CPU) is called at the end of every outermost :data:`SYNCED_PHASES`
phase, inside it, so the ``update`` phase holds the time its kernels ran and
the next step's ``data`` phase does not (``codec`` likewise: its copy of a decoded
mean back to the device). Every strategy's update goes through
:meth:`PhaseTimer.phase`, so none needs its own synchronization.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from syncbench.algorithms.traits import PHASES

#: Phases whose CPU time is kept together as :attr:`PhaseTimer.sync_cpu_s`.
SYNC_PHASES = frozenset({"comm", "wait"})

#: Phases whose CPU time is kept (a thread-clock read on entering and leaving each).
CPU_PHASES = SYNC_PHASES | {"compute"}

#: Phases that end with :attr:`PhaseTimer.device_sync` (their kernels finish inside them).
SYNCED_PHASES = frozenset({"update", "codec"})


class InjectedFault(RuntimeError):
    """Raised on purpose by ``--inject-fault`` to test that failures end the job."""


class PhaseTimer:
    """Accumulates seconds per phase for the current step, with nesting.

    ``fault = (step, phase, mode)`` makes entering ``phase`` during step
    ``step`` raise :class:`InjectedFault` (``mode="raise"``) or block forever
    (``mode="hang"``): fault injection for the reliability tests, firing
    wherever that phase runs (e.g. with a request in flight).
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        #: CPU seconds of this thread inside ``compute`` this step (its nested phases out).
        self.compute_cpu_s = 0.0
        #: CPU seconds of this thread inside ``comm`` and ``wait`` this step.
        self.sync_cpu_s = 0.0
        self._stack: list[str] = []
        self._mark = 0.0
        self._cpu_mark = 0.0
        self._step_cpu_mark = time.thread_time()
        self.step = 0
        self.fault: tuple[int, str, str] | None = None
        #: Waits for the device's queued work (the GPU backend's ``synchronize``); None on
        #: the CPU, where work is done when it returns.
        self.device_sync: Callable[[], None] | None = None

    def reset(self) -> None:
        """Start a new step: zero every phase and mark the step's CPU clock."""
        for name in PHASES:
            self.totals[name] = 0.0
        self.compute_cpu_s = 0.0
        self.sync_cpu_s = 0.0
        self._stack.clear()
        self._step_cpu_mark = time.thread_time()

    def step_cpu_s(self) -> float:
        """CPU seconds of this thread since :meth:`reset` (the step so far, every phase and
        the time between them)."""
        return time.thread_time() - self._step_cpu_mark

    def _charge(self, now: float) -> None:
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        self._mark = now

    def _switch(self, leaving: str, entering: str) -> None:
        """Charge the thread's CPU time when a phase of :data:`CPU_PHASES` is left or
        entered (read only then: a thread-clock read is a system call)."""
        if leaving in CPU_PHASES or entering in CPU_PHASES:
            cpu = time.thread_time()
            if leaving == "compute":
                self.compute_cpu_s += cpu - self._cpu_mark
            elif leaving in SYNC_PHASES:
                self.sync_cpu_s += cpu - self._cpu_mark
            self._cpu_mark = cpu

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to ``name`` (pausing any outer phase)."""
        if self.fault is not None and self.fault[:2] == (self.step, name):
            mode, self.fault = self.fault[2], None
            if mode == "hang":  # never returns: for the hang-guard tests
                while True:
                    time.sleep(3600)
            raise InjectedFault(f"injected fault in phase {name!r} of step {self.step}")
        self._charge(time.monotonic())
        self._switch(self.current, name)
        self._stack.append(name)
        try:
            yield
            if (self.device_sync is not None and name in SYNCED_PHASES
                    and self._stack.count(name) == 1):
                self.device_sync()  # the phase's kernels run inside it
        finally:
            self._charge(time.monotonic())
            # the CPU clock is read as soon after the wall clock on leaving as on entering,
            # so a phase's CPU time is never its wall time plus the timer's own work
            self._switch(name, self._stack[-2] if len(self._stack) > 1 else "")
            self._stack.pop()

    @property
    def current(self) -> str:
        """The innermost phase running now ("" between phases)."""
        return self._stack[-1] if self._stack else ""

    def add(self, name: str, seconds: float) -> None:
        """Charge ``seconds`` measured elsewhere to ``name``."""
        self.totals[name] += seconds


class NullTimer(PhaseTimer):
    """A timer for code paths that do not record (tests, evaluation)."""
