"""Launching ``syncbench train`` (or a peer program) under ``mpiexec`` from a driver process.

The one launch of the runner (``syncbench run``, ``compare``, ``sweep``) and
of ``syncbench peers``. A command that runs past its timeout is killed and
comes back as a :class:`TimedOut` result (exit status -SIGKILL, what
:func:`subprocess.run` leaves), never as an exception. The launcher is
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


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
    """Run ``cmd`` with the ranks' environment (``env``: replaces it); its output streams
    through unless ``quiet`` (then it is captured); :class:`TimedOut` past ``timeout``."""
    if not quiet:
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        return subprocess.run(list(cmd), env=env or rank_env(), timeout=timeout, text=True,
                              capture_output=quiet)
    except subprocess.TimeoutExpired as exc:
        return TimedOut(cmd, exc.timeout, exc.stdout, exc.stderr)


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
