"""OD-SGD under MPI equals a serial float64 re-computation of its recurrence.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_odsgd_mpi.py``
(and ``-n 4``); the end-to-end ``syncbench train`` test launches its own
``mpiexec`` and so runs only in a plain serial ``pytest``.

Split off ``tests/mpi_inproc/test_odsgd_mpi.py``: the tests that launch a process
(``mpiexec``, a ``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis.labels import run_label
from syncbench.analysis.report import format_report, report_rows


@pytest.mark.mpi_skip
def test_train_odsgd_end_to_end_writes_run_file(tmp_path):
    from syncbench.analysis.runfile import read_run

    out = tmp_path / "odsgd.h5"
    proc = run_mpi(2, "train", "--algorithm", "odsgd", "--dataset", "synthetic",
                   "--synthetic-samples", "512", "--batch-size", "16", "--epochs", "1",
                   "--warmup-steps", "4", "--local-opt", "dc", "--eval-every", "0.5",
                   "--progress", "never", "--out", str(out), timeout=90)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert run.attrs["algorithm"] == "odsgd" and run.world_size == 2
    assert run.config["local_opt"] == "dc" and run.config["warmup_steps"] == 4
    assert run.attrs["warmup_steps"] == 4 and run.config["local_lookahead"] == "off"
    assert run_label(run.attrs) == "odsgd"
    assert format_report(report_rows([str(out)]), "csv").splitlines()[1].startswith("odsgd,")
    steps = 512 // 2 // 16
    for rank in (0, 1):
        rows = run.ranks[rank]
        assert len(rows["step"]) == steps
        np.testing.assert_array_equal(rows["staleness"], np.arange(steps) >= 4)
        assert np.all(np.isfinite(rows["loss"]))
    assert run.eval["samples_seen"][-1] == steps * 16 * 2
    assert 0.0 <= run.summary["final_accuracy"] <= 1.0
