"""Heterogeneity emulation: slowdown specs, schedules, and the driver following them.

Serial tests; the end-to-end ones launch their own ``mpiexec`` (bounded by
subprocess timeouts) and are skipped when pytest itself runs under mpiexec.

Split off ``tests/unit/test_hetero.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis.runfile import read_run

UNDER_MPI = any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


SMALL = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--batch-size", "16",
         "--progress", "never"]


# -- end to end: the driver and the algorithms -----------------------------------
needs_mpiexec = pytest.mark.skipif(UNDER_MPI, reason="launches its own mpiexec")


@needs_mpiexec
@pytest.mark.parametrize("algorithm", ["oscars", "localsgd"])
def test_driver_runs_with_a_slowdown_schedule(tmp_path, algorithm):
    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", *SMALL, "--algorithm", algorithm, "--epochs", "2",
                   "--eval-every", "0.5", "--slowdown", "1,3",
                   "--slowdown-schedule", "0.2s:1=1,0=3", "--out", str(out), timeout=90)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    budget = 2 * (1024 // 2 // 16) * 16 * 2  # epochs * steps_per_epoch * batch * ranks
    samples = sum(int(rows["samples"].sum()) for rows in run.ranks.values())
    assert samples == budget  # equal work: exactly the sample budget
    assert run.eval["samples_seen"][-1] == budget
    assert np.all(np.diff(run.eval["samples_seen"]) > 0)
    assert run.rank_attrs[1]["slowdown"] == 3.0
    assert run.ranks[1]["t_delay"][:3].sum() > 0  # rank 1 was slowed down at first
    for rows in run.ranks.values():
        assert rows["round"][-1] >= 1 and np.all(rows["local_steps"] >= 1)
        assert np.all(np.diff(rows["round"]) >= 0)
    rounds = {int(rows["round"][-1]) for rows in run.ranks.values()}
    assert len(rounds) == 1  # every rank ended in the same round


@needs_mpiexec
def test_bad_slowdown_schedule_fails_before_training():
    started = time.monotonic()
    proc = run_mpi(2, "train", *SMALL, "--slowdown-schedule", "5s:2=3", timeout=60)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncbench")]
    assert len(errors) == 1 and "rank 2 out of range 0..1" in errors[0], proc.stderr
    assert errors[0].startswith("syncbench train: error: ")
    assert "Traceback" not in proc.stderr


@needs_mpiexec
@pytest.mark.alone  # the realised factor is a ratio of times: not beside another test worker
@pytest.mark.parametrize(("mode", "recorded"), [(None, "work"), ("sleep", "sleep")])
def test_driver_records_the_slowdown_mode_reference_and_realised_factor(tmp_path, mode,
                                                                        recorded):
    out = tmp_path / "run.h5"
    flags = ["--slowdown-mode", mode] if mode else []  # default auto: 2 ranks share a node
    proc = run_mpi(2, "train", *SMALL, "--algorithm", "ssgd", "--epochs", "2",
                   "--slowdown", "1,4", *flags, "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    fast, slow = run.rank_attrs[0], run.rank_attrs[1]
    assert fast["slowdown_mode"] == "none" and fast["slowdown_realised"] == 1.0
    assert math.isnan(fast["slowdown_reference_s"])
    assert slow["slowdown_mode"] == recorded
    rows = run.ranks[1]
    assert slow["slowdown_reference_s"] > 0
    # the analysis's definition (per-step medians against the unslowed rank's compute),
    # not the rank's own busy over its own compute
    from syncbench.analysis.fairness import realised_factor

    assert slow["slowdown_realised"] == pytest.approx(realised_factor(run, "median"))
    assert len(rows["t_delay"]) > 0
    # The rank's own delay follows its own compute: (compute + delay) / compute
    # per step is the factor, whatever else runs on the machine.
    own = np.median((rows["t_compute"] + rows["t_delay"]) / rows["t_compute"])
    assert 3.0 < own < 5.0
    # Against the other rank's compute it is looser: on a shared machine the
    # slowed rank's compute itself runs up to ~1.5x slower than the fast rank's
    # (it computes while the fast rank busy-polls in the Allreduce; CI read 5.69).
    assert 2.0 < slow["slowdown_realised"] < 8.0
    assert run.attrs["buckets"] == 2  # mlp at the default bucket size
