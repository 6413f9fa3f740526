"""A diverged run is marked in its run file and warned about once by ``train``.

Serial; the end-to-end tests launch their own ``mpiexec`` and are skipped
when pytest itself runs under mpiexec.

Split off ``tests/unit/test_divergence.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import os

import pytest
from helpers import run_mpi

from syncbench.analysis.runfile import read_run
from syncbench.analysis.summary import run_diverged

UNDER_MPI = any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


needs_mpiexec = pytest.mark.skipif(UNDER_MPI, reason="launches its own mpiexec")


SMALL = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--batch-size", "16",
         "--progress", "never"]


@needs_mpiexec
def test_a_diverged_run_is_marked_and_warned_about_once(tmp_path):
    out = tmp_path / "diverged.h5"
    proc = run_mpi(2, "train", *SMALL, "--lr", "50", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "warning" in ln]
    assert len(warnings) == 1, proc.stdout + proc.stderr
    assert warnings[0].startswith("syncbench train: warning: run diverged (")
    run = read_run(out)
    assert run.summary_extra["diverged"] is True and run_diverged(run)


@needs_mpiexec
def test_a_healthy_run_is_not_marked(tmp_path):
    out = tmp_path / "ok.h5"
    proc = run_mpi(2, "train", *SMALL, "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stdout + proc.stderr
    run = read_run(out)
    assert run.summary_extra["diverged"] is False and not run_diverged(run)
    assert run.summary["final_accuracy"] > 0.15
