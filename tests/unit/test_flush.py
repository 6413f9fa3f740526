"""The incremental rows flush: at most ``--flush-every`` (1 s) of a killed rank's rows lost,
torn trailing chunks ignored, the last row re-written, each flush only its new rows.

Split off this module: ``tests/e2e/test_flush_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import numpy as np
from helpers import train_config

from syncbench.analysis import schema
from syncbench.bench.train.checkpoint import RowsFile, read_rows, read_rows_file


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
