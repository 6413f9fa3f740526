"""AD-PSGD's atomic pairwise averaging over RMA windows (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_pairwise_mpi.py`` and with
``-n 4``. The conservation test: every rank starts from a constant vector of an integer
value, active ranks average with random passive peers while passive ranks keep changing
their own model (zero gradients: +1 then -1 under their lock); at the end the sum of all
models equals the initial sum exactly in float64 (values stay dyadic rationals with few
bits, so no rounding: a lost or doubled average changes the sum), and every model is
still a constant vector (a torn read or write would mix two states of a model).

Split off ``tests/mpi_inproc/test_pairwise_mpi.py``: the tests that compute in the test's
process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest

from syncbench.algorithms.averagers.pairwise import (
    bipartite_peers,
    check_bipartite,
)
from syncbench.algorithms.graphs import Mixing, build_graph


def test_bipartite_peers_of_graphs():
    ring = build_graph("ring", 6).cycle[0]
    assert bipartite_peers(ring, 0) == [1, 5] and bipartite_peers(ring, 3) == [2, 4]
    check_bipartite(ring, "ring")
    exp = build_graph("exp", 8).cycle[0]  # i <-> i +- 1, 2, 4: only the odd offsets remain
    assert bipartite_peers(exp, 0) == [1, 7]
    with pytest.raises(ValueError, match="rank 0 has no neighbour of the other parity"):
        check_bipartite(Mixing(3, ({2: 0.5}, {}, {0: 0.5}), (0.5, 1.0, 0.5)), "file")
    with pytest.raises(ValueError, match="at least 2 ranks"):
        check_bipartite(build_graph("ring", 1).cycle[0], "ring")
