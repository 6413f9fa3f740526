"""``syncbench comm``: OSU-style micro-benchmarks of the MPI operations the strategies use.

Run it under mpiexec. Each operation is timed alone, for message sizes
doubling from --min-size to --max-size bytes: allreduce (SSGD --comm
blocking), iallreduce (SSGD overlap, OD-SGD) and bcast on every rank; and
rma-accumulate, rma-get and rma-get-accumulate (ASGD's parameter store in
Win.Allocate windows, MPI-4.1 chapter 12): every rank targets (rank + 1) % N
inside one passive-target Lock_all epoch, and one iteration is the operation
plus Win.Flush (OSU's default flush synchronization).

Timing follows the OSU micro-benchmarks (osu_allreduce): --iterations
iterations after --skip untimed ones, on MPI_Wtime. Blocking collectives and
RMA operations run back to back, one Wtime per iteration, as a training loop
calls them; --barrier times each iteration alone and ends it with an untimed
barrier as osu_allreduce does (adding the barrier's exit skew to every
sample); iallreduce always does. The columns are OSU's (``-f``): Avg, Min and
Max Latency(us) are the mean, smallest and largest over ranks of each rank's
mean latency; P50 and P99 are percentiles of every rank's latencies pooled.
AlgBW and BusBW are nccl-tests' (doc/PERFORMANCE.md), in MB/s (10^6 B/s):
AlgBW = size / Avg, BusBW = AlgBW x :func:`bus_factor` (2(N-1)/N for allreduce
and iallreduce, 1 for bcast and the point-to-point RMA operations). With
several ranks on each of M nodes, MPICH's node-aware allreduce moves 2(M-1)/M
of the buffer through each link: the link's rate is AlgBW x 2(M-1)/M there.

iallreduce also reports overlap as osu_iallreduce does: with t_comm the pure
Iallreduce + Wait time, each iteration posts the Iallreduce, runs a NumPy
busy loop calibrated to t_comm that calls Test between chunks, and waits;
overlap = max(0, 100 (1 - (t_overall - t_compute) / t_comm)) %, t_compute
without the Test calls. --buffer cupy puts the buffers on GPU local_rank %
count and hands the collectives to MPI as training does, through the
communicator of train's GPU backend, in place: staged through its pinned host
mirror (device -> pinned host copy,
the MPI call on the mirror, the copy back, all in the timed region; a staged
Iallreduce copies on a copy stream and is posted once the copy is done), or
the device buffer itself when the MPI is CUDA-aware (--cuda-aware, or neither switch
and the library says so). RMA operations stage through pinned buffers too,
copying to the host only what MPI reads and back only what it wrote.
--out writes every row and every raw latency to an HDF5 file (AlgBW also
as ``bw_mbps``, its name before, for older readers).
"""

from __future__ import annotations

import argparse

from syncbench.bench.flags import switch
from syncbench.bench.micro import comm as bench
from syncbench.bench.micro.comm import BUFFERS, OPS

HELP = "OSU-style communication micro-benchmarks (under mpiexec)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench comm``."""
    parser.add_argument("--op", choices=OPS, default="allreduce", help="operation to time")
    parser.add_argument("--min-size", type=int, default=4,
                        help="smallest message in bytes (default 4)")
    parser.add_argument("--max-size", type=int, default=1 << 20,
                        help="largest message in bytes (default 1048576)")
    parser.add_argument("--iterations", type=int, default=1000,
                        help="timed iterations per size (default 1000)")
    parser.add_argument("--skip", type=int, default=20,
                        help="warm-up iterations per size, not timed (default 20)")
    parser.add_argument("--buffer", choices=BUFFERS, default="numpy",
                        help="host (numpy) or GPU (cupy) buffers")
    switch(parser, "--cuda-aware", on="yes", off="no", auto="auto", default="auto",
           has_auto=True,
           help="cupy buffers: hand device pointers to MPI (--cuda-aware) or stage them "
           "through pinned host memory (--no-cuda-aware); auto, the default as in train, asks "
           "the MPI library (the PyPI MPI wheels are not CUDA-aware: staged)")
    parser.add_argument("--barrier", action="store_true",
                        help="blocking collectives: an untimed barrier after every iteration "
                        "(as osu_allreduce does; it adds the barrier's exit skew to each "
                        "sample); default: back to back, like a training loop")
    parser.add_argument("--out", default=None, help="also write the results to this HDF5 file")
    parser.add_argument("--check-raw", action="store_true",
                        help="allreduce only: also time a bare mpi4py Allreduce loop per size "
                        "and print it beside (harness overhead check)")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench comm``: the benchmark on ``MPI.COMM_WORLD``; 0 on success, 2 on a
    setup error."""
    from syncbench.bench.mpi.runtime import run_on_world  # lazy: imports mpi4py.MPI

    return run_on_world(lambda comm: bench.run(args, comm))
