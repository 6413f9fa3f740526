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

Run serially, then with ``mpiexec -n 2|4 python -m pytest --only-mpi tests/unit/test_gpu.py``.

Split off this module: ``tests/e2e/test_gpu_e2e.py`` (its tests that launch a process or
start MPI) and ``tests/mpi_inproc/test_gpu_mpi.py`` (its in-process MPI tests).
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.device_buffers import (
    HostMirror,
    copy_to_device,
    detect_cuda_aware,
)
from syncbench.algorithms.optimizer import MomentumSGD
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
def test_gpt_on_gpu_matches_cpu():
    """gpt on the GPU backend (cuBLAS GEMMs, the transformer kernels, softmax_xent) against
    the CPU path in float64, then one AdamW step through the fused kernel, bit for bit
    against the NumPy reference from the same state."""
    from syncbench.algorithms.adamw import AdamW
    from syncbench.kernels.gpt import GPT, GPTSpec

    spec, vocab = GPTSpec(d=32, layers=2, heads=4, ctx=16), 13
    rng = np.random.default_rng(24)
    x, y = rng.integers(0, vocab, size=(4, 12)), rng.integers(0, vocab, size=(4, 12))
    cpu = GPT(spec, vocab, dtype=np.float64, seed=3)
    gpu = GPT(spec, vocab, select_backend("gpu"), np.float64, seed=3)
    np.testing.assert_array_equal(CUPY.asnumpy(gpu.params), cpu.params)
    cpu_loss = cpu.loss_and_grad(x, y)
    gpu_loss = gpu.loss_and_grad(CUPY.asarray(x), CUPY.asarray(y))
    assert isinstance(gpu_loss, float) and gpu_loss == pytest.approx(cpu_loss, rel=1e-10)
    np.testing.assert_allclose(CUPY.asnumpy(gpu.grads), cpu.grads, rtol=1e-8, atol=1e-11)
    params, grads = CUPY.asnumpy(gpu.params), CUPY.asnumpy(gpu.grads)
    opt_gpu = AdamW(gpu.params, 1e-3, 0.1, (0.9, 0.999), 1e-8)
    opt_ref = AdamW(params, 1e-3, 0.1, (0.9, 0.999), 1e-8)
    opt_gpu.step(gpu.params, gpu.grads)
    opt_ref.steps = 1
    opt_ref.reference_step(params, grads, 1e-3, (1 - 0.9, 0.999, 1 - 0.999,
                                                  (1 - 0.999) ** 0.5, 1e-8, -1e-3 / (1 - 0.9)))
    np.testing.assert_array_equal(CUPY.asnumpy(gpu.params), params)
    np.testing.assert_array_equal(CUPY.asnumpy(opt_gpu.exp_avg_sq), opt_ref.exp_avg_sq)
    gpu.warm_up(2)  # compiles every kernel, one step on zeros, leaves params alone
    np.testing.assert_array_equal(CUPY.asnumpy(gpu.params), params)
    assert np.isfinite(gpu.evaluate(x, y, batch_size=3)[0])
    assert len(gpu.generate(b"ab", 3)) == 3


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
