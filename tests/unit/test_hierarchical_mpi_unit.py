"""Hierarchical Local SGD against a serial re-computation of every rank in one process.

Run with ``mpiexec -n 2`` and ``-n 4 ... python -m pytest --only-mpi
tests/mpi_inproc/test_hierarchical_mpi.py``; every rank here shares one host, so ``--group-size``
stands in for nodes (1 on two ranks, 2 on four). The option checks also run serially.

Split off ``tests/mpi_inproc/test_hierarchical_mpi.py``: the tests that compute in the
test's process (no process launched, no MPI).
"""

from __future__ import annotations

import pytest
from helpers import train_args

from syncbench.bench.train.config import build_train_config


@pytest.mark.parametrize(
    ("flags", "world", "message"),
    [
        (["--node-period", "0"], 4, "--node-period must be >= 1, got 0"),
        (["--node-period", "3", "--global-period", "8"], 4,
         "--global-period must be a multiple of --node-period 3, got 8"),
        (["--group-size", "-1"], 4, "--group-size must be >= 0, got -1"),
        (["--group-size", "3"], 4, "--group-size 3 must divide the 4 ranks into 2 or more "
         "groups"),
        (["--group-size", "2"], 2, "--group-size 2 must divide the 2 ranks into 2 or more "
         "groups"),
    ],
)
def test_bad_options_are_one_line(flags, world, message):
    with pytest.raises(ValueError) as err:  # where the run's configuration is built
        build_train_config(train_args("--algorithm", "hierarchical", *flags), world)
    assert str(err.value) == message
