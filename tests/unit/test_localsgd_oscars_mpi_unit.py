"""Local SGD and Oscars against serial re-computations (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_localsgd_oscars_mpi.py``
(and ``-n 4``). The pure schedule tests also run in a plain serial pytest.

Split off ``tests/mpi_inproc/test_localsgd_oscars_mpi.py``: the tests that compute in the
test's process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest
from helpers import train_config

from syncbench.algorithms.averagers.schedule import fit_budget, schedule, uniform_schedule


# -- pure functions (serial) ---------------------------------------------------
def test_schedule_gives_slowest_rank_tau0_and_others_more():
    assert schedule([1.0, 1.0, 1.0, 4.0], 4, 32) == [16, 16, 16, 4]
    assert schedule([1.0, 1.0, 1.0, 4.0], 4, 8) == [8, 8, 8, 4]  # clamped to tau_max
    assert schedule([0.3, 0.3, 0.3, 0.3], 4, 32) == [4, 4, 4, 4]
    assert schedule([0.1, 0.7], 3, 100) == [21, 3]  # floor(3 * 0.7 / 0.1 = 20.999...) = 21
    assert schedule([1.0, 0.0], 4, 32) == [4, 4]  # a rank without a measurement yet
    assert schedule([1e-3, 1.0], 1, 5) == [5, 1]
    assert uniform_schedule(3, 4.7, 32) == [4, 4, 4]


@pytest.mark.parametrize(
    ("taus", "remaining", "expected"),
    [
        ([4, 4], 100, [4, 4]),  # leaves >= N steps: unchanged
        ([4, 4], 8, [4, 4]),  # exactly the rest
        ([4, 4], 6, [3, 3]),  # cut
        ([16, 16, 16, 4], 32, [10, 10, 10, 2]),  # cut, proportional to tau - 1
        ([16, 4], 2, [1, 1]),  # one step each
        ([4, 4, 4], 14, [5, 5, 4]),  # a full round would leave 2 < N: extended
        ([1, 1, 1], 5, [2, 2, 1]),
    ],
)
def test_fit_budget_is_exact(taus, remaining, expected):
    got = fit_budget(taus, remaining)
    assert got == expected
    assert min(got) >= 1
    assert sum(got) == remaining or remaining - sum(got) >= len(taus)


def test_momentum_sync_defaults_to_keep():
    assert train_config("--algorithm", "oscars").momentum_sync == "keep"
