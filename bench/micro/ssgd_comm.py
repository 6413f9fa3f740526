"""The measurement behind ``syncbench ssgd-comm`` (its command line and what it measures:
:mod:`syncbench.bench.commands.ssgd_comm`): SSGD's variants interleaved in blocks on
one trajectory, their time inside MPI per step, and the figures of rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data.catalog import DatasetError, load_dataset
from syncbench.bench.files import write_atomic
from syncbench.bench.flags import check_json_out
from syncbench.bench.micro.comm import time_loop
from syncbench.bench.micro.output import check_writable_parent
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels.backend import select_backend
from syncbench.kernels.zoo import build_model

VARIANTS = ("mpi", "blocking", "overlap", "tight", "osu", "spin")
REFERENCE = "mpi"


# -- the measured loop (every rank) ---------------------------------------------

@dataclass
class Bench:
    """One rank's model, batches and SSGD variants."""

    comm: Any
    stream: Any
    model: Any
    timer: Any
    ssgd: dict[str, Any]
    optimizer: Any
    scratch: np.ndarray
    compute_s: list[float] = field(default_factory=list)

    def bare_allreduce(self, buf: np.ndarray) -> float:
        """Seconds of one in-place ``Allreduce`` of ``buf``, nothing else timed."""
        from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

        t0 = MPI.Wtime()
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        return MPI.Wtime() - t0

    def mpi_step(self) -> float:
        """Forward, backward, a bare in-place Allreduce (timed alone), the update."""
        from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

        x, y = self.stream.next()
        model = self.model
        started = MPI.Wtime()
        model.loss_and_grad(x, y)
        self.compute_s.append(MPI.Wtime() - started)
        inside = self.bare_allreduce(model.grads)
        model.grads *= 1.0 / self.comm.Get_size()
        self.optimizer.step(model.params, model.grads)
        return inside

    def ssgd_step(self, mode: str) -> float:
        """One SSGD step (``--comm mode``); its comm + wait seconds."""
        x, y = self.stream.next()
        self.timer.reset()
        self.ssgd[mode].step(x, y)
        return self.timer.totals["comm"] + self.timer.totals["wait"]

    def run_block(self, variant: str, steps: int) -> np.ndarray:
        """Seconds inside MPI of each of ``steps`` timed steps, after one untimed one."""
        from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

        buf = self.scratch
        if variant in ("tight", "osu"):  # time_loop's own timing, as syncbench comm
            return time_loop(self.comm, steps, 1,
                             lambda: self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                             barrier=variant == "osu")
        if variant == "spin":
            gap = float(np.median(self.compute_s)) if self.compute_s else 0.0

            def step() -> float:
                until = MPI.Wtime() + gap
                while MPI.Wtime() < until:
                    pass
                return self.bare_allreduce(buf)
        elif variant == REFERENCE:
            step = self.mpi_step
        else:
            step = lambda: self.ssgd_step(variant)  # noqa: E731
        step()  # untimed: the first step after another variant's block
        return np.array([step() for _ in range(steps)])


def build_bench(args: argparse.Namespace, comm: Any) -> Bench:
    """Data shard, model and the two SSGD instances; ``ValueError`` with one line."""
    # lazy: the four import mpi4py.MPI
    from syncbench.algorithms.base import Budget
    from syncbench.algorithms.communicator import Communicator
    from syncbench.algorithms.ssgd import SSGD
    from syncbench.bench.train.config import default_train_config

    if args.untimed_steps < 0:
        raise ValueError(f"--untimed-steps must be >= 0, got {args.untimed_steps}")
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        data = load_dataset(args.dataset, args.data_dir,
                            synthetic_train=args.synthetic_samples, seed=args.seed)
    except DatasetError as exc:
        raise ValueError(str(exc)) from None
    backend = select_backend("cpu")
    dtype = np.dtype(args.dtype)
    stream = BatchStream(data.train_x, data.train_y, rank, size, args.batch_size, args.seed,
                         backend, dtype)
    model = build_model(args.model, data.input_shape, data.num_classes, backend, dtype,
                        args.seed)
    timer = PhaseTimer()
    communicator = Communicator(comm, timer)
    budget = Budget(args.batch_size * size, args.batch_size, size)
    sgd = default_train_config(lr=args.lr, momentum=args.momentum, weight_decay=0.0)
    ssgd = {mode: SSGD(model, communicator, sgd, budget,
                       options=SSGD.Options(comm=mode, bucket_mb=args.bucket_mb))
            for mode in ("blocking", "overlap")}
    optimizer = ssgd["blocking"].optimizer
    ssgd["overlap"].optimizer = optimizer  # one trajectory whatever a step's variant
    return Bench(comm, stream, model, timer, ssgd, optimizer,
                 np.zeros(model.size, dtype=dtype))


def measure(bench: Bench, variants: list[str], blocks: int, block_steps: int,
            untimed_steps: int) -> dict[str, np.ndarray]:
    """``{variant: seconds[block, step]}`` of this rank, rounds rotating the order."""
    for variant in variants:
        if untimed_steps:
            bench.run_block(variant, untimed_steps)
    times = {v: np.empty((blocks, block_steps)) for v in variants}
    for block in range(blocks):
        shift = block % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            times[variant][block] = bench.run_block(variant, block_steps)
    return times


# -- statistics (rank 0) ----------------------------------------------------------

def block_figures(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``seconds[rank, block, step]`` -> per block (last, mean) in ms.

    *last*: the mean over the block's steps of the smallest time of any rank
    in that step; *mean*: the mean over ranks and steps.
    """
    last = seconds.min(axis=0).mean(axis=1) * 1e3
    mean = seconds.mean(axis=(0, 2)) * 1e3
    return last, mean


def paired_ratio(values: np.ndarray, reference: np.ndarray) -> float:
    """Median over rounds of ``values[round] / reference[round]``."""
    return float(np.median(np.asarray(values) / np.asarray(reference)))


def summarize(gathered: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Per variant: per-block figures, their medians and the paired ratios."""
    per_block = {v: block_figures(t) for v, t in gathered.items()}
    ref_last, ref_mean = per_block[REFERENCE]
    tight_last = per_block["tight"][0] if "tight" in per_block else None
    out: dict[str, dict[str, Any]] = {}
    for variant, (last, mean) in per_block.items():
        out[variant] = {
            "last_ms": statistics.median(last.tolist()),
            "mean_ms": statistics.median(mean.tolist()),
            "last_min_ms": float(last.min()), "last_max_ms": float(last.max()),
            "last_over_mpi": paired_ratio(last, ref_last),
            "mean_over_mpi": paired_ratio(mean, ref_mean),
            "last_over_tight": (paired_ratio(last, tight_last) if tight_last is not None
                                else float("nan")),
            "blocks_last_ms": last.tolist(), "blocks_mean_ms": mean.tolist(),
        }
    return out


HEADER = (f"# {'variant':<10}{'last[ms]':>12}{'mean[ms]':>12}{'last_min':>12}{'last_max':>12}"
          f"{'last/mpi':>10}{'mean/mpi':>10}{'last/tight':>12}")


def format_row(variant: str, s: dict[str, Any]) -> str:
    """One fixed-column row of the table."""
    return (f"  {variant:<10}{s['last_ms']:>12.4f}{s['mean_ms']:>12.4f}"
            f"{s['last_min_ms']:>12.4f}{s['last_max_ms']:>12.4f}{s['last_over_mpi']:>10.3f}"
            f"{s['mean_over_mpi']:>10.3f}{s['last_over_tight']:>12.3f}")


def run(args: argparse.Namespace, comm: Any) -> dict[str, Any] | None:
    """Measure on every rank; rank 0 prints the table and returns the figures."""
    from syncbench.bench.mpi.runtime import (  # lazy: imports mpi4py.MPI
        agree_on_setup,
        library_version,
    )

    def setup() -> Bench:
        if args.json:
            check_json_out(args)
            check_writable_parent("--out", args.json)
        return build_bench(args, comm)

    bench = agree_on_setup(comm, setup, "ssgd-comm")
    rank, size = comm.Get_rank(), comm.Get_size()
    nbytes = int(bench.model.grads.nbytes)
    if rank == 0:
        library = library_version()
        print(f"# syncbench ssgd-comm: {args.model} on {args.dataset}, {size} ranks, batch "
              f"{args.batch_size}/rank, {args.dtype} gradient of {nbytes} bytes, bucket "
              f"{args.bucket_mb} MB; {args.blocks} rounds x {args.block_steps} steps of "
              f"{','.join(args.variants)}", flush=True)
        print(f"# MPI: {library}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
              flush=True)
    local = measure(bench, args.variants, args.blocks, args.block_steps, args.untimed_steps)
    gathered = {v: comm.gather(t, root=0) for v, t in local.items()}
    if rank != 0:
        return None
    figures = summarize({v: np.stack(ts) for v, ts in gathered.items()})
    print(HEADER)
    for variant in args.variants:
        print(format_row(variant, figures[variant]))
    result = {"model": args.model, "dataset": args.dataset, "world_size": size,
              "batch_size": args.batch_size, "dtype": args.dtype, "nbytes": nbytes,
              "bucket_mb": args.bucket_mb, "blocks": args.blocks,
              "block_steps": args.block_steps, "mpi_library": library, "variants": figures}
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1).encode())
        print(f"# figures -> {args.json}", flush=True)
    return result
