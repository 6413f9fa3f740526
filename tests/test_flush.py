"""The incremental rows flush: at most ``--flush-every`` (1 s) of a killed rank's rows lost,
torn trailing chunks ignored, the last row re-written, each flush only its new rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
from helpers import MPIEXEC, rank_pid, train_config

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.train.checkpoint import RowsFile, read_rows, read_rows_file

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--batch-size", "16",
         "--progress", "never"]


def rows_of(n: int) -> dict[str, np.ndarray]:
    rows = {name: np.zeros(n, dtype=dt) for name, dt in schema.RANK_COLUMNS.items()}
    rows["step"][:] = np.arange(n)
    rows["t_start"][:] = np.arange(n) * 0.01
    rows["t_compute"][:] = 0.005
    return rows


def test_the_default_flush_is_every_second():
    assert train_config().flush_every == 1.0


def test_each_flush_appends_its_new_rows_and_the_last_one_again(tmp_path):
    rows = rows_of(100)
    file = RowsFile(tmp_path, 3)
    file.flush({k: v[:40] for k, v in rows.items()}, {"hostname": "h"}, None)
    size = file.path.stat().st_size
    rows["t_compute"][39] += 1.0  # add_to_last after the flush
    file.flush({k: v[:41] for k, v in rows.items()}, {"hostname": "h"}, None)
    record = np.dtype([(n, d) for n, d in schema.RANK_COLUMNS.items()]).itemsize
    assert file.path.stat().st_size - size == 24 + 2 * record  # rows 39 and 40 only
    file.flush(rows, {"hostname": "h"}, None)
    got = read_rows_file(file.path)
    for name in schema.RANK_COLUMNS:
        np.testing.assert_array_equal(got[name], rows[name])
    assert got["t_compute"][39] == 1.005


def test_a_torn_or_corrupt_trailing_chunk_is_ignored(tmp_path):
    rows = rows_of(30)
    file = RowsFile(tmp_path, 0)
    file.flush({k: v[:20] for k, v in rows.items()}, {}, None)
    whole = file.path.stat().st_size
    file.flush(rows, {}, None)
    data = file.path.read_bytes()
    for cut in (whole + 5, whole + 30, len(data) - 1):  # a flush cut short anywhere
        file.path.write_bytes(data[:cut])
        np.testing.assert_array_equal(read_rows_file(file.path)["step"], np.arange(20))
    corrupt = bytearray(data)
    corrupt[-3] ^= 0xFF  # a flipped byte in the last chunk: its CRC fails
    file.path.write_bytes(bytes(corrupt))
    np.testing.assert_array_equal(read_rows_file(file.path)["step"], np.arange(20))
    file.path.write_bytes(data + b"\0" * 100)  # zeros after the end (a crash's garbage)
    np.testing.assert_array_equal(read_rows_file(file.path)["step"], np.arange(30))


def test_a_new_process_starts_the_file_afresh(tmp_path):
    """A resumed run's rows come from its checkpoint: the crashed run's later rows go."""
    RowsFile(tmp_path, 0).flush(rows_of(50), {}, None)
    RowsFile(tmp_path, 0).flush(rows_of(10), {}, None)
    np.testing.assert_array_equal(read_rows(tmp_path, 0)[0]["step"], np.arange(10))


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
