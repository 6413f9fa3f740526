"""Helpers for tests: configs with the CLI's defaults, launching ``mpiexec``, reading ranks'
processes, a tmpfs (the serial reference computations are in ``tests/oracles.py``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from syncbench.bench.cli import build_parser

VENV_BIN = Path(sys.executable).parent
MPIEXEC = os.environ.get("MPIEXEC", str(VENV_BIN / "mpiexec"))


def slow_unless(names, fast) -> list:
    """pytest params of ``names``, each outside ``fast`` marked ``slow``.

    ``make test`` leaves the ``slow`` tests out to stay within its time (``make test-all``
    runs them): a test repeated per strategy launches its jobs for one strategy per kind
    of synchronization in ``fast``, and for every other strategy under ``slow``."""
    import pytest

    return [pytest.param(n, marks=() if n in fast else pytest.mark.slow) for n in names]


def train_args(*flags: str, **overrides) -> argparse.Namespace:
    """``syncbench train``'s parsed flags: the parser's defaults, ``flags``, then
    ``overrides`` (by ``dest``)."""
    args = build_parser("train").parse_args(["train", *flags])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def train_config(*flags: str, **overrides):
    """The ``TrainConfig`` of :func:`train_args` (``TrainConfig.from_args``: the strategy's
    options validated; the checks for a world size and the file system are not made)."""
    from syncbench.bench.train.config import TrainConfig  # lazy: imports mpi4py.MPI

    return TrainConfig.from_args(train_args(*flags, **overrides))


def strategy_on_world(algorithm: str, steps_per_rank: int, base_flags, flags, batch: int,
                      seed: int, model_name: str = "mlp"):
    """(strategy, this rank's batch stream, data, config): ``algorithm`` built over
    ``MPI.COMM_WORLD`` on the 512-sample synthetic set with ``base_flags``, then
    ``--algorithm``, then ``flags``, for ``steps_per_rank`` steps of ``batch`` samples
    (float64 ``model_name`` and streams seeded with ``seed``), as the in-process MPI tests
    of the round-based strategies drive it."""
    import numpy as np
    from mpi4py import MPI  # lazy: the unit tier never loads MPI
    from oracles import rank_streams

    from syncbench.algorithms.base import Budget
    from syncbench.algorithms.communicator import Communicator
    from syncbench.algorithms.registry import get_algorithm, validate
    from syncbench.bench.data.catalog import make_synthetic
    from syncbench.kernels.zoo import build_model

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config(*base_flags, "--algorithm", algorithm, *flags)
    validate(get_algorithm(algorithm), config, size)
    model = build_model(model_name, data.input_shape, 10, dtype=np.float64, seed=seed)
    budget = Budget(steps_per_rank * batch * size, batch, size)
    algo = get_algorithm(algorithm)(model, Communicator(world), config, budget)
    stream = rank_streams(data.train_x, data.train_y, size, batch, seed)[rank]
    return algo, stream, data, config


def small_ssgd_run(path, dataset: str = "synthetic", wall: float = 1.0, **root) -> str:
    """A complete 2-rank SSGD run file as train writes it: 8 steps of 64 samples per rank,
    one evaluation, ``wall`` seconds, ``dataset``, and ``root`` as further root
    attributes."""
    import numpy as np

    from syncbench.analysis import schema
    from syncbench.bench.train.recorder import write_run_file

    def rank() -> dict:
        cols = {name: np.zeros(8, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()}
        cols.update(step=np.arange(8), t_start=np.arange(8) * 0.1, t_compute=np.full(8, 0.1),
                    loss=np.full(8, 1.0), samples=np.full(8, 64))
        return cols

    evals = {"t": np.asarray([1.0]), "step": np.asarray([8]),
             "samples_seen": np.asarray([1024]), "loss": np.asarray([0.5]),
             "accuracy": np.asarray([0.9])}
    attrs = {"algorithm": "ssgd", "model": "mlp", "dataset": dataset, "world_size": 2,
             "config": {"algorithm": "ssgd", "batch_size": 64}, "hostnames": ["h"], **root}
    write_run_file(path, attrs, {0: rank(), 1: rank()}, {r: {"slowdown": 1.0} for r in (0, 1)},
                   evals, wall, None)
    return str(path)


def corpus_root() -> str:
    """The first folder of ``$SYNCBENCH_DATA`` that holds the shakespeare corpus; the test
    is skipped, saying how to get it, where none does."""
    import pytest

    from syncbench.bench.data import catalog
    from syncbench.bench.data.dataset import DatasetError

    for root in [p for p in os.environ.get("SYNCBENCH_DATA", "").split(os.pathsep) if p]:
        try:
            catalog.find_dataset_dir("shakespeare", root)
            return root
        except DatasetError:
            continue
    pytest.skip("the shakespeare corpus is not under $SYNCBENCH_DATA "
                "(syncbench data fetch shakespeare --out-dir DIR)")


def run_mpi(np_: int, *args: str, timeout: float = 120, env: dict | None = None):
    """Run ``mpiexec -n np_ <python> -m syncbench <args>``; returns CompletedProcess."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [MPIEXEC, "-n", str(np_), sys.executable, "-m", "syncbench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def _rank_processes(marker: str):
    """(pid, environment) of each Python ``syncbench`` rank whose command line holds
    ``marker`` (an argument, e.g. the run's ``--out`` path)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if marker.encode() in argv and b"syncbench" in argv \
                and Path(argv[0].decode()).name.startswith("python"):
            yield int(entry.name), env


def rank_pids(marker: str) -> list[int]:
    """PIDs of the Python ranks whose command line contains ``marker``."""
    return sorted(pid for pid, _ in _rank_processes(marker))


def rank_pid(marker: str, rank: int, wait: float = 30.0) -> int:
    """The PID of MPI rank ``rank`` (MPICH's ``PMI_RANK``, Open MPI's
    ``OMPI_COMM_WORLD_RANK``) of the job whose command line holds ``marker``."""
    import time

    wanted = {f"PMI_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
    deadline = time.monotonic() + wait
    while True:
        for pid, env in _rank_processes(marker):
            if wanted & env:
                return pid
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank} of {marker} not found")
        time.sleep(0.1)


def report_cli(*argv: str, capsys) -> tuple[int, str, str]:
    """``syncbench report ARGV`` in this process: (exit status, stdout, stderr)."""
    from syncbench.bench.commands import report as report_command

    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    rc = report_command.run(parser.parse_args(list(argv)))
    out = capsys.readouterr()
    return rc, out.out, out.err


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False):
    """``folder`` as a tmpfs of ``size`` (read-only if asked); skips the test where it
    cannot be mounted (not root, no mount permission)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    options = f"ro,size={size}" if read_only else f"size={size}"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
