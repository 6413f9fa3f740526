"""The GPU path: kernels against their NumPy references, models, and GPU buffers under MPI.

Tests marked ``gpu`` need CuPy with a usable CUDA device and are skipped
otherwise (``cupy.cuda.is_available()`` False). The rest run everywhere:

* ``--cuda-aware`` detection, and nonblocking collectives staged unless
  ``--cuda-aware-nonblocking yes``;
* :class:`~syncbench.algorithms.device_buffers.DeviceCommunicator` under real
  MPI with NumPy arrays standing in for device memory: the staging protocol
  (mirror, copy out, MPI on the mirror, copy back when a request completes)
  runs unchanged, posts deferred inside ``compute`` keep their order, and
  SSGD through it is bit-identical to the plain communicator;
* copies to the device are complete on return (the stream is synchronized
  after ``ndarray.set``), checked with a recording stand-in for CuPy;
* the GPU is bound before MPI starts, from the launcher's local rank;
  without a usable GPU ``--device gpu`` fails with the probe's reason;
* the model's untimed warm-up step leaves the parameters alone.

Run serially, then with ``mpiexec -n 2|4 python -m pytest --with-mpi tests/test_gpu.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import rank_streams, train_config, train_global_batch

from syncbench.algorithms import device_buffers
from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator, make_communicator
from syncbench.algorithms.device_buffers import (
    DeviceCommunicator,
    HostMirror,
    StagedRequest,
    Staging,
    copy_to_device,
    detect_cuda_aware,
)
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data.synthetic import make_synthetic
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels import backend as backend_module
from syncbench.kernels import cuda_bench, cuda_cases, ops
from syncbench.kernels.backend import (
    Backend,
    BackendError,
    _cupy_if_available,
    env_local_rank,
    numpy_backend,
    select_backend,
)
from syncbench.kernels.zoo import build_model

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
@pytest.mark.parametrize("case", cuda_cases.CASES, ids=[c.name for c in cuda_cases.CASES])
def test_kernel_matches_reference_on_gpu(case, dtype):
    args = case.build(np.random.default_rng(21), np.dtype(dtype), False)
    expected = cuda_cases.run_case(ops.REFERENCES[case.op], _copy(args, False))
    got = cuda_cases.run_case(getattr(ops, case.op), _copy(args, True))  # dispatched by type
    for e, g in zip(expected, got):
        g = CUPY.asnumpy(g) if ops.on_device(g) else np.asarray(g)
        e = np.asarray(e)
        assert e.shape == g.shape and e.dtype == g.dtype, case.name
        if case.is_exact(False):
            np.testing.assert_array_equal(g, e, err_msg=case.name)
        else:
            tol = cuda_cases.tolerance(dtype, False)
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=case.name)


@pytest.mark.gpu
@needs_gpu
def test_kernels_at_benchmark_size_on_gpu():
    """Large inputs: many blocks, grid-stride loops past MAX_BLOCKS * BLOCK elements."""
    rows = cuda_bench.benchmark(np.float32, repeat=1)
    assert len(rows) == len(cuda_cases.CASES)
    for row, case in zip(rows, cuda_cases.CASES):
        assert row["exact"] == case.is_exact(True)
        # exact: bit for bit; else within cuda_cases.tolerance (float32 sums in another order)
        assert row["ok"], row


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
    assert isinstance(gpu_loss, float) and gpu_loss == pytest.approx(cpu_loss, rel=1e-10)
    bad = CUPY.asarray(np.where(np.arange(16) == 3, 10, y))
    with pytest.raises(ValueError, match="outside 0..9"):
        gpu.loss_and_grad(CUPY.asarray(x), bad)
    np.testing.assert_allclose(CUPY.asnumpy(gpu.grads), cpu.grads, rtol=1e-8, atol=1e-11)
    opt_cpu = MomentumSGD(cpu.params, 0.1, 0.9, 1e-4)
    opt_gpu = MomentumSGD(gpu.params, 0.1, 0.9, 1e-4)
    opt_cpu.step(cpu.params, cpu.grads)
    opt_gpu.step(gpu.params, gpu.grads)
    np.testing.assert_allclose(CUPY.asnumpy(gpu.params), cpu.params, rtol=1e-8, atol=1e-11)
    loss, acc = gpu.evaluate(x, y, batch_size=5)
    assert np.isfinite(loss) and 0 <= acc <= 1
    gpu.warm_up(4)  # compiles every kernel, runs a step on zeros, leaves params alone
    np.testing.assert_allclose(CUPY.asnumpy(gpu.params), cpu.params, rtol=1e-8, atol=1e-11)


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


def test_help_names_the_nonblocking_opt_in():
    proc = subprocess.run([sys.executable, "-m", "syncbench", "train", "--help"],
                          capture_output=True, text=True, timeout=120)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "--cuda-aware-nonblocking, --no-cuda-aware-nonblocking" in text
    assert "BLOCKING collectives" in text and "coll/libnbc" in text


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


# -- copies complete on return ---------------------------------------------------------------
class _RecordingCuda:
    """Stands in for ``cupy.cuda``: records stream synchronizations."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.cuda = self

    def get_current_stream(self):
        return self

    def synchronize(self) -> None:
        self.calls.append("sync")


class _RecordingArray(np.ndarray):
    """Stands in for a CuPy array: ``set``/``get`` record their call, then copy."""

    calls: list[str] = []

    def set(self, host):
        self.calls.append("set")
        np.copyto(self, host)

    def get(self, out):
        self.calls.append("get")
        np.copyto(out, self)


def test_copies_to_the_device_are_complete_on_return():
    """``ndarray.set`` only queues the copy in CuPy 13/14: the stream must be synchronized
    after it, before the caller may reuse the host buffer."""
    calls: list[str] = []
    fake = Backend("cupy", _RecordingCuda(calls), "stand-in")
    _RecordingArray.calls = calls
    device = np.zeros(4).view(_RecordingArray)
    copy_to_device(fake, np.arange(4.0), device)
    assert calls == ["set", "sync"] and np.array_equal(device, np.arange(4.0))
    calls.clear()
    mirror = HostMirror(fake, device, host=np.full(4, 7.0))
    mirror.push(device)
    assert calls == ["set", "sync"] and np.array_equal(device, np.full(4, 7.0))
    calls.clear()
    mirror.pull(device)
    assert calls[-2:] == ["get", "sync"]


# -- device binding and the probe ----------------------------------------------------------
def test_local_rank_comes_from_the_launcher_variables_in_order():
    assert env_local_rank({}) is None
    assert env_local_rank({"SLURM_LOCALID": "3"}) == 3
    assert env_local_rank({"MPI_LOCALRANKID": "2", "SLURM_LOCALID": "3"}) == 2
    assert env_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "MPI_LOCALRANKID": "2"}) == 1
    assert env_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "", "SLURM_LOCALID": "x"}) is None
    assert backend_module.bind_before_mpi("cpu", {"SLURM_LOCALID": "1"}) is None


def test_train_binds_the_device_before_mpi_starts(tmp_path):
    code = textwrap.dedent("""
        from syncbench.bench import cli
        from syncbench.kernels import backend
        seen = []
        def bind(device, environ=None):
            import sys  # the flag modules do not even load mpi4py.MPI
            mpi = sys.modules.get("mpi4py.MPI")
            seen.append((device, mpi is not None and mpi.Is_initialized()))
            raise SystemExit(7)
        backend.bind_before_mpi = bind
        try:
            cli.main(["train", "--device", "gpu", "--dataset", "synthetic"])
        except SystemExit as exc:
            assert exc.code == 7, exc.code
        assert seen == [("gpu", False)], seen
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(CUPY is not None, reason="a usable GPU is present")
def test_device_gpu_without_a_usable_gpu_says_why():
    with pytest.raises(BackendError, match="no usable CUDA GPU \\(.+\\)"):
        select_backend("gpu")
    assert not select_backend("auto").is_gpu


def test_warm_up_leaves_the_parameters_and_zeroes_the_gradient(monkeypatch):
    """Warm-up runs the optimizer's update too (first-use compiles stay out of step 0),
    on scratch copies: the parameters are unchanged."""
    calls = []

    def recording(name, real):
        def wrapper(*args, **kwargs):
            calls.append((name, args[0]))
            return real(*args, **kwargs)
        return wrapper

    for name in ("sgd_momentum_", "axpy_"):
        monkeypatch.setattr(ops, name, recording(name, getattr(ops, name)))
    model = build_model("lenet", (1, 28, 28), 10, dtype=np.float64, seed=2)
    params = model.params.copy()
    model.grads[...] = 1.0
    model.warm_up(3)
    assert np.array_equal(model.params, params) and not model.grads.any()
    assert {name for name, _ in calls} == {"sgd_momentum_", "axpy_"}
    for _, target in calls:  # every update wrote to a copy of the model's size
        assert target.shape == params.shape and target is not model.params


def test_cuda_wheel_libraries_are_preloaded_when_installed(tmp_path):
    from syncbench.kernels import compile_check

    assert backend_module.preload_cuda_wheels([str(tmp_path)]) == []
    lib = compile_check.load_nvrtc()
    path = getattr(lib, "_syncbench_path", "")
    if "nvidia/cuda_nvrtc/lib/" not in path:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    site = path.split("nvidia/cuda_nvrtc/lib/")[0]
    loaded = backend_module.preload_cuda_wheels([site])
    assert any(p.endswith("nvidia/cuda_nvrtc/lib/libnvrtc.so.12") for p in loaded), loaded


class _NumpyWithRecordingCuda:
    """NumPy plus a ``cuda`` attribute that records stream synchronizations: a backend
    named "cupy" over host arrays, so the model takes its GPU bookkeeping path."""

    def __init__(self, calls: list[str]) -> None:
        self.cuda = _RecordingCuda(calls)

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def zeros(*args, **kwargs):
        return np.zeros(*args, **kwargs).view(_RecordingArray)

    @staticmethod
    def asnumpy(array):
        return np.asarray(array)


def test_loss_and_grad_synchronizes_at_its_end_on_the_gpu_backend():
    """Honest compute timing: the stream is synchronized after the last backward layer
    (after the last bucket hook), once per call, and the loss is read after it."""
    calls: list[str] = []
    fake = Backend("cupy", _NumpyWithRecordingCuda(calls), "stand-in")
    model = build_model("mlp", (1, 28, 28), 10, fake, np.float64, seed=1)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((4, 1, 28, 28)), rng.integers(0, 10, size=4)
    loss = model.loss_and_grad(x, y, on_grads_ready=lambda offset: calls.append("hook"))
    assert isinstance(loss, float) and np.isfinite(loss)
    assert calls[-1] == "sync" and calls.count("sync") == 1 and "hook" in calls


# -- ASGD through its pinned mirrors ---------------------------------------------------------
def _asgd_run(backend, steps=5, batch=16, seed=5):
    from mpi4py import MPI

    data = make_synthetic(256, 32, (1, 28, 28), 10, seed=2)
    config = train_config("--algorithm", "asgd", "--ps-layout", "single", "--lr", "0.1",
                          "--momentum", "0.9", "--weight-decay", "1e-4")
    model = build_model("mlp", data.input_shape, 10, backend, np.float64, seed=seed)
    comm = MPI.COMM_SELF.Dup()
    algo = get_algorithm("asgd")(model, Communicator(comm), config, Budget(steps * batch, batch, 1))
    stream = rank_streams(data.train_x, data.train_y, 1, batch, seed)[0]
    try:
        while not algo.done():
            algo.step(*stream.next())
        algo.finish()
        params = np.array(algo.consensus_params())
    finally:
        algo.close()
        comm.Free()
    return algo, params


def test_asgd_on_the_gpu_backend_goes_through_pinned_mirrors(monkeypatch):
    """Pulled weights and pushed gradients go through the two pinned HostMirrors (one copy
    each per step, each complete on return) and the result equals the CPU run."""
    calls: list[str] = []
    fake = Backend("cupy", _NumpyWithRecordingCuda(calls), "stand-in")
    monkeypatch.setattr(device_buffers, "host_empty",
                        lambda backend, shape, dtype: np.empty(shape, dtype))
    _RecordingArray.calls = calls
    algo, params = _asgd_run(fake)
    _, expected = _asgd_run(numpy_backend())
    np.testing.assert_array_equal(params, expected)
    assert algo._param_mirror.copies == algo._grad_mirror.copies == 5
    assert calls.count("set") == 5 and calls.count("get") == 5
    assert all(calls[i + 1] == "sync" for i, c in enumerate(calls) if c in ("set", "get"))


def test_without_cupy_no_cuda_library_is_loaded():
    """--device auto on a machine without CuPy loads nothing of CUDA (the NVRTC wheel of
    the cuda-build extra stays unloaded), before or after MPI starts."""
    code = textwrap.dedent("""
        import importlib.util, sys
        if importlib.util.find_spec("cupy") is not None:
            sys.exit(3)
        from syncbench.kernels import backend
        assert backend.bind_before_mpi("auto", {"SLURM_LOCALID": "0"}) is None
        assert not backend.select_backend("auto").is_gpu
        maps = open("/proc/self/maps").read()
        assert "libnvrtc" not in maps and "libcublas" not in maps
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode == 3:
        pytest.skip("CuPy is installed")
    assert proc.returncode == 0, proc.stderr


def test_gpu_check_fits_a_ten_minute_device_budget():
    """jobs/gpu_check.sh: its steps' timeouts, install included, add up to under 600 s."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "jobs" / "gpu_check.sh"
    proc = subprocess.run(["bash", str(script), "--budget"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    worst, budget = map(int, re.findall(r"(\d+) s", proc.stdout))
    assert worst <= budget <= 600, proc.stdout
