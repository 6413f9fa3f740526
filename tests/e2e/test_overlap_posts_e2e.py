"""When reductions are posted and waited on: SSGD buckets and OD-SGD's one-step delay.

The communicator is wrapped by a real :class:`Communicator` subclass that
records the order of its calls (the MPI calls still run), and the model's
first trained layer records when its backward runs: the last backward work of
a step. SSGD must post buckets *before* that, and OD-SGD must wait on a
request only in the next step, after polls. Either would still pass the
equivalence tests with a ``Wait`` right after every post; these would not.

Bucket planning is serial; the rest runs under ``mpiexec -n 2`` (and 4).

Split off ``tests/mpi_inproc/test_overlap_posts.py``: the tests that launch a process
(``mpiexec``, a ``syncbench`` command) or start MPI in the test's own process.
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
