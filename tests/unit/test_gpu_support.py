"""The GPU path's support code, tested without a GPU (and a few checks that need one).

* CuPy 13 and 14, ``cupy-cuda12x`` and ``cupy-cuda13x``: the installed distribution and
  its CUDA major are found from the package metadata (a fake module and fake metadata
  here), the CUDA wheels of that major are preloaded, run files record both;
* the machine context names the GPUs and the ranks per GPU, and flags ranks sharing one;
* the ``update`` phase ends with the device synchronization, inside it;
* ``compile_check`` builds sm_90 machine code (NVRTC, and nvcc whenever it is on PATH);
* ``syncbench comm`` hands device buffers to MPI as training does: in place, through
  the GPU backend's communicator and its pinned mirrors (NumPy arrays through the
  same code path here);
* ``gpu_measure``: each kernel's declared traffic is what ``cuda_bench.bytes_moved``
  finds on its NumPy reference, the arrays are at least 1 GiB, and the tables build.

Tests marked ``gpu`` need CuPy with a usable device (``jobs/gpu_check.sh`` runs them).

Split off this module: ``tests/e2e/test_gpu_support_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import types
from importlib import metadata

import numpy as np
import pytest

from syncbench.algorithms import device_buffers
from syncbench.algorithms.timing import PhaseTimer
from syncbench.analysis import schema
from syncbench.analysis.context import format_context, machine_context
from syncbench.kernels import backend as backend_module
from syncbench.kernels import compile_check, cuda_bench, gpu_measure, ops
from syncbench.kernels.backend import (
    cupy_cuda_major,
    cupy_distribution,
    gpu_identity,
    numpy_backend,
)

CUPY = backend_module._cupy_if_available()
needs_gpu = pytest.mark.skipif(
    CUPY is None, reason="no CUDA GPU: CuPy missing or cupy.cuda.is_available() is False")


# -- CuPy 13 and 14, cupy-cuda12x and cupy-cuda13x -----------------------------------------
VERSIONS = {"cupy-cuda12x": "13.6.0", "cupy-cuda13x": "14.2.0", "cupy": "14.0.0"}


def _version_of(name: str) -> str:
    if name not in VERSIONS:
        raise metadata.PackageNotFoundError(name)
    return VERSIONS[name]


def test_cupy_cuda_major_of_each_distribution_name():
    assert cupy_cuda_major("cupy-cuda12x") == 12
    assert cupy_cuda_major("cupy-cuda13x") == 13
    assert cupy_cuda_major("cupy_cuda11x") == 11
    assert cupy_cuda_major("cupy") is None  # built from source
    assert cupy_cuda_major("cupy-rocm-6-0") is None


def test_cupy_distribution_names_the_installed_package_and_version():
    image = {"cupy": ["cupy-cuda13x"], "numpy": ["numpy"]}
    assert cupy_distribution(owners=image, version_of=_version_of) == ("cupy-cuda13x", "14.2.0")
    assert cupy_distribution(owners={"cupy": ["cupy-cuda12x"]}, version_of=_version_of) == \
        ("cupy-cuda12x", "13.6.0")
    assert cupy_distribution(owners={}, version_of=_version_of) == ("", "")


def test_the_imported_module_decides_between_two_installed_distributions():
    both = {"cupy": ["cupy-cuda12x", "cupy-cuda13x"]}
    cupy13 = types.SimpleNamespace(__version__="13.6.0")
    assert cupy_distribution(cupy13, both, _version_of) == ("cupy-cuda12x", "13.6.0")
    # not imported: the newest CUDA's wheel; a module no distribution installed: "cupy"
    assert cupy_distribution(None, both, _version_of)[0] == "cupy-cuda13x"
    tree = types.SimpleNamespace(__version__="15.0.0a1")
    assert cupy_distribution(tree, both, _version_of) == ("cupy", "15.0.0a1")


def test_cuda_wheels_of_the_cupy_major_are_preloaded(tmp_path):
    """CUDA 13's wheels put their libraries under nvidia/cu13/lib: loaded for a CUDA 13
    CuPy, not for a CUDA 12 one."""
    lib = compile_check.load_nvrtc()
    path = getattr(lib, "_syncbench_path", "")
    if not path.startswith("/"):
        pytest.skip("no NVRTC library file to stand in for the CUDA 13 one")
    folder = tmp_path / "nvidia" / "cu13" / "lib"
    folder.mkdir(parents=True)
    (folder / "libnvrtc.so.13").symlink_to(path)
    loaded = backend_module.preload_cuda_wheels([str(tmp_path)], major=13)
    assert loaded == [str(folder / "libnvrtc.so.13")]
    assert backend_module.preload_cuda_wheels([str(tmp_path)], major=12) == []
    assert set(backend_module.CUDA_WHEEL_LIBRARIES_BY_MAJOR) >= {12, 13}


def test_gpu_identity_is_the_pci_bus_id():
    class Device:
        def __init__(self, index):
            self.pci_bus_id = "0000:3B:00.0"

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device))
    assert gpu_identity(fake, 0) == "pci:0000:3b:00.0"
    older = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda i: object()))
    assert gpu_identity(older, 1) == "cuda:1"
    assert numpy_backend().device_id == ""


def test_env_names_the_cupy_distribution(monkeypatch):
    from syncbench.bench.mpi import environment

    monkeypatch.setattr(backend_module, "cupy_distribution", lambda module=None: (
        "cupy-cuda13x", "14.2.0"))
    assert environment.cupy_fact().value == "cupy-cuda13x 14.2.0"
    monkeypatch.setattr(backend_module, "cupy_distribution", lambda module=None: ("", ""))
    assert "gpu-cuda13" in environment.cupy_fact().how


def test_the_machine_context_names_the_gpu_and_flags_sharing():
    run = {"host_cores": 16, "host_cpus": 16, "world_size": 2, "hostnames": ["h"],
           "ranks_per_host": 2, "oversubscribed": False, "backend": "cupy",
           "devices": ["cuda:0 NVIDIA H200"], "gpu_count": 1, "ranks_per_gpu": 2,
           "gpu_shared": True}
    ctx = machine_context(run)
    assert ctx["gpus"] == "1 GPU (NVIDIA H200)" and ctx["ranks_per_gpu"] == 2
    assert ctx["gpu_shared"] is True
    line = format_context(ctx)
    assert "not oversubscribed" in line and "1 GPU (NVIDIA H200), 2 ranks/GPU" in line
    assert "GPU SHARED" in line
    alone = format_context(machine_context({**run, "world_size": 1, "ranks_per_host": 1,
                                            "ranks_per_gpu": 1, "gpu_shared": False}))
    assert "1 rank/GPU" in alone and "SHARED" not in alone
    # an older GPU file without the attributes: the ranks spread over its devices
    old = machine_context({k: v for k, v in run.items() if k not in schema.GPU_ATTRS})
    assert old["ranks_per_gpu"] == 2 and old["gpu_shared"] is True
    # a CPU run's line says nothing of GPUs
    cpu = machine_context({"host_cores": 2, "world_size": 2, "hostnames": ["h"],
                           "backend": "numpy", "devices": ["cpu"]})
    assert cpu["gpus"] is None and "GPU" not in format_context(cpu)


# -- the update phase ends when its kernels have run ------------------------------------------
def test_the_update_phase_synchronizes_the_device_inside_it():
    timer = PhaseTimer()
    seen: list[str] = []
    timer.device_sync = lambda: seen.append(timer.current)
    with timer.phase("compute"):
        pass
    with timer.phase("update"):
        with timer.phase("comm"):
            pass
        with timer.phase("update"):  # nested: once, at the outer one's end
            pass
    assert seen == ["update"]
    plain = PhaseTimer()
    with plain.phase("update"):  # the CPU: nothing to wait for
        pass
    assert plain.device_sync is None


# -- compile_check: sm_90 machine code ---------------------------------------------------------
def test_nvcc_builds_sm90_machine_code_besides_ptx(tmp_path):
    source = tmp_path / "k.cu"
    cubin = compile_check.nvcc_command(source, ("-DSB_REAL=float",), "out.cubin", "sm_90")
    assert cubin[:3] == ["nvcc", "-cubin", "-arch=sm_90"] and cubin[-1] == str(source)
    assert compile_check.nvcc_command(source, (), "out.ptx")[:2] == ["nvcc", "-ptx"]
    assert compile_check.arch_builds(["nvrtc"], ("sm_90",), nvcc_found=True) == [
        ("nvrtc", "sm_90"), ("nvcc", "sm_90")]
    assert compile_check.arch_builds(["nvrtc"], ("sm_90",), nvcc_found=False) == [
        ("nvrtc", "sm_90")]
    assert compile_check.arch_builds(["host"], ("sm_90",), nvcc_found=True) == []
    assert compile_check.arch_builds(["nvrtc"], (), nvcc_found=True) == []


def test_nvrtc_builds_an_sm90_cubin():
    if compile_check.load_nvrtc() is None:
        pytest.skip("no NVRTC")
    source = compile_check.KERNEL_DIR / "optim.cu"
    result = compile_check.build(source, "nvrtc", np.dtype(np.float32), "sm_90")
    assert result.ok, result.log
    assert result.label == "nvrtc:sm_90"


# -- syncbench comm: device buffers staged as training stages them ----------------------------
@pytest.fixture
def pinned(monkeypatch):
    """Records every pinned host allocation (device_buffers.host_empty) and its backend."""
    made: list[tuple] = []

    def host_empty(backend, shape, dtype):
        made.append((backend, tuple(shape)))
        return np.empty(shape, dtype)

    monkeypatch.setattr(device_buffers, "host_empty", host_empty)
    return made


def test_rma_staging_copies_out_only_what_mpi_reads(pinned, monkeypatch):
    from syncbench.bench.micro import comm as commbench

    copies: list[str] = []
    monkeypatch.setattr(device_buffers, "copy_to_host", lambda b, d, h: copies.append("out"))
    bufs = commbench.make_buffers("cupy", False, 0, backend=numpy_backend())
    origin, result = bufs.pair("rma-get-accumulate", 64)
    bufs.mpi(origin)
    bufs.mpi(result, send=False)  # MPI writes it
    assert copies == ["out"] and len(pinned) == 2


# -- gpu_measure ---------------------------------------------------------------------------------
def _reference_args(kernel: gpu_measure.Streaming, args: tuple) -> tuple:
    """The NumPy reference's arguments: the ``out`` buffers dropped, the fixed ones added."""
    name = kernel.name
    if name in ("relu_forward", "relu_backward"):
        return args[:-1]
    if name == "axpy_":
        return (args[0], 0.3, args[1])
    if name == "bias_add_":
        return (*args, 1)
    return args


@pytest.mark.parametrize("kernel", gpu_measure.BANDWIDTH_KERNELS, ids=lambda k: k.name)
def test_bandwidth_kernels_declare_the_traffic_bytes_moved_finds(kernel):
    n = gpu_measure.elements(4096, np.float32)
    args = kernel.build(np, n, np.float32)
    reference = ops.REFERENCES[kernel.name]
    assert kernel.bytes(n, np.float32) == cuda_bench.bytes_moved(
        reference, _reference_args(kernel, args))


def test_bandwidth_arrays_are_at_least_one_gigabyte():
    assert gpu_measure.MIN_BYTES >= 1e9
    n = gpu_measure.elements(gpu_measure.MIN_BYTES, np.float32)
    assert n * 4 >= gpu_measure.MIN_BYTES and n % gpu_measure.BIAS_COLUMNS == 0


# -- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
def test_gpu_backend_names_its_cupy_and_its_gpu():
    backend = backend_module.select_backend("gpu")
    name, version = cupy_distribution(backend.xp)
    assert name.startswith("cupy") and version == backend.xp.__version__
    assert backend.device_id.startswith(("pci:", "cuda:"))


@pytest.mark.gpu
@needs_gpu
def test_bandwidth_and_gemm_on_the_gpu():
    cupy = CUPY
    table = gpu_measure.bandwidth(cupy, min_bytes=1 << 26, launches=3, repeat=2)
    assert table["timer"] == "CUDA events" and table["copy"]["gb_s"] > 0
    assert all(np.isfinite(r["vs_copy"]) and r["gb_s"] > 0 for r in table["rows"])
    rows = gpu_measure.gemm(cupy, gpu_measure.GEMMS[:2], launches=2, repeat=1)
    assert all(r["cublas_tflop_s"] and r["matmul_tflop_s"] > 0 for r in rows)


@pytest.mark.gpu
@needs_gpu
def test_update_phase_waits_for_the_gpu():
    backend = backend_module.select_backend("gpu")
    timer = PhaseTimer()
    calls: list[str] = []

    def sync() -> None:
        calls.append(timer.current)
        backend.synchronize()

    timer.device_sync = sync
    x = backend.xp.ones(1 << 24, dtype=np.float32)
    with timer.phase("update"):
        ops.axpy_(x, 0.5, x)
    assert calls == ["update"]
    assert backend.xp.cuda.get_current_stream().done
