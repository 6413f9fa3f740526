"""Atomic pairwise averaging over MPI one-sided windows: the exchange of AD-PSGD.

AD-PSGD (Lian et al., ICML 2018, "Asynchronous decentralized parallel stochastic gradient
descent", arXiv 1710.06952, Alg. 1) has no steps in common: a worker averages its model
with one random neighbour's, ``x_i, x_j <- (x_i + x_j) / 2``, atomically, and applies a
gradient it computed on its (possibly stale) model. To avoid the deadlock of two workers
each waiting on the other, the graph is split in two (ibid., section 4): *active* workers
start averagings, *passive* ones only take part in them, and every edge used joins an
active worker to a passive one (here: even ranks active, odd ranks passive, over the
graph's edges between the two).

Every rank's model lives in its own window (``MPI.Win.Allocate``, as ASGD's,
:mod:`syncbench.algorithms.windows`). What makes an average atomic is MPI's
``MPI_LOCK_EXCLUSIVE`` (MPI-3.1 section 11.5.3): an exclusive lock epoch on a target
excludes every other epoch on it, so

- an active rank i holds the passive peer j's window EXCLUSIVE while it reads x_j
  (``Get``, ``Flush``), computes the mean and writes it back (``Put``), so no other
  average with j and no update by j falls inside: x_j is never torn and no average is
  lost. Rank i's own model changes inside an EXCLUSIVE epoch on its own window, held
  across the exchange;
- every rank changes or reads its own model only inside an EXCLUSIVE (or SHARED) epoch on
  its own window (:meth:`PairwiseWindow.update_own`, :meth:`PairwiseWindow.read_own`).

A rank holds at most its own lock while it waits for another's, and only active ranks
wait, on passive ones, which wait on nobody: no cycle, no deadlock. With zero gradients
the sum of all models is conserved (each average replaces a, b by two halves of a + b).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from syncbench.algorithms.graphs import Mixing
from syncbench.algorithms.mpi import MPI


def bipartite_peers(mixing: Mixing, rank: int) -> list[int]:
    """The peers rank ``rank`` averages with: its graph neighbours (either direction) of
    the other parity (an even, active rank's odd neighbours; an odd, passive rank's even
    ones)."""
    neighbours = set(mixing.sources(rank)) | set(mixing.destinations(rank))
    return sorted(j for j in neighbours if (j - rank) % 2)


def check_bipartite(mixing: Mixing, label: str) -> None:
    """Raise ``ValueError`` (one line) unless every rank has a peer of the other parity
    (at least 2 ranks)."""
    if mixing.size < 2:
        raise ValueError(f"--graph {label}: pairwise averaging needs at least 2 ranks")
    for rank in range(mixing.size):
        if not bipartite_peers(mixing, rank):
            raise ValueError(f"--graph {label}: rank {rank} has no neighbour of the other "
                             "parity (active ranks are even, passive ones odd)")


class PairwiseWindow:
    """This rank's model in an RMA window, averaged atomically with peers' (collective)."""

    def __init__(self, comm: Any, n: int, dtype: Any) -> None:
        self.comm = comm
        self.mpi_comm = comm.mpi_comm
        self.rank = comm.rank
        self.dtype = np.dtype(dtype)
        size = n * self.dtype.itemsize
        self.win = MPI.Win.Allocate(size, self.dtype.itemsize, comm=self.mpi_comm)
        #: This rank's model: the window's own memory (change it through the methods).
        self.local = np.frombuffer(self.win.tomemory(), dtype=self.dtype)[:n]
        self._peer = np.empty(n, dtype=self.dtype)
        self._mpi_type = MPI.Datatype.fromcode(self.dtype.char)
        self.averages = 0  # averages this rank started

    @property
    def active(self) -> bool:
        """Even ranks start averagings; odd ranks only take part."""
        return self.rank % 2 == 0

    @contextmanager
    def own(self, exclusive: bool = True) -> Iterator[np.ndarray]:
        """This rank's model inside a lock epoch on its own window (EXCLUSIVE to change
        it, SHARED to read it)."""
        self.win.Lock(self.rank, MPI.LOCK_EXCLUSIVE if exclusive else MPI.LOCK_SHARED)
        try:
            yield self.local
        finally:
            self.win.Unlock(self.rank)

    def read_own(self) -> np.ndarray:
        """A copy of this rank's model."""
        with self.own(exclusive=False) as x:
            return x.copy()

    def update_own(self, delta: np.ndarray) -> None:
        """``x += delta`` on this rank's model (a gradient step), atomically."""
        with self.own() as x:
            x += delta

    def average_with(self, peer: int, while_locked: Callable[[], None] | None = None) -> None:
        """``x_self, x_peer <- (x_self + x_peer) / 2``, atomically for both: this rank's
        window EXCLUSIVE, then the peer's EXCLUSIVE while it is read, averaged and written.

        ``while_locked`` runs while both locks are held, after the peer's model is written
        (AD-PSGD counts the averages each model took part in there, so that a count read
        under a model's lock always matches the model)."""
        if not self.active:
            raise ValueError(f"rank {self.rank} is passive: only even ranks start averages")
        buf, typ = self._peer, self._mpi_type
        with self.own() as x:
            self.win.Lock(peer, MPI.LOCK_EXCLUSIVE)
            try:
                self.win.Get([buf, typ], peer)
                self.win.Flush(peer)
                buf += x
                buf *= 0.5
                self.win.Put([buf, typ], peer)
                if while_locked is not None:
                    while_locked()
            finally:
                self.win.Unlock(peer)
            x[...] = buf
        self.averages += 1

    def set_own(self, values: np.ndarray) -> None:
        """``x = values`` on this rank's model (before training, or on resume)."""
        with self.own() as x:
            x[...] = values

    def close(self) -> None:
        self.win.Free()
