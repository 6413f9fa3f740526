"""How long a block of compute takes on a node at a CPU quota, right after a wait in MPI.

A rank on a node at a quota (the emulated cluster's ``--node-speed``) alternates waits
inside MPI with blocks of compute. How long a block takes depends on how the kernel's
bandwidth control charges the quota: at the scheduler tick for a process that makes no
system call, so a block runs free for a first burst, is frozen, then runs in bursts
(:class:`syncbench.bench.simulate.quota.Throttle`). This measures it with MPI itself:
rank 0 (a node at full speed) sleeps a random 0.5-1.5 times ``--wait-ms``, then sends a
token; rank 1 (the node at the quota) receives it, computes a block of ``L`` ms of work
(96 x 96 float32 products, their count timed on rank 0, the fastest of five tries) and
answers. For each ``L`` of ``--blocks-ms`` it prints rank 1's wall per block (median,
10th and 90th percentile, mean) beside what the simulator's quota model gives for one
block after a wait, from the pattern the cluster measured on the node
(``$SYNCBENCH_NODE_THROTTLE``), and from the pattern without its first burst's spread;
then the share of its waits' wall rank 1 spent on the CPU (MPICH polls while it waits),
and how long its waits lasted past rank 0's send (a wait that spent the quota is frozen,
and sees the message only at its next burst)::

    syncbench cluster up --nodes 2 --link 200mbit --node-speed 1,0.5
    syncbench cluster mpiexec -n 2 -- python -m syncbench.bench.micro.quota_blocks

Figures and what they showed: docs/RESULTS.md, "A quota's first burst".
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

#: Side of the float32 matrices one unit of work multiplies.
SIDE = 96


def _units_per_ms(a: np.ndarray) -> float:
    """Products per millisecond on this process's CPU: the fastest of five timed tries."""
    for _ in range(200):
        a @ a
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(1000):
            a @ a
        best = min(best, time.perf_counter() - start)
    return 1000 / (best * 1e3)


def _throttle_text() -> str:
    return os.environ.get("SYNCBENCH_NODE_THROTTLE", "")


def _predicted_ms(throttle_text: str, block_ms: float, spread: bool) -> float:
    """The quota model's wall for one block after a long wait (NaN without a pattern)."""
    from syncbench.bench.simulate.quota import Throttle, parse_node_throttles

    try:
        parsed = parse_node_throttles(throttle_text, [0.5], 1)
    except ValueError:
        return float("nan")
    if not parsed or parsed[0] is None:
        return float("nan")
    throttle = parsed[0] if spread else Throttle(parsed[0].on_s, parsed[0].off_s)
    return 1e3 * throttle.busy_wall(np.array([block_ms / 1e3]), np.array([1.0]))


def _report(args: argparse.Namespace, pattern: str, rows: list[tuple[float, list[float]]],
            share: float, waited: float, late: list[float]) -> None:
    """Rank 1's table: each block length's walls beside the model's, then its waits'."""
    print(f"# rank 1's wall per block of work after a wait in MPI (mean wait "
          f"{args.wait_ms:g} ms), {args.repeats} blocks each; the node's pattern "
          f"{pattern or '(none)'}", flush=True)
    print(f"{'work ms':>8} {'median':>8} {'p10':>8} {'p90':>8} {'mean':>8}"
          f" {'model':>8} {'model, no spread':>17}")
    for block, walls in rows:
        p10, p90 = np.percentile(walls, [10, 90])
        print(f"{block:8.1f} {statistics.median(walls):8.2f} {p10:8.2f} {p90:8.2f} "
              f"{statistics.fmean(walls):8.2f} {_predicted_ms(pattern, block, True):8.2f}"
              f" {_predicted_ms(pattern, block, False):17.2f}", flush=True)
    print(f"# rank 1 was on the CPU for {share:.2f} of its {waited:.2f} s of "
          "waits in MPI (a wait that polls uses its quota)", flush=True)
    p10, p50, p90 = np.percentile(late, [10, 50, 90])
    print(f"# a wait lasted {p50:.2f} ms past rank 0's send at the median ({p10:.2f}-"
          f"{p90:.2f}, 10th-90th percentile; mean {statistics.fmean(late):.2f}): a rank "
          "frozen in its wait sees the message at its next burst", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks-ms", default="1,2,3,4,5,6,8,12,16",
                        help="block lengths in ms of work, comma-separated")
    parser.add_argument("--wait-ms", type=float, default=6.0,
                        help="mean wait in MPI before each block (ms)")
    parser.add_argument("--repeats", type=int, default=30, help="blocks per length")
    args = parser.parse_args(argv)
    usage = ("quota_blocks: run 2 ranks, rank 1 on the node at a quota, with --blocks-ms > 0, "
             "--wait-ms >= 0 and --repeats >= 1")
    try:
        blocks = [float(b) for b in args.blocks_ms.split(",")]
    except ValueError:
        blocks = [0.0]
    if (args.repeats < 1 or not (math.isfinite(args.wait_ms) and args.wait_ms >= 0)
            or not all(math.isfinite(b) and b > 0 for b in blocks)):
        print(usage, file=sys.stderr)  # before MPI starts: every rank says it, or none runs
        return 2
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size != 2:
        if comm.rank == 0:
            print(usage, file=sys.stderr)
        return 2
    a = np.random.default_rng(0).random((SIDE, SIDE), dtype=np.float32)
    per_ms = comm.bcast(_units_per_ms(a) if comm.rank == 0 else None)
    pattern = comm.bcast(_throttle_text() if comm.rank == 1 else None, root=1)
    token = np.zeros(1)
    rng = np.random.default_rng(1)
    rows = []
    waited = spun = 0.0  # rank 1's wall and CPU seconds inside its waits
    late: list[float] = []  # ms each of rank 1's waits lasted past rank 0's send
    for block in blocks:
        units, walls = int(round(block * per_ms)), []
        for _ in range(args.repeats):
            if comm.rank == 0:
                slept = time.perf_counter()
                time.sleep(args.wait_ms * 1e-3 * (0.5 + rng.random()))
                token[0] = time.perf_counter() - slept
                comm.Send(token, dest=1)
                comm.Recv(token, source=1)
            else:
                wall, cpu = time.perf_counter(), time.process_time()
                comm.Recv(token, source=0)
                waited += time.perf_counter() - wall
                spun += time.process_time() - cpu
                # past rank 0's send (it sleeps from its receipt of the last answer):
                # what a wait that spent its quota and was frozen adds
                late.append(1e3 * (time.perf_counter() - wall - token[0]))
                start = time.perf_counter()
                for _ in range(units):
                    a @ a
                walls.append(1e3 * (time.perf_counter() - start))
                comm.Send(token, dest=0)
        rows.append((block, walls))
    if comm.rank == 1:
        _report(args, pattern, rows, spun / waited, waited, late)
    return 0


if __name__ == "__main__":
    sys.exit(main())
