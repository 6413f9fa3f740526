"""AD-PSGD's flags and peers, checked without MPI.

Split off ``tests/mpi_inproc/test_adpsgd_mpi.py``: the tests that compute in the test's
process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest
from helpers import train_config

from syncbench.algorithms.adpsgd import averaging_peers, peer_at
from syncbench.algorithms.graphs import build_graph
from syncbench.algorithms.registry import get_algorithm, validate


def test_a_graph_needs_a_neighbour_of_the_other_parity_for_every_rank(tmp_path):
    cls = get_algorithm("adpsgd")
    with pytest.raises(ValueError, match="needs at least 2 ranks"):
        validate(cls, train_config("--algorithm", "adpsgd"), 1)
    same_parity = tmp_path / "g.txt"
    same_parity.write_text("0 2\n2 1\n1 3\n")  # connected, but rank 0's only neighbour is 2
    with pytest.raises(ValueError, match="rank 0 has no neighbour of the other parity"):
        validate(cls, train_config("--algorithm", "adpsgd", "--graph", str(same_parity)), 4)
    for graph in ("ring", "exp", "onepeer-exp"):
        validate(cls, train_config("--algorithm", "adpsgd", "--graph", graph), 3)
    with pytest.raises(ValueError, match="--meet-every must be >= 1, got 0"):
        validate(cls, train_config("--algorithm", "adpsgd", "--meet-every", "0"), 2)


def test_peers_are_the_union_over_a_time_varying_graph():
    # one-peer exponential on 8 ranks: offsets 1, 2, 4 in turn; only offset 1 is odd
    schedule = build_graph("onepeer-exp", 8)
    assert [averaging_peers(schedule, r) for r in (0, 3)] == [[1, 7], [2, 4]]
    assert averaging_peers(build_graph("ring", 3), 0) == [1]  # the edge 2 - 0 is unused


def test_the_peer_stream_is_keyed_by_seed_rank_and_step():
    peers = [1, 3, 5]
    drawn = [peer_at(peers, 7, 0, t) for t in range(200)]
    assert set(drawn) == set(peers)
    assert drawn == [peer_at(peers, 7, 0, t) for t in range(200)]  # no state: resumable
    assert drawn != [peer_at(peers, 8, 0, t) for t in range(200)]
    assert drawn != [peer_at(peers, 7, 2, t) for t in range(200)]
