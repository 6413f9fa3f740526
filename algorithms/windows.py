"""MPI RMA windows that hold ASGD's global parameters and its update counters.

Two windows, both made with ``MPI.Win.Allocate`` (the MPI library owns the
memory, so it may place it in shared memory and do accesses without the target;
Open MPI's passive-target Accumulate on a ``Create``'d window waits for it):

* :class:`ParamWindow` holds the flat parameter vector in contiguous shards
  (:func:`shard_layout`): one per rank (``sharded``) or all on rank 0
  (``single``, ``dedicated``). An access is one passive-target epoch that locks
  every owner SHARED, posts ``Get_accumulate(NO_OP)`` (a read) or
  ``Accumulate(SUM)`` on every shard, then unlocks them all, so the shards move
  concurrently. Accumulate-type calls are element-wise atomic with each other
  (MPI-3.1 section 11.7.1): concurrent pushes are never lost, and a read sees
  each element before or after a push (Hogwild-style, which asynchronous SGD
  tolerates); a plain ``Get`` racing an ``Accumulate`` is undefined.
* :class:`Counters` holds a few int64 counters on rank 0, changed only with
  ``Fetch_and_op`` (atomic: ``SUM`` to add, ``NO_OP`` to read).

Every lock is SHARED, so ``MPI_MODE_NOCHECK`` is a valid assertion
(``lock_assert``): without it MPICH sends a lock request that the target grants
only inside MPI; with it, on ``Allocate``'d windows on one node, MPICH and Open
MPI complete the accesses without the target (docs/RESULTS.md, "ASGD's pull and
push latencies"). Methods named after one MPI call are capitalised as in mpi4py
(``Get_accumulate``, ``Accumulate``, ``Flush``, ``Fetch_and_op``, ``Free``); the
lowercase ones (``pull``, ``push``, ``gather``, ``fetch_add``, ``read``) are
whole operations. The info hints ``accumulate_ordering=none`` and
``accumulate_ops=same_op_no_op`` say that only SUM and NO_OP are used, unordered.
With an :class:`~syncbench.algorithms.communicator.EventSink` (``--events on``) every
epoch of the parameter window is an event: ``rma_push`` if it accumulates,
else ``rma_pull``, from before its locks to after its unlocks; every epoch on the
counters is an ``rma_counter`` event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.algorithms.communicator import EventSink
from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.timing import PhaseTimer

LAYOUTS = ("sharded", "single", "dedicated")


@dataclass(frozen=True)
class Shard:
    """Elements ``[lo, hi)`` of the flat vector, hosted by rank ``owner`` at offset 0."""

    owner: int
    lo: int
    hi: int


def shard_layout(n: int, size: int, layout: str) -> list[Shard]:
    """The non-empty shards of an ``n``-element vector over ``size`` ranks.

    ``sharded``: rank r hosts ``[r*n//size, (r+1)*n//size)``; ``single`` and
    ``dedicated``: rank 0 hosts everything.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if layout != "sharded":
        return [Shard(0, 0, n)]
    bounds = [r * n // size for r in range(size + 1)]
    return [Shard(r, bounds[r], bounds[r + 1]) for r in range(size) if bounds[r + 1] > bounds[r]]


def _info() -> MPI.Info:
    info = MPI.Info.Create()
    info.Set("accumulate_ordering", "none")
    info.Set("accumulate_ops", "same_op_no_op")
    return info


def _allocate(comm: MPI.Comm, count: int, dtype: np.dtype) -> tuple[MPI.Win, np.ndarray]:
    """``Win.Allocate`` of ``count`` elements here; returns the window and a local view."""
    info = _info()
    try:
        win = MPI.Win.Allocate(count * dtype.itemsize, dtype.itemsize, info, comm)
    finally:
        info.Free()
    local = np.frombuffer(win.tomemory(), dtype=dtype) if count else np.zeros(0, dtype)
    return win, local


def _read_own(win: MPI.Win, rank: int, local: np.ndarray, lock_assert: int) -> np.ndarray:
    """A copy of this rank's own window memory ``local`` (in a SHARED lock epoch)."""
    win.Lock(rank, MPI.LOCK_SHARED, lock_assert)
    out = local.copy()
    win.Unlock(rank)
    return out


def _write_own(win: MPI.Win, rank: int, local: np.ndarray, values: np.ndarray) -> None:
    """``local[...] = values`` in this rank's own window memory (an EXCLUSIVE lock epoch)."""
    win.Lock(rank, MPI.LOCK_EXCLUSIVE)
    local[...] = values
    win.Unlock(rank)


def _record(events: EventSink | None, timer: PhaseTimer | None, kind: str, nbytes: int,
            t_post: float) -> None:
    """One epoch posted at ``t_post`` and done now, as a ``kind`` event of ``timer``'s
    step (nothing without a sink that records)."""
    if events is not None and events.recording:
        events.post(kind, nbytes, timer.step if timer is not None else 0, t_post,
                    t_done=time.monotonic())


class ParamWindow:
    """A flat vector spread over the ranks of ``comm`` as :class:`Shard` s (collective)."""

    def __init__(
        self, comm: MPI.Comm, n: int, dtype: np.dtype, layout: str, lock_assert: int,
        events: EventSink | None = None, timer: PhaseTimer | None = None,
    ) -> None:
        #: Where the epochs are recorded (and the timer whose step they belong to).
        self.events, self.timer = events, timer
        self._epoch_kind, self._epoch_bytes = "rma_pull", 0
        self.comm = comm
        self.rank = comm.Get_rank()
        self.n = n
        self.dtype = np.dtype(dtype)
        self.shards = shard_layout(n, comm.Get_size(), layout)
        self.lock_assert = lock_assert
        self._mpi_type = MPI.Datatype.fromcode(self.dtype.char)
        mine = [s for s in self.shards if s.owner == self.rank]
        self.local_shard: Shard | None = mine[0] if mine else None
        count = mine[0].hi - mine[0].lo if mine else 0
        self.win, self.local = _allocate(comm, count, self.dtype)

    def set_local(self, full: np.ndarray) -> None:
        """Write this rank's shard of ``full`` into its own window (before training)."""
        if self.local_shard is None:
            return
        self.set_shard(full[self.local_shard.lo : self.local_shard.hi])

    def set_shard(self, values: np.ndarray) -> None:
        """Write this rank's own shard (``read_local``'s inverse; before training)."""
        if self.local_shard is None:
            return
        _write_own(self.win, self.rank, self.local, values)

    def read_local(self) -> np.ndarray:
        """A copy of this rank's shard (empty when it hosts none)."""
        if self.local_shard is None:
            return np.zeros(0, self.dtype)
        return _read_own(self.win, self.rank, self.local, self.lock_assert)

    @contextmanager
    def epoch(self) -> Iterator[None]:
        """One passive-target epoch: SHARED-lock every owner, then unlock every owner.

        ``Unlock`` completes the epoch's operations at origin and target.
        """
        t_post = time.monotonic() if self.events is not None else 0.0
        self._epoch_kind, self._epoch_bytes = "rma_pull", 0
        for shard in self.shards:
            self.win.Lock(shard.owner, MPI.LOCK_SHARED, self.lock_assert)
        try:
            yield
        finally:
            for shard in self.shards:
                self.win.Unlock(shard.owner)
            _record(self.events, self.timer, self._epoch_kind, self._epoch_bytes, t_post)

    def Get_accumulate(self, out: np.ndarray) -> None:
        """Post an atomic read of every shard into ``out`` (inside :meth:`epoch`).

        ``Get_accumulate`` with ``NO_OP``: the origin buffer is ignored (none
        is passed), the target's elements land in ``out``.
        """
        self._epoch_bytes += out.nbytes
        for shard in self.shards:
            count = shard.hi - shard.lo
            self.win.Get_accumulate([None, 0, self._mpi_type], out[shard.lo : shard.hi],
                                    shard.owner, target=(0, count, self._mpi_type),
                                    op=MPI.NO_OP)

    def Accumulate(self, delta: np.ndarray) -> None:
        """Post ``window += delta`` on every shard (``Accumulate`` SUM, inside :meth:`epoch`)."""
        self._epoch_kind = "rma_push"
        self._epoch_bytes += delta.nbytes
        for shard in self.shards:
            self.win.Accumulate(delta[shard.lo : shard.hi], shard.owner, op=MPI.SUM)

    def Flush(self) -> None:
        """Complete the posted operations of the current epoch (``Win.Flush`` per owner)."""
        for shard in self.shards:
            self.win.Flush(shard.owner)

    def pull(self, out: np.ndarray) -> None:
        """``out = window`` (one epoch of atomic reads)."""
        with self.epoch():
            self.Get_accumulate(out)

    def push(self, delta: np.ndarray) -> None:
        """``window += delta`` (one epoch of Accumulates)."""
        with self.epoch():
            self.Accumulate(delta)

    def gather(self) -> np.ndarray:
        """The whole vector on every rank (collective: local shards + ``Allgatherv``)."""
        local = self.read_local()
        counts = [0] * self.comm.Get_size()
        for shard in self.shards:
            counts[shard.owner] = shard.hi - shard.lo
        full = np.empty(self.n, self.dtype)
        self.comm.Allgatherv(local, [full, counts])
        return full

    def Free(self) -> None:
        """``Win.Free`` (collective)."""
        self.win.Free()


class Counters:
    """``count`` int64 counters hosted by rank 0 of ``comm`` (collective).

    With an :class:`~syncbench.algorithms.communicator.EventSink` (``--events on``) each
    epoch is recorded as an ``rma_counter`` event: over a transport without hardware
    atomics its request and reply ride the connections that carry the window's epochs,
    so when they ran is what says what they waited for."""

    def __init__(self, comm: MPI.Comm, count: int, lock_assert: int,
                 events: EventSink | None = None, timer: PhaseTimer | None = None) -> None:
        #: Where the epochs are recorded (and the timer whose step they belong to).
        self.events, self.timer = events, timer
        self.rank = comm.Get_rank()
        self.lock_assert = lock_assert
        self.win, self.local = _allocate(comm, count if self.rank == 0 else 0, np.dtype(np.int64))
        self.set_local(np.zeros(count, np.int64))
        self._origin = np.zeros(count, np.int64)
        self._result = np.zeros(count, np.int64)

    def read_local(self) -> np.ndarray:
        """A copy of the counters on rank 0 (empty elsewhere)."""
        if self.rank != 0:
            return np.zeros(0, np.int64)
        return _read_own(self.win, 0, self.local, self.lock_assert)

    def set_local(self, values: np.ndarray) -> None:
        """Set the counters on rank 0 (zeroing them when made, restoring a checkpoint; a
        no-op elsewhere)."""
        if self.rank != 0:
            return
        _write_own(self.win, 0, self.local, values)

    def Fetch_and_op(self, ops: list[tuple[int, int, MPI.Op]]) -> list[int]:
        """Apply each ``(index, value, op)`` atomically, in one epoch; values before each op.

        ``op`` is ``MPI.SUM`` (add ``value``) or ``MPI.NO_OP`` (read). Each
        index may appear once.
        """
        t_post = time.monotonic() if self.events is not None else 0.0
        self.win.Lock(0, MPI.LOCK_SHARED, self.lock_assert)
        for index, value, op in ops:
            self._origin[index] = value
            self.win.Fetch_and_op(
                self._origin[index : index + 1], self._result[index : index + 1], 0, index, op=op
            )
        self.win.Unlock(0)
        _record(self.events, self.timer, "rma_counter", 8 * len(ops), t_post)
        return [int(self._result[index]) for index, _, _ in ops]

    def fetch_add(self, index: int, value: int = 1) -> int:
        """``counter[index] += value``; returns the value before the addition."""
        return self.Fetch_and_op([(index, value, MPI.SUM)])[0]

    def read(self, index: int) -> int:
        """The current value of counter ``index`` (``Fetch_and_op`` NO_OP)."""
        return self.Fetch_and_op([(index, 0, MPI.NO_OP)])[0]

    def Free(self) -> None:
        """``Win.Free`` (collective)."""
        self.win.Free()


#: Least time between two progress polls inside compute (Open MPI yields the core in every
#: poll when oversubscribed, so polling every layer is costly).
POLL_MIN_GAP_S = 5e-4


class ProgressPoll:
    """Enter MPI at most every :data:`POLL_MIN_GAP_S` (an ``Iprobe``, timed as ``comm``),
    so that one-sided operations targeting this rank's windows progress while it
    computes: the ``on_grads_ready`` and ``poll`` hooks of ASGD's and AD-PSGD's compute."""

    def __init__(self, mpi_comm: Any, timer: PhaseTimer) -> None:
        self.mpi_comm, self.timer = mpi_comm, timer
        self.last = 0.0

    def __call__(self, _offset: int = 0) -> None:
        if time.perf_counter() - self.last < POLL_MIN_GAP_S:
            return
        with self.timer.phase("comm"):
            self.mpi_comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        self.last = time.perf_counter()
