"""Signals stop a run at a step boundary: the rows, a checkpoint, an incomplete run file.

Each test launches its own job (``mpiexec -n 2``) and signals the launcher or
one rank once training runs, with subprocess timeouts, so a hang fails the
test. See ``bench/train/stopping.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import MPIEXEC, rank_pid, slow_unless

from syncbench.analysis.runfile import read_run

#: 512 steps per rank at 2 ranks (about 1 s here when quiet); rows flushed every 50 ms,
#: so the signal, sent once the rows grow (the second flush), lands about a tenth of the
#: way in: the stop comes well before the end, and the resume (which trains the rest of
#: the budget, most of each test's work) stays short.
EPOCHS = 4
FLAGS = ["--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", "4096",
         "--batch-size", "16", "--epochs", str(EPOCHS), "--progress", "never",
         "--flush-every", "0.05"]
STEPS = 4096 // 2 // 16 * EPOCHS  # per rank
BUDGET = STEPS * 16 * 2  # samples: steps per rank x batch x ranks

try:
    from mpi4py import MPI

    OPEN_MPI = "Open MPI" in MPI.Get_library_version()
except ImportError:  # pragma: no cover
    OPEN_MPI = False


def _start(out: Path, *flags: str, session: bool = False) -> subprocess.Popen:
    """The job, in a process group of its own with ``session`` (the launcher leads it)."""
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *FLAGS,
           "--out", str(out), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            start_new_session=session)


def _wait_for_training(out: Path, proc: subprocess.Popen) -> None:
    """Until a rank's rows file has grown past its first flush (training runs; ASGD's
    dedicated host takes no steps)."""
    deadline = time.monotonic() + 60
    parts = out.with_name(out.name + ".parts")
    first: dict[int, int] = {}
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "training did not start"
        sizes = {r: (parts / f"rows-{r:05d}.bin").stat().st_size
                 for r in (0, 1) if (parts / f"rows-{r:05d}.bin").exists()}
        for rank, size in sizes.items():
            first.setdefault(rank, size)
        if any(size > first[r] for r, size in sizes.items()):
            return
        time.sleep(0.02)


def _wait_for_start(out: Path, proc: subprocess.Popen) -> None:
    """Until the parts folder's metadata exists (written just before the start barrier)."""
    deadline = time.monotonic() + 60
    while not (out.with_name(out.name + ".parts") / "meta.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)


def _stop(out: Path, sig: signal.Signals, target: str | int = "launcher", *flags: str):
    """Start a run, send ``sig`` to the launcher, to the job's whole process group
    ("group", as a terminal's Ctrl-C does) or to one rank (its number) once it trains;
    (returncode, stderr, seconds from the signal to the exit)."""
    group = target == "group"
    proc = _start(out, *flags, session=group)
    try:
        _wait_for_training(out, proc)
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid if target == "launcher" else rank_pid(str(out), target), sig)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()


def _resume(out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *FLAGS,
           "--out", str(out), *flags, "--resume"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _stop_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("syncbench train: stopped by")]


def _assert_budget_once(out: Path) -> None:
    """Every rank's rows are steps 0..N-1 once each; all ranks' samples are the budget."""
    run = read_run(out)
    assert run.complete and run.stopped_by == "" and run.resumes == 1
    total = 0
    for cols in run.ranks.values():
        assert (cols["step"] == np.arange(len(cols["step"]))).all()
        total += int(cols["samples"].sum())
    assert total == BUDGET


@pytest.mark.parametrize("algorithm", slow_unless(["ssgd", "odsgd", "localsgd", "oscars", "asgd"],
                                                 {"ssgd"}))
def test_sigterm_stops_at_a_step_boundary_and_resume_consumes_the_budget_once(
        tmp_path, algorithm):
    if OPEN_MPI:
        pytest.skip("Open MPI's launcher kills its ranks ~0.25 s after forwarding SIGTERM")
    out = tmp_path / "run.h5"
    status, err, seconds = _stop(out, signal.SIGTERM, "launcher", "--algorithm", algorithm)
    assert status == 128 + signal.SIGTERM, err
    assert seconds < 20  # well within Slurm's KillWait (30 s)
    lines = _stop_lines(err)
    assert len(lines) == 1, err  # rank 0 only
    assert "Traceback" not in err
    assert "--resume" in lines[0] and "with a checkpoint at" in lines[0]
    run = read_run(out)
    assert not run.complete and run.stopped_by == "SIGTERM" and run.resumes == 0
    assert run.summary_extra["complete"] is False
    steps = [len(c["step"]) for c in run.ranks.values()]
    assert 0 < min(steps) and max(steps) < STEPS  # stopped early, rows kept
    parts = out.with_name(out.name + ".parts")
    assert (parts / "checkpoint.json").exists()
    resumed = _resume(out, "--algorithm", algorithm)
    assert resumed.returncode == 0, resumed.stderr
    _assert_budget_once(out)
    assert not parts.exists()


def test_a_signal_to_one_rank_stops_every_rank_and_resumes_bit_identical(tmp_path):
    """SIGUSR1 to one rank only: the vote carries it to the other. Stopped and resumed,
    SSGD ends with exactly the parameters of a run that was never stopped."""
    out = tmp_path / "run.h5"
    status, err, _ = _stop(out, signal.SIGUSR1, 1, "--algorithm", "ssgd",
                           "--save-model", str(tmp_path / "stopped.npy"))
    assert status == 128 + signal.SIGUSR1, err
    assert len(_stop_lines(err)) == 1 and "SIGUSR1" in err
    assert read_run(out).stopped_by == "SIGUSR1"
    resumed = _resume(out, "--algorithm", "ssgd", "--save-model", str(tmp_path / "stopped.npy"))
    assert resumed.returncode == 0, resumed.stderr
    _assert_budget_once(out)
    whole = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *FLAGS,
         "--algorithm", "ssgd", "--save-model", str(tmp_path / "whole.npy")],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert whole.returncode == 0, whole.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "stopped.npy"),
                                  np.load(tmp_path / "whole.npy"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGUSR1])
def test_the_launchers_signals_end_with_128_plus_the_signal(tmp_path, sig):
    if OPEN_MPI and sig == signal.SIGINT:
        pytest.skip("Open MPI's launcher kills its ranks ~0.25 s after forwarding SIGINT")
    out = tmp_path / "run.h5"
    status, err, _ = _stop(out, sig, "launcher", "--algorithm", "localsgd")
    assert status == 128 + sig, err
    assert read_run(out).stopped_by == sig.name
    assert len(_stop_lines(err)) == 1


def test_without_out_a_stop_says_nothing_is_kept(tmp_path):
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *FLAGS,
           "--algorithm", "ssgd", "--epochs", "200", "--data-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        rank_pid(str(tmp_path), 1)  # no parts folder to watch: the ranks exist
        time.sleep(4.0)  # a signal during imports would kill them (Python's default);
        assert proc.poll() is None  # from the setup on it is caught
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGUSR1, err
    assert "ssgd mlp synthetic np=2" in out  # the result line of what was trained
    lines = _stop_lines(err)
    assert len(lines) == 1 and "nothing is kept (no --out)" in lines[0]


@pytest.mark.slow
def test_asgd_stops_when_only_the_dedicated_host_is_signalled(tmp_path):
    """Rank 0 hosts the parameters and takes no step: it ends the run from its wait."""
    out = tmp_path / "run.h5"
    status, err, _ = _stop(out, signal.SIGUSR1, 0, "--algorithm", "asgd",
                           "--ps-layout", "dedicated")
    assert status == 128 + signal.SIGUSR1, err
    assert read_run(out).stopped_by == "SIGUSR1"
    resumed = _resume(out, "--algorithm", "asgd", "--ps-layout", "dedicated")
    assert resumed.returncode == 0, resumed.stderr
    _assert_budget_once(out)


def test_ctrl_c_to_the_whole_job_counts_once(tmp_path):
    """A terminal's Ctrl-C reaches the launcher and every rank, and the launcher
    forwards it again: each rank sees SIGINT twice within milliseconds."""
    if OPEN_MPI:
        pytest.skip("Open MPI's launcher kills its ranks ~0.25 s after forwarding SIGINT")
    out = tmp_path / "run.h5"
    status, err, _ = _stop(out, signal.SIGINT, "group", "--algorithm", "ssgd")
    assert status == 128 + signal.SIGINT, err
    assert "again" not in err and len(_stop_lines(err)) == 1
    assert read_run(out).stopped_by == "SIGINT"
    assert (out.with_name(out.name + ".parts") / "checkpoint.json").exists()


def test_a_second_signal_ends_a_rank_stuck_in_mpi(tmp_path):
    """Rank 1 sleeps ~10 s after each step's compute, so rank 0 waits inside the
    Allreduce: its first SIGTERM cannot act, the second, 3 s later, ends it at once."""
    out = tmp_path / "run.h5"
    proc = _start(out, "--algorithm", "ssgd", "--slowdown", "1,40000",
                  "--slowdown-mode", "sleep")
    try:
        _wait_for_start(out, proc)
        time.sleep(1.0)  # into the first step
        pid = rank_pid(str(out), 0)
        os.kill(pid, signal.SIGTERM)
        time.sleep(3.0)
        os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        ended = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert ended < 8  # the launcher ends the job once rank 0 is gone
    assert "syncbench: SIGTERM again: ending this rank now, without a checkpoint" in err, err
