"""How long a small one-sided round trip waits behind bulk bytes on its connections.

ASGD's workers other than rank 0 make four round trips a step to rank 0's counter
(``Fetch_and_op``, ``algorithms/windows.py``), over the same connections that carry the
pushes and the pulls' replies. Rank 0 moves ``--bytes`` in passive-target epochs
(``MPI_MODE_NOCHECK``, as ASGD's windows) back to back for ``--seconds`` (or, as the
baseline, only polls), while rank 1 times a ``Fetch_and_op`` epoch on rank 0's counter,
then polls for a random 1-3 ms (rank 0's transfers progress; the trips land at random
phases of them, not locked to them). ``--behind`` says which way the bytes go:

- ``pushes`` (the default): rank 0 ``Accumulate``s into rank 1's window, ASGD's push: the
  bytes go the way of the trip's reply, 0 to 1;
- ``replies``: rank 0 reads rank 1's window with ``Get_accumulate(NO_OP)``, ASGD's pull:
  rank 1 serves the reply, and its bytes go the way of rank 1's own requests, 1 to 0.

Both ranks stay in MPI, so no wait here is a poll's: what the round trip gains is its
time behind the other bytes. It prints the transfers' rate and the round trip's median,
10th and 90th percentiles, both ways::

    syncbench cluster up --nodes 2 --link 1gbit
    syncbench cluster mpiexec -n 2 -- python -m syncbench.bench.micro.rma_behind \\
        --bytes 470000 --behind replies

Figures: docs/RESULTS.md, "ASGD's owners followed poll by poll" (pushes) and "ASGD's
counter behind its shards: per-rank events and a combined trial" (replies).
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
#: ``--behind``'s choices: what each line calls rank 0 while it moves bytes, and them.
BEHIND = {"pushes": ("pushing", "Accumulates"), "replies": ("pulling", "Get_accumulate replies")}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("rma_behind", __doc__)
    parser.add_argument("--bytes", default="470000",
                        help="bytes of each of rank 0's Accumulates (default 470000)")
    parser.add_argument("--seconds", default="4",
                        help="seconds of each half, without and with the transfers (default 4)")
    parser.add_argument("--behind", default="pushes",
                        help="rank 0's transfers: pushes (Accumulate into rank 1, the bytes "
                        "the way of the trip's reply) or replies (Get_accumulate of rank 1's "
                        "window, the bytes the way of rank 1's requests); default pushes")
    args = known_flags(parser, "rma_behind", argv)
    try:
        args.bytes, args.seconds = int(args.bytes), float(args.seconds)
    except ValueError:
        args.bytes, args.seconds = 0, math.nan
    if not (args.bytes >= 4 and 0 < args.seconds < math.inf):
        raise ValueError("rma_behind: give --bytes >= 4 and --seconds > 0")
    if args.behind not in BEHIND:
        raise ValueError(f"rma_behind: --behind {args.behind!r}: give pushes or replies")
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
    read = np.zeros(count, dtype=np.float32)
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
                    if args.behind == "pushes":
                        win.Accumulate(data, 1, op=MPI.SUM)
                    else:  # ASGD's pull: an atomic read, the origin buffer unused
                        win.Get_accumulate([None, 0, MPI.FLOAT], read, 1,
                                           target=(0, count, MPI.FLOAT), op=MPI.NO_OP)
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
                busy, moved = BEHIND[args.behind]
                print(f"{busy if pushing else 'idle':>7} {args.bytes} B {moved} "
                      f"({rate:.1f} MB/s): Fetch_and_op round trip {statistics.median(ms):.3f} "
                      f"ms (p10 {tenth:.3f}, p90 {ninetieth:.3f}), {len(ms)} trips", flush=True)
    finally:
        win.Free()
        cwin.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
