"""Helpers for tests: configs with the CLI's defaults, serial re-computations."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from syncbench.bench.cli import build_parser
from syncbench.bench.stream import BatchStream

VENV_BIN = Path(sys.executable).parent
MPIEXEC = os.environ.get("MPIEXEC", str(VENV_BIN / "mpiexec"))


def train_config(*flags: str, **overrides) -> argparse.Namespace:
    """A ``syncbench train`` namespace: the parser's defaults, ``flags``, then overrides."""
    config = build_parser("train").parse_args(["train", *flags])
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def rank_streams(x, y, world_size: int, batch_size: int, seed: int, dtype=np.float64):
    """Every rank's batch stream, rebuilt in one process."""
    return [BatchStream(x, y, r, world_size, batch_size, seed, dtype=dtype)
            for r in range(world_size)]


def run_mpi(np_: int, *args: str, timeout: float = 120, env: dict | None = None):
    """Run ``mpiexec -n np_ <python> -m syncbench <args>``; returns CompletedProcess."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [MPIEXEC, "-n", str(np_), sys.executable, "-m", "syncbench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
