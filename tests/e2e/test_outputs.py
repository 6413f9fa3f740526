"""Every command that writes an output refuses an output it cannot write, before any work.

One table row per (command, output flag): the command line with the output left as
``{out}``, and whether the output is a file or a folder. Each row runs twice: once with
an output that cannot be made (a path under a file, ``FILE/sub/out``: permission bits
do not stop root, a file on the way does) and once with the wrong kind of output (an
existing folder where a file is expected, an existing file where a folder is). Each
time: one line on stderr, a non-zero exit, no traceback, and nothing written anywhere
in the working folder. A new command that writes is one more row.

A read-only mount (root only, skipped elsewhere) checks ``simulate --out`` and
``run --out-dir`` in a writable-looking folder that is not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tmpfs

from syncbench.bench.cli import COMMANDS

FILE, DIR = "file", "folder"

#: (command line with {out} for the output, its kind). Inputs in the working folder:
#: run.h5 (a run file).
ROWS: list[tuple[str, str]] = [
    ("train --dataset synthetic --synthetic-samples 64 --progress never --overwrite "
     "--out {out}", FILE),
    ("trace run.h5 -o {out}", FILE),
    ("simulate --np 8 --steps 2 --out {out}", FILE),
    ("simulate --np 8 --steps 2 --phase-cache {out}", FILE),
    ("comm --max-size 8 --iterations 2 --skip 0 --out {out}", FILE),
    ("report run.h5 --format steps -o {out}", FILE),
    ("report run.h5 --plots {out}", DIR),
    ("speed --model mlp --steps 1 --out {out}", FILE),
    ("ssgd-comm --out {out}", FILE),
    ("run demo --dataset synthetic --np 1 --repeats 1 --out-dir {out}", DIR),
    ("run demo --dataset synthetic --np 1 --repeats 1 --dry-run --out-dir {out}", DIR),
    ("run demo --dataset synthetic --np 1 --repeats 1 --plots {out} --out-dir runs", DIR),
    ("compare --algorithms ssgd --dataset synthetic --np 1 --out-dir {out}", DIR),
    ("sweep --np 1 --dataset synthetic --out-dir {out}", DIR),
    ("sweep --np 1 --dataset synthetic --out-dir runs --manifest {out}", FILE),
    ("peers --out-dir {out}", DIR),
    ("data fetch mnist --out-dir {out}", DIR),
    ("recover {out}", FILE),
]

#: Commands that write nothing (or only to stdout): every other command has a row.
WRITES_NOTHING = {"env", "cluster", "overlap", "hetero", "asgd-bench", "sample"}


def start(cwd: Path, argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "syncbench", *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, stdin=subprocess.DEVNULL)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """(exit status, stderr) of a command started by :func:`start`."""
    try:
        _, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        pytest.fail(f"{proc.args} did not end: {stderr}")
    return proc.returncode, stderr


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and modification time."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            st = path.lstat()
            found[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    """A small complete run file (two ranks, synthetic data)."""
    folder = tmp_path_factory.mktemp("run")
    path = folder / "run.h5"
    proc = subprocess.run([str(Path(sys.executable).parent / "mpiexec"), "-n", "2",
                           sys.executable, "-m", "syncbench", "train", "--dataset",
                           "synthetic", "--synthetic-samples", "256", "--batch-size", "32",
                           "--progress", "never", "--out", str(path)],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return path


def workdir(folder: Path, run_file: Path) -> Path:
    """A working folder with the inputs the rows name, a file and a folder."""
    folder.mkdir()
    (folder / "run.h5").write_bytes(run_file.read_bytes())
    (folder / "a_file").write_text("not a folder\n")
    (folder / "a_folder").mkdir()
    return folder


def assert_refused(status: int, stderr: str, before: dict, after: dict) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status != 0, stderr
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    assert after == before, sorted(set(after) ^ set(before))


def test_every_command_that_writes_has_a_row():
    named = {row.split()[0] for row, _ in ROWS}
    assert set(COMMANDS) - WRITES_NOTHING == named


@pytest.mark.parametrize(("line", "kind"), ROWS, ids=[r.split(" {")[0] for r, _ in ROWS])
def test_an_output_that_cannot_be_written_is_one_line_and_nothing_written(
        tmp_path, run_file, line, kind):
    """Under a file (``a_file/sub/out``) and of the wrong kind, side by side."""
    cases = {"under a file": "a_file/sub/out" + (".json" if kind == FILE else ""),
             "wrong kind": "a_folder" if kind == FILE else "a_file"}
    runs = {}
    for i, (case, out) in enumerate(cases.items()):
        folder = workdir(tmp_path / f"w{i}", run_file)
        runs[case] = (folder, out, snapshot(folder), start(folder, line.format(out=out).split()))
    for case, (folder, out, before, proc) in runs.items():
        status, stderr = finish(proc)
        assert_refused(status, stderr, before, snapshot(folder))
        assert out.split("/")[0] in stderr, (case, stderr)


@pytest.fixture
def read_only(tmp_path: Path):
    """A read-only tmpfs (root only; skipped where it cannot be mounted)."""
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as folder:
        yield folder


@pytest.mark.parametrize("line", [
    "simulate --np 8 --steps 2 --out ro/sim.h5",
    "run demo --dataset synthetic --np 1 --repeats 1 --out-dir ro/runs",
    "run demo --dataset synthetic --np 1 --repeats 1 --dry-run --out-dir ro",
])
def test_a_read_only_folder_is_one_line_before_any_work(tmp_path, read_only, line):
    before = snapshot(tmp_path)
    status, stderr = finish(start(tmp_path, line.split()))
    assert_refused(status, stderr, before, snapshot(tmp_path))
    assert "not writable" in stderr
