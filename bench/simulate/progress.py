"""How a nonblocking collective progresses: only while its ranks are inside MPI.

MPI advances a nonblocking collective only inside an MPI call
(``Communicator.poll``'s ``Testall``, a ``Wait``, the polls of the straggler's
delay). MPICH runs an Iallreduce as a schedule of stages (each exchange of
recursive doubling or halving, each step of a ring: :func:`allreduce_stages`);
a stage's sends are posted only once the previous stage completed and the rank
is in MPI. So stage 1 is issued when the last rank posts the collective, and
stage k+1 at the first instant at or after stage k's end at which every rank is
inside MPI (:class:`Calendar`): a ``Testall`` at a hook call, a poll of the
delay, or any time in a ``Wait``, where what is left runs back to back. A stage
is one synchronous step over all ranks (as every phase, :mod:`.collectives`).
The network carries one stage at a time (:class:`Wire`): of the collectives in
flight whose next stage is issued, the one posted first goes first
(:func:`advance`). Each ``Testall`` with a request outstanding takes
:data:`TESTALL_SECONDS` on the rank's clock between its layers, charged to
``comm`` as ``Communicator.poll`` charges it. The straggler's delay polls as
``bench/train/slowdown.py`` does in the mode ``--slowdown-mode auto`` resolves
to on the simulated nodes (:func:`delay_polls`); a node quota's freezes poll nothing.

Over TCP a progress call moves at most :data:`PROGRESS_SEGMENT_BYTES` of a flow, so a
stage whose flows send more is that many stages, each issued at a progress call
(:func:`allreduce_stages`; on a ``--calibrate``'d platform, whose links are this suite's
TCP ones). Measured across 2 emulated nodes (MPICH 5.0.2 over UCX's
TCP; ``python -m syncbench.bench.micro.polls --op iallreduce``, both ranks polling 1, 2
or 4 ms apart): a 940 KB Iallreduce took 17-18 polls whatever the gap, 300 KB 7, 16 KB
3-4 (docs/RESULTS.md, "A nonblocking allreduce moves 64 KiB a poll"). The links' token
bucket (``--link-burst``) passes a segment's bytes at once while it holds credit, and
refills while the wire is idle (:class:`Wire`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.bench.simulate.collectives import (
    PhaseClock,
    burst_of,
    placed_phases,
    refill_rate,
    segment_of,
)
from syncbench.bench.simulate.workload import ComputeSplit
from syncbench.bench.train.slowdown import PROGRESS_INTERVAL_S, resolve_mode

#: Seconds one ``MPI.Request.Testall`` takes with an Iallreduce in flight
#: (``Communicator.poll``): the median measured on one machine, rounded (the
#: measurement and its command: docs/RESULTS.md, "Testall with an Iallreduce in
#: flight"). The means also hold the polls that run a stage's local reduction,
#: whose arithmetic every collective here leaves out.
TESTALL_SECONDS = 2.0e-6
#: Bytes of a flow that one progress call moves (MPICH 5.0.2 over UCX's TCP, across the
#: emulated cluster's nodes; over TCP's loopback on one host about half of it): the module
#: docstring. The clock's ``segment`` (:class:`.collectives.PlacedClock`): this on a
#: ``--calibrate``'d platform, none on the modelled ones (RDMA moves an issued transfer
#: without the ranks).
PROGRESS_SEGMENT_BYTES = 65536


def allreduce_stages(nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
                     itemsize: int = 4) -> np.ndarray:
    """Seconds of each stage of a nonblocking allreduce of ``nbytes``, in order.

    The stages are the phases of the Iallreduce (:func:`.collectives.placed_phases`), each
    repeat of a phase (a step of a ring) a stage of its own: the schedule of
    MPICH's Iallreduce advances one such exchange per progress call. A phase whose flows
    send more than :data:`PROGRESS_SEGMENT_BYTES` is as many stages as it has segments,
    its time shared among them: each progress call moves one (module docstring). The
    links' token bucket is the :class:`Wire`'s, given the stages' bytes
    (:func:`allreduce_stage_bytes`).
    """
    phases, parts = _segmented(nbytes, n, algorithm, time_phase, itemsize)
    return np.repeat([time_phase(p) / k for p, k in zip(phases, parts)],
                     [p.repeat * k for p, k in zip(phases, parts)]).astype(float)


def _segmented(nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
               itemsize: int) -> tuple[list[Any], list[int]]:
    """The phases of a nonblocking allreduce of ``nbytes`` and how many progress segments
    each one's flows take (1 each without a limit)."""
    phases = placed_phases(nbytes, n, algorithm, time_phase, itemsize, nonblocking=True)
    segment = segment_of(time_phase)
    if segment <= 0:
        return phases, [1] * len(phases)
    return phases, [max(1, math.ceil(p.nbytes / segment)) if p.nbytes > 0 else 1
                    for p in phases]


def allreduce_stage_bytes(nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
                          itemsize: int = 4) -> np.ndarray:
    """Bytes a flow of each stage of :func:`allreduce_stages` sends across a link (0 for a
    node-local stage), in the same order."""
    phases, parts = _segmented(nbytes, n, algorithm, time_phase, itemsize)
    return np.repeat([p.nbytes / k if p.block <= 0 else 0.0 for p, k in zip(phases, parts)],
                     [p.repeat * k for p, k in zip(phases, parts)]).astype(float)


def bucketed_wire(time_phase: PhaseClock, nbytes: float, n: int, algorithm: str,
                  itemsize: int = 4) -> Wire:
    """A :class:`Wire` with the links' token bucket of ``time_phase`` (``--link-burst``;
    none: 0), refilled at the rate of an allreduce of ``nbytes``' first phase on a link."""
    burst = burst_of(time_phase)
    if burst <= 0:
        return Wire()
    rate = refill_rate(placed_phases(nbytes, n, algorithm, time_phase, itemsize), time_phase)
    return Wire(burst=burst, rate=rate)


class Calendar:
    """When each rank is inside MPI (so can issue a collective's next stage).

    Made of per-rank segments: poll instants (an ``(n, P)`` array, sorted
    along each row), spans ``[a, b]`` (inside a ``Wait``: every instant),
    and periodic polls ``a + period * (m + grid)`` for ``m = 0, 1, ...``
    within ``[a, b]`` (a straggler's delay). :meth:`next` is vectorised over
    the ranks.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.polls: list[np.ndarray] = []
        self.spans: list[tuple[np.ndarray, np.ndarray]] = []
        self.periodic: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.version = 0

    def add_polls(self, instants: np.ndarray) -> None:
        if instants.size:
            self.polls.append(instants)
            self.version += 1

    def add_span(self, a: Any, b: Any) -> None:
        self.spans.append((np.broadcast_to(np.asarray(a, float), (self.n,)),
                           np.broadcast_to(np.asarray(b, float), (self.n,))))
        self.version += 1

    def add_periodic(self, a: np.ndarray, b: np.ndarray, period: np.ndarray | float,
                     grid: np.ndarray) -> None:
        """Polls at ``a + period * (m + grid[i])`` up to ``b`` (``grid`` sorted, in [0, 1))."""
        period = np.broadcast_to(np.asarray(period, float), (self.n,))
        keep = (b > a) & (period > 0)
        if keep.any():
            self.periodic.append((a, np.where(keep, b, -np.inf), np.where(keep, period, 1.0),
                                  np.asarray(grid, float)))
            self.version += 1

    def next(self, e: float) -> np.ndarray:
        """Per rank, the first instant >= ``e`` at which the rank is in MPI (inf: none)."""
        out = np.full(self.n, np.inf)
        for instants in self.polls:
            out = np.minimum(out, np.where(instants >= e, instants, np.inf).min(axis=1))
        for a, b in self.spans:
            t = np.maximum(a, e)
            out = np.minimum(out, np.where(t <= b, t, np.inf))
        for a, b, period, grid in self.periodic:
            u = np.maximum(e - a, 0.0) / period
            whole = np.floor(u)
            idx = np.searchsorted(grid, u - whole - 1e-12)
            wrap = idx >= len(grid)
            frac = grid[np.where(wrap, 0, idx)] + wrap
            t = np.maximum(a + period * (whole + frac), e)
            out = np.minimum(out, np.where(t <= b, t, np.inf))
        return out

    def continuous_until(self, e: float) -> float:
        """Until when every rank is inside a ``Wait`` span holding ``e`` (-inf: some is not)."""
        until = np.full(self.n, -np.inf)
        for a, b in self.spans:
            until = np.maximum(until, np.where((a <= e) & (e <= b), b, -np.inf))
        return float(until.min())


@dataclass
class Inflight:
    """A nonblocking collective in flight: its stages and how far it has got."""

    stages: np.ndarray
    posted: float  # when its last rank posted it (stage 1 issued)
    calendar: Calendar  # when its ranks are in MPI after the post
    order: int  # posting order: the earlier goes first on the network
    #: Bytes of a flow of each stage (:func:`allreduce_stage_bytes`; None: the links'
    #: bucket is left out)
    stage_bytes: np.ndarray | None = None
    done_stages: int = 0
    last_end: float = -np.inf
    _ready: tuple[int, int, float] | None = None

    @property
    def done(self) -> bool:
        return self.done_stages >= len(self.stages)

    @property
    def end(self) -> float:
        """When its last stage ended (its post, without stages)."""
        return self.last_end if len(self.stages) else self.posted

    def ready(self) -> float:
        """When its next stage is issued (every rank in MPI after the previous one ended)."""
        if self.done_stages == 0:
            return self.posted
        key = (self.done_stages, self.calendar.version)
        if self._ready is None or self._ready[:2] != key:
            self._ready = (*key, float(self.calendar.next(self.last_end).max()))
        return self._ready[2]


@dataclass
class Wire:
    """The network: free from ``free_at`` on (it carries one stage at a time).

    ``burst``: bytes of the links' token bucket, refilled at ``rate`` bytes/s while the
    wire is idle, full at the start; a stage's flows send what it holds at the wire's own
    speed (:func:`~.collectives.burst_stages`)."""

    free_at: float = 0.0
    burst: float = 0.0
    rate: float = 0.0
    credit: float = math.inf

    def durations(self, seconds: np.ndarray, nbytes: np.ndarray | None,
                  start: float) -> tuple[np.ndarray, np.ndarray]:
        """Seconds of ``seconds``' stages run back to back from ``start``, less what the
        bucket passes at once, and the bucket's credit after each."""
        if self.burst <= 0 or self.rate <= 0:
            return seconds, np.full(len(seconds), self.credit)
        credit = min(self.burst, self.credit + max(0.0, start - self.free_at) * self.rate)
        if nbytes is None:  # bytes not known: nothing spent, the idle spell's refill kept
            return seconds, np.full(len(seconds), credit)
        spent = np.minimum(np.cumsum(nbytes), credit)  # the credit runs out and stays out
        free = np.diff(spent, prepend=0.0)
        return seconds - np.minimum(free / self.rate, 0.9 * seconds), credit - spent

    def spend_all(self, end: float) -> None:
        """A blocking collective took the links until ``end`` and, after a compute phase,
        their whole bucket (:func:`~.collectives.burst_stages`)."""
        self.free_at = max(self.free_at, end)
        if self.burst > 0:
            self.credit = 0.0


def advance(active: Sequence[Inflight], wire: Wire, target: Inflight) -> None:
    """Run stages of ``active`` collectives until ``target`` is done.

    The next stage on the network is, among the collectives whose next
    stage is issued by the time the network is free, the earliest posted;
    else the one issued first. While every rank is inside a ``Wait`` the
    earliest posted collective's stages run back to back.
    """
    while not target.done:
        pending = [c for c in active if not c.done]
        ready = [(c.ready(), c.order, c) for c in pending]
        issued = [r for r in ready if r[0] <= wire.free_at]
        when, _, pick = (min(issued, key=lambda r: r[1]) if issued
                         else min(ready, key=lambda r: r[:2]))
        start = max(when, wire.free_at)
        i = pick.done_stages
        sizes = None if pick.stage_bytes is None else pick.stage_bytes[i:]
        seconds, credit = wire.durations(pick.stages[i:], sizes, start)
        end = start + float(seconds[0])
        count = 1
        if pick.order == min(c.order for c in pending):  # back to back while all wait
            until = pick.calendar.continuous_until(start)
            if until >= end:
                ends = start + np.cumsum(seconds)
                count = min(len(ends), int(np.searchsorted(ends, until, "right")) + 1)
                end = float(ends[count - 1])
        pick.done_stages += count
        wire.credit = float(credit[count - 1])
        pick.last_end = wire.free_at = end


def delay_polls(calendar: Calendar, cfg: argparse.Namespace, split: ComputeSplit,
                begin: np.ndarray, delay: np.ndarray, compute: np.ndarray) -> None:
    """Add the polls of the straggler's delay ``[begin, begin + delay]`` to ``calendar``.

    ``bench/train/slowdown.py``: the mode is ``auto``'s (``resolve_mode`` with
    ``--gpus-per-node`` ranks per node); ``sleep`` (and ``spin``) call the
    progress hook every ``PROGRESS_INTERVAL_S`` and once at the deadline,
    ``work`` (``ModelWork``) before each pass of the model copy and at each
    of its hook calls (a pass takes the rank's compute time).
    """
    end = begin + delay
    if resolve_mode("auto", int(getattr(cfg, "gpus_per_node", 1) or 1)) == "work":
        grid = np.unique(np.concatenate([[0.0], split.hooks % 1.0]))
        calendar.add_periodic(begin, end, compute, grid)
    else:
        calendar.add_periodic(begin, end, PROGRESS_INTERVAL_S, np.zeros(1))
    slowed = delay > 0
    calendar.add_span(np.where(slowed, end, np.inf), np.where(slowed, end, -np.inf))


def compute_polls(begin: np.ndarray, compute: np.ndarray, shares: np.ndarray,
                  cost_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(instants of a ``Testall`` at each hook call, end of compute) for every rank.

    Poll i starts after the compute up to its hook and the i polls before it.
    """
    count = len(shares)
    instants = begin[:, None] + compute[:, None] * shares[None, :] + cost_s * np.arange(count)
    return instants, begin + compute + cost_s * count
