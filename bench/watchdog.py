"""The hang guard (``--timeout SECONDS``).

Each rank writes a heartbeat (steps done, the phase it is in, the time) at
most once a second. A daemon thread watches the main loop: if the rank has
made no progress for ``timeout`` seconds (stuck in a collective, a wait, an
RMA epoch), it writes a fresh heartbeat, gives the other ranks a moment to
do the same, and names the ranks that had not arrived: those with fewer
steps than the furthest rank, those outside MPI (not in a ``comm`` or
``wait`` phase while the others wait for them), and those with no heartbeat
at all. Then it prints one line and calls ``MPI_Abort``, so the job ends
instead of burning its allocation.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from mpi4py import MPI

from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.runtime import ABORT_GRACE_S

IN_MPI = ("comm", "wait")


class Watchdog:
    """Heartbeats plus a thread that aborts the job after ``timeout`` s without progress."""

    def __init__(self, folder: Path, rank: int, world_size: int, timeout: float,
                 timer: PhaseTimer | None = None) -> None:
        self.folder, self.rank, self.size, self.timeout = folder, rank, world_size, timeout
        self.timer = timer
        self.folder.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.last_progress = time.monotonic()
        self._last_beat = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="syncbench-watchdog",
                                        daemon=True)
        self._write(0, "start")

    def start(self) -> None:
        self.last_progress = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def beat(self, step: int) -> None:
        """Record progress (called after every step; writes at most once a second)."""
        self.step = step
        now = time.monotonic()
        self.last_progress = now
        if now - self._last_beat >= 1.0:
            self._last_beat = now
            self._write(step, "step")

    def _write(self, step: int, where: str) -> None:
        path = self.folder / f"heartbeat-{self.rank:05d}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{step} {where or '-'} {time.time():.3f}\n")
        tmp.replace(path)

    def heartbeats(self) -> dict[int, tuple[int, str]]:
        """Every rank's last readable (steps done, phase)."""
        beats = {}
        for rank in range(self.size):
            try:
                step, where, _ = (self.folder / f"heartbeat-{rank:05d}").read_text().split()
                beats[rank] = (int(step), where)
            except (OSError, ValueError):
                continue
        return beats

    def laggards(self) -> list[int]:
        """Ranks that had not arrived where the others wait."""
        beats = self.heartbeats()
        missing = [r for r in range(self.size) if r not in beats]
        if not beats:
            return missing
        furthest = max(step for step, _ in beats.values())
        behind = [r for r, (step, where) in beats.items()
                  if step < furthest or where not in IN_MPI]
        return sorted(missing + behind)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            idle = time.monotonic() - self.last_progress
            if idle < self.timeout:
                continue
            where = self.timer.current if self.timer is not None else ""
            self._write(self.step, where)
            time.sleep(1.5)  # let the other ranks' guards write theirs
            if self._stop.is_set():
                return
            lag = self.laggards()
            names = ", ".join(map(str, lag)) if lag else "none (every rank is blocked in MPI)"
            print(f"syncbench: rank {self.rank}: no progress for {idle:.0f} s (--timeout "
                  f"{self.timeout:g}) in step {self.step}; ranks that had not arrived: {names}; "
                  "aborting the job", file=sys.stderr, flush=True)
            time.sleep(ABORT_GRACE_S)
            MPI.COMM_WORLD.Abort(3)
            return
