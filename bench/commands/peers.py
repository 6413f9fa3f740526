"""``syncbench peers``: our strategies against PyTorch's, and SSGD against the bare Allreduce.

For every model ``--model`` (those PyTorch's side builds too), rank count
``--np`` and algorithm ``--algorithms`` it plans ``--repeats`` rounds of
``syncbench train`` then its PyTorch peer (``ssgd`` <->
DistributedDataParallel, ``localsgd`` <-> PeriodicModelAverager with the same
``--period``), with the same data, ranks, per-rank batch, steps, seed and
optimizer, and runs them one at a time under the same launcher as ``syncbench
run`` (ours writes its run file, the peer a JSON record). It prints in fixed columns the median
samples/s of each (both: total samples over the slowest rank's training wall
time) and the ratio ``ours / peer`` of the medians.

Communication efficiency (SSGD, ``np >= 2``): once per rank count and model,
``syncbench ssgd-comm`` measures, interleaved in ``--comm-blocks`` rounds,
SSGD's time inside MPI per step (``comm + wait`` of the last-arriving rank,
``--comm overlap`` and ``blocking``) against a bare ``Allreduce`` of the same
bytes at the same point of the step (``mpi``) and back to back (``tight``);
ratios are medians of per-round ratios, 1.0: what MPI alone needs.

``--speed`` compares one process's training step instead (no data loading,
no MPI), ours (as ``syncbench speed`` measures it) against
PyTorch with one thread, alternating, each measurement in a fresh process.

BatchNorm follows docs/ALGORITHMS.md on both sides (per-rank statistics, DDP
without its buffer broadcast, Local SGD averaging the running statistics);
ours with ``--train-flags '--sync-bn'`` has no peer (PyTorch's SyncBatchNorm
takes GPU inputs only): a ``#`` note says so. SSGD's ``--compress fp16`` or
``powersgd[:R]`` (and ``--powersgd-start``) in ``--train-flags`` go to the peer too,
which registers PyTorch's ``fp16_compress_hook`` or ``powerSGD_hook`` with the same
rank and start step; another codec has no peer on the CPU and is refused. Rows (two
leading spaces) are whitespace-separated, one token per column; ``#`` lines are headers
and notes.
"""

from __future__ import annotations

import argparse
import os
import sys

from syncbench.bench.experiment.peers.pairs import run_pairs, run_speed, usage_error
from syncbench.bench.flags import rank_counts, renamed
from syncbench.kernels.zoo import split_models

HELP = "ours vs PyTorch DDP / PeriodicModelAverager, and SSGD vs a bare Allreduce"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench peers``."""
    parser.add_argument("--np", type=rank_counts, default=[2], metavar="N,...",
                        help="rank counts, comma-separated (default 2)")
    renamed(parser, ("--models",), "--model", default="mlp", metavar="MODEL,...",
            help="models, comma-separated (default mlp): mlp, lenet, resnet8, resnet20")
    parser.add_argument("--algorithms", default="ssgd,localsgd",
                        help="ssgd (vs DDP) and/or localsgd (vs PeriodicModelAverager)")
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="dataset (default fashion-mnist)")
    parser.add_argument("--synthetic-samples", type=int, default=8192,
                        help="training samples of --dataset synthetic")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs per run (default 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch (default 64)")
    parser.add_argument("--period", type=int, default=4, help="Local SGD period (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both (default 0)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each, alternating ours/peer; medians shown (default 3)")
    parser.add_argument("--comm-blocks", type=int, default=10,
                        help="rounds of syncbench ssgd-comm per rank count (default 10; "
                        "0 skips the communication-efficiency table)")
    parser.add_argument("--comm-block-steps", type=int, default=20,
                        help="steps per variant per round of syncbench ssgd-comm (default 20)")
    parser.add_argument("--train-flags", default="",
                        help="extra flags for our runs, e.g. '--comm blocking'")
    parser.add_argument("--speed", action="store_true",
                        help="single-process step throughput of ours vs PyTorch instead "
                        "(no MPI; --model, --batch-size, --repeats, --steps)")
    parser.add_argument("--steps", type=int, default=50,
                        help="--speed: training steps per repeat (default 50)")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else mpiexec next to this Python)")
    parser.add_argument("--run-timeout", type=float, default=900,
                        help="seconds allowed per run (default 900)")
    parser.add_argument("--out-dir", default=None, metavar="DIR",
                        help="keep every run's file (ours: HDF5, the peer's: JSON) and the "
                        "plan in DIR (default: a temporary folder, removed at the end)")
    parser.add_argument("--resume", action="store_true",
                        help="with --out-dir: keep the complete run files a stopped "
                        "invocation of the same plan left there, run the others")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench peers``: run every cell and print the two tables; exit status 0,
    or 1 if a run failed."""
    algorithms = [a for a in args.algorithms.split(",") if a]
    models = split_models(args.model)
    error = usage_error(args, algorithms, models)
    if error is not None:
        print(f"syncbench peers: {error}", file=sys.stderr)
        return 2
    # PyTorch's version from its metadata: the runs import it, this process need not
    # (importing it costs some four seconds of CPU)
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        print("syncbench peers: PyTorch is not installed: pip install -e '.[peers]'",
              file=sys.stderr)
        return 2
    threads = os.environ.get("OMP_NUM_THREADS", "1 (set per rank)")
    if args.speed:
        return run_speed(args, models, version, threads)
    return run_pairs(args, models, algorithms, version, threads)
