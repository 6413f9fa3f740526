"""Stopping a run at a step boundary when a signal arrives (SIGTERM, SIGINT, SIGUSR1).

Jobs on shared clusters are stopped by others all the time. Slurm sends
SIGTERM to every task at the time limit, on ``scancel`` and on preemption,
then SIGKILL after ``KillWait`` (30 s by default); ``--signal=USR1@60`` warns
every task a minute before the end. MPICH's Hydra ``mpiexec`` forwards all
three to every rank and exits with the highest exit status of its ranks. Open
MPI's ``prterun`` forwards SIGUSR1, but kills its ranks too soon after
forwarding SIGTERM or SIGINT for any clean ending (docs/DESIGN.md): send it
SIGUSR1, or signal the ranks themselves.

:class:`SignalCatcher` only records the first of those signals; another one
two seconds or more later ends the rank at once with 128 + its number (Ctrl-C
twice forces, even from inside a hung MPI call), one sooner is the first
delivered twice. The ranks then agree where to stop without adding a wait to
any strategy:

* Lock-step strategies (SSGD, OD-SGD) and round-based ones (Local SGD,
  Oscars) have *evaluation points*, where every rank is at the same step
  (:meth:`~syncbench.algorithms.base.Strategy.evaluation_point`). At each one
  every rank posts a vote and completes an older one (:class:`StopVote`), so
  all stop at the same point, or none does.
* Strategies without evaluation points (ASGD) end themselves
  (:meth:`~syncbench.algorithms.not_lock_step.NotLockStep.end_early`): the signalled rank
  hands out the rest of the sample budget at once, and every rank finds it
  exhausted at its next claim.

The driver (:class:`~syncbench.bench.train.hooks.StopOnSignal`) then writes a
checkpoint where the strategy has one, every rank's rows and the run file
(``complete=False``, ``stopped_by``), and exits with 128 + the signal's number.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where a vote is made: the scenario runner reads the names
    from mpi4py import MPI  # of the signals without starting MPI in its own process

#: The signals that stop a run at a step boundary.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: Evaluation points between posting a vote and completing it (:class:`StopVote`).
VOTE_LAG = 2


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; "" for 0."""
    if not signum:
        return ""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(name: str) -> int:
    """The shell's status of a process ended by signal ``name``: 128 + its number (0 for "")."""
    if not name:
        return 0
    return 128 + int(signal.Signals[name])


def stopped_by_status(returncode: int) -> str:
    """The stop signal an exit status names (128 + its number, as :func:`exit_status`
    makes it, or minus it for a process killed by it); "" otherwise."""
    for sig in STOP_SIGNALS:
        if returncode in (128 + int(sig), -int(sig)):
            return sig.name
    return ""


class SignalCatcher:
    """Records the first of :data:`STOP_SIGNALS` instead of dying of it.

    Python runs signal handlers in the main thread between bytecodes, so a rank
    blocked inside an MPI call would notice nothing until the call returns. The
    handlers here do nothing themselves: every delivery also writes its number
    to a wakeup pipe (``signal.set_wakeup_fd``, written by the C-level handler at
    once), which a daemon thread reads (mpi4py releases the GIL inside MPI
    calls). The first signal is recorded for the step loop. Another one at least
    :data:`FORCE_AFTER_S` later ends the process at once with 128 + its number,
    even from inside a hung MPI call; one sooner is the same stop delivered
    twice (a terminal's Ctrl-C reaches every rank and ``mpiexec`` forwards it
    again; Slurm signals the tasks while ``srun`` forwards) and is ignored.
    :meth:`restore` puts the previous handlers and wakeup fd back.
    """

    #: Seconds after the first signal before another one forces the process to end.
    FORCE_AFTER_S = 2.0

    def __init__(self) -> None:
        #: The first signal's number, 0 until one arrives.
        self.signum = 0
        self._first = 0.0
        self._previous: dict[signal.Signals, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._wakeup_before = -1

    def install(self) -> SignalCatcher:
        if threading.current_thread() is not threading.main_thread():
            return self
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._pipe = (read_end, write_end)
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._wakeup_before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_end,), name="syncbench-signals",
                         daemon=True).start()
        return self

    @staticmethod
    def _handle(_signum: int, _frame: FrameType | None) -> None:
        """Replaces the default action; the wakeup pipe carries the signal."""

    def _watch(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:  # restore() closed the pipe's write end
                os.close(read_end)
                return
            for signum in data:
                self.note(signum)

    def note(self, signum: int) -> None:
        """One delivery of ``signum`` (the watcher thread calls it)."""
        now = time.monotonic()
        if not self.signum:
            self.signum, self._first = signum, now
        elif now - self._first >= self.FORCE_AFTER_S:
            os.write(2, f"syncbench: {signal_name(signum)} again: ending this rank now, "
                        "without a checkpoint\n".encode())
            os._exit(128 + signum)

    def restore(self) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._wakeup_before)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        read_end, write_end = self._pipe
        self._pipe = None
        del read_end  # the watcher closes it at the end-of-file this close sends
        os.close(write_end)


class StopVote:
    """Agreement on a stop at evaluation points, with no wait of its own (module doc).

    At each point :meth:`post` posts an 8-byte ``Iallreduce(MAX)`` of this rank's
    signal on a duplicate of the run's communicator, and completes the vote it
    posted ``lag`` points earlier (``StrategyTraits.stop_vote_lag``: 1 where every
    step or round ends with a blocking reduction, else 2). Every rank has posted
    that older vote by then (the strategy's own reductions in between required
    every rank to get past it), so the wait is only the vote's delivery, and
    every rank reads the same result at the same point.

    Each :meth:`post` is collective in the nonblocking sense: every rank posts
    the same number of votes, at the same evaluation points.
    """

    def __init__(self, comm: MPI.Comm, lag: int = VOTE_LAG) -> None:
        from mpi4py import MPI  # lazy: it starts MPI; the runner reads only the signal names

        self._max = MPI.MAX
        self.comm = comm.Dup()
        self.lag = lag
        self._pending: deque[tuple[MPI.Request, np.ndarray, np.ndarray]] = deque()

    def post(self, signum: int) -> int:
        """Post this point's vote; the signal agreed ``lag`` points ago (0: go on)."""
        send = np.array([signum], dtype=np.int64)
        recv = np.zeros(1, dtype=np.int64)
        self._pending.append((self.comm.Iallreduce(send, recv, op=self._max), send, recv))
        if len(self._pending) <= self.lag:
            return 0
        return self._complete_oldest()

    def _complete_oldest(self) -> int:
        request, _send, recv = self._pending.popleft()
        request.Wait()
        return int(recv[0])

    def drain(self) -> int:
        """Complete every posted vote (every rank posted as many); the largest signal."""
        agreed = 0
        while self._pending:
            agreed = max(agreed, self._complete_oldest())
        return agreed

    def free(self) -> None:
        self.drain()
        self.comm.Free()
