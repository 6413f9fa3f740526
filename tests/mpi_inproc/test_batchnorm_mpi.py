"""BatchNorm across ranks (run under mpiexec): ``--sync-bn`` equals one process with the
global batch, per-rank statistics do not, and Local SGD averages the running statistics.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_batchnorm_mpi.py``
(and ``-n 1``, ``-n 4``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams, train_global_batch

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

STEPS = 3
BATCH = 4
SEED = 5
FLAGS = ("--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4", "--wd-exempt")


def serial_global_batch(data, world, config, steps):
    """One process, batch world*BATCH: the concatenation of every rank's batch."""
    model = build_model("resnet8", data.input_shape, data.num_classes, dtype=np.float64,
                        seed=SEED)
    opt = MomentumSGD(model.params, config.lr, config.momentum, config.weight_decay,
                      model.decay_mask())
    return train_global_batch(model, opt, rank_streams(data.train_x, data.train_y, world,
                                                       BATCH, SEED), steps)


def ssgd_resnet8(data, config, sync: bool):
    """SSGD over every rank of COMM_WORLD, ``sync``: SyncBatchNorm."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    model = build_model("resnet8", data.input_shape, 10, dtype=np.float64, seed=SEED)
    comm = Communicator(world)
    if sync:
        model.sync_batchnorm(comm.Allreduce)
    algo = get_algorithm("ssgd")(model, comm, config, Budget(STEPS * BATCH * size, BATCH, size))
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED)[rank]
    for _ in range(STEPS):
        algo.step(*stream.next())
    return model, comm


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("comm_mode", ["blocking", "overlap"])
def test_sync_bn_equals_one_process_with_the_global_batch(comm_mode):
    """Weights and running statistics after SSGD steps with --sync-bn: those of one process
    on the concatenated batch (float64, 1e-10), with gradient buckets in flight during the
    BatchNorm reductions of the backward pass (overlap)."""
    from mpi4py import MPI

    data = make_synthetic(256, 64, (1, 28, 28), 10, seed=2)
    config = train_config("--comm", comm_mode, "--bucket-mb", "0.02", *FLAGS)
    model, comm = ssgd_resnet8(data, config, sync=True)
    expected = serial_global_batch(data, MPI.COMM_WORLD.Get_size(), config, STEPS)
    np.testing.assert_allclose(model.params, expected.params, rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.buffers, expected.buffers, rtol=0, atol=1e-10)
    assert comm.timer.totals["comm"] > 0


@pytest.mark.mpi(min_size=2)
def test_per_rank_batchnorm_is_not_the_global_batch():
    """Without --sync-bn each rank normalises its own batch: the weights leave the
    single-process run (the equivalence above is not automatic) and the running
    statistics differ from rank to rank."""
    from mpi4py import MPI

    data = make_synthetic(256, 64, (1, 28, 28), 10, seed=2)
    config = train_config(*FLAGS)
    model, _ = ssgd_resnet8(data, config, sync=False)
    expected = serial_global_batch(data, MPI.COMM_WORLD.Get_size(), config, STEPS)
    assert np.max(np.abs(model.params - expected.params)) > 1e-6
    buffers = MPI.COMM_WORLD.allgather(model.buffers)
    assert any(not np.array_equal(buffers[0], b) for b in buffers[1:])


@pytest.mark.mpi(min_size=2)
def test_local_sgd_averages_running_statistics_with_the_weights():
    """After a Local SGD round every rank holds the mean of the ranks' running statistics
    (computed here from each rank's statistics before the average)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(256, 64, (1, 28, 28), 10, seed=2)
    config = train_config("--algorithm", "localsgd", "--period", "2", *FLAGS)
    model = build_model("resnet8", data.input_shape, 10, dtype=np.float64, seed=SEED)
    algo = get_algorithm("localsgd")(model, Communicator(world), config,
                                     Budget(2 * BATCH * size, BATCH, size))
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED)[rank]
    algo.step(*stream.next())
    x, y = stream.next()
    before = {}
    original = algo.averager.average

    def spy() -> None:
        before["buffers"] = model.buffers.copy()
        original()

    algo.averager.average = spy
    algo.step(x, y)
    assert "buffers" in before
    mean = np.mean(world.allgather(before["buffers"]), axis=0)
    np.testing.assert_allclose(model.buffers, mean, rtol=0, atol=1e-12)
    assert np.array_equal(world.allgather(model.buffers)[0], model.buffers)
