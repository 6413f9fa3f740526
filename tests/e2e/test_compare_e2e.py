"""``syncbench report --compare A B``: the U test, the sets of runs, flags and bad input: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_compare.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import subprocess
import sys

from test_compare import (
    needs_golden,
    results_pair,  # noqa: F401  (fixtures)
)

from syncbench.analysis import compare


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench", "report", *args],
                          capture_output=True, text=True, timeout=120)


@needs_golden
def test_the_command_prints_a_fixed_table_and_exits_by_its_flags(results_pair):
    a, b, _ = results_pair
    proc = run_report("--compare", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("label "))
    rows = [ln for ln in lines if ln and not ln.startswith("#") and ln != head]
    start = head.index("result")
    assert rows and all(ln[start - 2:start] == "  " and ln[start] != " " for ln in rows)
    flagged = [ln for ln in rows if ln[start:].startswith("changed")]
    assert len(flagged) == 2 and all(ln.startswith("ssgd ") for ln in flagged)
    assert all(" samples_per_s " in ln and " 0.70 (" in ln for ln in flagged)
    assert lines[-1].startswith("# 2 changed: ssgd ")
    proc = run_report("--compare", str(a), str(b), "--fail-on-change")
    assert proc.returncode == 1
    proc = run_report("--compare", str(a), str(b), "--fail-on-change", "--threshold", "0.5")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "# no change flagged"
    proc = run_report("--compare", str(a), str(b), "--format", "json")
    records = json.loads(proc.stdout)
    assert sum(r["result"] == "changed" for r in records) == 2
    assert set(records[0]) == set(compare.RECORD_KEYS)


def one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("syncbench report: ") and words in proc.stderr, proc.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    other = tmp_path / "report.json"
    other.write_text(json.dumps([{"algorithm": "ssgd"}]))  # a report's JSON, not results
    text = tmp_path / "notes.json"
    text.write_text("not json")
    missing = str(tmp_path / "missing.json")
    one_line_error(run_report("--compare", missing, str(other)), "missing.json: no such")
    one_line_error(run_report("--compare", str(other), str(other)), "not a results file")
    one_line_error(run_report("--compare", str(text), str(other)), "not JSON")
    not_run = tmp_path / "x.h5"
    not_run.write_bytes(b"\x00" * 64)
    one_line_error(run_report("--compare", str(not_run), str(not_run)), "x.h5")
    one_line_error(run_report("--compare", str(other)), "takes two sets")
    one_line_error(run_report("--compare", str(other), str(other), "--by", "algorithm"),
                   "--by does not apply")
    one_line_error(run_report("--compare", str(other), str(other), "--alpha", "2"),
                   "--alpha must be between 0 and 1")  # before any file is read
    one_line_error(run_report("--compare", str(other), str(other), "--format", "steps"),
                   "--format steps does not apply")


@needs_golden
def test_bad_flags_with_good_files(results_pair):
    a, b, _ = results_pair
    one_line_error(run_report("--compare", str(a), str(b), "--target-accuracy", "0.8"),
                   "records its figures")
