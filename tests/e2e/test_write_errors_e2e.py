"""Write errors (a full disk, a quota, a read-only folder, an I/O error): one line, a: the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_write_errors.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import run_mpi, tmpfs
from test_write_errors import rows_of

from syncbench.analysis.runfile import read_run
from syncbench.bench.train import checkpoint
from syncbench.bench.train.checkpoint import (
    RowsFile,
    read_rows,
    write_meta,
)

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--batch-size", "16",
         "--progress", "never"]


ROWS_PER_RANK = 64  # one epoch of SMALL over 2 ranks


def remount(folder: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(folder)], check=True)


def syncbench_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("syncbench")]


def assert_clean(proc: subprocess.CompletedProcess, folder: Path) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode not in (0, -11, 139), output[-3000:]
    assert "Traceback" not in output and "Segmentation" not in output, output[-3000:]
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name], list(folder.rglob("*"))


# -- jobs on a small tmpfs ------------------------------------------------------
def test_a_full_disk_at_the_run_file_keeps_every_row_for_recover(tmp_path):
    """The parts (~32 KiB) fit, the run file (~45 KiB) does not: one line from rank 0,
    status 2, no temporary file, the parts intact; recover works once there is room."""
    with tmpfs(tmp_path / "disk", "48k") as disk:
        out = disk / "run.h5"
        proc = run_mpi(2, "train", *SMALL, "--epochs", "1", "--flush-every", "1000",
                       "--out", str(out), timeout=120)
        assert_clean(proc, disk)
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = syncbench_lines(proc.stderr)
        assert len(lines) == 1, proc.stderr[-3000:]
        assert lines[0].startswith(f"syncbench train: error: cannot write {out}: "
                                   "No space left on device (errno 28); every row is kept in ")
        assert "syncbench recover" in lines[0]
        assert not out.exists()
        parts = disk / "run.h5.parts"
        for rank in (0, 1):
            rows, attrs, _ = read_rows(parts, rank)
            np.testing.assert_array_equal(rows["step"], np.arange(ROWS_PER_RANK))
            assert attrs["hostname"]
        full = subprocess.run([sys.executable, "-m", "syncbench", "recover", str(out)],
                              capture_output=True, text=True, timeout=60)
        assert full.returncode == 2 and "Traceback" not in full.stderr
        assert full.stderr.strip() == (f"syncbench recover: cannot write {out}: "
                                       "No space left on device (errno 28)")
        assert not [p for p in disk.rglob("*") if ".tmp" in p.name]
        remount(disk, "size=1m")  # room again
        rec = subprocess.run([sys.executable, "-m", "syncbench", "recover", str(out)],
                             capture_output=True, text=True, timeout=60)
        assert rec.returncode == 0, rec.stderr
        run = read_run(out)
        assert run.complete is False
        for rank in (0, 1):
            np.testing.assert_array_equal(run.ranks[rank]["step"], np.arange(ROWS_PER_RANK))
        assert len(run.eval["t"]) >= 1  # rank 0's evaluation rows were kept too


def test_a_disk_full_mid_run_ends_the_job_with_one_clean_line(tmp_path):
    with tmpfs(tmp_path / "disk", "12k") as disk:
        out = disk / "run.h5"
        proc = run_mpi(2, "train", *SMALL, "--epochs", "20", "--flush-every", "0.2",
                       "--out", str(out), timeout=120)
        assert_clean(proc, disk)
        lines = syncbench_lines(proc.stderr)
        assert 1 <= len(lines) <= 2, proc.stderr[-3000:]  # each rank may meet the full disk
        for line in lines:
            assert line.startswith("syncbench: rank "), line
            assert ": cannot write " in line and str(disk) in line
            assert line.endswith(": No space left on device (errno 28); aborting the job")
        assert not out.exists()


def test_save_model_on_a_full_disk_is_one_line_and_status_2(tmp_path):
    with tmpfs(tmp_path / "disk", "16k") as disk:
        model = disk / "model.npy"
        proc = run_mpi(2, "train", *SMALL, "--epochs", "1", "--save-model", str(model),
                       timeout=120)
        assert_clean(proc, disk)
        assert proc.returncode == 2
        assert syncbench_lines(proc.stderr) == [
            f"syncbench train: error: cannot write {model}: No space left on device (errno 28)"]
        assert not model.exists()


def test_recover_into_a_read_only_folder(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "run.h5"
        parts = checkpoint.parts_dir(out)
        write_meta(parts, {"algorithm": "ssgd", "world_size": 1}, None)
        RowsFile(parts, 0).flush(rows_of(10), {"hostname": "h"}, None)
        remount(disk, "ro")
        rec = subprocess.run([sys.executable, "-m", "syncbench", "recover", str(out)],
                             capture_output=True, text=True, timeout=60)
        assert rec.returncode == 2
        assert rec.stderr.strip() == (f"syncbench recover: cannot write {out}: "
                                      "Read-only file system (errno 30)")
        assert sorted(p.name for p in disk.rglob("*")) == [
            "attrs-00000.json", "meta.json", "rows-00000.bin", "run.h5.parts"]
