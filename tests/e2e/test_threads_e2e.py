"""BLAS/OpenMP threads per rank: the node's cores over its ranks, unless the user chose: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_threads.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import MPIEXEC
from test_threads import CORES

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.mpi import threads

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--batch-size", "32",
         "--epochs", "1"]


LINE = "BLAS/OpenMP thread"


def _train(tmp_path, **extra: str) -> tuple[subprocess.CompletedProcess, object]:
    env = {k: v for k, v in os.environ.items() if k not in threads.USER_VARIABLES}
    env.update(extra)
    out = tmp_path / "run.h5"
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train",
                           *SMALL, "--out", str(out)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc, read_run(out)


def test_train_limits_each_rank_before_numpy_loads_and_says_so(tmp_path):
    proc, run = _train(tmp_path)
    expected = max(1, CORES // 2)
    lines = [line for line in proc.stderr.splitlines() if LINE in line]
    assert lines == [f"syncbench train: {expected} {LINE}{'s' if expected != 1 else ''} per "
                     f"rank ({CORES} cores (sched_getaffinity) / 2 ranks on this node "
                     "(MPI_LOCALNRANKS)); set OMP_NUM_THREADS to choose"], proc.stderr
    assert run.attrs[schema.THREADS_ATTR] == expected
    facts = json.loads(run.attrs[schema.ENVIRONMENT_ATTR])
    # set before NumPy loaded: the BLAS itself runs that many (its default is one per CPU)
    assert facts["train threads"]["how"].endswith(f"OpenBLAS reports {expected}"), facts


def test_train_leaves_a_users_threads_alone_and_says_nothing(tmp_path):
    proc, run = _train(tmp_path, OMP_NUM_THREADS="2")
    assert LINE not in proc.stderr
    assert run.attrs[schema.THREADS_ATTR] == 2
    facts = json.loads(run.attrs[schema.ENVIRONMENT_ATTR])
    assert "OMP_NUM_THREADS=2 set before syncbench started" in facts["train threads"]["how"]
