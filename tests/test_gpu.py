"""The GPU path: kernels against their NumPy references, models, and GPU buffers under MPI.

Tests marked ``gpu`` need CuPy with a usable CUDA device and are skipped
otherwise (``cupy.cuda.is_available()`` False). The rest run everywhere:

* ``--cuda-aware`` detection;
* :class:`~syncbench.algorithms.device_buffers.DeviceCommunicator` under real
  MPI with NumPy arrays standing in for device memory: the staging protocol
  (mirror, copy out, MPI on the mirror, copy back when a request completes)
  runs unchanged, and SSGD through it is bit-identical to the plain
  communicator.

Run serially, then with ``mpiexec -n 2|4 python -m pytest --with-mpi tests/test_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rank_streams, train_config

from syncbench.algorithms import device_buffers
from syncbench.algorithms.base import Budget, MomentumSGD
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.device_buffers import (
    DeviceCommunicator,
    HostMirror,
    detect_cuda_aware,
    make_communicator,
)
from syncbench.algorithms.registry import get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data import make_synthetic
from syncbench.bench.stream import BatchStream
from syncbench.kernels import cuda_ops, ops
from syncbench.kernels.backend import _cupy_if_available, numpy_backend, select_backend
from syncbench.kernels.models import build_model

CUPY = _cupy_if_available()
needs_gpu = pytest.mark.skipif(
    CUPY is None, reason="no CUDA GPU: CuPy missing or cupy.cuda.is_available() is False")


# -- --cuda-aware detection ---------------------------------------------------------
def test_cuda_aware_yes_and_no_are_obeyed():
    assert detect_cuda_aware("yes", environ={}, query=False).enabled
    assert not detect_cuda_aware("no", environ={"MV2_USE_CUDA": "1"}, query=True).enabled
    with pytest.raises(ValueError):
        detect_cuda_aware("maybe")


def test_cuda_aware_auto_trusts_the_library_query_first():
    env = {"OMPI_MCA_opal_cuda_support": "true"}
    assert detect_cuda_aware("auto", environ={}, query=True).enabled
    assert not detect_cuda_aware("auto", environ=env, query=False).enabled
    # no query in the library: known environment settings, else no
    assert detect_cuda_aware("auto", environ=env, query=None).enabled
    assert detect_cuda_aware("auto", environ={"MPICH_GPU_SUPPORT_ENABLED": "1"},
                             query=None).enabled
    off = detect_cuda_aware("auto", environ={"MV2_USE_CUDA": "0"}, query=None)
    assert not off.enabled and "staging" in off.reason


def test_library_query_of_this_mpi():
    answer = device_buffers.query_library_cuda_support()
    assert answer in (True, False, None)
    from mpi4py import MPI

    if "MPICH" in MPI.Get_library_version() and CUPY is None:
        assert answer is False  # the PyPI MPICH wheel is not CUDA-aware


def test_cpu_backend_keeps_the_plain_communicator():
    from mpi4py import MPI

    comm = make_communicator(MPI.COMM_SELF, PhaseTimer(), numpy_backend(), cuda_aware=True)
    assert type(comm) is Communicator


def test_host_mirror_counts_copies():
    device = np.arange(6.0)
    mirror = HostMirror(numpy_backend(), device)
    host = mirror.pull(device)
    np.testing.assert_array_equal(host, device)
    host *= 2
    mirror.push(device)
    np.testing.assert_array_equal(device, 2 * np.arange(6.0))
    assert mirror.copies == 2 and mirror.seconds >= 0
    with pytest.raises(ValueError):
        HostMirror(numpy_backend(), device, host=np.zeros(5))


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
    if not comm.cuda_aware:  # staged: the device buffer changes only when the request completes
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
@pytest.mark.parametrize("cuda_aware", [False, True], ids=["staged", "direct"])
def test_device_communicator_protocol_with_host_arrays(cuda_aware):
    from mpi4py import MPI

    comm = DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), numpy_backend(), cuda_aware)
    _collectives(comm, np)
    staged = comm.staging.bytes["to_host"]
    assert (staged > 0) != cuda_aware
    assert comm.staging.bytes["to_device"] > 0 or cuda_aware


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


# -- on a GPU ----------------------------------------------------------------------------
def _copy(args, to_device: bool):
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(CUPY.asarray(a) if to_device else a.copy())
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float", "double"])
@pytest.mark.parametrize("case", cuda_ops.CASES, ids=[c.name for c in cuda_ops.CASES])
def test_kernel_matches_reference_on_gpu(case, dtype):
    args = case.build(np.random.default_rng(21), np.dtype(dtype), False)
    expected = cuda_ops.run_case(ops.REFERENCES[case.op], _copy(args, False))
    got = cuda_ops.run_case(getattr(ops, case.op), _copy(args, True))  # dispatched by type
    for e, g in zip(expected, got):
        g = CUPY.asnumpy(g) if ops.on_device(g) else np.asarray(g)
        e = np.asarray(e)
        assert e.shape == g.shape and e.dtype == g.dtype, case.name
        if case.exact:
            np.testing.assert_array_equal(g, e, err_msg=case.name)
        else:
            tol = 2e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=case.name)


@pytest.mark.gpu
@needs_gpu
def test_kernels_at_benchmark_size_on_gpu():
    """Large inputs: many blocks, grid-stride loops past MAX_BLOCKS * BLOCK elements."""
    rows = cuda_ops.benchmark(np.float32, repeat=1)
    assert len(rows) == len(cuda_ops.CASES)
    for row, case in zip(rows, cuda_ops.CASES):
        if case.exact:
            assert row["max_abs_diff"] == 0.0, row
        else:
            assert row["max_rel_diff"] <= 1e-4, row  # float32 sums in another order


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_gpu_model_matches_cpu_model(model_name):
    gpu_backend = select_backend("gpu")
    rng = np.random.default_rng(22)
    x, y = rng.standard_normal((16, 1, 28, 28)), rng.integers(0, 10, size=16)
    cpu = build_model(model_name, (1, 28, 28), 10, dtype=np.float64, seed=4)
    gpu = build_model(model_name, (1, 28, 28), 10, gpu_backend, np.float64, seed=4)
    np.testing.assert_array_equal(CUPY.asnumpy(gpu.params), cpu.params)
    cpu_loss = cpu.loss_and_grad(x, y)
    gpu_loss = gpu.loss_and_grad(CUPY.asarray(x), CUPY.asarray(y))
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-10)
    np.testing.assert_allclose(CUPY.asnumpy(gpu.grads), cpu.grads, rtol=1e-8, atol=1e-11)
    opt_cpu = MomentumSGD(cpu.params, 0.1, 0.9, 1e-4)
    opt_gpu = MomentumSGD(gpu.params, 0.1, 0.9, 1e-4)
    opt_cpu.step(cpu.params, cpu.grads)
    opt_gpu.step(gpu.params, gpu.grads)
    np.testing.assert_allclose(CUPY.asnumpy(gpu.params), cpu.params, rtol=1e-8, atol=1e-11)
    loss, acc = gpu.evaluate(x, y, batch_size=5)
    assert np.isfinite(loss) and 0 <= acc <= 1


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
    streams = rank_streams(data.train_x, data.train_y, size, batch, seed)
    for _ in range(steps):
        parts = [s.next() for s in streams]
        serial.loss_and_grad(np.concatenate([p[0] for p in parts]),
                             np.concatenate([p[1] for p in parts]))
        opt.step(serial.params, serial.grads)
    np.testing.assert_allclose(params, serial.params, rtol=0, atol=1e-9)
    for other in world.allgather(params):
        assert np.array_equal(other, params)  # replicas bit-identical
