"""One run clock across ranks whose monotonic clocks differ (``bench/mpi/clocks.py``): the tests
that run in process on every rank (pytest-mpi).

Split off e2e/test_clocks.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import pytest


@pytest.mark.mpi(min_size=2)
def test_ping_pong_recovers_each_ranks_offset():
    import time

    from mpi4py import MPI

    from syncbench.bench.mpi.clocks import measure_offsets

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    shift = 1000.0 * rank - 0.5  # every rank's clock off by its own amount (rank 0 too)
    got = measure_offsets(comm, clock=lambda: time.monotonic() + shift)
    truth = 1000.0 * rank  # against rank 0's clock
    assert got.uncertainty_s < 1e-3
    assert abs(got.offset_s - truth) <= got.uncertainty_s + 1e-9
    if rank == 0:
        assert got.offset_s == 0.0 and got.uncertainty_s == 0.0
    with pytest.raises(ValueError, match="rounds"):
        measure_offsets(comm, rounds=0)
