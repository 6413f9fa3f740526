"""What data a run read: the run file's record of it (``schema.DATA_ATTRS``), ``data info``: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_data_provenance.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from helpers import run_mpi
from test_data_provenance import FILES, make_mnist

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.data import catalog


@pytest.fixture(autouse=True)
def _only_explicit_data(tmp_path, monkeypatch):
    """No $SYNCBENCH_DATA and an empty system folder: only the test's own data is found."""
    monkeypatch.delenv("SYNCBENCH_DATA", raising=False)
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", tmp_path / "no-system-data")


def _syncbench(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SYNCBENCH_DATA"}
    return subprocess.run([sys.executable, "-m", "syncbench", *args], capture_output=True,
                          text=True, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})


def test_data_info_prints_the_hash_and_refuses_a_data_dir_that_is_not_there(tmp_path):
    paths = make_mnist(tmp_path / "mnist")
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
    proc = _syncbench("data", "info", "mnist", "--data-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"from {tmp_path / 'mnist'} sha256 {whole}")
    proc = _syncbench("data", "info", "fashion-mnist", "--data-dir", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and not proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--data-dir {tmp_path / 'nowhere'} does not exist" in lines[0]
    proc = _syncbench("data", "info", "fashion-mnist", "--data-dir", str(tmp_path))
    assert proc.returncode == 2 and f"not found in --data-dir {tmp_path}" in proc.stderr


def test_the_run_file_records_the_data_train_read_and_report_shows_it(tmp_path):
    paths = make_mnist(tmp_path / "data" / "mnist")
    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", "--dataset", "mnist", "--data-dir", str(tmp_path / "data"),
                   "--batch-size", "8", "--eval-every", "0", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
    assert run.attrs[schema.DATA_SOURCE_ATTR] == str((tmp_path / "data" / "mnist").resolve())
    assert run.attrs[schema.DATA_SHA256_ATTR] == whole
    assert len(json.loads(run.attrs[schema.DATA_FILES_ATTR])) == len(FILES)
    assert run.attrs["config"]["data_dir"] == str(tmp_path / "data")
    report = _syncbench("report", str(out))
    assert report.returncode == 0, report.stderr
    section = report.stdout.split("## Data read", 1)[1]
    assert f"mnist from {(tmp_path / 'data' / 'mnist').resolve()} (4 files), " \
           f"sha256 {whole} (1 run)" in section
    # the machine-readable tables carry it too, per run
    for fmt in ("json", "csv"):
        table = _syncbench("report", str(out), "--format", fmt)
        assert table.returncode == 0, table.stderr
        rows = (json.loads(table.stdout) if fmt == "json"
                else list(csv.DictReader(io.StringIO(table.stdout))))
        assert rows[0]["data_sha256"] == whole, fmt
        assert rows[0]["data_source"] == str((tmp_path / "data" / "mnist").resolve()), fmt
