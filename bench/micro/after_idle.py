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

With ``--model NAME`` the compute before each post is one forward and backward of that
model (``--batch-size``; the step ``syncbench speed`` times) in place of the spin: after
a real step the same collectives take longer than after a spin (18.8 KB gathered at
200 Mbit/s: 0.065-0.077 ms against 0.024-0.031), the state a step leaves the process in.
``--out FILE.json`` writes the medians per operation and size, the calibration
``syncbench simulate --calibrate-after-step`` takes for the compressing reducers'
collectives (``jobs/validate_simulator.sh`` measures it per link and model); ``--op``
then takes both operations, ``--op allreduce,allgather``.

Figures: docs/RESULTS.md, "A short collective after compute" and "A short collective
after a training step, calibrated".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable

import numpy as np

from syncbench.bench.files import write_atomic
from syncbench.bench.micro.output import check_writable_parent
from syncbench.bench.micro.pair import flag_parser, known_flags, spin, start_pair

OPS = ("allreduce", "allgather")
#: The largest size a rank contributes (its buffers are allocated at once).
MAX_BYTES = 64 << 20


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("after_idle", __doc__)
    parser.add_argument("--op", default="allreduce",
                        help=f"one of {', '.join(OPS)}, or both comma-separated")
    parser.add_argument("--sizes", default="3072,11264,18816,49152",
                        help="bytes each rank contributes, comma-separated")
    parser.add_argument("--gap-ms", default="1.0",
                        help="milliseconds spun before each post (> 0)")
    parser.add_argument("--repeats", default="200", help="collectives per size and mode")
    parser.add_argument("--model", default=None,
                        help="compute one forward and backward of this model (mlp, lenet, "
                        "resnet8, ...) before each post in place of the spin")
    parser.add_argument("--batch-size", default="64", help="--model's batch (default 64)")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="write the medians per operation and size (the simulator's "
                        "--calibrate-after-step)")
    args = known_flags(parser, "after_idle", argv)
    args.ops = [op.strip() for op in str(args.op).split(",")]
    if not args.ops or any(op not in OPS for op in args.ops) or len(set(args.ops)) < len(
            args.ops):
        raise ValueError(f"after_idle: --op {args.op}: give {' or '.join(OPS)}, or both "
                         "comma-separated")
    if args.out is not None and not str(args.out).lower().endswith(".json"):
        raise ValueError(f"after_idle: --out {args.out}: name it *.json")
    if args.model is not None:
        from syncbench.kernels.zoo import model_name  # lazy: the models import kernels

        try:
            model_name(args.model)
        except ValueError as exc:
            raise ValueError(f"after_idle: --model: {exc}") from None
    try:
        args.batch_size = int(args.batch_size)
    except ValueError:
        args.batch_size = 0
    if not 1 <= args.batch_size <= 65536:
        raise ValueError("after_idle: give --batch-size of 1 to 65536")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        args.gap_ms, args.repeats = float(args.gap_ms), int(args.repeats)
    except ValueError:
        args.sizes, args.gap_ms = [], math.nan
    if not (args.sizes and 4 <= min(args.sizes) and max(args.sizes) <= MAX_BYTES
            and 0 < args.gap_ms <= 1e4 and 10 <= args.repeats <= 100_000):
        raise ValueError("after_idle: give --sizes of 4 bytes to 64 MiB, --gap-ms in "
                         "(0, 10000] and --repeats of 10 to 100000")
    if "allreduce" in args.ops and any(size % 4 for size in args.sizes):
        raise ValueError("after_idle: an allreduce sums float32: give --sizes in multiples "
                         "of 4 bytes")
    if args.out is not None:
        check_writable_parent("--out", args.out)
    return args


def buffers(op: str, nbytes: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(send, receive) of one rank's ``nbytes``: float32 to sum, or bytes to gather from
    ``size`` ranks."""
    if op == "allreduce":
        send = np.ones(nbytes // 4, dtype=np.float32)
        return send, np.empty_like(send)
    return np.ones(nbytes, dtype=np.uint8), np.empty(nbytes * size, dtype=np.uint8)


def compute_of(args: argparse.Namespace, rank: int) -> Callable[[float], None]:
    """What a rank does before each post, given the gap: spin it, or (``--model``) one
    forward and backward of the model, whatever the gap (0: back to back)."""
    if args.model is None:
        return spin
    from syncbench.bench.micro.speed import timed_model  # lazy: builds the model

    model, x, y = timed_model(args.model, args.batch_size, "float32", rank)
    model.loss_and_grad(x, y)  # untimed: allocator, caches

    def step(gap_s: float) -> None:
        if gap_s > 0:
            model.loss_and_grad(x, y)
    return step


def timed(comm, op: str, send: np.ndarray, recv: np.ndarray, gap_s: float,
          repeats: int, compute: Callable[[float], None] = spin) -> list[float]:
    """This rank's seconds in each of ``repeats`` collectives of ``send``, each after
    ``compute(gap_s)``."""
    out = []
    for _ in range(repeats):
        comm.Barrier()
        compute(gap_s)
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
    compute = compute_of(args, rank)
    after = (f"after a step of {args.model} (batch {args.batch_size})" if args.model
             else f"after {args.gap_ms:g} ms")
    table: dict[str, dict[str, list[float]]] = {}
    for op in args.ops:
        if rank == 0:
            print(f"# {op}, 2 ranks, {args.repeats} collectives per size and mode; ms of "
                  f"the later rank: median (p10-p90)", flush=True)
        medians = table[op] = {"back_to_back_s": [], "after_s": []}
        for nbytes in args.sizes:
            row = []
            send, recv = buffers(op, nbytes, comm.Get_size())
            for gap_s, key in ((0.0, "back_to_back_s"), (args.gap_ms / 1e3, "after_s")):
                timed(comm, op, send, recv, gap_s, 5, compute)  # warm-up: connections, buffers
                mine = np.asarray(timed(comm, op, send, recv, gap_s, args.repeats, compute))
                both = comm.gather(mine, root=0)
                if rank == 0:
                    later = 1e3 * np.minimum(both[0], both[1])
                    p10, p50, p90 = np.percentile(later, [10, 50, 90])
                    medians[key].append(float(p50) / 1e3)
                    label = "back to back" if gap_s == 0 else after
                    row.append(f"{label} {p50:.3f} ({p10:.3f}-{p90:.3f})")
            if rank == 0:
                print(f"{nbytes:>9} B  " + ";  ".join(row), flush=True)
    if rank == 0 and args.out is not None:
        result = {"world_size": comm.Get_size(), "model": args.model,
                  "batch_size": args.batch_size if args.model else None,
                  "gap_ms": None if args.model else args.gap_ms, "repeats": args.repeats,
                  "sizes": args.sizes, "ops": table}
        try:
            write_atomic(args.out, json.dumps(result, indent=1).encode())
        except OSError as exc:  # WriteError: one line naming the file
            print(f"after_idle: --out: {exc}", file=sys.stderr)
            return 1
        print(f"# medians -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
