"""How long a short nonblocking collective takes after the ranks computed, against back to back.

The compressing reducers' collectives are short (PowerSGD's P and Q, top-k's allgather:
3-19 KB on mlp) and come once a step, after backward and the encode: the links' token
bucket is full again and the bytes pass at once, so their time is what the MPI library,
the transport and the kernel add to a message. Both ranks meet at a barrier, spin for
``--gap-ms`` (no MPI call: the compute), post the collective (``Iallreduce`` of float32
or ``Iallgather`` of bytes, as ``algorithms/reducers`` post them) and wait for it; the
later rank's time (the one that waits least for the other) is the collective's. The
same without the spin is the back-to-back figure a ``syncbench comm`` sweep measures.
It prints, per size, the median and the 10th and 90th percentiles of both::

    syncbench cluster up --nodes 2 --link 200mbit
    syncbench cluster mpiexec -n 2 -- python -m syncbench.bench.micro.after_idle \\
        --op allreduce --sizes 3072,11264,18816

Figures: docs/RESULTS.md, "A short collective after compute".
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from syncbench.bench.micro.pair import flag_parser, known_flags, spin, start_pair

OPS = ("allreduce", "allgather")
#: The largest size a rank contributes (its buffers are allocated at once).
MAX_BYTES = 64 << 20


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("after_idle", __doc__)
    parser.add_argument("--op", default="allreduce", help=f"one of {', '.join(OPS)}")
    parser.add_argument("--sizes", default="3072,11264,18816,49152",
                        help="bytes each rank contributes, comma-separated")
    parser.add_argument("--gap-ms", default="1.0",
                        help="milliseconds spun before each post (> 0)")
    parser.add_argument("--repeats", default="200", help="collectives per size and mode")
    args = known_flags(parser, "after_idle", argv)
    if args.op not in OPS:
        raise ValueError(f"after_idle: --op {args.op}: give one of {', '.join(OPS)}")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        args.gap_ms, args.repeats = float(args.gap_ms), int(args.repeats)
    except ValueError:
        args.sizes, args.gap_ms = [], math.nan
    if not (args.sizes and 4 <= min(args.sizes) and max(args.sizes) <= MAX_BYTES
            and 0 < args.gap_ms <= 1e4 and 10 <= args.repeats <= 100_000):
        raise ValueError("after_idle: give --sizes of 4 bytes to 64 MiB, --gap-ms in "
                         "(0, 10000] and --repeats of 10 to 100000")
    if args.op == "allreduce" and any(size % 4 for size in args.sizes):
        raise ValueError("after_idle: an allreduce sums float32: give --sizes in multiples "
                         "of 4 bytes")
    return args


def buffers(op: str, nbytes: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(send, receive) of one rank's ``nbytes``: float32 to sum, or bytes to gather from
    ``size`` ranks."""
    if op == "allreduce":
        send = np.ones(nbytes // 4, dtype=np.float32)
        return send, np.empty_like(send)
    return np.ones(nbytes, dtype=np.uint8), np.empty(nbytes * size, dtype=np.uint8)


def timed(comm, op: str, send: np.ndarray, recv: np.ndarray, gap_s: float,
          repeats: int) -> list[float]:
    """This rank's seconds in each of ``repeats`` collectives of ``send``."""
    out = []
    for _ in range(repeats):
        comm.Barrier()
        spin(gap_s)
        start = time.perf_counter()
        if op == "allreduce":
            request = comm.Iallreduce(send, recv)
        else:
            request = comm.Iallgather(send, recv)
        request.Wait()
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> int:
    started = start_pair("after_idle", parse, argv)
    if isinstance(started, int):
        return started
    args, comm = started
    rank = comm.Get_rank()
    if rank == 0:
        print(f"# {args.op}, 2 ranks, {args.repeats} collectives per size and mode; ms of "
              f"the later rank: median (p10-p90)", flush=True)
    for nbytes in args.sizes:
        row = []
        send, recv = buffers(args.op, nbytes, comm.Get_size())
        for gap_s in (0.0, args.gap_ms / 1e3):
            timed(comm, args.op, send, recv, gap_s, 5)  # warm-up: connections, buffers
            mine = np.asarray(timed(comm, args.op, send, recv, gap_s, args.repeats))
            both = comm.gather(mine, root=0)
            if rank == 0:
                later = 1e3 * np.minimum(both[0], both[1])
                p10, p50, p90 = np.percentile(later, [10, 50, 90])
                label = "back to back" if gap_s == 0 else f"after {args.gap_ms:g} ms"
                row.append(f"{label} {p50:.3f} ({p10:.3f}-{p90:.3f})")
        if rank == 0:
            print(f"{nbytes:>9} B  " + ";  ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
