"""AdamW, the local optimizer part: against ``torch.optim.AdamW`` in float64, its state: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_adamw.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import time

from helpers import run_mpi


def test_bad_optimizer_options_end_train_with_one_line_and_status_2():
    started = time.monotonic()
    proc = run_mpi(2, "train", "--dataset", "synthetic", "--synthetic-samples", "256",
                   "--optimizer", "adamw", "--beta1", "1.5", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started < 30
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("syncbench train: error: --beta1 must be in [0, 1), got 1.5")
    assert "Traceback" not in proc.stderr
