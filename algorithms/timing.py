"""Per-step phase timers.

A step's wall time is split into the phases of the run-file schema
(``data``, ``compute``, ``comm``, ``wait``, ``update``, ``delay``, ``codec``). Phases
nest: entering ``comm`` inside ``compute`` (a ``Test`` poll between layers)
pauses ``compute``, so every second is charged to exactly one phase and the
phases of a step add up to its duration. The clock is ``time.monotonic``
(``CLOCK_MONOTONIC``), the run's clock, on which the driver stamps ``t_start``.

Each phase also has its CPU time (the training thread's ``CLOCK_THREAD_CPUTIME_ID``,
which the scheduler accounts to the nanosecond, not at the tick): on a node held to a CPU
quota a phase's wall holds the quota's freezes, and its CPU time is what the rank's own
CPU did apart from them. The step keeps three sums (:attr:`PhaseTimer.compute_cpu_s`;
:attr:`PhaseTimer.sync_cpu_s`, the ``comm`` and ``wait`` phases, where a wait in MPI
polls; :attr:`PhaseTimer.step_cpu_s`, every phase).

Reading that clock is not free of effect at a quota: to answer it the kernel brings the
running task's runtime up to date (``task_sched_runtime`` calls ``update_curr``), which
is where CFS bandwidth control checks the quota, so a process over its quota is frozen
on the read rather than at the next tick (``python -m syncbench.bench.micro.quota_wakes
--waker cpuclock`` inside a node at speed 0.5: a spin alone ran 2.48 ms and was frozen
3.53, a share of 0.41; reading the clock every 1 ms or less, 1.00 and 1.00, a share of
0.50: docs/RESULTS.md, "The CPU clock's reads and the quota"). So the clock is read at
every phase boundary, and on the side that keeps a freeze inside a phase: before the
wall clock where a phase is left or paused (the freeze is the left phase's), after it
where a phase is entered with none running (the freeze is the entered phase's). No
freeze falls between phases, where no phase would hold it.

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

#: Phases whose CPU time is summed as :attr:`PhaseTimer.sync_cpu_s`.
SYNC_PHASES = frozenset({"comm", "wait"})

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
        #: CPU seconds of this thread in each phase this step (nested phases apart).
        self.cpu_totals: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._stack: list[str] = []
        self._mark = 0.0
        self._cpu_mark = 0.0
        self.step = 0
        self.fault: tuple[int, str, str] | None = None
        #: Waits for the device's queued work (the GPU backend's ``synchronize``); None on
        #: the CPU, where work is done when it returns.
        self.device_sync: Callable[[], None] | None = None

    def reset(self) -> None:
        """Start a new step: zero every phase."""
        for name in PHASES:
            self.totals[name] = 0.0
            self.cpu_totals[name] = 0.0
        self._stack.clear()

    @property
    def compute_cpu_s(self) -> float:
        """CPU seconds of this thread in ``compute`` this step (its nested phases out)."""
        return self.cpu_totals["compute"]

    @property
    def sync_cpu_s(self) -> float:
        """CPU seconds of this thread in ``comm`` and ``wait`` this step."""
        return sum(self.cpu_totals[name] for name in SYNC_PHASES)

    @property
    def step_cpu_s(self) -> float:
        """CPU seconds of this thread in every phase of this step."""
        return sum(self.cpu_totals.values())

    def _charge(self, now: float) -> None:
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        self._mark = now

    def _boundary(self, from_none: bool) -> None:
        """A phase boundary: charge the wall clock and the CPU clock since the last one to
        the innermost phase running until now. The CPU clock is read first (a freeze it
        brings on is the phase's being left), but where a phase is entered with none
        running (``from_none``), last (the freeze is the entered phase's)."""
        if from_none:
            self._charge(time.monotonic())
            self._cpu_mark = time.thread_time()
            return
        cpu = time.thread_time()
        self._charge(time.monotonic())
        self.cpu_totals[self._stack[-1]] += cpu - self._cpu_mark  # a phase runs: not from none
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
        self._boundary(from_none=not self._stack)
        self._stack.append(name)
        try:
            yield
            if (self.device_sync is not None and name in SYNCED_PHASES
                    and self._stack.count(name) == 1):
                self.device_sync()  # the phase's kernels run inside it
        finally:
            self._boundary(from_none=False)
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
