"""The algorithm-agnostic training driver behind ``syncbench train``.

Per rank: load and shard the data, build the model (same seed everywhere),
let the chosen algorithm take steps until the sample budget is consumed,
time every step by phase, evaluate the consensus model on the held-out split
at evaluation points, and finally gather every rank's rows to rank 0, which
writes the run file. Setup errors are agreed on by all ranks before any
training communication (one line, exit 2); any later exception aborts the job.
Before the setup, rank 0 locks the run file for the whole run
(:func:`~.checkpoint.run_lock`) and every rank learns whether it could: a run
whose ``--out`` another run holds ends there, having removed nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h5py
import numpy as np
from mpi4py import MPI

from syncbench.algorithms.base import Budget, Strategy, steps_per_rank
from syncbench.algorithms.communicator import Communicator, make_communicator
from syncbench.algorithms.device_buffers import detect_cuda_aware
from syncbench.algorithms.not_lock_step import data_shard, protocol_of
from syncbench.algorithms.registry import ALGORITHMS, get_algorithm
from syncbench.algorithms.timing import PhaseTimer
from syncbench.analysis import fairness, schema
from syncbench.analysis.context import (
    cpu_sample,
    foreign_cpu,
    host_info,
    load_average,
    machine_key,
    merge_transport_env,
    transport_env,
)
from syncbench.analysis.summary import divergence
from syncbench.bench.data.catalog import Dataset, DatasetError, load_dataset
from syncbench.bench.data.provenance import data_attrs
from syncbench.bench.data.text import for_model
from syncbench.bench.mpi import environment, threads
from syncbench.bench.mpi.clocks import ClockOffset, drift_since, measure_offsets
from syncbench.bench.mpi.provenance import git_sha, package_version
from syncbench.bench.mpi.runtime import (
    SetupError,
    abort_on_exception,
    agree_on_setup,
    library_version,
    start_mpi,
)
from syncbench.bench.mpi.watchdog import Watchdog, open_guard
from syncbench.bench.train import saved_model
from syncbench.bench.train.checkpoint import (
    RowsFile,
    WriteError,
    abort_on_write_error,
    agree_on_write,
    latest_checkpoint,
    parts_dir,
    remove_parts,
    run_identity,
    run_lock,
    take_lock,
    write_meta,
)
from syncbench.bench.train.config import TrainConfig, build_train_config
from syncbench.bench.train.evaluation import Evaluator, SnapshotKeeper, quality
from syncbench.bench.train.events import EventLog, on_run_clock
from syncbench.bench.train.hooks import (
    Checkpointer,
    Heartbeat,
    Hook,
    ProgressLine,
    RowFlusher,
    StepContext,
    StopOnSignal,
    StrategyReport,
)
from syncbench.bench.train.node_env import link_burst, node_speed, node_throttle
from syncbench.bench.train.recorder import StepRecorder, run_summary, write_run_file
from syncbench.bench.train.slowdown import (
    ModelWork,
    Slowdown,
    make_slowdown,
    parse_slowdown,
    parse_slowdown_schedule,
    resolve_mode,
)
from syncbench.bench.train.stopping import SignalCatcher, StopVote, exit_status
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels.backend import (
    Backend,
    BackendError,
    bind_before_mpi,
    cupy_distribution,
    select_backend,
)
from syncbench.kernels.model import Model
from syncbench.kernels.zoo import build_model


@dataclass
class LoopState:
    """The driver's own position in a run (saved with checkpoints)."""

    eval_stride: int
    ckpt_stride: int
    step: int = 0
    eval_seconds: float = 0.0
    last_eval_seen: int = -1
    elapsed: float = 0.0
    next_eval: float = math.inf
    next_ckpt: float = math.inf
    #: Times the run was continued with ``--resume`` (root attribute ``resumes``).
    resumes: int = 0

    def __post_init__(self) -> None:
        if self.eval_stride > 0 and self.next_eval == math.inf:
            self.next_eval = self.eval_stride
        if self.ckpt_stride > 0 and self.next_ckpt == math.inf:
            self.next_ckpt = self.ckpt_stride

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def load(self, saved: dict[str, float]) -> None:
        for key, value in saved.items():
            setattr(self, key, type(getattr(self, key))(value))


class Training:
    """One rank's live training run: its state (data, model, strategy, records, the
    evaluator and checkpointer, clocks) and the step loop."""

    def __init__(self, config: TrainConfig, comm: MPI.Comm) -> None:
        #: The run's flags, built and checked once (:func:`build_train_config`).
        self.config = config
        #: The raw MPI communicator of the run (collectives of the driver itself).
        self.world = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timer = PhaseTimer()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = local.Get_rank()
        local.Free()
        #: Every rank's node (its host name), in rank order.
        self.host_names: list[str] = comm.allgather(socket.gethostname())
        #: Most ranks on one node (``--slowdown-mode auto`` works unless every rank is alone).
        self.ranks_per_node = max(Counter(self.host_names).values())
        #: This rank's clock offset to rank 0 at the start and at the end of training.
        self.clock_start: ClockOffset | None = None
        self.clock_end: ClockOffset | None = None
        #: The global samples at the end of training (None until known).
        self.final_seen: int | None = None

    # -- setup (no training communication; errors agreed on by all ranks) ---
    def lock_run(self) -> None:
        """Rank 0 locks the run file (``--out``) for the whole run, before anything of
        an earlier run is removed, and tells every rank the outcome (one broadcast, the
        first collective): a run file that another run holds is a ``SetupError`` on
        every rank, whose line names the holder. Without ``--out``, or when its folder
        cannot hold the lock file (the setup's checks name that), nothing is locked."""
        #: Rank 0's lock on the run file (released by :meth:`release_lock`).
        self.run_lock = None
        error = ""
        out = self.config.out
        if self.rank == 0 and out:
            parent = Path(out).parent
            if parent.is_dir() and os.access(parent, os.W_OK):
                lock = run_lock(out)
                error = take_lock(lock, "syncbench train")
                self.run_lock = lock if lock.held else None
        error = self.world.bcast(error, root=0)
        if error:
            raise SetupError(error)

    def release_lock(self) -> None:
        if getattr(self, "run_lock", None) is not None:
            self.run_lock.release()

    def setup(self) -> None:
        config = self.config
        self.slowdowns = parse_slowdown(config.slowdown, self.size)
        self.slowdown_changes = parse_slowdown_schedule(config.slowdown_schedule, self.size)
        try:
            self.backend: Backend = select_backend(config.device, self.local_rank)
        except BackendError as exc:
            raise SetupError(str(exc)) from None
        # the update phase ends when its kernels have run, not when they are queued
        self.timer.device_sync = self.backend.synchronize if self.backend.is_gpu else None
        self.cuda_aware = self.backend.is_gpu and detect_cuda_aware(
            config.cuda_aware).enabled
        #: The strategy's timed communicator (built once, for this backend).
        self.communicator: Communicator = make_communicator(
            self.world, self.timer, self.backend, self.cuda_aware,
            config.cuda_aware_nonblocking == "yes",
            EventLog() if config.events == "on" else None)
        try:
            self.data: Dataset = load_dataset(
                config.dataset, config.data_dir,
                synthetic_train=config.synthetic_samples, seed=config.seed,
            )
            self.data = for_model(self.data, config.model)  # a language model's windows
            #: What data was read (``schema.DATA_ATTRS``; rank 0's, the one that writes).
            self.data_record = data_attrs(self.data) if self.rank == 0 else {}
        except DatasetError as exc:
            raise SetupError(str(exc)) from None
        dtype = np.dtype(config.dtype)
        cls = get_algorithm(config.algorithm)
        shard, shards = data_shard(cls, config, self.rank, self.size)
        self.stream = BatchStream(
            self.data.train_x, self.data.train_y, shard, shards,
            config.batch_size, config.seed, self.backend, dtype,
        )
        self.model: Model = build_model(
            config.model, self.data.input_shape, self.data.num_classes,
            self.backend, dtype, config.seed,
        )
        # Steps per epoch with the data sharded over every rank: the sample budget and
        # the strides are the same whatever ranks an algorithm trains on.
        self.steps_per_epoch = len(self.data.train_y) // self.size // config.batch_size
        steps = steps_per_rank(config.epochs, len(self.data.train_y), self.size, config.batch_size)
        self.budget = Budget(steps * config.batch_size * self.size, config.batch_size, self.size)
        if config.sync_bn:  # SyncBatchNorm: statistics of the global batch
            self.model.sync_batchnorm(self.communicator.Allreduce)
        self.algorithm: Strategy = cls(self.model, self.communicator, config, self.budget)
        #: The strategy's not-lock-step protocol (a lock-step strategy's: its lock-step view).
        self.protocol = protocol_of(self.algorithm)
        self.slowdown_mode = resolve_mode(config.slowdown_mode, self.ranks_per_node)
        slowdown = make_slowdown(
            self.slowdowns, self.slowdown_changes, self.rank, self.slowdown_mode,
            work=lambda: ModelWork(build_model(
                config.model, self.data.input_shape, self.data.num_classes,
                self.backend, dtype, config.seed), config.batch_size, config.seed))
        if slowdown is not None:
            slowdown.progress = self.protocol.drive_progress  # polls during the delay
            self.algorithm.slowdown = slowdown
        self.parts = parts_dir(config.out) if config.out else None
        # what a checkpoint of this run records, and --resume checks
        identity = run_identity(config, self.size, self.budget.total_samples)
        resume_step = None
        if config.resume:
            resume_step = latest_checkpoint(  # of this very run, or a one-line error
                self.parts, self.size, identity)
        elif self.parts is not None and self.parts.exists() and not config.overwrite:
            raise SetupError(
                f"{self.parts} holds rows of an earlier run of {config.out} that did not "
                f"complete: rebuild it with `syncbench recover {config.out}`, continue it "
                "with --resume, or pass --overwrite to discard it"
            )
        elif self.parts is not None and self.parts.exists():
            remove_parts(config.out)
        #: Saves and restores this rank's state (a run with a parts folder has one).
        self.checkpointer = (Checkpointer(self.parts, identity, resume_step)
                             if self.parts is not None else None)
        if config.inject_fault:
            fault_rank, *fault = config.inject_fault
            if fault_rank == self.rank:
                self.timer.fault = tuple(fault)
        self.watchdog: Watchdog | None = None
        #: Held while the rows change or are flushed (the hang guard flushes from its thread).
        self.rows_lock = threading.Lock()
        #: Evaluates the run and holds its evaluation rows.
        self.evaluator = Evaluator(config, self.data, self.backend, dtype, self.rank)

    # -- training -----------------------------------------------------------
    def train(self) -> dict[str, float] | None:
        """Train until the budget is consumed (or the target reached); write the run file.

        The loop only gets data, steps and records; evaluation, checkpoints,
        row flushes, snapshots, the heartbeat and progress are hooks
        (:mod:`syncbench.bench.train.hooks`, :mod:`syncbench.bench.train.evaluation`).
        """
        loop = self.open_records()
        hooks = self.make_hooks(loop)
        self.describe_run()
        ctx = StepContext(self, loop, self.start_clock(loop))
        for hook in hooks:
            hook.on_start(ctx)
        while not self.algorithm.done():
            if any(hook.before_step(ctx) for hook in hooks):
                continue
            self.take_step(ctx)
            if any(hook.after_step(ctx) for hook in hooks):  # stops at the first True
                break
        for hook in hooks:
            hook.before_finish(ctx)  # the Evaluator keeps this rank's own final weights
        self.algorithm.finish()
        ctx.train_end = ctx.now()
        # training time: what the off-clock blocks after this point (a stop checkpoint
        # in on_end) take is not subtracted from it
        ctx.train_seconds = ctx.train_end - loop.eval_seconds
        self.cpu_end = cpu_sample(self.local_rank == 0)
        ctx.seen = self.final_samples()
        for hook in hooks:
            hook.on_end(ctx)  # StopOnSignal's sets self.stopped_by (collective)
        self.final_seen = ctx.seen
        if self.config.save_model:
            self.save_model()
        # each rank's own training time (its off-clock blocks differ: rank 0 commits a
        # checkpoint after the barrier that frees the others), then the longest
        wall = self.world.allreduce(ctx.train_seconds, op=MPI.MAX)
        self.root.update(self.algorithm.run_attributes)  # and what it measured while training
        self.root["t_end_unix"] = time.time()
        self.root["load_end"] = _load()
        self.root.update(self.foreign_cpu_attrs())
        self.clock_end = measure_offsets(self.world)  # the drift since the start
        return self.write(self.recorder, wall, self.stopped_by)

    def open_records(self) -> LoopState:
        """Empty (or, with ``--resume``, restored) rows, evaluations and loop position
        (the evaluation rows are the evaluator's)."""
        config = self.config
        self.recorder = StepRecorder(self.budget.steps_per_rank + 1)
        loop = LoopState(
            eval_stride=int(config.eval_every * self.steps_per_epoch)
            * config.batch_size * self.size,
            ckpt_stride=config.checkpoint_every * config.batch_size * self.size,
        )
        if config.resume:
            self.checkpointer.restore(self, loop)
            loop.resumes += 1
        self.resumes = loop.resumes
        return loop

    def make_hooks(self, loop: LoopState) -> list[Hook]:
        """The hooks of this run, in the order they are called."""
        config = self.config
        # first: a stop ends the step loop before any other hook acts on the point
        hooks: list[Hook] = [StopOnSignal(self.catcher, StopVote(
            self.world, self.algorithm.traits.stop_vote_lag), self.checkpointer)]
        if config.timeout > 0:
            self.watchdog = self.start_watchdog()
            hooks.append(Heartbeat(self.watchdog))
        if self.parts is not None:
            hooks.append(RowFlusher(config.flush_every))
        hooks.append(SnapshotKeeper(self.evaluator))
        hooks.append(ProgressLine(self.budget.total_samples,
                                  config.progress if self.rank == 0 else "never"))
        hooks.append(self.evaluator)
        if loop.ckpt_stride > 0:  # validated: --checkpoint-every needs --out
            hooks.append(self.checkpointer)
        hooks.append(StrategyReport())
        return hooks

    def describe_run(self) -> None:
        """Root attributes (every rank's node, device and MPI transport settings) and the
        parts folder's metadata."""
        config = self.config
        ranks = self.world.allgather((self.backend.device, self.cuda_aware,
                                      {**host_info(), "gpu": self.backend.device_id},
                                      transport_env()))
        infos = [info for _, _, info, _ in ranks]
        self.host_cores_by_rank = [info.get("host_cores") for info in infos]
        self.machine_by_rank = [info.get("machine", "") for info in infos]
        self.root = self.root_attrs(self.host_names, [d for d, _, _, _ in ranks])
        self.root["cuda_aware"] = all(aware for _, aware, _, _ in ranks)
        self.root.update(machine_attrs(self.host_names, infos, config.scaling_mode))
        self.root[schema.TRANSPORT_ATTR] = json.dumps(
            merge_transport_env([env for _, _, _, env in ranks]), sort_keys=True)
        self.root[schema.THREADS_ATTR] = threads.current().threads
        if self.rank == 0:  # the writer's view, from what is known (no subprocess, no probe)
            self.root[schema.ENVIRONMENT_ATTR] = json.dumps(environment.run_facts(
                self.backend.device, self.data.source, config.cuda_aware),
                sort_keys=True)
        if self.parts is not None and self.rank == 0:
            if config.overwrite and not config.resume:
                Path(config.out).unlink(missing_ok=True)  # no stale result beside new parts
            try:
                write_meta(self.parts, self.root, config.target_accuracy, config.target_loss)
            except WriteError as exc:
                abort_on_write_error(self.world, exc)

    def start_clock(self, loop: LoopState) -> float:
        """Untimed warm-up and collective set-up, the start barrier; returns time 0."""
        if self.backend.is_gpu:  # untimed: NVRTC compiles, cuBLAS handle (Model.warm_up)
            self.model.warm_up(self.config.batch_size)
        self.protocol.prepare()  # collective set-up (ASGD's windows) stays off the clock
        self.world.Barrier()
        t0 = self.t0 = self.clock_origin() - loop.elapsed
        if self.communicator.events is not None:
            self.communicator.events.start()  # the collectives of training, from time 0
        # the offset measurement is not training: off the clock, like an evaluation
        loop.eval_seconds += max(0.0, time.monotonic() - t0 - loop.elapsed)
        # the run's interval, set-up included (it loads the CPU too): overlap detection
        self.root["t_begin_unix"] = self.t_begin_unix
        self.root["load_begin"] = _load()  # information; "loaded" is foreign_cpu_share's
        self.cpu_begin = cpu_sample(self.local_rank == 0)  # each host's first rank reads it
        if isinstance(self.algorithm.slowdown, Slowdown):
            self.algorithm.slowdown.start(loop.elapsed)  # --slowdown-schedule times from here
        return t0

    def foreign_cpu_attrs(self) -> dict[str, float]:
        """``foreign_cpu_s`` / ``foreign_cpu_share`` of the run (collective; rank 0's are real).

        Every rank's CPU samples at the start barrier and the end of training
        are gathered to rank 0 (:func:`~syncbench.analysis.context.foreign_cpu`),
        which pairs them with the hosts and cores :meth:`describe_run` gathered.
        """
        samples = self.world.gather((self.cpu_begin, self.cpu_end), root=0)
        if self.rank != 0:
            return {}
        records = [{"host": host, "machine": machine, "cores": cores, "begin": begin,
                    "end": end}
                   for host, machine, cores, (begin, end)
                   in zip(self.host_names, self.machine_by_rank, self.host_cores_by_rank,
                          samples)]
        return foreign_cpu(records)

    def take_step(self, ctx: StepContext) -> None:
        """One step: data, ``algorithm.step``, the row; sets the context's step fields."""
        loop = ctx.loop
        self.timer.reset()
        self.timer.step = loop.step
        ctx.t_start = ctx.now()
        with self.timer.phase("data"):
            x, y = self.stream.next()
        ctx.stats = self.algorithm.step(x, y)
        with self.rows_lock:  # the hang guard may flush the rows from its thread
            self.recorder.append(loop.step, ctx.t_start, self.timer.totals, ctx.stats,
                                 self.timer.compute_cpu_s, self.timer.sync_cpu_s,
                                 self.timer.step_cpu_s)
        loop.step += 1
        ctx.seen = self.algorithm.evaluation_point()

    def final_samples(self) -> int:
        """Global samples at the end of training (collective: the same on every rank)."""
        seen = self.algorithm.evaluation_point()
        if seen is None:
            seen = int(self.world.allreduce(int(self.recorder.columns()["samples"].sum())))
        return seen

    def clock_origin(self) -> float:
        """This rank's ``time.monotonic()`` at time 0 of the run (collective, after the
        start barrier).

        Time 0 is the moment rank 0 left the start barrier, mapped onto this
        rank's ``CLOCK_MONOTONIC`` through its measured offset to rank 0
        (:func:`~syncbench.bench.mpi.clocks.measure_offsets`): every rank's rows are on
        rank 0's clock, within the offset's uncertainty, whatever node it runs
        on (monotonic clocks start at each node's boot) and however far apart the
        ranks left the barrier. ``MPI.Wtime`` is not used: its origin is per
        process under Open MPI and it is not ``CLOCK_MONOTONIC`` under MPICH.
        """
        exit_time = time.monotonic()
        self.clock_start = measure_offsets(self.world)
        start = self.world.bcast(exit_time if self.rank == 0 else None, root=0)
        return start + self.clock_start.offset_s

    # -- crash safety -------------------------------------------------------
    def start_watchdog(self) -> Watchdog:
        """The hang guard (collective); its heartbeat files go to the parts folder (none
        without one: the guards' probes carry them)."""
        return open_guard(self.world, self.host_names[self.rank], self.parts,
                          self.config.timeout, self.timer,
                          flush=self.flush_from_guard if self.parts is not None else None)

    def rank_attrs(self, rows: dict[str, np.ndarray]) -> dict[str, Any]:
        """This rank's attributes; ``rows`` are its recorded rows (``recorder.columns()``)."""
        return {
            "hostname": self.host_names[self.rank],
            "node": sorted(set(self.host_names)).index(self.host_names[self.rank]),
            "device": self.backend.device,
            "slowdown": self.slowdowns[self.rank],
            "node_speed": node_speed(),
            **node_throttle(),
            "link_burst_bytes": link_burst(),
            **self.slowdown_attrs(rows),
            **clock_attrs(self.clock_start, self.clock_end),
        }

    def slowdown_attrs(self, rows: dict[str, np.ndarray]) -> dict[str, Any]:
        """``slowdown_mode``, ``slowdown_reference_s`` and ``slowdown_realised`` of this rank.

        The realised factor here is this rank's own mean (compute + delay) over
        its mean compute (1.0 when it was never slowed), from its ``rows``, a
        partial-file placeholder: the run file gets :func:`realised_into`'s value.
        """
        slowdown = self.algorithm.slowdown
        if not isinstance(slowdown, Slowdown):
            return {"slowdown_mode": "none", "slowdown_reference_s": float("nan"),
                    "slowdown_realised": 1.0}
        compute = float(np.sum(rows.get("t_compute", 0.0)))
        delay = float(np.sum(rows.get("t_delay", 0.0)))
        return {"slowdown_mode": slowdown.mode,
                "slowdown_reference_s": slowdown.mean_reference,
                "slowdown_realised": (compute + delay) / compute if compute > 0 else 1.0}

    def flush(self) -> None:
        """Bring this rank's rows file up to date (rank 0 adds the evaluation rows);
        a failed write ends the job with one line."""
        try:
            with self.rows_lock:
                self._flush()
        except WriteError as exc:
            abort_on_write_error(self.world, exc)

    def flush_from_guard(self) -> None:
        """:meth:`flush` from the hang guard's thread, while the main thread is blocked
        (in MPI, or anywhere else); skipped if the main thread holds the rows for
        longer than a moment (a flush of its own stuck on the file system)."""
        if self.rows_lock.acquire(timeout=2.0):
            try:
                self._flush()
            finally:
                self.rows_lock.release()

    def _flush(self) -> None:
        """Append the rows since the last flush (:class:`.checkpoint.RowsFile`;
        the first flush of this process writes the file afresh); raises ``WriteError``."""
        if getattr(self, "rows_file", None) is None:
            self.rows_file = RowsFile(self.parts, self.rank)
        evals = self.evaluator.rows.columns() if self.rank == 0 else None
        rows = self.recorder.view()
        self.rows_file.flush(rows, self.rank_attrs(rows), evals)

    def stop_line(self) -> str:
        """Rank 0's line on a run stopped by a signal: where, what is kept, how to go on."""
        config, seen = self.config, self.final_seen
        where = (f"at {seen:,} of {self.budget.total_samples:,} samples" if seen is not None
                 else f"after {self.recorder.count} steps of rank 0")
        if config.out is None:
            return (f"syncbench train: stopped by {self.stopped_by} {where}; nothing is kept "
                    "(no --out)")
        kept = f"{config.out} is written incomplete (complete=False)"
        at = self.checkpointer.stop_samples if self.checkpointer is not None else None
        if at is not None:
            return (f"syncbench train: stopped by {self.stopped_by} {where}; {kept}, with a "
                    f"checkpoint at {at:,} samples in {self.parts}: continue with the same "
                    "command and --resume")
        return (f"syncbench train: stopped by {self.stopped_by} {where}; {kept}; "
                f"{config.algorithm} keeps no checkpoint at a stop (--resume continues from "
                "its last --checkpoint-every pause, if any)")

    def save_model(self) -> None:
        """Rank 0 writes the final consensus parameters (``--save-model``, .npy) and the
        record of what they are beside them (:mod:`~syncbench.bench.train.saved_model`;
        collective: a failed write is one line from rank 0 and status 2 on every rank)."""
        def write() -> None:
            saved_model.save(self.config.save_model,
                             self.backend.to_numpy(self.evaluator.consensus_model.params),
                             saved_model.describe(self.config.model, self.data))

        agree_on_write(self.world, write if self.rank == 0 else None)

    # -- output ---------------------------------------------------------------
    def write(self, recorder: StepRecorder, wall_s: float,
              stopped_by: str = "") -> dict[str, float] | None:
        """Gather every rank's rows to rank 0, which writes the run file atomically.

        Each rank first moves its ``t_start`` onto rank 0's clock for the drift
        between its two offset measurements (:func:`~syncbench.bench.mpi.clocks.drift_since`).
        A run ``stopped_by`` a signal is written ``complete=False`` and keeps its parts
        folder (its rows and the checkpoint that ``--resume`` continues from).
        """
        config = self.config
        kept = self.parts is not None  # the parts keep every row should the run file fail
        if kept:
            with self.rows_lock:
                try:
                    self._flush()
                except OSError:
                    kept = False
        own = recorder.columns()
        if self.clock_start is not None:
            own["t_start"] = own["t_start"] - drift_since(
                own["t_start"] + self.t0, self.clock_start, self.clock_end)
        gathered = self.world.gather((own, self.rank_attrs(own), kept, self.own_events()),
                                     root=0)
        if self.rank != 0:
            if config.out is not None:  # rank 0's outcome: a failed write ends every rank
                agree_on_write(self.world, None)
            return None
        rows = {r: g[0] for r, g in enumerate(gathered)}
        attrs = {r: g[1] for r, g in enumerate(gathered)}
        events = {r: g[3] for r, g in enumerate(gathered) if g[3] is not None} or None
        realised_into(attrs, rows, self.root)
        evals = self.evaluator.rows.columns()
        local_evals = (self.evaluator.local_rows.columns() if self.evaluator.mode == "both"
                       else None)
        classes = self.data.num_classes
        if config.out is None:
            summary = run_summary(rows, evals, wall_s, config.target_accuracy, classes,
                                  local_evals, target_loss=config.target_loss)
            summary.update({schema.COMPLETE_ATTR: not stopped_by,
                            schema.STOPPED_BY_ATTR: stopped_by})
        else:
            if all(g[2] for g in gathered):
                note = (f"; every row is kept in {self.parts}: `syncbench recover {config.out}` "
                        "rebuilds the run once the file can be written")
            else:
                note = (f"; {self.parts} keeps the rows flushed before: `syncbench recover "
                        f"{config.out}` rebuilds a partial run once the file can be written"
                        if self.parts is not None and self.parts.is_dir() else "")
            summary = agree_on_write(self.world, lambda: write_run_file(
                config.out, self.root, rows, attrs, evals,
                wall_s, config.target_accuracy, num_classes=classes,
                complete=not stopped_by, stopped_by=stopped_by, target_loss=config.target_loss,
                local_evals=local_evals, events=events), note=note)
            if not stopped_by:
                remove_parts(config.out)
        # the reason, for the warning line; only a diverged run has one
        self.divergence = divergence(rows, evals, classes) if summary["diverged"] else None
        return summary

    def own_events(self) -> tuple[dict[str, np.ndarray], dict[str, int]] | None:
        """This rank's collective events on the run's clock (as its ``t_start``), and their
        attributes; None without ``--events on``."""
        log = self.communicator.events
        if log is None:
            return None
        def drift(local: np.ndarray) -> np.ndarray:
            if self.clock_start is None:
                return np.zeros_like(local)
            return drift_since(local, self.clock_start, self.clock_end)

        cols = log.columns()
        for name in ("t_post", "t_done"):
            cols[name] = on_run_clock(cols[name], self.t0, drift)
        return cols, log.attrs()

    def root_attrs(self, hostnames: list[str], devices: list[str]) -> dict[str, Any]:
        config = self.config
        cupy_package, cupy_version = cupy_distribution(
            self.backend.xp if self.backend.is_gpu else None)
        return {
            "algorithm": config.algorithm,
            "model": config.model,
            "dataset": config.dataset,
            "world_size": self.size,
            "config": json.dumps(config.record(), sort_keys=True, default=str),
            "started_utc": self.started_utc,
            "syncbench_version": package_version(),
            "git_sha": git_sha(),
            "mpi_library": library_version(),
            "mpi4py_version": metadata.version("mpi4py"),
            "numpy_version": np.__version__,
            # the CuPy installed (imported, on the GPU backend): cupy-cuda12x or -cuda13x
            "cupy_version": cupy_version,
            "cupy_package": cupy_package,
            "h5py_version": h5py.__version__,
            "backend": self.backend.name,
            "devices": sorted(set(devices)),
            "cuda_aware": False,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "hostnames": sorted(set(hostnames)),
            **self.algorithm.run_attributes,
            schema.RESUMES_ATTR: int(getattr(self, "resumes", 0)),
            **strategy_flag_attrs(config.algorithm),
            **getattr(self, "data_record", {}),
        }


def _load() -> float:
    """The host's 1-minute load average (NaN where unavailable)."""
    value = load_average()
    return float("nan") if value is None else value


def strategy_flag_attrs(algorithm: str) -> dict[str, str]:
    """``strategy_flags`` / ``option_flags``: JSON lists of ``config`` keys that are options.

    The run's own strategy's ``Options`` fields, and every registered
    strategy's, so that analysis (which imports no strategy) can tell the
    shared train flags and the run's own options from another strategy's; and
    the strategy's traits (``schema.TRAITS_ATTR``), which analysis reads instead of
    keying tables by the strategy's name.
    """
    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls.Options)]

    every = sorted({n for cls in ALGORITHMS.values() for n in names(cls)})
    traits = get_algorithm(algorithm).traits
    return {"strategy_flags": json.dumps(sorted(names(get_algorithm(algorithm)))),
            "option_flags": json.dumps(every), schema.TRAITS_ATTR: traits.to_json()}


def realised_into(attrs: dict[int, dict[str, Any]], rows: dict[int, dict[str, Any]],
                  root: dict[str, Any]) -> None:
    """Set each slowed rank's ``slowdown_realised`` to the analysis's definition.

    :func:`syncbench.analysis.fairness.realised_factors` with per-step medians:
    (compute + delay) over the median of the unslowed ranks' compute, from the
    gathered rows of every rank (one definition for the file and the reports).
    """
    run = SimpleNamespace(attrs=root, ranks=rows, rank_attrs=attrs)
    for rank, factor in fairness.realised_factors(run, "median").items():
        attrs[rank]["slowdown_realised"] = factor


def clock_attrs(start: ClockOffset | None, end: ClockOffset | None) -> dict[str, float]:
    """Rank attributes ``schema.CLOCK_ATTRS``: offsets to rank 0 and their uncertainties
    at the start and at the end of training (NaN where not measured yet)."""
    nan = float("nan")
    values = [getattr(m, name, nan) for m in (start, end)
              for name in ("offset_s", "uncertainty_s")]
    return dict(zip(schema.CLOCK_ATTRS, values))


def machine_attrs(hostnames: list[str], infos: list[dict[str, int | None]],
                  scaling_mode: str | None) -> dict[str, Any]:
    """Root attributes of the machine context (``schema.CONTEXT_ATTRS`` but the times,
    and ``schema.NODE_ATTRS``).

    ``hostnames`` and ``infos`` (:func:`~syncbench.analysis.context.host_info`)
    have one entry per rank; a node is a host name. A machine (one kernel,
    ``info["machine"]``: the nodes of the emulated cluster are one) is
    oversubscribed when its ranks outnumber its physical cores (its own
    count, not rank 0's); ``ranks_per_node`` follows the sorted ``hostnames``.
    ``info["gpu"]`` (``Backend.device_id``, "" on the CPU) gives ``schema.GPU_ATTRS``:
    the distinct GPUs of the run (a GPU is one id on one machine), the most ranks on
    one of them, and whether some GPU is shared by several ranks (they time-slice it:
    a timing of its own, whatever the cores say).
    """
    per_host = Counter(hostnames)
    # cores are a kernel's: nodes that are namespaces of one host share its cores
    machines = [machine_key(host, info.get("machine")) for host, info in zip(hostnames, infos)]
    per_machine = Counter(machines)
    cores = {machine: info.get("host_cores") for machine, info in zip(machines, infos)}
    per_gpu = Counter((machine, info["gpu"]) for machine, info in zip(machines, infos)
                      if info.get("gpu"))
    return {
        "host_cores": infos[0].get("host_cores") or 0,
        "host_cpus": infos[0].get("host_cpus") or 0,
        "ranks_per_host": max(per_host.values()),
        "ranks_per_machine": max(per_machine.values()),
        "nodes": len(per_host),
        "ranks_per_node": [per_host[h] for h in sorted(per_host)],
        # None (written as "", read as unknown) when a host's cores could not be read
        "oversubscribed": None if None in cores.values()
        else any(per_machine[m] > c for m, c in cores.items()),
        "scaling_mode": scaling_mode or "",
        "gpu_count": len(per_gpu),
        "ranks_per_gpu": max(per_gpu.values(), default=0),
        "gpu_shared": any(count > 1 for count in per_gpu.values()),
    }


def main(args: argparse.Namespace) -> int:
    """Body of ``syncbench train``: one run on every rank of ``MPI.COMM_WORLD``.

    The flags were parsed before MPI started (``cli.main``; mpi4py was imported
    then without initializing MPI); MPI starts here, after the GPU of this
    rank is made current (``backend.bind_before_mpi``). The run's config is built
    and checked then, for the ranks of the job, once (a bad value: one line from
    rank 0, every rank exits 2).
    """
    bind_before_mpi(args.device)
    comm = start_mpi()
    config = agree_on_setup(comm, lambda: build_train_config(args, comm.Get_size()), "train")
    training = train_run(config, comm)
    # every rank: 128 + the signal that stopped the run, as if it had died of it
    return exit_status(training.stopped_by)


def run_training(config: TrainConfig, comm: MPI.Comm | None = None) -> dict | None:
    """Train once on every rank of ``comm``; returns the summary on rank 0."""
    return train_run(config, comm).summary


def train_run(config: TrainConfig, comm: MPI.Comm | None = None) -> Training:
    """Train once on every rank of ``comm``; the :class:`Training` (``summary`` on rank 0,
    ``stopped_by`` on every rank).

    SIGTERM, SIGINT and SIGUSR1 are caught from before the setup to the end
    (:class:`~syncbench.bench.train.stopping.SignalCatcher`): training stops at an
    agreed step boundary and the run file is written incomplete.
    """
    comm = comm or MPI.COMM_WORLD
    training = Training(config, comm)
    training.started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    training.t_begin_unix = time.time()
    training.catcher = SignalCatcher().install()
    training.stopped_by, training.summary = "", None
    try:
        agree_on_setup(comm, training.lock_run, "train")  # before the setup removes anything
        agree_on_setup(comm, training.setup, "train")

        def body() -> dict | None:
            try:
                return training.train()
            finally:
                training.algorithm.close()

        training.summary = abort_on_exception(comm, body)
    finally:
        training.catcher.restore()
        training.release_lock()  # after the run file is written and its parts removed
    summary = training.summary
    if comm.Get_rank() == 0 and summary is not None:
        print(format_summary(config, comm.Get_size(), summary), flush=True)
        if getattr(training, "divergence", None):
            print(f"syncbench train: warning: run diverged ({training.divergence}); its "
                  "timings are not a result", file=sys.stderr, flush=True)
        if training.stopped_by:
            print(training.stop_line(), file=sys.stderr, flush=True)
    return training


def format_summary(config: TrainConfig, world: int, s: dict[str, float]) -> str:
    """One fixed-format result line (parseable by scripts): every figure with its unit
    (comm and wait are shares of the wall time, in percent), then where the run file
    was written (with ``--out``)."""
    out = f"; run file {config.out}" if config.out else ""
    return (f"{config.algorithm} {config.model} {config.dataset} np={world}: "
            f"{quality(s)}  "
            f"{s['samples_per_s']:.1f} samples/s  wall {s['wall_s']:.2f}s  "
            f"comm {100 * s['comm_fraction']:.1f}%  wait {100 * s['wait_fraction']:.1f}% "
            f"of wall time{out}")
