"""``simulate --validate-pool`` from the command line: a table that is not one, or runs
counted twice, is one line and exit 2 (bench/simulate/validate_pool.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sim_helpers import needs_simgrid
from validation_rows import rows_of

from syncbench.bench.simulate.validate_pool import COLUMNS, write_table


def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench", "simulate", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content, fault", [
    (None, "No such file"),
    ("run,model\n", "not a --validate-csv table"),
    (",".join(COLUMNS) + "\n", "no runs in it"),
    (",".join(COLUMNS) + "\n/r.h5,mlp,ssgd,hom,12,fast,1e8\n", "row 2 is not"),
    (",".join(COLUMNS) + "\n/r.h5,mlp,ssgd\n", "row 2 is not"),
    ("\xff\xfe", "not a --validate-csv table"),
])
def test_a_table_that_is_not_one_is_one_line_and_exit_2(tmp_path, content, fault):
    path = tmp_path / "t.csv"
    if content is not None:
        path.write_text(content, encoding="latin-1")
    proc = simulate("--validate-pool", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and fault in proc.stderr
    assert str(path) in proc.stderr


def test_a_run_in_two_tables_or_a_table_twice_is_refused(tmp_path):
    rows = rows_of("a", {("ssgd", "hom"): [0.0]})
    for name in ("a.csv", "b.csv"):
        write_table(str(tmp_path / name), rows)
    proc = simulate("--validate-pool", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"))
    assert proc.returncode == 2 and "in more than one table" in proc.stderr
    proc = simulate("--validate-pool", str(tmp_path / "a.csv"), str(tmp_path / "a.csv"))
    assert proc.returncode == 2 and "names a file twice" in proc.stderr
    for flag in ("--validate", "--validate-csv", "--validate-out"):
        proc = simulate("--validate-pool", str(tmp_path / "a.csv"), flag, str(tmp_path / "x"))
        assert proc.returncode == 2 and f"without {flag}" in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert not (tmp_path / "x").exists()


@needs_simgrid
def test_validate_csv_without_validate_is_one_line_and_writes_nothing(tmp_path):
    proc = simulate("--algorithm", "ssgd", "--np", "2", "--validate-csv",
                    str(tmp_path / "t.csv"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("syncbench simulate: error: --validate-csv keeps the rows "
                                   "of a --validate: give it with --validate")
    assert not (tmp_path / "t.csv").exists()
