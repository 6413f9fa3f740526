"""ASGD through MPI RMA windows: atomic pushes, serial equivalence, DC-ASGD, end to end.

Under Open MPI (``make test-openmpi``) every test here holds; the same file runs
under both MPI libraries.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_asgd_mpi.py``
(and ``-n 4``); the end-to-end tests launch their own ``mpiexec`` and run in a
plain serial ``pytest``.

Split off ``tests/mpi_inproc/test_asgd_mpi.py``: the tests that launch a process
(``mpiexec``, a ``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_mpi


def _train(tmp_path, np_, *flags, samples=1024, batch=32):
    from syncbench.analysis.runfile import read_run
    from syncbench.analysis.schema import ASGD_REPORT_ATTR

    out = tmp_path / f"asgd{np_}.h5"
    proc = run_mpi(np_, "train", "--algorithm", "asgd", "--dataset", "synthetic",
                   "--synthetic-samples", str(samples), "--batch-size", str(batch),
                   "--epochs", "1", "--progress", "never", "--out", str(out), *flags,
                   timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "asgd: layout" in proc.stdout
    run = read_run(out)
    report = json.loads(run.attrs[ASGD_REPORT_ATTR])  # the asgd: line's figures, kept
    assert f"pushes {int(report['pushes'])} " in proc.stdout
    assert f"pull ms p50 {report['pull_p50_ms']:.3f} " in proc.stdout
    assert 0 < report["push_p50_ms"] <= report["push_p90_ms"] <= report["push_max_ms"]
    from syncbench.bench.simulate.workload import build_zoo_model

    # the pull's read and the push's Accumulate of the whole model, float32; DC reads W_now
    params = build_zoo_model(run.attrs["model"], "synthetic").size
    reads = 3 if "--delay-compensation" in flags else 2
    assert run.attrs["wire_bytes_per_step"] == reads * 4 * params
    budget = (samples // np_ // batch) * batch * np_
    assert run.attrs["algorithm"] == "asgd" and run.world_size == np_
    assert sum(int(rows["samples"].sum()) for rows in run.ranks.values()) == budget
    assert run.eval["samples_seen"][-1] == budget
    return run


@pytest.mark.mpi_skip
def test_train_asgd_two_ranks_writes_staleness(tmp_path):
    run = _train(tmp_path, 2)
    for rank in (0, 1):
        rows = run.ranks[rank]
        assert "staleness" in rows and len(rows["staleness"]) == len(rows["step"]) > 0
        assert np.all(rows["staleness_min"] >= 0)
        assert np.all(rows["staleness_min"] <= rows["staleness"])
    assert run.summary["final_accuracy"] > 0.3


@pytest.mark.mpi_skip
def test_train_asgd_four_ranks_is_stale(tmp_path):
    run = _train(tmp_path, 4, samples=2048, batch=16)
    stale = np.concatenate([rows["staleness"] for rows in run.ranks.values()])
    lower = np.concatenate([rows["staleness_min"] for rows in run.ranks.values()])
    assert stale.max() > 0 and np.all(lower <= stale)


@pytest.mark.mpi_skip
def test_train_asgd_dedicated_host_takes_no_steps(tmp_path):
    run = _train(tmp_path, 2, "--ps-layout", "dedicated", "--delay-compensation", "0.1",
                 "--checkpoint-every", "1")
    assert len(run.ranks[0]["step"]) == 0
    assert np.all(run.ranks[1]["staleness"] == 0)  # one worker: never stale, by both bounds
    assert np.all(run.ranks[1]["staleness_min"] == 0)
    # the host takes no steps: the fractions are over the worker only
    rows = run.ranks[1]
    # a pause at every step (16): each rank's checkpoint time is off its clock, its steps
    # are on it, so the worker's phases fit in wall_s (subtracting rank 0's off-clock time,
    # which includes committing each checkpoint while the worker trains on, broke this);
    # 1 us per step covers the two clocks' (perf_counter, MPI.Wtime) granularity
    busy = sum(float(rows[f"t_{p}"].sum()) for p in ("data", "compute", "comm", "wait",
                                                      "update", "delay"))
    assert busy <= run.summary["wall_s"] + 1e-6 * len(rows["step"])
    assert run.summary["comm_fraction"] == pytest.approx(
        rows["t_comm"].sum() / run.summary["wall_s"])


@pytest.mark.mpi_skip
@pytest.mark.parametrize("np_,layout", [pytest.param(1, "sharded", marks=pytest.mark.slow),
                                        (2, "dedicated")])
def test_one_worker_resume_is_bit_identical(tmp_path, np_, layout):
    """Crash after a checkpoint pause, resume: the final window equals an uninterrupted run's."""
    flags = ["--algorithm", "asgd", "--dataset", "synthetic", "--synthetic-samples", "1024",
             "--batch-size", "16", "--epochs", "2", "--dtype", "float64", "--progress", "never",
             "--ps-layout", layout]
    worker = np_ - 1
    full = run_mpi(np_, "train", *flags, "--out", str(tmp_path / "full.h5"),
                   "--save-model", str(tmp_path / "full.npy"), timeout=120)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "crash.h5"
    crash = run_mpi(np_, "train", *flags, "--out", str(out), "--checkpoint-every", "30",
                    "--inject-fault", f"{worker}:75", timeout=120)
    assert crash.returncode != 0 and not out.exists()
    from syncbench.analysis.runfile import read_run
    from syncbench.bench.train.checkpoint import latest_checkpoint, load_state, parts_dir, read_rows

    # the rows the crashed run saved at its checkpoint and flushed before dying
    parts = parts_dir(out)
    saved = load_state(parts, worker, latest_checkpoint(parts, np_))["rows"]["t_start"]
    flushed_t_start = read_rows(parts, worker)[0]["t_start"]
    assert 0 < len(saved) <= len(flushed_t_start)
    np.testing.assert_array_equal(flushed_t_start[:len(saved)], saved)
    resumed = run_mpi(np_, "train", *flags, "--out", str(out), "--resume",
                      "--save-model", str(tmp_path / "resumed.npy"), timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "full.npy"))
    a, b = read_run(tmp_path / "full.h5"), read_run(out)
    np.testing.assert_array_equal(a.ranks[worker]["loss"], b.ranks[worker]["loss"])
    assert b.complete and len(b.ranks[worker]["step"]) == 2 * (1024 // np_ // 16) * np_
    # resumed, not restarted: the steps before the checkpoint are the crashed run's
    # (their start times)
    t_start = b.ranks[worker]["t_start"]
    np.testing.assert_array_equal(t_start[:len(saved)], saved)
    assert not np.array_equal(t_start, a.ranks[worker]["t_start"])


@pytest.mark.mpi_skip
@pytest.mark.slow
def test_three_worker_run_resumes_into_the_same_accuracy_band(tmp_path):
    flags = ["--algorithm", "asgd", "--dataset", "synthetic", "--synthetic-samples", "2048",
             "--batch-size", "16", "--epochs", "2", "--lr", "0.02", "--progress", "never"]
    full = run_mpi(3, "train", *flags, "--out", str(tmp_path / "full.h5"), timeout=120)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "crash.h5"
    # a pause every 10 * 3 = 30 pushes, the fault at rank 2's 41st step: after the first
    # pause whatever the ranks' speeds (rank 2 has at most 30 steps there), and reached
    # even when rank 2 is the slowest (55-60 of the 256 steps under Open MPI, 2 cores)
    crash = run_mpi(3, "train", *flags, "--out", str(out), "--checkpoint-every", "10",
                    "--inject-fault", "2:40", timeout=120)
    assert crash.returncode != 0
    resumed = run_mpi(3, "train", *flags, "--out", str(out), "--resume", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    from syncbench.analysis.runfile import read_run

    a, b = read_run(tmp_path / "full.h5"), read_run(out)
    total = sum(int(rows["samples"].sum()) for rows in b.ranks.values())
    assert total == sum(int(rows["samples"].sum()) for rows in a.ranks.values())
    assert abs(a.summary["final_accuracy"] - b.summary["final_accuracy"]) < 0.1
