"""``syncbench comm``: every operation under ``mpiexec -n 2``, rows, HDF5, RMA windows.

End-to-end tests launch their own ``mpiexec`` (serial pytest run, bounded by
subprocess timeouts); the statistics stored in the HDF5 file are re-computed
from its raw latencies, the columns are OSU's names, the bandwidths nccl-tests'
(algbw, busbw) and the simulator's ``--calibrate`` reads the file. The MPI
tests (pytest-mpi, ``--only-mpi`` at 2 and 4 ranks) check the RMA targets'
windows exactly and that windows are freed even when the measured body raises.
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


def test_message_sizes_and_statistics():
    assert commbench.message_sizes(4, 64) == [4, 8, 16, 32, 64]
    assert commbench.message_sizes(3, 20) == [3, 6, 12]
    with pytest.raises(ValueError):
        commbench.message_sizes(8, 4)
    samples = np.array([[1.0, 3.0], [2.0, 6.0]]) * 1e-6  # rank x iteration, seconds
    stats = commbench.latency_stats(samples, 8)
    assert stats["avg_us"] == pytest.approx(3.0)  # mean of the rank means 2 and 4
    assert (stats["min_us"], stats["max_us"]) == pytest.approx((2.0, 4.0))
    assert stats["p50_us"] == pytest.approx(2.5)  # pooled samples 1, 2, 3, 6
    assert stats["iterations"] == 2
    assert stats["algbw_mbps"] == pytest.approx(8 / 3.0)  # bytes / us = MB/s
    assert stats["busbw_mbps"] == stats["algbw_mbps"]
    # nccl-tests' bus bandwidth: 2(N-1)/N of the buffer per rank for an allreduce
    assert commbench.bus_factor("allreduce", 4) == pytest.approx(1.5)
    assert commbench.bus_factor("iallreduce", 4) == pytest.approx(1.5)
    assert commbench.bus_factor("allreduce", 2) == commbench.bus_factor("bcast", 8) == 1.0
    for op in commbench.RMA_OPS:  # one target per rank: point-to-point
        assert commbench.bus_factor(op, 16) == 1.0
    with pytest.raises(ValueError, match="no bus factor"):
        commbench.bus_factor("alltoall", 4)
    stats = commbench.latency_stats(samples, 8, commbench.bus_factor("allreduce", 8))
    assert stats["busbw_mbps"] == pytest.approx(8 / 3.0 * 14 / 8)
    # osu_iallreduce: overlap = 100 * (1 - (overall - compute) / pure)
    over = commbench.overlap_stats(10.0, np.full((2, 3), 14e-6), np.full((2, 3), 8e-6))
    assert over["overlap_pct"] == pytest.approx(40.0)
    assert commbench.overlap_stats(10.0, np.full((1, 1), 30e-6),
                                   np.full((1, 1), 1e-6))["overlap_pct"] == 0.0


def test_header_is_osu_and_aligned_with_the_rows():
    cols = commbench.columns_of("allreduce", False)
    head = commbench.header(cols)
    assert head.startswith("# Size    ") and "Avg Latency(us)" in head
    assert list(cols.values())[:5] == ["Size", "Avg Latency(us)", "Min Latency(us)",
                                       "Max Latency(us)", "Iterations"]
    assert list(cols)[-2:] == ["algbw_mbps", "busbw_mbps"]
    row = commbench.latency_stats(np.full((2, 3), 1e-6), 1 << 20)
    line = commbench.format_row(row, cols)
    assert len(line) == len(head) == 10 + 18 * (len(cols) - 1)  # OSU's widths
    fields = [head[10 + 18 * i:28 + 18 * i].strip() for i in range(len(cols) - 1)]
    assert [head[:10].strip(), *fields] == ["# Size", *list(cols.values())[1:]]
    assert line.split()[:5] == ["1048576", "1.00", "1.00", "1.00", "3"]
    iall = commbench.columns_of("iallreduce", False)
    assert list(iall)[-5:] == ["algbw_mbps", "busbw_mbps", "overall_us", "compute_us",
                               "overlap_pct"]


def test_results_keep_the_old_bandwidth_name_and_calibrate_reads_them(tmp_path):
    import h5py

    from syncbench.bench.simulate.platform import comm_timings

    sizes = [1024, 2048, 4096]
    rows = [commbench.latency_stats(np.full((2, 4), (10 + s / 1000) * 1e-6), s, 1.0)
            for s in sizes]
    path = tmp_path / "new.h5"
    commbench.write_results(str(path), {"schema": commbench.SCHEMA, "op": "allreduce",
                                        "world_size": 2}, rows, [])
    res = commbench.read_results(str(path))
    np.testing.assert_array_equal(res["bw_mbps"], res["algbw_mbps"])
    _, got_sizes, mean, _, statistic, keep = comm_timings(str(path), "allreduce", "--calibrate")
    np.testing.assert_array_equal(got_sizes, sizes)
    np.testing.assert_allclose(mean, [r["avg_us"] * 1e-6 for r in rows])
    assert statistic == "p50_us" and keep.all()
    old = tmp_path / "old.h5"  # a file from before algbw_mbps: bw_mbps only
    with h5py.File(old, "w") as f:
        f.attrs["op"] = "allreduce"
        f.create_dataset("size", data=np.array(sizes))
        f.create_dataset("avg_us", data=np.array([10.0, 20.0, 40.0]))
        f.create_dataset("bw_mbps", data=np.array([102.4, 102.4, 102.4]))
    res = commbench.read_results(str(old))
    np.testing.assert_array_equal(res["algbw_mbps"], [102.4, 102.4, 102.4])


# -- in-process MPI tests (mpiexec -n 2|4 python -m pytest --only-mpi) ------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", commbench.RMA_OPS)
def test_rma_ops_update_the_target_exactly_and_free_the_window(op):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bufs = commbench.make_buffers("numpy", False, 0)
    dtype = commbench.element_type(op)
    nbytes, iterations, skip = 64, 7, 3
    with commbench.rma_window(comm, 256, dtype.itemsize) as win:
        local = np.frombuffer(win.tomemory(), dtype=dtype)
        local[:] = 0
        comm.Barrier()
        samples = commbench.rma_samples(op, comm, win, bufs, nbytes, iterations, skip)
        assert samples.shape == (iterations,) and np.all(samples > 0)
        count = nbytes // dtype.itemsize
        # exactly one origin ((rank - 1) % N) adds 1 per element per iteration; get reads only
        expected = 0 if op == "rma-get" else skip + iterations
        np.testing.assert_array_equal(local[:count], expected)
        np.testing.assert_array_equal(local[count:], 0)
        comm.Barrier()
    assert commbench.open_windows() == 0


@pytest.mark.mpi(min_size=2)
def test_window_is_freed_when_the_body_raises():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with pytest.raises(RuntimeError, match="inside the epoch"):
        with commbench.rma_window(comm, 64, 4):
            assert commbench.open_windows() == 1
            raise RuntimeError("inside the epoch")
    assert commbench.open_windows() == 0
    comm.Barrier()
