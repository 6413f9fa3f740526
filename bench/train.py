"""The algorithm-agnostic training driver behind ``syncbench train``.

Per rank: load and shard the data, build the model (same seed everywhere),
let the chosen algorithm take steps until the sample budget is consumed,
time every step by phase, evaluate the consensus model on the held-out split
at evaluation points, and finally gather every rank's rows to rank 0, which
writes the run file. Setup errors are agreed on by all ranks before any
training communication (one line, exit 2); any later exception aborts the job.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from syncbench.algorithms.base import Algorithm, Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.registry import get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data import Dataset, DatasetError, load_dataset
from syncbench.bench.hetero import (
    Slowdown,
    make_slowdown,
    parse_slowdown,
    parse_slowdown_schedule,
)
from syncbench.bench.options import validate_train_config
from syncbench.bench.progress import Progress
from syncbench.bench.recorder import EvalRecorder, StepRecorder, write_run_file
from syncbench.bench.runtime import (
    SetupError,
    abort_on_exception,
    agree_on_setup,
    wait_politely,
)
from syncbench.bench.stream import BatchStream
from syncbench.kernels.backend import Backend, BackendError, select_backend
from syncbench.kernels.model import Model
from syncbench.kernels.models import build_model


class Run:
    """Everything one rank holds for one training run."""

    def __init__(self, config: argparse.Namespace, comm: MPI.Comm) -> None:
        self.config = config
        self.mpi = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timer = PhaseTimer()
        self.comm = Communicator(comm, self.timer)
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = local.Get_rank()
        local.Free()

    # -- setup (no training communication; errors agreed on by all ranks) ---
    def setup(self) -> None:
        config = self.config
        validate_train_config(config, self.size)
        self.slowdowns = parse_slowdown(config.slowdown, self.size)
        self.slowdown_changes = parse_slowdown_schedule(
            getattr(config, "slowdown_schedule", None), self.size
        )
        try:
            self.backend: Backend = select_backend(config.device, self.local_rank)
        except BackendError as exc:
            raise SetupError(str(exc)) from None
        try:
            self.data: Dataset = load_dataset(
                config.dataset, config.data_dir,
                synthetic_train=config.synthetic_samples, seed=config.seed,
            )
        except DatasetError as exc:
            raise SetupError(str(exc)) from None
        dtype = np.dtype(config.dtype)
        self.stream = BatchStream(
            self.data.train_x, self.data.train_y, self.rank, self.size,
            config.batch_size, config.seed, self.backend, dtype,
        )
        self.model: Model = build_model(
            config.model, self.data.input_shape, self.data.num_classes,
            self.backend, dtype, config.seed,
        )
        steps = max(1, int(config.epochs * self.stream.steps_per_epoch))
        self.budget = Budget(steps * config.batch_size * self.size, config.batch_size, self.size)
        cls = get_algorithm(config.algorithm)
        self.algorithm: Algorithm = cls(self.model, self.comm, config, self.budget)
        slowdown = make_slowdown(self.slowdowns, self.slowdown_changes, self.rank)
        if slowdown is not None:
            self.algorithm.slowdown = slowdown
        self.eval_model = build_model(
            config.model, self.data.input_shape, self.data.num_classes, self.backend, dtype
        ) if self.rank == 0 else None

    # -- training -----------------------------------------------------------
    def evaluate(self, t: float, step: int, samples_seen: int) -> float:
        """Evaluate the consensus model (collective); returns the accuracy on all ranks."""
        params = self.algorithm.consensus_params()
        result = np.zeros(2)
        if self.rank == 0:
            self.eval_model.params[...] = params
            result[:] = self.eval_model.evaluate(self.data.test_x, self.data.test_y)
            self.evals.append(t, step, samples_seen, float(result[0]), float(result[1]))
        wait_politely(self.mpi.Ibcast(result, root=0))
        return float(result[1])

    def train(self) -> dict[str, float] | None:
        config, algo = self.config, self.algorithm
        recorder = StepRecorder(self.budget.steps_per_rank + 1)
        self.evals = EvalRecorder()
        eval_stride = (
            int(config.eval_every * self.stream.steps_per_epoch) * config.batch_size * self.size
            if config.eval_every > 0 else 0
        )
        next_eval = eval_stride if eval_stride > 0 else math.inf
        progress = Progress(
            self.budget.total_samples, config.progress if self.rank == 0 else "never"
        )
        eval_seconds = 0.0
        last_eval_seen = -1
        self.mpi.Barrier()
        t0 = MPI.Wtime()
        if isinstance(algo.slowdown, Slowdown):
            algo.slowdown.start()  # --slowdown-schedule times count from here
        step = 0
        while not algo.done():
            self.timer.reset()
            t_start = MPI.Wtime() - t0
            with self.timer.phase("data"):
                x, y = self.stream.next()
            stats = algo.step(x, y)
            recorder.append(step, t_start, self.timer.totals, stats)
            step += 1
            seen = algo.evaluation_point()
            if seen is not None:
                progress.update(seen, stats.loss)
                if seen >= next_eval:
                    started = MPI.Wtime()
                    acc = self.evaluate(started - t0 - eval_seconds, step, seen)
                    eval_seconds += MPI.Wtime() - started
                    last_eval_seen = seen
                    next_eval += eval_stride
                    if config.stop_at_target and acc >= config.target_accuracy:
                        break
        algo.finish()
        train_end = MPI.Wtime() - t0
        seen = algo.evaluation_point()
        if seen is None:
            seen = int(self.mpi.allreduce(int(recorder.columns()["samples"].sum())))
        if seen != last_eval_seen:  # same decision on every rank: evaluate is collective
            self.evaluate(train_end - eval_seconds, step, seen)
        progress.update(seen, float("nan"), force=True)
        progress.close()
        wall = self.mpi.allreduce(train_end, op=MPI.MAX) - eval_seconds
        return self.write(recorder, wall)

    # -- output ---------------------------------------------------------------
    def write(self, recorder: StepRecorder, wall_s: float) -> dict[str, float] | None:
        config = self.config
        rank_attrs = {
            "hostname": socket.gethostname(),
            "device": self.backend.device,
            "slowdown": self.slowdowns[self.rank],
        }
        gathered = self.mpi.gather((recorder.columns(), rank_attrs), root=0)
        if self.rank != 0:
            return None
        rows = {r: g[0] for r, g in enumerate(gathered)}
        attrs = {r: g[1] for r, g in enumerate(gathered)}
        summary_only = config.out is None
        root = self.root_attrs([a["hostname"] for a in attrs.values()],
                               [a["device"] for a in attrs.values()])
        if summary_only:
            from syncbench.analysis.summary import summarize  # noqa: PLC0415

            return summarize(rows, self.evals.columns(), wall_s, config.target_accuracy)
        return write_run_file(
            config.out, root, rows, attrs, self.evals.columns(), wall_s, config.target_accuracy
        )

    def root_attrs(self, hostnames: list[str], devices: list[str]) -> dict[str, Any]:
        config = self.config
        import h5py  # noqa: PLC0415

        return {
            "algorithm": config.algorithm,
            "model": config.model,
            "dataset": config.dataset,
            "world_size": self.size,
            "config": json.dumps({k: v for k, v in vars(config).items() if k != "func"},
                                 sort_keys=True, default=str),
            "started_utc": self.started_utc,
            "syncbench_version": _version(),
            "git_sha": _git_sha(),
            "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
            "mpi4py_version": metadata.version("mpi4py"),
            "numpy_version": np.__version__,
            "cupy_version": _optional_version("cupy-cuda12x") or _optional_version("cupy"),
            "h5py_version": h5py.__version__,
            "backend": self.backend.name,
            "devices": sorted(set(devices)),
            "cuda_aware": False,
            "slurm_job_id": _env("SLURM_JOB_ID"),
            "hostnames": sorted(set(hostnames)),
        }


def _env(name: str) -> str:
    import os  # noqa: PLC0415

    return os.environ.get(name, "")


def _version() -> str:
    try:
        return metadata.version("syncbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def _optional_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def _git_sha() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def run_training(config: argparse.Namespace, comm: MPI.Comm | None = None) -> dict | None:
    """Train once on every rank of ``comm``; returns the summary on rank 0."""
    comm = comm or MPI.COMM_WORLD
    run = Run(config, comm)
    run.started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    agree_on_setup(comm, run.setup)

    def body() -> dict | None:
        try:
            return run.train()
        finally:
            run.algorithm.close()

    started = time.perf_counter()
    summary = abort_on_exception(comm, body)
    if comm.Get_rank() == 0 and summary is not None:
        print(format_summary(config, comm.Get_size(), summary, time.perf_counter() - started))
    return summary


def format_summary(config: argparse.Namespace, world: int, s: dict[str, float],
                   elapsed: float) -> str:
    """One fixed-format result line (parseable by scripts)."""
    out = f" -> {config.out}" if config.out else ""
    return (f"{config.algorithm} {config.model} {config.dataset} np={world}: "
            f"accuracy {s['final_accuracy']:.4f}  loss {s['final_loss']:.4f}  "
            f"{s['samples_per_s']:.1f} samples/s  wall {s['wall_s']:.2f}s  "
            f"comm {s['comm_fraction']:.3f}  wait {s['wait_fraction']:.3f}{out}")
