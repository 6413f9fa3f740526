"""Launching ``syncbench train`` (or a peer program) under ``mpiexec`` from a driver process.

The one launch of the runner (``syncbench run``, ``compare``, ``sweep``) and
of ``syncbench peers``. Every launcher starts in a session of its own
(``start_new_session``), and a command that runs past its timeout is ended
whole (:func:`end_job`): SIGTERM to its process group and to every process of
the job, SIGKILL :data:`KILL_GRACE_S` later to what is left. The job is the
launcher's session and its descendants: Open MPI's ranks stay in the session
(each in a process group of its own), MPICH's Hydra gives each rank a session
of its own under its proxy, so neither the group nor the session alone holds
every rank. It comes back as a :class:`TimedOut` result (exit status
-SIGKILL), never as an exception. The launcher is
``--mpiexec``, else ``$MPIEXEC``, else the ``mpiexec`` next to this Python
(the MPICH wheel installs one in the virtual environment), else the one on
``PATH``. Every rank gets ``OMP_NUM_THREADS=1`` (and the BLAS equivalents)
unless the caller set them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Seconds between the SIGTERM that ends a timed-out job and the SIGKILL to what is left
#: (a training run stops at a step boundary on SIGTERM and writes its file incomplete).
KILL_GRACE_S = 5.0
#: The launchers running now (for :func:`signal_running`).
_RUNNING: set[subprocess.Popen] = set()


def find_mpiexec(explicit: str | None = None) -> list[str]:
    """The launcher command as an argument list."""
    if explicit:
        return shlex.split(explicit)
    if os.environ.get("MPIEXEC"):
        return shlex.split(os.environ["MPIEXEC"])
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError("no mpiexec found: pip install mpich, or set $MPIEXEC")
    return [found]


def rank_env() -> dict[str, str]:
    """The environment for ranks: one BLAS/OpenMP thread each unless already set."""
    env = dict(os.environ)
    for name in THREAD_VARS:
        env.setdefault(name, "1")
    return env


def train_command(np_: int, train_args: list[str], mpiexec: str | None = None) -> list[str]:
    """``mpiexec -n NP python -m syncbench train ARGS``."""
    return [*find_mpiexec(mpiexec), "-n", str(np_), sys.executable, "-m", "syncbench",
            "train", *train_args]


def peer_command(np_: int, module: str, peer_args: list[str],
                 mpiexec: str | None = None) -> list[str]:
    """``mpiexec -n NP python -m MODULE ARGS`` (a peer program)."""
    return [*find_mpiexec(mpiexec), "-n", str(np_), sys.executable, "-m", module, *peer_args]


class TimedOut(subprocess.CompletedProcess):
    """A command killed at its timeout (``timeout``: the seconds it was allowed)."""

    def __init__(self, args: Sequence[str], timeout: float, stdout: Any, stderr: Any) -> None:
        super().__init__(list(args), -int(signal.SIGKILL), stdout or "", stderr or "")
        self.timeout = timeout


def timed_out(proc: subprocess.CompletedProcess) -> bool:
    """Whether ``proc`` ran past its timeout (:class:`TimedOut`)."""
    return isinstance(proc, TimedOut)


def run_command(cmd: Sequence[str], timeout: float | None = None, quiet: bool = False,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the ranks' environment (``env``: replaces it) in a session of its
    own; its output streams through unless ``quiet`` (then it is captured);
    :class:`TimedOut` past ``timeout``, the whole job ended (:func:`end_job`). An
    exception here (a second Ctrl-C to the runner) ends the job too before it goes on."""
    if not quiet:
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    pipe = subprocess.PIPE if quiet else None
    proc = subprocess.Popen(list(cmd), env=env or rank_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe,
                            start_new_session=True)
    _RUNNING.add(proc)
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_job(proc)
            stdout, stderr = _rest_of_output(proc)
            return TimedOut(cmd, timeout or 0.0, stdout, stderr)
        except BaseException:
            end_job(proc)
            raise
    finally:
        _RUNNING.discard(proc)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, stdout or "", stderr or "")


def _rest_of_output(proc: subprocess.Popen) -> tuple[str, str]:
    """What an ended job wrote; a process left holding its pipes (on another node) does
    not keep the caller waiting past :data:`KILL_GRACE_S`."""
    try:
        return proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired as exc:
        def text(data: Any) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return text(exc.stdout), text(exc.stderr)


def _proc_table() -> dict[int, tuple[int, int, str, int]]:
    """pid -> (parent pid, session id, state, start time) of every process in /proc
    (empty where there is no /proc)."""
    table = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the command: state ppid pgrp session ... starttime (the 20th)
        table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0].decode(),
                                  int(fields[19]))
    return table


def job_processes(leader: int) -> dict[int, int]:
    """pid -> start time of every live process of the job that ``leader`` (a launcher
    started with ``start_new_session``) leads: its session and every descendant of the
    launcher or of a session member (a rank in a session of its own)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {pid for pid, (_, sid, _, _) in table.items() if sid == leader}
    todo = [leader, *found]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return {pid: table[pid][3] for pid in found if pid in table and table[pid][2] != "Z"}


def _alive(procs: dict[int, int]) -> Iterator[int]:
    """The processes of ``procs`` (pid -> start time) still running (the same process:
    a pid that was reused since has another start time)."""
    table = _proc_table()
    for pid, start in procs.items():
        if pid in table and table[pid][3] == start and table[pid][2] != "Z":
            yield pid


def _signal(proc: subprocess.Popen, procs: dict[int, int], sig: signal.Signals) -> None:
    for send, target in ((os.killpg, proc.pid), *((os.kill, pid) for pid in _alive(procs))):
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_job(proc: subprocess.Popen, grace: float | None = None) -> None:
    """End the job ``proc`` leads (a launcher in a session of its own): SIGTERM to its
    process group and every process of the job (:func:`job_processes`), then SIGKILL,
    ``grace`` seconds (default :data:`KILL_GRACE_S`) later, to what is left of them and
    of the session; reaps ``proc``.

    The processes are found before the first signal: a rank whose launcher dies
    is reparented and would no longer be its descendant."""
    procs = job_processes(proc.pid)
    _signal(proc, procs, signal.SIGTERM)
    deadline = time.monotonic() + (KILL_GRACE_S if grace is None else grace)
    while time.monotonic() < deadline:
        proc.poll()  # reap the launcher: a zombie counts as ended
        if not any(True for _ in _alive(procs)) and proc.returncode is not None:
            break
        time.sleep(0.05)
    procs.update(job_processes(proc.pid))
    _signal(proc, procs, signal.SIGKILL)
    proc.wait()


def signal_running(sig: int) -> None:
    """Send ``sig`` to the launchers running now (each one's process group): what a
    terminal's Ctrl-C did when they shared the runner's process group."""
    for proc in list(_RUNNING):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def free_port() -> int:
    """A TCP port that was free a moment ago (a peer's ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_peer(np_: int, module: str, peer_args: list[str], mpiexec: str | None = None,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run a peer program (``python -m module``) on ``np_`` ranks under the same launcher,
    quietly; its process group meets at 127.0.0.1 on a free port."""
    cmd = peer_command(np_, module, peer_args, mpiexec)
    env = {**rank_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return run_command(cmd, timeout, quiet=True, env=env)


def run_train(np_: int, train_args: list[str], mpiexec: str | None = None,
              timeout: float | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run one training job (see :func:`run_command`)."""
    return run_command(train_command(np_, train_args, mpiexec), timeout, quiet)
