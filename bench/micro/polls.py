"""How many polls of busy ranks an RMA operation or a nonblocking allreduce takes.

Over a transport without hardware one-sided operations (MPICH's CH4 over UCX's TCP) a
rank moves a message only inside an MPI call. Ranks that compute between polls (ASGD's
owners at ``ProgressPoll``'s ``Iprobe``, ``algorithms/windows.py``; SSGD's and OD-SGD's
``Testall`` between layers) so get a message through a few polls at a time, and the
simulator follows how many a message needs (``bench/simulate/asgd.py``: ``push_polls``;
``bench/simulate/progress.py``: ``PROGRESS_SEGMENT_BYTES``).

* ``--op accumulate`` (ASGD's push) and ``get-accumulate`` (its pull, ``NO_OP``): rank 1
  spins between ``Iprobe`` polls ``--gap-ms`` apart; rank 0 runs one passive-target
  epoch (``MPI_MODE_NOCHECK``, as ASGD's windows do) of the operation on rank 1's
  window, timed, at varied phases of rank 1's gaps.
* ``--op iallreduce``: both ranks post an ``Iallreduce`` of the size, then spin between
  ``Test`` polls ``--gap-ms`` apart until it completes, timed on rank 0.

For each size it prints the median, min and max, and the median in gaps: an operation
served at the first poll takes half a gap on average (an Iallreduce, whose completion is
seen only at a poll, a whole one), each further poll it needs one gap more::

    syncbench cluster up --nodes 2 --link 1gbit
    syncbench cluster mpiexec -n 2 -- python -m syncbench.bench.micro.polls \\
        --op accumulate --gap-ms 2

Figures: docs/RESULTS.md, "What a target's polls move" and "A nonblocking allreduce moves
64 KiB a poll".
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

import numpy as np

from syncbench.bench.micro.pair import flag_parser, known_flags, spin, start_pair

#: Operations timed per size, and how many of them are warm-up left out of the figures.
REPEATS, WARMUP = 12, 2
#: Tag of rank 0's end message.
DONE_TAG = 7
OPS = ("accumulate", "get-accumulate", "iallreduce")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("polls", __doc__)
    parser.add_argument("--op", choices=OPS, default="accumulate")
    parser.add_argument("--gap-ms", default="2",
                        help="milliseconds a rank spins between two polls (default 2)")
    parser.add_argument("--sizes", default="16384,65536,158720,470000",
                        help="comma-separated bytes of the operation (float32 elements x 4)")
    args = known_flags(parser, "polls", argv)
    try:
        args.gap_ms = float(args.gap_ms)
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        args.gap_ms, args.sizes = math.nan, []
    if not (args.gap_ms > 0 and math.isfinite(args.gap_ms) and args.sizes
            and all(s >= 4 for s in args.sizes)):
        raise ValueError("polls: give --gap-ms > 0 and --sizes as comma-separated "
                         "bytes, each >= 4")
    return args


def _one_sided(comm: Any, win: Any, op: str, data: np.ndarray, n: int, gap: float,
               rep: int) -> float:
    """Rank 0: one epoch of ``op`` on rank 1's window (seconds); rank 1: polls until told."""
    from mpi4py import MPI

    if comm.Get_rank() == 1:
        while True:
            spin(gap)
            if comm.Iprobe(0, DONE_TAG):
                comm.recv(source=0, tag=DONE_TAG)
                return 0.0
    time.sleep(0.0007 * (rep % 5))  # land at varied phases of the gaps
    start = time.perf_counter()
    win.Lock(1, MPI.LOCK_SHARED, MPI.MODE_NOCHECK)
    if op == "accumulate":
        win.Accumulate(data[:n], 1, op=MPI.SUM)
    else:
        win.Get_accumulate([None, 0, MPI.FLOAT], data[:n], 1, target=(0, n, MPI.FLOAT),
                           op=MPI.NO_OP)
    win.Unlock(1)
    seconds = time.perf_counter() - start
    comm.send(None, dest=1, tag=DONE_TAG)
    return seconds


def _iallreduce(comm: Any, data: np.ndarray, out: np.ndarray, n: int, gap: float) -> float:
    """Both ranks: post an Iallreduce of ``n`` floats, poll every ``gap`` until done."""
    start = time.perf_counter()
    request = comm.Iallreduce(data[:n], out[:n])
    while True:
        spin(gap)
        if request.Test():
            return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    started = start_pair("polls", parse, argv)
    if isinstance(started, int):
        return started
    args, comm = started
    from mpi4py import MPI
    rank, gap = comm.Get_rank(), args.gap_ms * 1e-3
    count = max(args.sizes) // 4
    window = np.zeros(count, dtype=np.float32)
    win = MPI.Win.Create(window, comm=comm)
    data, out = np.ones(count, dtype=np.float32), np.zeros(count, dtype=np.float32)
    try:
        for size in args.sizes:
            n = size // 4
            seen: list[float] = []
            for rep in range(REPEATS):
                comm.Barrier()
                if args.op == "iallreduce":
                    seen.append(_iallreduce(comm, data, out, n, gap))
                else:
                    seen.append(_one_sided(comm, win, args.op, data, n, gap, rep))
            if rank == 0:
                ms = [1e3 * t for t in seen[WARMUP:]]
                mid = statistics.median(ms)
                print(f"{args.op} {size:>9} B, polls {args.gap_ms:g} ms apart: "
                      f"{mid:.2f} ms (min {min(ms):.2f}, max {max(ms):.2f}), "
                      f"{mid / args.gap_ms:.1f} gaps", flush=True)
    finally:
        win.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
