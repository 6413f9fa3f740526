"""``syncbench comm``: every operation under ``mpiexec -n 2``, rows, HDF5, RMA windows.

End-to-end tests launch their own ``mpiexec`` (serial pytest run, bounded by
subprocess timeouts); the statistics stored in the HDF5 file are re-computed
from its raw latencies, the columns are OSU's names, the bandwidths nccl-tests'
(algbw, busbw) and the simulator's ``--calibrate`` reads the file. The MPI
tests (pytest-mpi, ``--only-mpi`` at 2 and 4 ranks) check the RMA targets'
windows exactly and that windows are freed even when the measured body raises.

Split off this module: ``tests/unit/test_commbench_unit.py`` (its tests that need neither)
and ``tests/mpi_inproc/test_commbench_mpi.py`` (its in-process MPI tests).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import MPIEXEC

from syncbench.bench.micro import comm as commbench

ITERATIONS = 20


def run_comm(np_: int, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", str(np_), sys.executable, "-m", "syncbench", "comm", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def parse_rows(stdout: str) -> tuple[list[str], np.ndarray]:
    """The header's column names and the numeric rows of the fixed-column table."""
    lines = stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("# Size "))
    names = [name.strip() for name in head[2:].split("  ") if name.strip()]
    rows = [[float(x) for x in ln.split()] for ln in lines if ln and not ln.startswith("#")]
    assert rows and all(len(r) == len(names) for r in rows), stdout
    return names, np.array(rows)


@pytest.mark.parametrize("op", commbench.OPS)
def test_every_op_runs_prints_rows_and_round_trips(op, tmp_path):
    out = tmp_path / f"{op}.h5"
    proc = run_comm(2, "--op", op, "--min-size", "4", "--max-size", "4096",
                    "--iterations", str(ITERATIONS), "--skip", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    names, rows = parse_rows(proc.stdout)
    cols = commbench.columns_of(op, False)
    assert names == list(cols.values())
    sizes = [4 * 2**i for i in range(11)]
    np.testing.assert_array_equal(rows[:, 0], sizes)
    assert np.all(rows[:, 1:] >= 0)

    res = commbench.read_results(str(out))
    attrs = res["attrs"]
    assert attrs["schema"] == commbench.SCHEMA and attrs["op"] == op
    assert attrs["world_size"] == 2 and attrs["iterations"] == ITERATIONS
    for i, key in enumerate(cols):  # printed = stored, to the printed precision
        np.testing.assert_allclose(rows[:, i], res[key], atol=0.0051)
    samples = res["samples_us"]
    assert samples.shape == (len(sizes), 2, ITERATIONS)
    for k, size in enumerate(sizes):  # the statistics re-computed from the raw latencies
        recomputed = commbench.latency_stats(samples[k] / 1e6, size)
        for key in ("avg_us", "min_us", "max_us", "p50_us", "p99_us"):
            assert res[key][k] == pytest.approx(recomputed[key], rel=1e-12)
    np.testing.assert_array_equal(res["iterations"], ITERATIONS)
    # nccl-tests' algbw = size / time, busbw = algbw x the op's factor (1 at N = 2 for all)
    np.testing.assert_allclose(res["algbw_mbps"], np.array(sizes) / res["avg_us"])
    np.testing.assert_allclose(res["busbw_mbps"], res["algbw_mbps"] * commbench.bus_factor(op, 2))
    np.testing.assert_array_equal(res["bw_mbps"], res["algbw_mbps"])  # the name before
    if op == "iallreduce":
        assert np.all((res["overlap_pct"] >= 0) & (res["overlap_pct"] <= 100))
        assert np.all(res["overall_us"] > 0)
    else:
        assert attrs["nodes"] == 1


def test_check_raw_and_osu_barriers():
    proc = run_comm(2, "--op", "allreduce", "--min-size", "1024", "--max-size", "2048",
                    "--iterations", "50", "--skip", "5", "--check-raw", "--barrier")
    assert proc.returncode == 0, proc.stderr
    names, rows = parse_rows(proc.stdout)
    assert names[-2:] == ["Raw Latency(us)", "Ratio"]
    # the ratio is computed before rounding: compare to the printed precision
    np.testing.assert_allclose(rows[:, -1], rows[:, 1] / rows[:, -2], rtol=0.01, atol=0.006)


def test_setup_errors_end_every_rank_with_one_line():
    proc = run_comm(2, "--op", "allreduce", "--min-size", "1", "--max-size", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "multiple of 4" in proc.stderr
    assert proc.stderr.startswith("syncbench comm: error: "), proc.stderr
    assert proc.stderr.endswith(" (see 'syncbench comm --help')\n"), proc.stderr


def test_cupy_buffer_without_gpu_is_a_clear_error():
    from syncbench.kernels.backend import _cupy_if_available

    if _cupy_if_available() is not None:
        pytest.skip("a GPU is present")
    proc = run_comm(2, "--op", "allreduce", "--buffer", "cupy", "--max-size", "64")
    assert proc.returncode == 2
    assert "--buffer cupy needs CuPy and a CUDA GPU" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


# -- in-process MPI tests (mpiexec -n 2|4 python -m pytest --only-mpi) ------------
