"""SSGD on N ranks equals single-process SGD with batch N*b (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_ssgd_mpi.py``
(and ``-n 1``, ``-n 4``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams, serial_large_batch

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

STEPS = 6


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("comm_mode", ["blocking", "overlap"])
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_ssgd_equals_large_batch_sgd(comm_mode, model_name):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    batch, seed = 8, 3
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config("--comm", comm_mode, "--bucket-mb", "0.01",
                          "--weight-decay", "1e-4", "--lr", "0.1", "--momentum", "0.9")
    model = build_model(model_name, data.input_shape, 10, dtype=np.float64, seed=seed)
    comm = Communicator(world)
    algo = get_algorithm("ssgd")(model, comm, config, Budget(STEPS * batch * size, batch, size))
    stream = rank_streams(data.train_x, data.train_y, size, batch, seed)[rank]
    for _ in range(STEPS):
        algo.step(*stream.next())
    assert algo.done()

    expected = serial_large_batch(model_name, data, size, batch, seed, config, STEPS)
    np.testing.assert_allclose(model.params, expected, rtol=0, atol=1e-10)
    # replicas are bit-identical across ranks
    gathered = world.allgather(model.params)
    for other in gathered:
        assert np.array_equal(other, model.params)
    # overlap really cut the gradient into several buckets
    if comm_mode == "overlap":
        assert algo.reducer.posts_per_step > 1
