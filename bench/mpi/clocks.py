"""Clock offsets between ranks: one run clock across nodes with different clocks.

Every rank times its rows on its own ``CLOCK_MONOTONIC`` (``time.monotonic``),
whose origin is the node's boot, so two nodes' readings differ by seconds to
days. :func:`measure_offsets` estimates each rank's offset to rank 0 as
SKaMPI (Reussner, Sanders, Prechelt and Mueller, EuroPVM/MPI 1998) and
Score-P's offset measurement at ``MPI_Init`` and ``MPI_Finalize`` do: rank 0
ping-pongs with every rank in turn, and of ``rounds`` exchanges the one with
the smallest round trip gives the offset ``t_i - (t_send + t_recv) / 2``, off
by at most half that round trip (rank i read its clock between rank 0's send
and receive). Measured at the start and at the end of a run, the two
estimates give the drift, which :func:`drift_since` interpolates linearly as
Score-P does (its limit: drift is not constant over long runs; Becker,
Rabenseifner and Wolf, IEEE Cluster 2008).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

#: Ping-pong exchanges per rank (the minimum round trip of these is kept).
DEFAULT_ROUNDS = 20
#: Message tag of the exchanges (point-to-point: no collective of a strategy matches it).
TAG = 0x5C10
#: A rank waiting for its turn tests its receive this often (seconds) instead of
#: spinning, so waiting ranks leave the cores to the pair that measures.
POLL_S = 1e-4


@dataclass(frozen=True)
class ClockOffset:
    """One rank's clock against rank 0's at one moment (rank 0: offset and uncertainty 0)."""

    #: This rank's clock minus rank 0's at the same instant (s).
    offset_s: float
    #: Bound on the error of ``offset_s``: half the minimum round trip (s).
    uncertainty_s: float
    #: This rank's clock reading when it was measured (s, this rank's clock).
    at_s: float


def measure_offsets(comm: MPI.Comm, rounds: int = DEFAULT_ROUNDS,
                    clock: Callable[[], float] = time.monotonic) -> ClockOffset:
    """Estimate this rank's ``clock`` offset to rank 0 of ``comm`` (collective).

    Rank 0 exchanges ``rounds`` ping-pongs with each rank in turn: it reads
    ``t_send``, sends, receives rank i's reading ``t_i`` (taken on receipt),
    reads ``t_recv``; the round with the smallest ``t_recv - t_send`` gives
    ``offset = t_i - (t_send + t_recv) / 2`` and ``uncertainty = (t_recv -
    t_send) / 2``, which rank 0 sends back. Every rank returns its own
    :class:`ClockOffset`; ranks waiting for their turn sleep between tests.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(3)
    if rank != 0:
        first = comm.Irecv(buf[:1], source=0, tag=TAG)
        while not first.Test():
            time.sleep(POLL_S)
        for k in range(rounds):
            if k:
                comm.Recv(buf[:1], source=0, tag=TAG)
            buf[0] = clock()
            comm.Send(buf[:1], dest=0, tag=TAG)
        comm.Recv(buf, source=0, tag=TAG)
        return ClockOffset(float(buf[0]), float(buf[1]), float(buf[2]))
    ping, reply = np.zeros(1), np.zeros(1)
    for peer in range(1, size):
        best = (np.inf, 0.0, 0.0)  # (round trip, offset, peer's reading)
        for _ in range(rounds):
            t_send = clock()
            comm.Send(ping, dest=peer, tag=TAG)
            comm.Recv(reply, source=peer, tag=TAG)
            t_recv = clock()
            rtt = t_recv - t_send
            if rtt < best[0]:
                best = (rtt, float(reply[0]) - (t_send + t_recv) / 2, float(reply[0]))
        buf[:] = (best[1], best[0] / 2, best[2])
        comm.Send(buf, dest=peer, tag=TAG)
    return ClockOffset(0.0, 0.0, clock())


def drift_since(local: np.ndarray, start: ClockOffset, end: ClockOffset | None) -> np.ndarray:
    """How much this rank's offset grew between ``start`` and each reading of ``local``.

    ``local`` holds readings of this rank's clock; the offset is interpolated
    linearly between the two measurements (0 at ``start.at_s`` and before it,
    e.g. rows restored from an earlier job). Subtracting it from times taken
    relative to an origin mapped through ``start`` puts them on rank 0's clock.
    Zeros without a usable ``end`` (none, NaN, or not later than ``start``).
    """
    local = np.asarray(local, dtype=np.float64)
    if end is None or not np.isfinite(end.offset_s) or not end.at_s > start.at_s:
        return np.zeros_like(local)
    rate = (end.offset_s - start.offset_s) / (end.at_s - start.at_s)
    return rate * np.maximum(local - start.at_s, 0.0)
