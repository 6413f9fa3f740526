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

from syncbench.algorithms.reducers.buckets import bucket_mb_arg
from syncbench.bench.flags import add_json_out, positive_int, renamed
from syncbench.bench.micro import ssgd_comm as bench
from syncbench.bench.micro.ssgd_comm import REFERENCE, VARIANTS
from syncbench.bench.train.options import add_model_and_data_arguments

HELP = "SSGD's time inside MPI per step vs a bare Allreduce (under mpiexec)"



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
    add_model_and_data_arguments(parser)
    parser.add_argument("--batch-size", type=positive_int, default=64,
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
    parser.add_argument("--blocks", type=positive_int, default=10,
                        help="rounds; every variant runs one block per round (default 10)")
    parser.add_argument("--block-steps", type=positive_int, default=20,
                        help="timed steps (iterations) per block (default 20)")
    # --warmup-steps is OD-SGD's flag in train; the old spelling here is kept as an alias
    renamed(parser, ("--warmup-steps",), "--untimed-steps", dest="untimed_steps", type=int,
            default=5, help="untimed steps of each variant before the first round (default 5)")
    add_json_out(parser, "every figure (rank 0)")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench ssgd-comm``: the benchmark on ``MPI.COMM_WORLD``; 0 on success, 2
    on a setup error."""
    from syncbench.bench.mpi.runtime import run_on_world  # lazy: imports mpi4py.MPI

    return run_on_world(lambda comm: bench.run(args, comm))
