"""D-PSGD against a serial re-computation of x <- W x - gamma G (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_dpsgd_mpi.py`` and with
``-n 4`` (and ``-n 3``: a ring that is not a power of two); the flag checks also run in a
plain serial pytest. The serial re-computation keeps N replicas in one process, each with
the batches its rank draws: every step the gradients at the pre-mix models, then
X <- W_t X, then each replica's optimizer step with its own gradient (plain SGD:
x_i <- sum_j W_ij x_j - gamma g_i, Lian et al. 2017, Alg. 1).

Split off ``tests/mpi_inproc/test_dpsgd_mpi.py``: the tests that compute in the test's
process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest
from helpers import train_config

from syncbench.algorithms.registry import get_algorithm, validate


def test_graph_flags_are_checked_against_the_rank_count(tmp_path):
    cls = get_algorithm("dpsgd")
    with pytest.raises(ValueError, match="torus does not fit 3 ranks"):
        validate(cls, train_config("--algorithm", "dpsgd", "--graph", "torus"), 3)
    bad = tmp_path / "g.txt"
    bad.write_text("0 1\n1 2\n2 9\n")
    with pytest.raises(ValueError, match="rank 9 is out of range for 4 ranks"):
        validate(cls, train_config("--algorithm", "dpsgd", "--graph", str(bad)), 4)
    validate(cls, train_config("--algorithm", "dpsgd", "--graph", "onepeer-exp"), 3)
    with pytest.raises(SystemExit):
        train_config("--algorithm", "dpsgd", "--graph", str(tmp_path / "missing.txt"))
