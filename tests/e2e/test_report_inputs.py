"""What a user hands ``syncbench report`` and ``trace``, on real run files.

One ``syncbench compare`` of SSGD and Local SGD (2 ranks, synthetic data, a
target) makes a results folder; two more ``syncbench train`` runs make an SSGD
run of the same work without a target, saved under a name of the user's
(``ssgd.h5``), and one with another batch. Then: ``--compare`` pairs runs by what
they record, not by their names; a missing target is "n/a"; a run file with
bytes overwritten in its rows is one line and exit 2; results files and folders
are accepted by report and trace; ``-o`` writes any format.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import MPIEXEC

from syncbench.bench.cli import main

FLAGS = ("--dataset", "synthetic", "--epochs", "0.25", "--seed", "0", "--progress", "never")


@dataclass
class Done:
    """What a command did: exit status, stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str


def syncbench(*args: str, cwd: Path | None = None, user: bool = False) -> Done:
    """``syncbench ARGS`` in this process (the CLI's own main: seconds saved per call), or
    as nobody in a child (``user``: permission bits stop it; they do not stop root)."""
    if user:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
               sys.executable, "-m", "syncbench", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=cwd)
        return Done(proc.returncode, proc.stdout, proc.stderr)
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        os.chdir(cwd or here)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
    return Done(code, out.getvalue(), err.getvalue())


def one_line(proc: Done, *words: str, prog: str = "report") -> str:
    """The one stderr line of a refusal (exit 2, no traceback), holding ``words``."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"syncbench {prog}: "), proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The results folder ``demo`` of a compare, ``mine/ssgd.h5`` (no target) and
    ``batch/ssgd-hom-r0.h5`` (batch 32), made side by side."""
    root = tmp_path_factory.mktemp("inputs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [[sys.executable, "-m", "syncbench", "compare", "--algorithms", "ssgd,localsgd",
             "--np", "2", "--repeats", "1", "--out-dir", "demo", "--target-accuracy", "0.5",
             "--mpiexec", MPIEXEC, *FLAGS]]
    for out, extra in (("mine/ssgd.h5", ()), ("batch/ssgd-hom-r0.h5", ("--batch-size", "32"))):
        (root / out).parent.mkdir()
        jobs.append([MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train",
                     "--algorithm", "ssgd", "--eval-every", "0.05", *FLAGS, *extra,
                     "--out", str(root / out)])
    procs = [subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd in jobs]
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output
    return root


# ---------------------------------------------------------------- --compare pairs by identity


@pytest.mark.slow
def test_compare_pairs_runs_by_what_they_record_not_by_name(made, tmp_path):
    misnamed = tmp_path / "b"
    misnamed.mkdir()  # Local SGD's run under SSGD's name
    shutil.copy(made / "demo" / "localsgd-hom-r0.h5", misnamed / "ssgd-hom-r0.h5")
    proc = syncbench("report", "--compare", str(made / "demo"), str(misnamed),
                     "--format", "json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert records and {r["label"] for r in records} == {"localsgd"}
    assert {r["ratio"] for r in records if r["figure"] == "samples_per_s"} == {1.0}
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 1 and "warning: A (" in warnings[0] and "ssgd" in warnings[0]


@pytest.mark.slow
def test_runs_of_other_work_are_not_compared_and_fail_on_change_says_so(made):
    proc = syncbench("report", "--compare", str(made / "demo" / "ssgd-hom-r0.h5"),
                     str(made / "batch"))
    assert proc.returncode == 0
    assert "nothing compared" in proc.stdout and "B/A" not in proc.stdout.splitlines()[-2]
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all("warning:" in ln for ln in lines)
    assert "batch_size 64 vs 32" in lines[0] and "batch_size 32 vs 64" in lines[1]
    proc = syncbench("report", "--compare", str(made / "demo" / "ssgd-hom-r0.h5"),
                     str(made / "batch"), "--fail-on-change")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith(
        "syncbench report: --fail-on-change: nothing could be compared")


def test_a_run_without_a_target_has_no_time_to_target_and_no_regression(made):
    a, b = str(made / "demo" / "ssgd-hom-r0.h5"), str(made / "mine" / "ssgd.h5")
    proc = syncbench("report", "--compare", a, b, "--fail-on-change")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(ln for ln in proc.stdout.splitlines() if " time_to_target_s " in ln)
    assert row.split()[-1] == "n/a" and " n/a " in row and "inf" not in row
    assert proc.stderr == ""  # the user's name pairs: nothing unmatched
    proc = syncbench("report", "--compare", a, b, "--format", "json")
    ttt = next(r for r in json.loads(proc.stdout) if r["figure"] == "time_to_target_s")
    assert ttt["result"] == "n/a" and ttt["ratio"] is None and ttt["b_median"] is None
    assert ttt["a_median"] > 0


# ---------------------------------------------------------------- corrupt values


def overwritten(src: Path, dst: Path, dataset: str, garbage: bytes) -> Path:
    """A copy of ``src`` with ``garbage`` written over the middle of ``dataset``'s data."""
    shutil.copy(src, dst)
    with h5py.File(src, "r") as f:
        data = f[dataset]
        offset, nbytes = data.id.get_offset(), data.size * data.dtype.itemsize
    assert offset is not None and nbytes > 2 * len(garbage)
    with open(dst, "r+b") as fh:
        fh.seek(offset + nbytes // 2 - len(garbage) // 2)
        fh.write(garbage)
    return dst


def test_bytes_overwritten_in_the_rows_are_one_line_and_exit_2(made, tmp_path):
    src = made / "demo" / "ssgd-hom-r0.h5"
    mid = overwritten(src, tmp_path / "mid.h5", "ranks/t_comm", random.Random(1).randbytes(96))
    line = one_line(syncbench("report", str(mid)), str(mid), "is corrupt: /ranks/t_comm")
    one_line(syncbench("trace", str(mid), "-o", str(tmp_path / "t.json")), "/ranks/t_comm",
             prog="trace")
    assert not (tmp_path / "t.json").exists()
    one_line(syncbench("report", "--compare", str(src), str(mid)), "is corrupt")
    # NaN in a time: no NaN is allowed there
    nan = overwritten(src, tmp_path / "nan.h5", "ranks/t_compute",
                      np.full(4, np.nan).tobytes())
    one_line(syncbench("report", str(nan)), "/ranks/t_compute", "NaN")
    assert len(line) < 200


# ---------------------------------------------------------------- results files and folders


def test_report_reprints_the_runners_tables_from_a_results_file_or_folder(made):
    for spec in ("demo/results.json", "demo"):
        proc = syncbench("report", spec, cwd=made)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        assert "# compare: homogeneous" in out and "to 0.5 / ssgd" in out, out
        ratios = next(ln for ln in out.splitlines() if ln.startswith("  ssgd "))
        assert ratios.split()[1:3] == ["1.00", "1.00"]  # the baseline against itself
        assert "## Runs" in out and "localsgd-hom-r0.h5" in out


def test_trace_takes_a_results_file_or_folder(made, tmp_path):
    for spec in ("demo", "demo/results.json"):
        out = tmp_path / f"{Path(spec).stem}.json"
        proc = syncbench("trace", spec, "-o", str(out), cwd=made)
        assert proc.returncode == 0, proc.stderr
        assert "tracing demo/ssgd-hom-r0.h5, the baseline's first run" in proc.stderr
        assert json.loads(out.read_text())["traceEvents"]


def test_a_folder_of_nothing_is_one_line(tmp_path):
    one_line(syncbench("report", str(tmp_path)), "no run files")
    one_line(syncbench("trace", str(tmp_path), "-o", str(tmp_path / "t.json")),
             "name the run file", prog="trace")


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_output_writes_any_format(made, tmp_path, fmt):
    out = tmp_path / f"table.{fmt}"
    proc = syncbench("report", str(made / "demo"), "--format", fmt, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    text = out.read_text()
    if fmt == "csv":
        assert text.startswith("algorithm,world_size,") and text.count("\n") == 3
    elif fmt == "json":
        assert [r["algorithm"] for r in json.loads(text)] == ["ssgd", "localsgd"]
    else:
        assert "## Runs" in text


# ---------------------------------------------------------------- --plots


@pytest.mark.slow
def test_plots_into_a_file_or_a_read_only_folder_is_one_line(made, tmp_path):
    run = str(made / "demo" / "ssgd-hom-r0.h5")
    mine = tmp_path / "mine.toml"
    mine.write_text("x = 1\n")
    one_line(syncbench("report", run, "--plots", str(mine)), "mine.toml")
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    base = Path(tempfile.mkdtemp(prefix="syncbench-ro-"))
    try:
        base.chmod(0o755)
        shutil.copy(run, base / "run.h5")
        (base / "run.h5").chmod(0o644)
        (base / "rodir").mkdir(mode=0o555)
        (base / "rodir").chmod(0o555)
        proc = syncbench("report", str(base / "run.h5"), "--plots",
                         str(base / "rodir" / "plots"), user=True)
        one_line(proc, "rodir")
        assert not (base / "rodir" / "plots").exists()
    finally:
        shutil.rmtree(base)
