"""The GPU path: kernels against their NumPy references, models, and GPU buffers under MPI: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_gpu.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams
from test_gpu import CUPY, _NumpyWithRecordingCuda, _RecordingArray

from syncbench.algorithms import device_buffers
from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator, make_communicator
from syncbench.algorithms.registry import get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data.synthetic import make_synthetic
from syncbench.kernels.backend import (
    Backend,
    numpy_backend,
)
from syncbench.kernels.zoo import build_model


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


def test_help_names_the_nonblocking_opt_in():
    proc = subprocess.run([sys.executable, "-m", "syncbench", "train", "--help"],
                          capture_output=True, text=True, timeout=120)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "--cuda-aware-nonblocking, --no-cuda-aware-nonblocking" in text
    assert "BLOCKING collectives" in text and "coll/libnbc" in text


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

    script = Path(__file__).resolve().parents[2] / "jobs" / "gpu_check.sh"
    proc = subprocess.run(["bash", str(script), "--budget"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    worst, budget = map(int, re.findall(r"(\d+) s", proc.stdout))
    assert worst <= budget <= 600, proc.stdout
