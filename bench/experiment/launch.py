"""Launching ``syncbench train`` under ``mpiexec`` from a driver process.

Used by ``compare`` and the side-by-side benchmarks. The launcher is
``--mpiexec``, else ``$MPIEXEC``, else the ``mpiexec`` next to this Python
(the MPICH wheel installs one in the virtual environment), else the one on
``PATH``. Every rank gets ``OMP_NUM_THREADS=1`` (and the BLAS equivalents)
unless the caller set them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
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


def run_train(np_: int, train_args: list[str], mpiexec: str | None = None,
              timeout: float | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run one training job; its output streams through unless ``quiet``."""
    cmd = train_command(np_, train_args, mpiexec)
    if not quiet:
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.run(cmd, env=rank_env(), timeout=timeout, text=True,
                          capture_output=quiet)


def train_and_read(np_: int, train_args: list[str], out: Path, mpiexec: str | None = None,
                   timeout: float | None = None) -> Any:
    """Run one training job quietly into ``out`` and return its :class:`Run`.

    A failed job raises ``RuntimeError`` with the exit status and the last
    lines of its stderr.
    """
    from syncbench.analysis.runfile import read_run

    proc = run_train(np_, [*train_args, "--progress", "never", "--out", str(out),
                           "--overwrite"], mpiexec, timeout=timeout, quiet=True)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"syncbench train {' '.join(train_args[:2])} failed "
                           f"(exit {proc.returncode}): {tail}")
    return read_run(out)
