"""AdamW, the local optimizer part: against ``torch.optim.AdamW`` in float64, its state
through a checkpoint, its choice by ``--optimizer`` and its bad input.

The PyTorch comparison is skipped where PyTorch is not installed (the CPU wheel:
``pip install torch``). Both sides run the same operations in the same order
(``torch/optim/adam.py``, ``_single_tensor_adam``), so they agree to a few units in
the last place; PyTorch's CPU ``lerp`` and ``addcmul`` may fuse a multiply-add, which
the NumPy passes round separately: the bound below allows for that and nothing more.

Split off ``tests/unit/test_adamw.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
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
