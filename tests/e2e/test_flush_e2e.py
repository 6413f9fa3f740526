"""The incremental rows flush: at most ``--flush-every`` (1 s) of a killed rank's rows lost,
torn trailing chunks ignored, the last row re-written, each flush only its new rows.

Split off ``tests/unit/test_flush.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
from helpers import MPIEXEC, rank_pid

from syncbench.analysis.runfile import read_run
from syncbench.bench.train.checkpoint import read_rows

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--batch-size", "16",
         "--progress", "never"]


def test_a_killed_rank_loses_at_most_a_second_of_rows(tmp_path):
    out = tmp_path / "killed.h5"
    parts = tmp_path / "killed.h5.parts"
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *SMALL,
           "--epochs", "500", "--eval-every", "0", "--out", str(out)]  # default --flush-every
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not (parts / "rows-00001.bin").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        pid = rank_pid(str(out), 1)
        time.sleep(3.0)  # a few flushes
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        proc.wait(timeout=30)
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows, _, _ = read_rows(parts, 1)
    steps = rows["step"]
    assert len(steps) > 0
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    # the last append came at most --flush-every (1 s) before the kill, plus a step and
    # the flush itself on a loaded machine
    since_flush = killed - (parts / "rows-00001.bin").stat().st_mtime
    assert since_flush <= 1.0 + 1.0, since_flush
    # and it held every row up to it: the rows span the run up to that flush
    started = (parts / "meta.json").stat().st_mtime
    assert rows["t_start"][-1] >= killed - started - since_flush - 3.0
    rec = subprocess.run([sys.executable, "-m", "syncbench", "recover", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    np.testing.assert_array_equal(read_run(out).ranks[1]["step"], steps)
