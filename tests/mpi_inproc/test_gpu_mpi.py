"""The GPU path: kernels against their NumPy references, models, and GPU buffers under MPI: the
tests that run in process on every rank (pytest-mpi).

Split off unit/test_gpu.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams, train_global_batch
from test_gpu import CUPY, needs_gpu

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator, make_communicator
from syncbench.algorithms.device_buffers import (
    DeviceCommunicator,
    StagedRequest,
    Staging,
    detect_cuda_aware,
)
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data.synthetic import make_synthetic
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels import ops
from syncbench.kernels.backend import (
    numpy_backend,
    select_backend,
)
from syncbench.kernels.zoo import build_model


# -- the device communicator's protocol under MPI (NumPy stand-ins) -----------------------
def _collectives(comm: DeviceCommunicator, xp) -> None:
    rank, size = comm.rank, comm.size
    n = 10
    total = sum(range(1, size + 1))
    buf = xp.arange(n, dtype=np.float64) * (rank + 1)
    comm.Allreduce(buf)
    assert np.array_equal(_host(buf), np.arange(n) * total)

    buf = xp.arange(n, dtype=np.float64) * (rank + 1)
    req = comm.Iallreduce(buf[:4])
    req2 = comm.Iallreduce(buf[4:])
    if not comm.nonblocking_direct:  # staged: the buffer changes when the request completes
        assert np.array_equal(_host(buf), np.arange(n) * (rank + 1))
    comm.Wait(req)
    while not comm.Test(req2):
        comm.poll()
    assert np.array_equal(_host(buf), np.arange(n) * total)

    a, b = xp.ones(3) * rank, xp.ones(5) * rank
    reqs = [comm.Iallreduce(a), comm.Iallreduce(b)]
    comm.Waitall(reqs)
    expected = sum(range(size))
    assert np.array_equal(_host(a), np.full(3, expected))
    assert np.array_equal(_host(b), np.full(5, expected))

    root = 1 % size
    c = xp.full(4, float(rank))
    comm.Bcast(c, root=root)
    assert np.array_equal(_host(c), np.full(4, float(root)))
    assert not comm.outstanding and not comm._landing


def _host(array):
    return CUPY.asnumpy(array) if CUPY is not None and ops.on_device(array) else array


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("cuda_aware,nonblocking", [(False, False), (True, False), (True, True)],
                         ids=["staged", "direct-blocking", "direct"])
def test_device_communicator_protocol_with_host_arrays(cuda_aware, nonblocking):
    from mpi4py import MPI

    comm = DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), numpy_backend(), cuda_aware,
                              nonblocking)
    _collectives(comm, np)
    direct = cuda_aware and nonblocking
    assert (comm.staging.bytes["to_host"] > 0) != direct  # Iallreduce staged unless opted in
    assert (comm.staging.bytes["to_device"] > 0) != direct


def _run_ssgd(comm, data, model, batch, steps, seed, config):
    size = comm.size
    algo = get_algorithm("ssgd")(model, comm, config, Budget(steps * batch * size, batch, size))
    stream = BatchStream(data.train_x, data.train_y, comm.rank, size, batch, seed,
                         model.backend, model.dtype)
    for _ in range(steps):
        algo.step(*stream.next())
    return model


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("comm_mode", ["blocking", "overlap"])
def test_ssgd_through_staging_is_bit_identical(comm_mode):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    data = make_synthetic(256, 32, (1, 28, 28), 10, seed=1)
    config = train_config("--comm", comm_mode, "--bucket-mb", "0.01", "--lr", "0.1")
    runs = []
    for comm in (Communicator(world), DeviceCommunicator(world, None, numpy_backend(), False)):
        model = build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=3)
        runs.append(_run_ssgd(comm, data, model, 8, 4, 3, config).params)
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.mpi(min_size=2)
def test_device_communicator_with_device_arrays():
    from mpi4py import MPI

    backend = select_backend("gpu", MPI.COMM_WORLD.Get_rank())
    _collectives(DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), backend, False), CUPY)
    if detect_cuda_aware("auto").enabled:
        _collectives(DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), backend, True), CUPY)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("comm_mode", ["blocking", "overlap"])
def test_ssgd_on_gpu_equals_large_batch_sgd(comm_mode):
    """SSGD on N GPU ranks (staged buffers) == one CPU process with batch N*b (float64)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    batch, seed, steps = 8, 3, 4
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config("--comm", comm_mode, "--bucket-mb", "0.01", "--weight-decay", "1e-4",
                          "--lr", "0.1", "--momentum", "0.9")
    backend = select_backend("gpu", rank)
    comm = make_communicator(world, PhaseTimer(), backend, detect_cuda_aware("auto").enabled)
    model = build_model("lenet", data.input_shape, 10, backend, np.float64, seed=seed)
    params = CUPY.asnumpy(_run_ssgd(comm, data, model, batch, steps, seed, config).params)

    serial = build_model("lenet", data.input_shape, 10, dtype=np.float64, seed=seed)
    opt = MomentumSGD(serial.params, config.lr, config.momentum, config.weight_decay)
    train_global_batch(serial, opt, rank_streams(data.train_x, data.train_y, size, batch, seed),
                       steps)
    np.testing.assert_allclose(params, serial.params, rtol=0, atol=1e-9)
    for other in world.allgather(params):
        assert np.array_equal(other, params)  # replicas bit-identical


# -- nonblocking collectives are staged unless asked ---------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("nonblocking", [False, True], ids=["staged", "opted-in"])
def test_cuda_aware_stages_nonblocking_collectives_unless_opted_in(nonblocking):
    from mpi4py import MPI

    comm = DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), numpy_backend(), True, nonblocking)
    buf = np.ones(6)
    comm.Allreduce(buf)  # blocking: direct with a CUDA-aware library
    assert comm.staging.bytes["to_host"] == 0
    req = comm.Iallreduce(buf)
    assert isinstance(req, StagedRequest) != nonblocking
    comm.Wait(req)
    assert np.array_equal(buf, np.full(6, comm.size**2))
    assert (comm.staging.bytes["to_host"] == 0) == nonblocking
    _collectives(comm, np)


class ManualCopy:
    """A copy event that completes when the test says (or when waited on)."""

    def __init__(self) -> None:
        self.done = False

    def synchronize(self) -> None:
        self.done = True


class ManualStaging(Staging):
    """Staging whose copies complete only when released: the GPU's asynchronous copies."""

    def __init__(self, backend) -> None:
        super().__init__(backend)
        self.events: list[ManualCopy] = []

    def to_host_async(self, buf, host):
        super().to_host_async(buf, host)
        self.events.append(ManualCopy())
        return self.events[-1]


@pytest.mark.mpi(min_size=2)
def test_posts_deferred_in_compute_keep_their_order():
    from mpi4py import MPI

    timer = PhaseTimer()
    comm = DeviceCommunicator(MPI.COMM_WORLD, timer, numpy_backend(), False)
    comm.staging = staging = ManualStaging(numpy_backend())
    size = comm.size
    a, b, c = np.ones(3), np.full(4, 2.0), np.full(5, 3.0)
    with timer.phase("compute"):  # SSGD's buckets during backward
        ra, rb = comm.Iallreduce(a), comm.Iallreduce(b)
        assert ra.request is None and rb.request is None and not comm.outstanding
        staging.events[1].done = True  # b's copy is done, a's is not: nothing may be posted
        comm.poll()
        assert ra.request is None and rb.request is None
        staging.events[0].done = True
        comm.poll()
        assert ra.request is not None and rb.request is not None
        rc = comm.Iallreduce(c)
        assert rc.request is None
    comm.Allreduce(np.zeros(2))  # a blocking collective posts what is deferred first
    assert rc.request is not None
    comm.Waitall([ra, rb, rc])
    for buf, value in ((a, 1.0), (b, 2.0), (c, 3.0)):
        assert np.array_equal(buf, np.full(buf.size, value * size))
    outside = comm.Iallreduce(np.ones(2))  # outside compute: posted before returning
    assert outside.request is not None
    comm.Wait(outside)
    assert not comm._landing and not comm.outstanding
