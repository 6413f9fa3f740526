"""Write errors (a full disk, a quota, a read-only folder, an I/O error): one line, a
non-zero exit on every rank, no temporary file, the parts kept for ``syncbench recover``.

The job tests mount a small tmpfs (root only; skipped otherwise) and run real
``mpiexec -n 2`` jobs with subprocess timeouts; the errno cases that a tmpfs
cannot produce for root (a quota, an I/O error) are injected into ``os.write``.

Split off this module: ``tests/e2e/test_write_errors_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import errno
import json
import os
import uuid

import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.train import checkpoint
from syncbench.bench.train.checkpoint import (
    RowsFile,
    WriteError,
    read_rows,
    save_state,
    write_atomic,
    write_meta,
)
from syncbench.bench.train.recorder import write_run_file


def rows_of(n: int, start: float = 0.0) -> dict[str, np.ndarray]:
    rows = {name: np.zeros(n, dtype=dt) for name, dt in schema.RANK_COLUMNS.items()}
    rows["step"][:] = np.arange(n)
    rows["t_start"][:] = start + np.arange(n) * 0.01
    rows["t_compute"][:] = 0.005
    rows["samples"][:] = 16
    return rows


# -- every writer, every errno (in-process) -------------------------------------
ERRNOS = [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO]


@pytest.fixture
def failing_write(monkeypatch):
    """``fail(code)``: ``os.write`` raises that errno from now on."""
    def fail(code: int) -> None:
        def write(fd: int, data: bytes) -> int:
            raise OSError(code, os.strerror(code))
        monkeypatch.setattr(checkpoint.os, "write", write)
    return fail


@pytest.mark.parametrize("code", ERRNOS)
def test_write_error_names_the_path_and_the_cause(tmp_path, failing_write, code):
    final = tmp_path / "x.json"
    final.write_text("old")
    failing_write(code)
    with pytest.raises(WriteError) as raised:
        write_atomic(final, b"new")
    assert str(raised.value) == f"cannot write {final}: {os.strerror(code)} (errno {code})"
    assert raised.value.errno == code and isinstance(raised.value, OSError)
    assert final.read_text() == "old"  # the previous version stays
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary file


@pytest.mark.parametrize("writer", ["meta", "state", "run_file", "rows", "append"])
def test_every_writer_raises_write_error_and_leaves_nothing(tmp_path, failing_write, writer):
    parts = tmp_path / "run.h5.parts"
    rows_file = RowsFile(parts, 0)
    rows_file.flush(rows_of(5), {"hostname": "h"}, None)
    before = (parts / "rows-00000.bin").read_bytes()
    calls = {
        "meta": lambda: write_meta(parts, {"a": 1}, None),
        "state": lambda: save_state(parts, 0, 3, {"x": np.arange(4)}),
        "run_file": lambda: write_run_file(tmp_path / "run.h5", {}, {0: rows_of(5)}, {0: {}},
                                           {k: np.zeros(0, dt) for k, dt
                                            in schema.EVAL_COLUMNS.items()}, 1.0, None),
        "rows": lambda: RowsFile(parts, 0).flush(rows_of(9), {"hostname": "h"}, None),
        "append": lambda: rows_file.flush(rows_of(9), {"hostname": "h"}, None),
    }
    failing_write(errno.ENOSPC)
    with pytest.raises(WriteError, match="No space left on device"):
        calls[writer]()
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert (parts / "rows-00000.bin").read_bytes() == before  # an append is cut back
    np.testing.assert_array_equal(read_rows(parts, 0)[0]["step"], np.arange(5))


def test_write_error_on_a_missing_folder(tmp_path):
    with pytest.raises(WriteError, match=r"cannot write .*: No such file or directory"):
        write_atomic(tmp_path / "nowhere" / "x", b"")


def test_recover_reads_old_npz_rows(tmp_path):
    """Rows files of earlier versions (``rows-RRRRR.npz``, rewritten whole)."""
    out = tmp_path / "old.h5"
    parts = checkpoint.parts_dir(out)
    write_meta(parts, {"algorithm": "ssgd", "world_size": 1}, None)
    arrays = {f"row_{k}": v for k, v in rows_of(7).items()}
    arrays.update({f"eval_{k}": np.zeros(1, dt) for k, dt in schema.EVAL_COLUMNS.items()})
    arrays["attrs"] = np.array(json.dumps({"hostname": "old"}))
    np.savez(parts / "rows-00000.npz", **arrays)
    checkpoint.recover(out)
    run = read_run(out)
    np.testing.assert_array_equal(run.ranks[0]["step"], np.arange(7))
    assert len(run.eval["t"]) == 1 and run.complete is False


def test_hdf5_images_touch_no_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = checkpoint.hdf5_image(lambda f: f.create_dataset(uuid.uuid4().hex, data=[1]))
    assert image[:8] == b"\x89HDF\r\n\x1a\n" and not list(tmp_path.iterdir())
