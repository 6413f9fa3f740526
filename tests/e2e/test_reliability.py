"""No hangs, clear errors, nothing lost: failures under a real 4-rank mpiexec.

Each test launches its own job with a subprocess timeout, so a hang fails the
test instead of blocking the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import MPIEXEC, rank_pids, run_mpi

from syncbench.analysis.runfile import read_run

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--batch-size", "16"]

# Every strategy: a raising rank ends the job, a crash resumes (tests/unit/test_registry.py).


def test_a_killed_rank_ends_the_job(tmp_path):
    marker = str(tmp_path / "killed.h5")
    cmd = [MPIEXEC, "-n", "4", sys.executable, "-m", "syncbench", "train", *SMALL,
           "--epochs", "50", "--out", marker]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 30
        pids = []
        while time.monotonic() < deadline and len(pids) < 4:
            time.sleep(0.2)
            pids = rank_pids(marker)
        assert len(pids) == 4, f"ranks not found: {pids}"
        time.sleep(1.0)  # let training start
        os.kill(pids[2], signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - killed < 20
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in rank_pids(marker):
            os.kill(pid, signal.SIGKILL)


def _heartbeat_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("syncbench-hb-*")}


def test_hang_guard_names_the_rank_that_did_not_arrive():
    """Without --out no heartbeat file is written (the probes carry the progress), so the
    abort leaves no folder behind in the temporary directory."""
    before = _heartbeat_folders()
    started = time.monotonic()
    proc = run_mpi(4, "train", *SMALL, "--timeout", "3", "--inject-fault", "2:10:compute:hang",
                   timeout=60)
    assert proc.returncode != 0
    assert _heartbeat_folders() <= before
    assert time.monotonic() - started < 25
    lines = [ln for ln in proc.stderr.splitlines() if "no progress for" in ln]
    assert len(lines) == 1, proc.stderr[-2000:]  # rank 0's; the others' guards defer to it
    assert lines[0].startswith("syncbench: rank 0: ")
    assert lines[0].endswith("ranks that had not arrived: 2; aborting the job")


@pytest.mark.slow
def test_hang_guard_keeps_the_rows_until_the_hang(tmp_path):
    """No periodic flush (--flush-every far away): the guard flushes every rank's rows
    from its thread while the main thread is blocked, and recover rebuilds them."""
    out = tmp_path / "hang.h5"
    proc = run_mpi(2, "train", *SMALL, "--timeout", "3", "--flush-every", "1000",
                   "--inject-fault", "1:10:compute:hang", "--out", str(out), timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    rec = run_mpi(1, "recover", str(out), timeout=60)
    assert rec.returncode == 0, rec.stderr
    run = read_run(out)
    for rank in (0, 1):  # steps 0-9 done; rank 0 waits in step 10's allreduce
        np.testing.assert_array_equal(run.ranks[rank]["step"], np.arange(10))


def test_partial_run_is_recoverable_and_reported(tmp_path):
    out = tmp_path / "crash.h5"
    proc = run_mpi(2, "train", *SMALL, "--out", str(out), "--flush-every", "0.01",
                   "--inject-fault", "1:40", timeout=60)
    assert proc.returncode != 0 and not out.exists()
    parts = tmp_path / "crash.h5.parts"
    assert (parts / "rows-00000.bin").exists() and (parts / "rows-00001.bin").exists()
    # a new run refuses to discard the parts
    again = run_mpi(2, "train", *SMALL, "--out", str(out), timeout=60)
    assert again.returncode == 2 and "syncbench recover" in again.stderr
    rec = run_mpi(1, "recover", str(out), timeout=60)
    assert rec.returncode == 0, rec.stderr
    run = read_run(out)
    assert run.complete is False
    for rank in (0, 1):
        steps = run.ranks[rank]["step"]
        assert 0 < len(steps) <= 41
        np.testing.assert_array_equal(steps, np.arange(len(steps)))
    report = run_mpi(1, "report", str(out), "--format", "csv", timeout=60)
    assert report.returncode == 0 and "ssgd" in report.stdout


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    proc = run_mpi(2, "train", *SMALL, "--out", str(tmp_path / "x.h5"), "--resume",
                   timeout=60)
    assert proc.returncode == 2
    assert "--resume: no checkpoint" in proc.stderr


@pytest.mark.parametrize(("flags", "needle"), [
    (["--target-accuracy", "0.5", "--stop-at-target"], "asgd cannot --stop-at-target"),
])
def test_asgd_refuses_flags_it_cannot_honour(tmp_path, flags, needle):
    proc = run_mpi(2, "train", *SMALL, "--algorithm", "asgd", "--out", str(tmp_path / "a.h5"),
                   *flags, timeout=60)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("syncbench")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert errors[0].startswith("syncbench train: error: ")
    assert errors[0].endswith(" (see 'syncbench train --help')")
    assert not (tmp_path / "a.h5").exists()
