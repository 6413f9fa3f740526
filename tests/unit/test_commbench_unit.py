"""``syncbench comm``: every operation under ``mpiexec -n 2``, rows, HDF5, RMA windows: the
tests that launch nothing and load no MPI.

Split off e2e/test_commbench.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.bench.micro import comm as commbench


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
