"""The communicator: MPI calls on slices of the flat buffers, timed per phase.

Methods are named after the MPI calls they make (as in ChainerMN's
communicators). Reductions are in place on contiguous NumPy slices of a
model's flat parameter or gradient buffer, so nothing is packed or copied.
Time inside calls that post or complete communication is charged to the
``comm`` phase; time blocked in ``Wait``/``Barrier`` to ``wait``.

RMA is not here: ASGD's one-sided windows (``windows.py``) are made and
locked by ASGD itself, which charges its epochs to the same timer's ``comm``
phase; on a GPU its buffers pass through pinned host mirrors.
:func:`make_communicator` chooses the communicator of a run (CPU or GPU).

Nonblocking collectives progress only while a rank is inside MPI (no
asynchronous progress thread by default): code that overlaps communication
with compute calls :meth:`Communicator.poll` between layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from syncbench.algorithms.timing import PhaseTimer


class Communicator:
    """Wraps an ``MPI.Comm`` and charges its calls to a :class:`PhaseTimer`."""

    def __init__(self, comm: MPI.Comm, timer: PhaseTimer | None = None) -> None:
        #: The wrapped ``MPI.Comm`` (a strategy's ``self.comm`` is this Communicator).
        self.mpi_comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timer = timer or PhaseTimer()
        self.outstanding: list[MPI.Request] = []

    # -- blocking collectives ------------------------------------------------
    def Allreduce(self, buf: Any) -> None:
        """In-place sum of ``buf`` over all ranks."""
        with self.timer.phase("comm"):
            self.mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        with self.timer.phase("comm"):
            self.mpi_comm.Bcast(buf, root=root)

    def Barrier(self) -> None:
        with self.timer.phase("wait"):
            self.mpi_comm.Barrier()

    # -- nonblocking ---------------------------------------------------------
    def Iallreduce(self, buf: Any) -> MPI.Request:
        """Start an in-place sum of ``buf``; the request is also tracked for :meth:`poll`."""
        with self.timer.phase("comm"):
            req = self.mpi_comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self.outstanding.append(req)
        return req

    def Test(self, req: MPI.Request) -> bool:
        """Whether ``req`` completed; a completed request is no longer tracked (as in Wait)."""
        with self.timer.phase("comm"):
            done = bool(req.Test())
        if done:
            self._forget(req)
        return done

    def Wait(self, req: MPI.Request) -> None:
        with self.timer.phase("wait"):
            req.Wait()
        self._forget(req)

    def Waitall(self, reqs: list[MPI.Request]) -> None:
        with self.timer.phase("wait"):
            MPI.Request.Waitall(reqs)
        for req in reqs:
            self._forget(req)

    def poll(self) -> None:
        """Drive progress of every outstanding request (one ``Testall``, cheap)."""
        if self.outstanding:
            with self.timer.phase("comm"):
                MPI.Request.Testall(self.outstanding)

    def _forget(self, req: MPI.Request) -> None:
        self.outstanding = [r for r in self.outstanding if r is not req]

    # -- small helpers -------------------------------------------------------
    def allreduce_scalar(self, value: float, op: MPI.Op = MPI.SUM) -> float:
        """Reduce one float (not timed: bookkeeping, not training traffic)."""
        buf = np.array([value], dtype=np.float64)
        self.mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=op)
        return float(buf[0])


def make_communicator(
    comm: MPI.Comm,
    timer: PhaseTimer | None,
    backend: Any,
    cuda_aware: bool = False,
    nonblocking_direct: bool = False,
) -> Communicator:
    """The communicator a run's strategy gets: this class on the CPU, the GPU one on a GPU.

    On a GPU (``backend.is_gpu``) it is a
    :class:`~syncbench.algorithms.device_buffers.DeviceCommunicator`, which
    hands device buffers to MPI (``cuda_aware``; ``nonblocking_direct`` for
    nonblocking collectives too) or stages them through pinned host memory.
    """
    if not backend.is_gpu:
        return Communicator(comm, timer)
    # lazy: device_buffers subclasses Communicator (an import cycle at the top)
    from syncbench.algorithms.device_buffers import DeviceCommunicator

    return DeviceCommunicator(comm, timer, backend, cuda_aware, nonblocking_direct)
