"""Heterogeneity emulation: slowdown specs, schedules, and the driver following them.

Serial tests; the end-to-end ones launch their own ``mpiexec`` (bounded by
subprocess timeouts) and are skipped when pytest itself runs under mpiexec.

Split off ``tests/unit/test_hetero.py``: the in-process MPI tests (marked ``mpi``, every
rank runs them).
"""

from __future__ import annotations

import time

import pytest


# -- one time origin for every rank -----------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_ranks_share_time_zero():
    """Cross-rank analysis (who computed while a straggler was in its delay) needs the
    ranks' ``t_start`` on one timeline, not each offset by its own barrier exit."""
    from helpers import train_config
    from mpi4py import MPI

    from syncbench.bench.train.driver import Training

    training = Training(train_config(), MPI.COMM_WORLD)
    if training.rank == 0:
        time.sleep(0.02)  # rank 0 leaves "the barrier" 20 ms after the others
    origin = training.clock_origin()  # this rank's CLOCK_MONOTONIC at time 0
    if len(set(training.host_names)) > 1:
        pytest.skip("on several nodes the monotonic clocks differ (tests/e2e/test_clocks.py)")
    # one node, one clock: the same instant on every rank, the 20 ms not in it
    instants = MPI.COMM_WORLD.allgather(origin)
    assert max(instants) - min(instants) < 1e-3, instants
    assert abs(training.clock_start.offset_s) <= training.clock_start.uncertainty_s < 1e-3
