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

With an :class:`EventSink` (``--events on``: ``bench/train/events.py``'s log) every
call is also recorded where it is made, for every strategy at once: its post,
the completion the rank saw, its bytes and its blocked time. To see each
request complete, ``poll`` then tests with ``Testsome`` and ``Waitall`` waits
with ``Waitsome`` until all are done (each return's blocked time goes to the
requests it completed); without a log the calls are ``Testall`` and ``Waitall``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.timing import PhaseTimer


class EventSink(Protocol):
    """Where calls are recorded: ``kind`` is a name of the run file's event kinds
    (``allreduce``, ``iallreduce``, ``bcast``, ``barrier``, ``rma_pull``, ``rma_push``,
    ``ineighbor_allgather``, ``ialltoallv``, ``iallgather``, ``rma_counter``); ``key``
    identifies a nonblocking call's request until :meth:`complete`."""

    #: False before time 0 of the run (calls then are not recorded).
    recording: bool

    def post(self, kind: str, nbytes: int, step: int, t_post: float, key: int | None = None,
             t_done: float = float("nan"), wait_s: float = 0.0) -> int: ...

    def complete(self, key: int, t_done: float, wait_s: float = 0.0) -> None: ...


class Communicator:
    """Wraps an ``MPI.Comm`` and charges its calls to a :class:`PhaseTimer`."""

    def __init__(self, comm: MPI.Comm, timer: PhaseTimer | None = None,
                 events: EventSink | None = None) -> None:
        #: The wrapped ``MPI.Comm`` (a strategy's ``self.comm`` is this Communicator).
        self.mpi_comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timer = timer or PhaseTimer()
        self.outstanding: list[MPI.Request] = []
        #: The calls' events (``--events on``), else None.
        self.events = events

    # -- events ----------------------------------------------------------------
    def _recording(self) -> EventSink | None:
        events = self.events
        return events if events is not None and events.recording else None

    def _blocking(self, kind: str, nbytes: int, t_post: float, wait: bool = False) -> None:
        """Record a blocking call posted at ``t_post`` that returned now."""
        events = self._recording()
        if events is not None:
            now = time.monotonic()
            events.post(kind, nbytes, self.timer.step, t_post, t_done=now,
                        wait_s=now - t_post if wait else 0.0)

    def _posted(self, req: Any, nbytes: int, t_post: float, kind: str = "iallreduce") -> None:
        """Record a nonblocking call posted at ``t_post`` (completed by ``_seen``)."""
        events = self._recording()
        if events is not None:
            events.post(kind, nbytes, self.timer.step, t_post, key=id(req))

    def _seen(self, reqs: list[Any], t_enter: float | None,
              done: list[int] | None = None) -> None:
        """Requests ``reqs`` (those at ``done`` only) seen complete now, by a Wait entered at
        ``t_enter`` (its blocked time shared by them) or a test (``t_enter`` None)."""
        events = self.events
        if events is None:
            return
        now = time.monotonic()
        picked = reqs if done is None else [reqs[i] for i in done]
        share = (now - t_enter) / len(picked) if picked and t_enter is not None else 0.0
        for req in picked:
            events.complete(id(req), now, share)

    def _clock(self) -> float:
        return time.monotonic() if self.events is not None else 0.0

    # -- blocking collectives ------------------------------------------------
    def Allreduce(self, buf: Any) -> None:
        """In-place sum of ``buf`` over all ranks."""
        t = self._clock()
        with self.timer.phase("comm"):
            self.mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        if self.events is not None:
            self._blocking("allreduce", buf.nbytes, t)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        t = self._clock()
        with self.timer.phase("comm"):
            self.mpi_comm.Bcast(buf, root=root)
        if self.events is not None:
            self._blocking("bcast", buf.nbytes, t)

    def Barrier(self) -> None:
        t = self._clock()
        with self.timer.phase("wait"):
            self.mpi_comm.Barrier()
        if self.events is not None:
            self._blocking("barrier", 0, t, wait=True)

    # -- nonblocking ---------------------------------------------------------
    def Iallreduce(self, buf: Any) -> MPI.Request:
        """Start an in-place sum of ``buf``; the request is also tracked for :meth:`poll`."""
        t = self._clock()
        with self.timer.phase("comm"):
            req = self.mpi_comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self.outstanding.append(req)
        if self.events is not None:
            self._posted(req, buf.nbytes, t)
        return req

    def Ineighbor_allgather(self, graph: MPI.Distgraphcomm, sendbuf: Any, recvbuf: Any,
                            destinations: int) -> MPI.Request:
        """Start gathering ``sendbuf`` from each source of ``graph`` into the rows of
        ``recvbuf`` (in the order of the sources, MPI-3.1 section 7.6), while sending it to
        each of its ``destinations``; tracked for :meth:`poll`. Its event's bytes are what
        this rank sends (``sendbuf`` once per destination)."""
        t = self._clock()
        with self.timer.phase("comm"):
            req = graph.Ineighbor_allgather(sendbuf, recvbuf)
        self.outstanding.append(req)
        if self.events is not None:
            self._posted(req, sendbuf.nbytes * destinations, t, "ineighbor_allgather")
        return req

    def Ialltoallv(self, send: Any, send_counts: Any, recv: Any,
                   recv_counts: Any) -> MPI.Request:
        """Start sending byte segments of ``send`` to each rank in rank order and receiving
        ``recv``'s from each (the exchange of a hand-written reduce-scatter; counts in
        bytes, segments packed in order); tracked for :meth:`poll`."""
        t = self._clock()
        sdispl, rdispl = _displacements(send_counts), _displacements(recv_counts)
        with self.timer.phase("comm"):
            req = self.mpi_comm.Ialltoallv([_bytes(send), (send_counts, sdispl), MPI.BYTE],
                                           [_bytes(recv), (recv_counts, rdispl), MPI.BYTE])
        return self._track(req, "ialltoallv", send.nbytes, t)

    def Iallgatherv(self, send: Any, recv: Any, recv_counts: Any) -> MPI.Request:
        """Start gathering every rank's ``send`` (``recv_counts`` bytes each, rank order)
        into ``recv`` on every rank; tracked for :meth:`poll`."""
        t = self._clock()
        with self.timer.phase("comm"):
            req = self.mpi_comm.Iallgatherv(
                [_bytes(send), MPI.BYTE],
                [_bytes(recv), (recv_counts, _displacements(recv_counts)), MPI.BYTE])
        return self._track(req, "iallgather", send.nbytes, t)

    def Iallgather(self, send: Any, recv: Any) -> MPI.Request:
        """Start gathering every rank's ``send`` (as many bytes on each) into ``recv``."""
        t = self._clock()
        with self.timer.phase("comm"):
            req = self.mpi_comm.Iallgather([_bytes(send), MPI.BYTE], [_bytes(recv), MPI.BYTE])
        return self._track(req, "iallgather", send.nbytes, t)

    def _track(self, req: MPI.Request, kind: str, nbytes: int, t_post: float) -> MPI.Request:
        self.outstanding.append(req)
        if self.events is not None:
            self._posted(req, nbytes, t_post, kind)
        return req

    def Test(self, req: MPI.Request) -> bool:
        """Whether ``req`` completed; a completed request is no longer tracked (as in Wait)."""
        with self.timer.phase("comm"):
            done = bool(req.Test())
        if done:
            self._forget(req)
            if self.events is not None:
                self._seen([req], None)
        return done

    def Wait(self, req: MPI.Request) -> None:
        t = self._clock()
        with self.timer.phase("wait"):
            req.Wait()
        self._forget(req)
        if self.events is not None:
            self._seen([req], t)

    def Waitall(self, reqs: list[MPI.Request]) -> None:
        with self.timer.phase("wait"):
            if self.events is None:
                MPI.Request.Waitall(reqs)
            else:
                self._wait_each(reqs)
        for req in reqs:
            self._forget(req)

    def _wait_each(self, reqs: list[MPI.Request]) -> None:
        """``Waitall`` as ``Waitsome`` calls, each completion stamped as it returns."""
        while True:
            t = time.monotonic()
            done = MPI.Request.Waitsome(reqs)
            if done is None:  # every request was already complete (MPI_UNDEFINED)
                return
            self._seen(reqs, t, done)

    def poll(self) -> None:
        """Drive progress of every outstanding request (one ``Testall``, cheap; with an
        event log one ``Testsome``, which stamps the requests it finds complete)."""
        if self.outstanding:
            with self.timer.phase("comm"):
                if self.events is None:
                    MPI.Request.Testall(self.outstanding)
                else:
                    done = MPI.Request.Testsome(self.outstanding)
                    if done:
                        self._seen(self.outstanding, None, done)

    def _forget(self, req: MPI.Request) -> None:
        self.outstanding = [r for r in self.outstanding if r is not req]

    # -- topologies ----------------------------------------------------------
    def Create_dist_graph_adjacent(self, sources: list[int],
                                   destinations: list[int]) -> MPI.Distgraphcomm:
        """A distributed graph communicator over this one's ranks (collective, untimed:
        made once, before training), ranks kept in place (``reorder=False``): this rank
        receives from ``sources`` and sends to ``destinations`` in neighbourhood
        collectives."""
        return self.mpi_comm.Create_dist_graph_adjacent(sources, destinations, reorder=False)

    # -- small helpers -------------------------------------------------------
    def allreduce_scalar(self, value: float, op: MPI.Op | None = None) -> float:
        """Reduce one float with ``op`` (default ``MPI.SUM``; not timed: bookkeeping, not
        training traffic)."""
        buf = np.array([value], dtype=np.float64)
        self.mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM if op is None else op)
        return float(buf[0])


def _bytes(buf: Any) -> np.ndarray:
    """A contiguous NumPy array as the bytes MPI moves (a view: received bytes land in it)."""
    if not buf.flags.c_contiguous:
        raise ValueError("MPI byte buffers must be contiguous")
    return buf.reshape(-1).view(np.uint8)


def _displacements(counts: Any) -> list[int]:
    """Offsets of segments of ``counts`` packed one after another."""
    return [0, *np.cumsum(counts[:-1]).tolist()] if len(counts) else []


def make_communicator(
    comm: MPI.Comm,
    timer: PhaseTimer | None,
    backend: Any,
    cuda_aware: bool = False,
    nonblocking_direct: bool = False,
    events: EventSink | None = None,
) -> Communicator:
    """The communicator a run's strategy gets: this class on the CPU, the GPU one on a GPU.

    On a GPU (``backend.is_gpu``) it is a
    :class:`~syncbench.algorithms.device_buffers.DeviceCommunicator`, which
    hands device buffers to MPI (``cuda_aware``; ``nonblocking_direct`` for
    nonblocking collectives too) or stages them through pinned host memory.
    ``events``: the log every call is recorded in (``--events on``).
    """
    if not backend.is_gpu:
        return Communicator(comm, timer, events)
    # lazy: device_buffers subclasses Communicator (an import cycle at the top)
    from syncbench.algorithms.device_buffers import DeviceCommunicator

    return DeviceCommunicator(comm, timer, backend, cuda_aware, nonblocking_direct, events)
