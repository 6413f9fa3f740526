"""The hang guard (``--timeout SECONDS``).

Each rank keeps its progress (steps done) in memory; every rank's guard
answers the others' probes with it and its phase (``reach``), and, where the
run has a parts folder, writes it there as a heartbeat file at most once a
second. A daemon thread watches the main loop: after ``timeout`` seconds
without progress (stuck in a collective, a wait, an RMA epoch, or behind a
network that no longer carries its messages) it

1. writes a fresh heartbeat and flushes its rows to the parts folder (safe
   beside the blocked main thread), so ``syncbench recover`` keeps every step;
2. lets the other guards do the same, then probes the other guards and the
   launcher's host (``reach``): nodes that cannot be reached (a network
   fault), ranks that are gone, and what each rank that proves who it is says
   it does;
3. names the ranks that had not arrived: fewer steps than the furthest rank,
   outside MPI (not in ``comm`` or ``wait``) while the others wait, or not
   heard from at all;
4. prints ONE line for the job and ends it.

A run without a parts folder writes no file: its heartbeats travel only in the
probes' answers, so nothing is left behind in ``/tmp`` on any node, whatever
ends the job.

Rank 0 prints; another rank waits :data:`DEFER_S` longer and prints only if
no lower rank answers its probe, so the job prints once, from the launcher's
side. A rank that reaches neither the launcher's host nor any other node is
cut off: it prints nothing (its output could not leave the node) and ends.

Ending the job: ``MPI_Abort``, then ``os._exit`` :data:`EXIT_AFTER_S` later
whatever it did (MPICH's returns after telling its proxy, which cannot reach
``mpiexec`` from a cut-off node). Under Open MPI, with a node unreachable,
``MPI_Abort`` would leave ``prterun`` waiting for that node's daemon without
end (PRRTE has no daemon timeout, and TCP with data queued on a dead link
gives up after Linux's tcp_retries2, some 15 minutes): the printing rank kills
its node's PRRTE daemon instead, which ``prterun`` takes for a failed daemon,
ending the job at once. That daemon is recorded when the run starts (PID,
name, start time: ``Process``) and killed only if its PID still names
that very process (through a pidfd, so the check and the kill see the same
process); otherwise the guard says so and calls ``MPI_Abort``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpi4py import MPI

from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.files import write_atomic
from syncbench.bench.mpi import reach
from syncbench.bench.mpi.runtime import ABORT_GRACE_S
from syncbench.bench.processes import Process, signal_if_same

IN_MPI = ("comm", "wait")
#: Seconds the guards give each other to write their heartbeats and rows.
SETTLE_S = 1.5
#: Seconds a rank other than 0 waits, after its own probe, for a lower rank to end the job.
DEFER_S = 3.0
#: Longest a rank other than 0 waits for a lower rank that answers but does not end the job.
MAX_DEFER_S = 30.0
#: Seconds from ending the job to ``os._exit`` if the process is still there.
EXIT_AFTER_S = 3.0
#: Exit status of a rank the guard ended (``MPI_Abort``'s error code too).
EXIT_STATUS = 3
#: Seconds between two heartbeat files of a rank that makes progress.
BEAT_EVERY_S = 1.0


@dataclass
class Survey:
    """What one rank's probes found."""

    #: ``reach.ANSWERS`` / ``SILENT`` / ``REFUSED`` / ``UNREACHABLE`` per probed rank.
    status: dict[int, str] = field(default_factory=dict)
    #: The launcher's host: the same words, None if unknown.
    launcher: str | None = None
    #: (steps done, phase) of each rank that proved who it is.
    beats: dict[int, tuple[int, str]] = field(default_factory=dict)

    def answering(self, ranks: Iterable[int]) -> bool:
        return any(self.status.get(r) == reach.ANSWERS for r in ranks)


def open_guard(comm: MPI.Comm, host: str, folder: Path | None, timeout: float,
               timer: PhaseTimer | None = None,
               flush: Callable[[], None] | None = None) -> Watchdog:
    """Every rank's hang guard (collective): the job's key drawn by rank 0 and sent over
    MPI, this rank's listener (on the addresses it publishes and loopback), every rank's
    :class:`~syncbench.bench.mpi.reach.Peer`. ``folder``: where heartbeat files go (the
    parts folder); None writes none."""
    rank = comm.Get_rank()
    key = comm.bcast(reach.Identity.new_key() if rank == 0 else None, root=0)
    guard = Watchdog(folder, rank, comm.Get_size(), timeout, timer, flush, key=key)
    try:
        guard.listener = reach.Listener(reach.Identity(key, rank), state=guard.state)
    except OSError:  # no probes of this rank: the others find it unreachable
        guard.listener = None
    listener = guard.listener
    guard.peers = comm.allgather(reach.Peer(
        rank, host, listener.addresses if listener is not None else (),
        listener.port if listener is not None else 0))
    return guard


class Watchdog:
    """Progress plus a thread that ends the job after ``timeout`` s without progress.

    ``folder`` holds the heartbeat files (None: none are written); ``flush`` writes
    this rank's rows to the parts folder (called from the guard's thread); ``peers``
    are every rank's :class:`~syncbench.bench.mpi.reach.Peer` (gathered at the
    start), ``listener`` this rank's; ``key`` the job's, which every rank's listener
    proves it holds (:func:`open_guard` sets these up).
    """

    def __init__(self, folder: Path | None, rank: int, world_size: int, timeout: float,
                 timer: PhaseTimer | None = None, flush: Callable[[], None] | None = None,
                 peers: list[reach.Peer] | None = None,
                 listener: reach.Listener | None = None, key: bytes | None = None) -> None:
        self.folder, self.rank, self.size, self.timeout = folder, rank, world_size, timeout
        self.timer = timer
        self.flush = flush
        self.peers = peers or []
        self.listener = listener
        self.key = key or reach.Identity.new_key()
        self.chain = reach.agents()
        self.launcher = reach.launcher_addresses(self.chain)
        root = reach.prrte_root(self.chain)
        #: The PRRTE daemon a network fault ends, as it is now (its PID may be reused later).
        self.daemon = Process.of(root) if root is not None else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.last_progress = time.monotonic()
        self._beat_lock = threading.Lock()  # one heartbeat file written at a time
        self._written: tuple[int, float] = (-1, 0.0)  # step and time of the last file
        self._furthest = -1  # the furthest step a heartbeat file has said
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="syncbench-watchdog",
                                        daemon=True)
        self._write(0, "start")

    def start(self) -> None:
        self.last_progress = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.listener is not None:
            self.listener.close()

    def beat(self, step: int) -> None:
        """Record progress (called after every step; no I/O: the guard's thread writes
        the heartbeat file)."""
        self.step = step
        self.last_progress = time.monotonic()

    def phase(self) -> str:
        """What the main thread does now (``comm``, ``wait``, ...; ``-`` between phases)."""
        return (self.timer.current if self.timer is not None else "") or "-"

    def state(self) -> str:
        """``STEPS PHASE``: what this rank's listener answers a probe with."""
        return f"{self.step} {self.phase()}"

    def _write(self, step: int, where: str) -> None:
        """This rank's heartbeat file, whole (a unique temporary name, renamed over it);
        one writer at a time (the main thread at the start, then the guard's). Never a
        step below one a file already said: a writer that took ``self.step`` before
        another wrote a later one does not set the file back (:meth:`laggards` would take
        the rank for one behind)."""
        if self.folder is None:
            return
        with self._beat_lock:
            step = self._furthest = max(step, self._furthest)
            write_atomic(self.folder / f"heartbeat-{self.rank:05d}",
                         f"{step} {where or '-'} {time.time():.3f}\n".encode())
            self._written = (step, time.monotonic())

    def _beat_file(self) -> None:
        """A heartbeat file for new progress, at most every :data:`BEAT_EVERY_S`; a file
        that cannot be written is skipped (the rows' flush reports a full disk)."""
        step, when = self._written
        if self.folder is None or self.step == step or time.monotonic() - when < BEAT_EVERY_S:
            return
        try:
            self._write(self.step, "step")
        except OSError:
            pass

    def heartbeats(self) -> dict[int, tuple[int, str]]:
        """Every rank's last readable heartbeat file (steps done, phase)."""
        beats: dict[int, tuple[int, str]] = {}
        if self.folder is None:
            return beats
        for rank in range(self.size):
            try:
                step, where, _ = (self.folder / f"heartbeat-{rank:05d}").read_text().split()
                beats[rank] = (int(step), where)
            except (OSError, ValueError):
                continue
        return beats

    def laggards(self, survey: Survey | None = None) -> list[int]:
        """Ranks that had not arrived where the others wait: by the heartbeat files, what
        the ranks answered (``survey``) and this rank's own progress."""
        beats = self.heartbeats()
        if survey is not None:
            beats.update(survey.beats)
        beats.setdefault(self.rank, (self.step, self.phase()))
        missing = [r for r in range(self.size) if r not in beats]
        furthest = max(step for step, _ in beats.values())
        behind = [r for r, (step, where) in beats.items()
                  if step < furthest or where not in IN_MPI]
        return sorted(missing + behind)

    # -- the guard's thread ---------------------------------------------------
    def _idle(self) -> float:
        return time.monotonic() - self.last_progress

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            idle = self._idle()
            if idle < self.timeout:
                self._beat_file()
                continue
            try:
                if self._fire(idle):
                    return
            except Exception:  # the guard must end the job, never print a traceback
                self._end(network_fault=False)
                return

    def _fire(self, idle: float) -> bool:
        """Handle one timeout; False if progress resumed meanwhile (keep watching)."""
        try:
            self._write(self.step, self.phase())
        except OSError:
            pass  # the probes still carry this rank's progress
        self._keep_rows()
        time.sleep(SETTLE_S)  # let the other ranks' guards write theirs
        if self._stop.is_set():
            return True
        if self._idle() < self.timeout:
            return False
        survey = self.survey(r for r in range(self.size) if r != self.rank)
        others = [p.rank for p in self.peers if p.host != self.host]
        if survey.launcher == reach.UNREACHABLE and not survey.answering(others):
            self._end(network_fault=True, cut_off=True)  # no line: it could not leave the node
            return True
        if self.rank != 0:
            waited = self._wait_for_lower(survey)
            if waited is None:
                return False
            survey = waited
        print(self.describe(idle, survey), file=sys.stderr, flush=True)
        time.sleep(ABORT_GRACE_S)
        self._end(network_fault=bool(self.unreachable_nodes(survey)))
        return True

    def _wait_for_lower(self, survey: Survey) -> Survey | None:
        """A rank other than 0: wait while a lower rank answers (it ends the job);
        the survey to print once none does, None if progress resumed."""
        lower = range(self.rank)
        started = time.monotonic()
        due = started + DEFER_S
        while True:
            while time.monotonic() < due:
                if self._stop.wait(0.25) or self._idle() < self.timeout:
                    return None
            if not survey.answering(lower) or time.monotonic() - started > MAX_DEFER_S:
                return survey
            fresh = self.survey(lower)
            survey.status.update(fresh.status)
            survey.beats.update(fresh.beats)
            due = time.monotonic() + 1.0

    @property
    def host(self) -> str:
        return self.peers[self.rank].host if self.rank < len(self.peers) else ""

    def survey(self, ranks: Iterable[int]) -> Survey:
        """Probe the guards of ``ranks`` (each must prove it holds the job's key and is
        that rank) and the launcher's host, all at once."""
        if self.rank >= len(self.peers):
            return Survey()
        me = self.peers[self.rank]
        wanted = [self.peers[r] for r in ranks if r < len(self.peers) and self.peers[r].port]
        where: dict = dict(reach.targets(me, wanted, self.peers))
        if self.launcher:
            where["launcher"] = [(a, reach.CLOSED_PORT) for a in self.launcher]
        identities = {p.rank: reach.Identity(self.key, p.rank) for p in wanted}
        found, states = reach.probe_states(where, identities=identities)
        launcher = found.pop("launcher", None)
        beats = {}
        for rank, text in states.items():
            try:
                step, where_now = text.split()
                beats[rank] = (int(step), where_now)
            except ValueError:
                continue
        return Survey(status=found, launcher=launcher, beats=beats)

    def unreachable_nodes(self, survey: Survey) -> dict[str, list[int]]:
        """Nodes none of whose probed ranks answered: host -> ranks."""
        by_host: dict[str, list[int]] = {}
        for rank in survey.status:
            by_host.setdefault(self.peers[rank].host, []).append(rank)
        return {host: sorted(ranks) for host, ranks in sorted(by_host.items())
                if host != self.host
                and all(survey.status[r] == reach.UNREACHABLE for r in ranks)}

    def describe(self, idle: float, survey: Survey) -> str:
        """The line the job prints."""
        down = self.unreachable_nodes(survey)
        cut = {r for ranks in down.values() for r in ranks}  # their heartbeats say nothing
        lag = [r for r in self.laggards(survey) if r not in cut]
        names = ", ".join(map(str, lag)) if lag else "none (every rank is blocked in MPI)"
        parts = [f"syncbench: rank {self.rank}: no progress for {idle:.0f} s (--timeout "
                 f"{self.timeout:g}) in step {self.step}", f"ranks that had not arrived: {names}"]
        if down:
            nodes = ", ".join(f"{host} ({_ranks(ranks)})" for host, ranks in down.items())
            parts.append(f"node{'s' if len(down) > 1 else ''} {nodes} cannot be reached from "
                         f"{self.host} (rank {self.rank}): a network fault")
        silent = sorted(r for r, s in survey.status.items()
                        if s in (reach.UNREACHABLE, reach.SILENT)
                        and self.peers[r].host not in down)
        if silent:
            parts.append(f"{_ranks(silent)} on reachable nodes do not answer")
        gone = sorted(r for r, s in survey.status.items() if s == reach.REFUSED)
        if gone:
            hosts = ", ".join(sorted({self.peers[r].host for r in gone}))
            parts.append(f"{_ranks(gone)} on {hosts} ended (the node answers, the rank does not)")
        parts.append("aborting the job")
        return "; ".join(parts)

    def _keep_rows(self) -> None:
        """This rank's rows to the parts folder before anything can end the process."""
        if self.flush is None:
            return
        try:
            self.flush()
        except Exception:  # a full disk must not keep the guard from ending the job
            pass

    def _end(self, network_fault: bool, cut_off: bool = False) -> None:
        """End the job (see the module docstring); never returns normally."""
        threading.Thread(target=_exit_later, args=(EXIT_AFTER_S,), daemon=True).start()
        if network_fault and not cut_off and self.daemon is not None:
            if kill_if_same(self.daemon):
                os._exit(EXIT_STATUS)
            print(f"syncbench: rank {self.rank}: PID {self.daemon.pid} is no longer the PRRTE "
                  f"daemon {self.daemon.comm!r} recorded at the start: not killed",
                  file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(EXIT_STATUS)


def kill_if_same(process: Process) -> bool:
    """SIGKILL ``process`` if its PID still names it (same name and start time), through
    a pidfd so that a PID reused in between is not hit (:mod:`syncbench.bench.processes`).
    False if it is gone or another process now has its PID."""
    return signal_if_same(process, signal.SIGKILL)


def _exit_later(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(EXIT_STATUS)


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 1, 4-7``."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ranks
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    spans = [f"{first}-{last}" if last != first else f"{first}" for first, last in runs]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(spans)}"
