"""How long a small one-sided round trip waits behind bulk bytes going the other way.

ASGD's workers other than rank 0 make four round trips a step to rank 0's counter
(``Fetch_and_op``, ``algorithms/windows.py``), over the same connections that carry the
pushes and the pulls' replies. Rank 0 pushes ``--bytes`` ``Accumulate`` epochs to rank 1
back to back for ``--seconds`` (or, as the baseline, only polls), while rank 1 times a
``Fetch_and_op`` epoch on rank 0's counter, then polls for a random 1-3 ms (rank 0's
pushes progress; the trips land at random phases of the pushes, not locked to them).
Both ranks stay in MPI, so no wait here is a poll's: what the round trip gains under the
pushes is the reply's time behind them. It prints the pushes' rate and the round trip's
median, 10th and 90th percentiles, both ways::

    syncbench cluster up --nodes 2 --link 1gbit
    syncbench cluster mpiexec -n 2 -- python -m syncbench.bench.micro.rma_behind \\
        --bytes 470000

Figures: docs/RESULTS.md, "ASGD's owners followed poll by poll".
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

from syncbench.bench.micro.pair import flag_parser, known_flags, start_pair

#: Seconds rank 1 polls between two round trips: uniform in this range.
BETWEEN_S = (0.001, 0.003)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("rma_behind", __doc__)
    parser.add_argument("--bytes", default="470000",
                        help="bytes of each of rank 0's Accumulates (default 470000)")
    parser.add_argument("--seconds", default="4",
                        help="seconds of each half, without and with the pushes (default 4)")
    args = known_flags(parser, "rma_behind", argv)
    try:
        args.bytes, args.seconds = int(args.bytes), float(args.seconds)
    except ValueError:
        args.bytes, args.seconds = 0, math.nan
    if not (args.bytes >= 4 and 0 < args.seconds < math.inf):
        raise ValueError("rma_behind: give --bytes >= 4 and --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    started = start_pair("rma_behind", parse, argv)
    if isinstance(started, int):
        return started
    args, comm = started
    from mpi4py import MPI
    rank, count = comm.Get_rank(), args.bytes // 4
    window = np.zeros(count, dtype=np.float32)
    counter = np.zeros(1, dtype=np.int64)
    win, cwin = MPI.Win.Create(window, comm=comm), MPI.Win.Create(counter, comm=comm)
    data, one, got = np.ones(count, dtype=np.float32), np.ones(1, np.int64), np.zeros(1, np.int64)
    rng = np.random.default_rng(rank)
    try:
        for pushing in (False, True):
            comm.Barrier()
            end = time.perf_counter() + args.seconds
            trips: list[float] = []
            pushes = 0
            while time.perf_counter() < end:
                if rank == 0 and pushing:
                    win.Lock(1, MPI.LOCK_SHARED, MPI.MODE_NOCHECK)
                    win.Accumulate(data, 1, op=MPI.SUM)
                    win.Unlock(1)
                    pushes += 1
                elif rank == 0:
                    comm.Iprobe(1, 0)
                else:
                    start = time.perf_counter()
                    cwin.Lock(0, MPI.LOCK_SHARED, MPI.MODE_NOCHECK)
                    cwin.Fetch_and_op(one, got, 0, 0, MPI.SUM)
                    cwin.Unlock(0)
                    after = time.perf_counter()
                    trips.append(after - start)
                    pause = rng.uniform(*BETWEEN_S)
                    while time.perf_counter() - after < pause:
                        comm.Iprobe(0, 0)
            comm.Barrier()
            both = comm.gather((trips, pushes), root=0)
            if rank == 0:
                ms = sorted(1e3 * t for t in both[1][0])
                tenth, ninetieth = ms[len(ms) // 10], ms[(9 * len(ms)) // 10]
                rate = both[0][1] * args.bytes / args.seconds / 1e6
                print(f"{'pushing' if pushing else 'idle':>7} {args.bytes} B Accumulates "
                      f"({rate:.1f} MB/s): Fetch_and_op round trip {statistics.median(ms):.3f} "
                      f"ms (p10 {tenth:.3f}, p90 {ninetieth:.3f}), {len(ms)} trips", flush=True)
    finally:
        win.Free()
        cwin.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
