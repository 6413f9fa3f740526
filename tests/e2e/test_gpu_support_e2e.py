"""The GPU path's support code, tested without a GPU (and a few checks that need one): the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_gpu_support.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from helpers import train_config
from test_gpu_support import pinned  # noqa: F401  (fixtures)

from syncbench.algorithms import device_buffers
from syncbench.algorithms.timing import PhaseTimer
from syncbench.analysis import schema
from syncbench.kernels import compile_check, gpu_measure
from syncbench.kernels.backend import (
    numpy_backend,
)
from syncbench.kernels.compile_check import HostEmulator
from syncbench.kernels.cuda_launch import use_launcher


@pytest.mark.parametrize("algorithm", ["ssgd", "odsgd", "oscars", "localsgd"])
def test_every_strategy_update_ends_with_the_device_sync(algorithm):
    from mpi4py import MPI

    from syncbench.algorithms.base import Budget
    from syncbench.algorithms.communicator import Communicator
    from syncbench.algorithms.registry import get_algorithm
    from syncbench.bench.data.synthetic import make_synthetic
    from syncbench.bench.train.stream import BatchStream
    from syncbench.kernels.zoo import build_model

    data = make_synthetic(128, 16, (1, 28, 28), 10, seed=1)
    flags = ["--algorithm", algorithm] + (["--warmup-steps", "1"] if algorithm == "odsgd"
                                          else [])
    config = train_config(*flags)
    model = build_model("mlp", data.input_shape, 10, numpy_backend(), np.float64, seed=0)
    comm = MPI.COMM_SELF.Dup()
    timer = PhaseTimer()
    seen: list[str] = []
    timer.device_sync = lambda: seen.append(timer.current)
    algo = get_algorithm(algorithm)(model, Communicator(comm, timer), config,
                                    Budget(4 * 16, 16, 1))
    stream = BatchStream(data.train_x, data.train_y, 0, 1, 16, 0, dtype=np.float64)
    try:
        while not algo.done():
            timer.reset()
            algo.step(*stream.next())
        algo.finish()
    finally:
        algo.close()
        comm.Free()
    assert seen and set(seen) == {"update"}


def test_compile_check_runs_nvcc_for_sm90_when_nvcc_is_found(monkeypatch, capsys):
    """With nvcc on PATH (a stand-in that records its command lines), the default
    --arch builds every source for sm_90 with -cubin, as well as the PTX."""
    calls: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    real_which = compile_check.shutil.which
    monkeypatch.setattr(compile_check.shutil, "which",
                        lambda name: "/opt/cuda/bin/nvcc" if name == "nvcc" else real_which(name))
    monkeypatch.setattr(compile_check.subprocess, "run", fake_run)
    source = str(compile_check.KERNEL_DIR / "dense.cu")
    assert compile_check.main(["--compiler", "nvcc", source]) == 0
    cubins = [c for c in calls if "-cubin" in c]
    assert len(cubins) == 2 and all("-arch=sm_90" in c for c in cubins)  # float, double
    assert len([c for c in calls if "-ptx" in c]) == 2
    assert "nvcc:sm_90" in capsys.readouterr().out


@pytest.mark.parametrize("op", ["allreduce", "iallreduce", "bcast"])
def test_comm_stages_device_buffers_through_trainings_pinned_mirrors(pinned, op):
    from mpi4py import MPI

    from syncbench.bench.micro import comm as commbench

    backend = numpy_backend()  # NumPy arrays through the device path
    bufs = commbench.make_buffers("cupy", False, 0, backend=backend)
    assert bufs.staged and bufs.staging == "pinned"
    body = commbench.collective_body(op, MPI.COMM_SELF, bufs, 256)
    body()
    body()
    device = bufs.communicator(MPI.COMM_SELF)
    assert isinstance(device, device_buffers.DeviceCommunicator) and not device.cuda_aware
    # one mirror, allocated once (pinned on the GPU), 256 bytes out and back per call
    assert pinned == [(backend, (256 // commbench.element_type(op).itemsize,))]
    assert device.staging.bytes["to_host"] == 2 * 256
    # the root of a Bcast keeps its buffer: nothing comes back
    assert device.staging.bytes["to_device"] == (2 * 256 if op != "bcast" else 0)


def test_comm_hands_device_buffers_directly_to_a_cuda_aware_mpi(pinned):
    from mpi4py import MPI

    from syncbench.bench.micro import comm as commbench

    bufs = commbench.make_buffers("cupy", True, 0, backend=numpy_backend())
    assert not bufs.staged and bufs.staging == "direct"
    for op in ("allreduce", "iallreduce"):
        commbench.collective_body(op, MPI.COMM_SELF, bufs, 256)()
    device = bufs.communicator(MPI.COMM_SELF)
    assert device.cuda_aware and device.nonblocking_direct
    assert device.staging.bytes == {"to_host": 0, "to_device": 0} and pinned == []


def test_cupy_is_not_imported_by_these_helpers():
    """The CPU path: the distribution look-up reads metadata only."""
    import subprocess
    import sys

    code = ("import sys\nfrom syncbench.kernels.backend import cupy_distribution\n"
            "cupy_distribution()\nassert 'cupy' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_run_files_record_the_cupy_package_and_version(monkeypatch):
    from syncbench.bench.train import driver

    monkeypatch.setattr(driver, "cupy_distribution", lambda module=None: ("cupy-cuda13x",
                                                                          "14.2.0"))
    stub = types.SimpleNamespace(config=train_config("--algorithm", "ssgd"), size=1,
                                 started_utc="2026-01-01T00:00:00Z", backend=numpy_backend(),
                                 algorithm=types.SimpleNamespace(run_attributes={}))
    attrs = driver.Training.root_attrs(stub, ["h"], ["cpu"])
    assert attrs["cupy_package"] == "cupy-cuda13x" and attrs["cupy_version"] == "14.2.0"
    assert {"cupy_package", "cupy_version"} <= set(schema.ROOT_ATTRS)
    assert {"cupy_package", *schema.GPU_ATTRS} <= set(schema.OPTIONAL_ROOT_ATTRS)


# -- the machine context: GPUs, ranks per GPU, a shared GPU ----------------------------------
def _infos(gpus: list[str]) -> list[dict]:
    return [{"host_cores": 16, "host_cpus": 16, "machine": "boot-1", "gpu": g} for g in gpus]


def test_two_ranks_on_one_gpu_are_flagged():
    from syncbench.bench.train.driver import machine_attrs

    shared = machine_attrs(["h", "h"], _infos(["pci:0000:3b:00.0"] * 2), None)
    assert shared["gpu_count"] == 1 and shared["ranks_per_gpu"] == 2
    assert shared["gpu_shared"] is True and shared["oversubscribed"] is False
    apart = machine_attrs(["h", "h"], _infos(["pci:0000:3b:00.0", "pci:0000:5e:00.0"]), None)
    assert apart["gpu_count"] == 2 and apart["ranks_per_gpu"] == 1
    assert apart["gpu_shared"] is False
    cpu = machine_attrs(["h", "h"], _infos(["", ""]), None)
    assert (cpu["gpu_count"], cpu["ranks_per_gpu"], cpu["gpu_shared"]) == (0, 0, False)


def test_bandwidth_and_gemm_tables_on_the_host_emulator():
    with use_launcher(HostEmulator()):
        table = gpu_measure.bandwidth(np, min_bytes=4096, launches=2, repeat=1)
    assert table["timer"] == "perf_counter" and table["peak_gb_s"] is None
    assert [r["kernel"] for r in table["rows"]] == [k.name for k in
                                                    gpu_measure.BANDWIDTH_KERNELS]
    for row in table["rows"]:
        assert row["gb_s"] > 0
        assert row["vs_copy"] == pytest.approx(row["gb_s"] / table["copy"]["gb_s"])
    assert "vs copy" in gpu_measure.format_bandwidth(table)
    small = (gpu_measure.Gemm("x.T @ dy", (16, 8), (16, 4), ta=True),
             gpu_measure.Gemm("dy @ cols.T", (3, 20), (5, 20), tb=True))
    rows = gpu_measure.gemm(np, small, np.float64, launches=2, repeat=1)
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(8, 4, 16), (3, 5, 20)]
    assert rows[0]["cublas_tflop_s"] is None and "-" in gpu_measure.format_gemm(rows)
    with pytest.raises(ValueError):
        gpu_measure.Gemm("bad", (2, 3), (4, 5)).mnk()
    assert all(g.mnk() for g in gpu_measure.GEMMS)
