"""When reductions are posted and waited on: SSGD buckets and OD-SGD's one-step delay: the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off mpi_inproc/test_overlap_posts.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

from helpers import train_config

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.registry import get_algorithm
from syncbench.kernels.zoo import build_model


def test_ssgd_bucket_count_is_recorded_per_mode():
    from mpi4py import MPI

    cls = get_algorithm("ssgd")
    model = build_model("lenet", (1, 28, 28), 10)
    budget = Budget(64, 8, 1)
    comm = Communicator(MPI.COMM_SELF)
    overlap = cls(model, comm, train_config("--comm", "overlap"), budget)
    blocking = cls(model, comm, train_config("--comm", "blocking"), budget)
    assert overlap.run_attributes["buckets"] == 3 and blocking.run_attributes["buckets"] == 1
