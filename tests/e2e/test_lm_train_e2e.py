"""A language model in the training pipeline: its result clause, its divergence rule, and
``syncbench train --model gpt --dataset shakespeare`` on 1 and 2 ranks (the latter two
only where the corpus is under ``$SYNCBENCH_DATA``).

Here, the tests that launch a process (``mpiexec``, a ``syncbench`` command) or start MPI in
the test's own process; the rest are in ``tests/unit/test_lm_train.py``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis.runfile import read_run
from syncbench.bench.data import catalog, text
from syncbench.bench.data.dataset import DatasetError

TINY = ["--model", "gpt:d=32,layers=1,heads=2,ctx=32", "--dataset", "shakespeare",
        "--batch-size", "8", "--lr", "0.3", "--epochs", "0.002", "--progress", "never"]


def corpus_root() -> str:
    for root in [p for p in os.environ.get("SYNCBENCH_DATA", "").split(os.pathsep) if p]:
        try:
            catalog.find_dataset_dir("shakespeare", root)
            return root
        except DatasetError:
            continue
    pytest.skip("the shakespeare corpus is not under $SYNCBENCH_DATA "
                "(syncbench data fetch shakespeare --out-dir DIR)")


@pytest.mark.parametrize("ranks", [1, 2])
def test_train_gpt_on_shakespeare(tmp_path, ranks):
    out = tmp_path / "lm.h5"
    proc = run_mpi(ranks, "train", *TINY, "--data-dir", corpus_root(), "--out", str(out),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nats/token" in proc.stdout and "accuracy" not in proc.stdout
    run = read_run(out)
    assert np.isnan(run.eval["accuracy"]).all()
    assert run.eval["loss"][-1] < math.log(256)
    assert run.attrs["data_sha256"] == text.CORPUS_SHA256
