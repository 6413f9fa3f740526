"""AD-PSGD's atomic pairwise averaging over RMA windows (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_pairwise_mpi.py`` and with
``-n 4``. The conservation test: every rank starts from a constant vector of an integer
value, active ranks average with random passive peers while passive ranks keep changing
their own model (zero gradients: +1 then -1 under their lock); at the end the sum of all
models equals the initial sum exactly in float64 (values stay dyadic rationals with few
bits, so no rounding: a lost or doubled average changes the sum), and every model is
still a constant vector (a torn read or write would mix two states of a model).

Split off this module: ``tests/unit/test_pairwise_mpi_unit.py`` (its tests that need
neither).
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.averagers.pairwise import (
    PairwiseWindow,
    bipartite_peers,
)
from syncbench.algorithms.graphs import build_graph

#: Averages each active rank starts. Each adds at most one fractional bit to the values it
#: touches: with 6 integer bits and at most 2 x 20 averages in all (4 ranks), every value
#: fits 53 bits and no operation rounds.
AVERAGES = 20
N = 20_000  # elements: a Put/Get of 160 kB is not one atomic store


@pytest.mark.mpi(min_size=2)
def test_concurrent_pairwise_averages_conserve_the_sum_and_tear_no_model():
    from mpi4py import MPI

    from syncbench.algorithms.communicator import Communicator

    comm = Communicator(MPI.COMM_WORLD)
    rank, size = comm.rank, comm.size
    if size % 2:
        pytest.skip("the ring is bipartite at an even rank count")
    peers = bipartite_peers(build_graph("ring", size).cycle[0], rank)
    window = PairwiseWindow(comm, N, np.float64)
    window.set_own(np.full(N, float(17 * rank + 3)))
    start = MPI.COMM_WORLD.allreduce(float(17 * rank + 3))
    MPI.COMM_WORLD.Barrier()
    rng = np.random.default_rng(rank)
    one = np.ones(N)
    if window.active:
        for _ in range(AVERAGES):
            window.average_with(int(rng.choice(peers)))
    else:  # passive: change its own model concurrently, as a gradient step would
        done = MPI.COMM_WORLD.Ibarrier()
        while not done.Test():
            window.update_own(one)
            window.update_own(-one)
    if window.active:
        MPI.COMM_WORLD.Ibarrier().Wait()
    final = window.read_own()
    assert (final == final[0]).all(), "a model was torn"
    total = MPI.COMM_WORLD.allreduce(float(final[0]))
    assert total == start  # exact
    averaged = MPI.COMM_WORLD.allreduce(window.averages)
    assert averaged == AVERAGES * (size // 2)
    MPI.COMM_WORLD.Barrier()
    window.close()
