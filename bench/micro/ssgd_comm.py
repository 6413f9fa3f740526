"""``syncbench ssgd-comm``: SSGD's time inside MPI per step against a bare Allreduce.

Run it under mpiexec -n N. SSGD's communication overhead is the time a
training step spends inside MPI (comm + wait: posting, polling and completing
the gradient reduction) over what MPI itself needs to reduce the same bytes on
the same ranks. Both are measured in one job, interleaved in rounds, so that
they share the machine's conditions (the cost of one Allreduce drifts on a
shared machine: figures of separate jobs do not compare). Variants, each run
for --block-steps steps per round:

  mpi       the reference: SSGD's forward, backward and update on the same
            batches, with one bare in-place MPI Allreduce of the gradient
            between two MPI_Wtime calls where SSGD reduces it;
  blocking  SSGD --comm blocking (one Allreduce through its communicator);
  overlap   SSGD --comm overlap (an Iallreduce per --bucket-mb bucket, started
            during backward and polled between layers);
  tight     the bare Allreduce back to back (syncbench comm --check-raw's loop);
  osu       the bare Allreduce timed alone, then an untimed barrier (OSU);
  spin      the bare Allreduce after busy-waiting outside MPI for the median
            forward and backward time of mpi so far: the rhythm, no memory traffic.

Every training variant shares one model and optimizer (one SSGD trajectory).
A round runs each variant once, in an order rotated from round to round, each
block after one untimed step; --blocks rounds follow --untimed-steps untimed
steps of each variant. Per step, last is the smallest time inside MPI of any
rank (the last rank to arrive waits for no one: the reduction's own cost),
mean the mean over ranks; a block's figure is the mean over its steps, a
column the median over rounds, and last/mpi (last/tight) the median over
rounds of the block's last over the same round's mpi (tight) block. tight and
osu are no reference: back-to-back calls pipeline and a barrier hands every
rank to MPI at once, while a step reaches its reduction from compute. Rows
start with two spaces, one token per column; --out FILE.json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from syncbench.algorithms.timing import PhaseTimer
from syncbench.bench.data.catalog import DatasetError, load_dataset
from syncbench.bench.files import write_atomic
from syncbench.bench.flags import add_json_out, check_json_out, renamed
from syncbench.bench.micro.comm import time_loop
from syncbench.bench.micro.output import check_writable_parent
from syncbench.bench.mpi.errors import CommandParser
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels.backend import select_backend
from syncbench.kernels.zoo import build_model

VARIANTS = ("mpi", "blocking", "overlap", "tight", "osu", "spin")
REFERENCE = "mpi"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or REFERENCE not in names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct names from {','.join(VARIANTS)} including {REFERENCE} "
            f"(the reference), got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench ssgd-comm``."""
    # lazy: both import mpi4py.MPI, which importing this module must not (cli.py)
    from syncbench.algorithms.ssgd import bucket_mb_arg
    from syncbench.bench.train.options import add_model_and_data_arguments

    add_model_and_data_arguments(parser)
    parser.add_argument("--batch-size", type=_positive_int, default=64,
                        help="per-rank batch (default 64)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                        help="parameter and gradient precision (default float32)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    parser.add_argument("--momentum", type=float, default=0.9, help="momentum (default 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="seed of init, sharding, order")
    parser.add_argument("--bucket-mb", type=bucket_mb_arg, default="auto",
                        help="SSGD overlap bucket size in MB, or auto (default, as train: a "
                        "quarter of the model's gradient, at most 25 MB)")
    parser.add_argument("--variants", type=_variants, default=list(VARIANTS),
                        help=f"comma-separated, must include {REFERENCE} "
                        f"(default {','.join(VARIANTS)})")
    parser.add_argument("--blocks", type=_positive_int, default=10,
                        help="rounds; every variant runs one block per round (default 10)")
    parser.add_argument("--block-steps", type=_positive_int, default=20,
                        help="timed steps (iterations) per block (default 20)")
    # --warmup-steps is OD-SGD's flag in train; the old spelling here is kept as an alias
    renamed(parser, ("--warmup-steps",), "--untimed-steps", dest="untimed_steps", type=int,
            default=5, help="untimed steps of each variant before the first round (default 5)")
    add_json_out(parser, "every figure (rank 0)")


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


def main(args: argparse.Namespace) -> int:
    """Run on ``MPI.COMM_WORLD``; 0 on success, 2 on a setup error."""
    from syncbench.bench.mpi.runtime import run_on_world  # lazy: imports mpi4py.MPI

    return run_on_world(lambda comm: run(args, comm))


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser (``python -m syncbench.bench.micro.ssgd_comm``): one error line."""
    parser = CommandParser(
        prog="syncbench ssgd-comm",
        description="SSGD's time inside MPI per step against a bare Allreduce; run under "
        "mpiexec.")
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
