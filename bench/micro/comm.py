"""The OSU-style micro-benchmarks behind ``syncbench comm`` (its command line and what it
measures: :mod:`syncbench.bench.commands.comm`): buffers, the timed loops of each
operation, their statistics and the results file (:func:`write_results`,
:func:`read_results`, which the simulator's calibration reads).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from typing import Any

import numpy as np

from syncbench.algorithms import device_buffers
from syncbench.algorithms.device_buffers import DeviceCommunicator, detect_cuda_aware
from syncbench.algorithms.timing import NullTimer
from syncbench.bench.files import write_atomic
from syncbench.bench.micro.link_cpu import LinkCpu
from syncbench.bench.micro.output import check_writable_parent
from syncbench.kernels.backend import Backend, BackendError, select_backend

OPS = ("allreduce", "iallreduce", "bcast", "rma-accumulate", "rma-get", "rma-get-accumulate")
RMA_OPS = ("rma-accumulate", "rma-get", "rma-get-accumulate")
BUFFERS = ("numpy", "cupy")
SCHEMA = "syncbench-comm/1"

#: Element type of every op: float32 for reductions, bytes for pure data movement.
_FLOAT_OPS = ("allreduce", "iallreduce", "rma-accumulate", "rma-get-accumulate")

#: Column names (HDF5 datasets) and their printed headers (OSU's names), in order.
COLUMNS = {"size": "Size", "avg_us": "Avg Latency(us)", "min_us": "Min Latency(us)",
           "max_us": "Max Latency(us)", "iterations": "Iterations",
           "p50_us": "P50 Latency(us)", "p99_us": "P99 Latency(us)",
           "algbw_mbps": "AlgBW(MB/s)", "busbw_mbps": "BusBW(MB/s)"}
OVERLAP_COLUMNS = {"overall_us": "Overall(us)", "compute_us": "Compute(us)",
                   "overlap_pct": "Overlap(%)"}
RAW_COLUMNS = {"raw_us": "Raw Latency(us)", "ratio": "Ratio"}
#: Integer columns (printed without decimals).
INTEGER_COLUMNS = ("size", "iterations")
#: Dataset names kept for readers of files written before: old name -> column.
OLD_NAMES = {"bw_mbps": "algbw_mbps"}
#: OSU's widths: the size in 10 characters (``# Size`` above it), each field in 18.
SIZE_WIDTH, FIELD_WIDTH = 10, 18

#: The header's words for :attr:`Buffers.staging`.
STAGING_WORDS = {"": "", "pinned": " (staged through pinned host memory, as training)",
                 "direct": " (device pointers to MPI: CUDA-aware)"}

_open_windows = 0


def message_sizes(min_size: int, max_size: int) -> list[int]:
    """Sizes in bytes doubling from ``min_size`` while <= ``max_size``."""
    if min_size < 1 or max_size < min_size:
        raise ValueError(f"need 1 <= --min-size <= --max-size, got {min_size} and {max_size}")
    sizes = []
    size = min_size
    while size <= max_size:
        sizes.append(size)
        size *= 2
    return sizes


def element_type(op: str) -> np.dtype:
    """float32 for reductions, uint8 for bcast and get."""
    return np.dtype(np.float32 if op in _FLOAT_OPS else np.uint8)


# -- buffers -----------------------------------------------------------------

@dataclass
class Buffers:
    """Allocates the benchmark's arrays on the host or the GPU.

    ``backend`` is the GPU backend of device buffers (None: host buffers).
    Collectives on device buffers go through :meth:`communicator` (training's
    :class:`~syncbench.algorithms.device_buffers.DeviceCommunicator`): staged
    through its pinned mirrors when ``staged``, direct when not (CUDA-aware).
    For RMA, ``mpi(a, send)`` is what to hand to MPI for array ``a`` (a pinned
    host buffer filled from ``a`` when ``send``) and ``back(a, m)`` copies a
    received host buffer ``m`` back to the device; both are no-ops for host
    buffers and for CUDA-aware MPI.
    """

    xp: Any
    staged: bool
    backend: Backend | None = None
    _host: dict[int, np.ndarray] = field(default_factory=dict)
    _comms: dict[int, Any] = field(default_factory=dict)

    @property
    def on_device(self) -> bool:
        return self.backend is not None

    @property
    def staging(self) -> str:
        """How device buffers reach MPI: ``pinned`` (staged), ``direct``; "" for host ones."""
        return "" if not self.on_device else "pinned" if self.staged else "direct"

    def array(self, count: int, dtype: np.dtype, fill: float) -> Any:
        return self.xp.full(count, fill, dtype=dtype)

    def pair(self, op: str, nbytes: int) -> tuple[Any, Any]:
        """``op``'s source (ones) and destination (zeros) of ``nbytes``, ready on the device."""
        dtype = element_type(op)
        source = self.array(nbytes // dtype.itemsize, dtype, 1)
        destination = self.array(nbytes // dtype.itemsize, dtype, 0)
        self.sync()
        return source, destination

    def sync(self) -> None:
        if self.backend is not None:
            self.backend.synchronize()

    def communicator(self, comm: Any) -> Any:
        """Training's GPU communicator over ``comm`` (one per communicator), untimed:
        staged through pinned mirrors unless direct (CUDA-aware, nonblocking calls too)."""
        if id(comm) not in self._comms:
            direct = not self.staged
            self._comms[id(comm)] = DeviceCommunicator(comm, NullTimer(), self.backend,
                                                       cuda_aware=direct,
                                                       nonblocking_direct=direct)
        return self._comms[id(comm)]

    def mpi(self, a: Any, send: bool = True) -> Any:
        if not self.staged:
            return a
        host = self._host.get(id(a))
        if host is None:
            host = self._host[id(a)] = device_buffers.host_empty(self.backend, a.shape, a.dtype)
        if send:
            device_buffers.copy_to_host(self.backend, a, host)
        return host

    def back(self, a: Any, host: Any) -> None:
        if self.staged:
            device_buffers.copy_to_device(self.backend, host, a)


def make_buffers(kind: str, cuda_aware: bool, local_rank: int,
                 backend: Backend | None = None) -> Buffers:
    """NumPy buffers, or CuPy ones on device ``local_rank % count`` (else ``ValueError``);
    ``backend`` replaces the GPU one (tests: NumPy arrays through the device path)."""
    if kind == "numpy" and backend is None:
        return Buffers(np, staged=False)
    if backend is None:
        try:
            backend = select_backend("gpu", local_rank)
        except BackendError:
            raise ValueError("--buffer cupy needs CuPy and a CUDA GPU, and this rank has none "
                             "(pip install 'syncbench[gpu]' on a GPU machine, or use "
                             "--buffer numpy)") from None
    return Buffers(backend.xp, staged=not cuda_aware, backend=backend)


# -- timing ------------------------------------------------------------------

def time_loop(comm: Any, iterations: int, skip: int, body: Callable[[], None],
              barrier: bool = True) -> np.ndarray:
    """Per-iteration seconds of ``body`` after ``skip`` warm-ups.

    With ``barrier`` each iteration is timed alone and followed by an untimed
    barrier (osu_allreduce). Without it the iterations run back to back and
    iteration i lasts from the end of i-1 to its own end: one ``Wtime`` per
    iteration, so the harness costs about what a bare loop does.
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    wtime = MPI.Wtime
    total = skip + iterations
    comm.Barrier()
    if not barrier:
        for _ in range(skip):
            body()
        stamps = [0.0] * (iterations + 1)
        stamps[0] = wtime()
        for i in range(1, iterations + 1):
            body()
            stamps[i] = wtime()
        return np.diff(np.array(stamps))
    samples = np.empty(iterations)
    for i in range(total):
        t0 = wtime()
        body()
        elapsed = wtime() - t0
        if i >= skip:
            samples[i - skip] = elapsed
        comm.Barrier()
    return samples


def collective_body(op: str, comm: Any, bufs: Buffers, nbytes: int) -> Callable[[], None]:
    """One iteration of allreduce, iallreduce (post + wait) or bcast on ``nbytes``."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    send, recv = bufs.pair(op, nbytes)
    if not bufs.on_device:  # the bare MPI call: no Python frames in the timed region
        return {"allreduce": partial(comm.Allreduce, send, recv, MPI.SUM),
                "iallreduce": lambda: comm.Iallreduce(send, recv, op=MPI.SUM).Wait(),
                "bcast": partial(comm.Bcast, send, 0)}[op]
    # device buffers as training hands them over: in place, through its communicator
    # (zeros: a sum in place stays finite however many iterations run)
    device = bufs.communicator(comm)

    def iallreduce() -> None:
        device.Wait(device.Iallreduce(recv))

    return {"allreduce": partial(device.Allreduce, recv), "iallreduce": iallreduce,
            "bcast": partial(device.Bcast, recv, 0)}[op]


def open_windows() -> int:
    """Windows created by :func:`rma_window` and not yet freed in this process."""
    return _open_windows


@contextlib.contextmanager
def rma_window(comm: Any, nbytes: int, disp_unit: int) -> Iterator[Any]:
    """A ``Win.Allocate`` window of ``nbytes``, freed (collectively) however the block ends."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    global _open_windows
    win = MPI.Win.Allocate(nbytes, disp_unit, comm=comm)
    _open_windows += 1
    try:
        yield win
    finally:
        win.Free()
        _open_windows -= 1


def rma_samples(op: str, comm: Any, win: Any, bufs: Buffers, nbytes: int, iterations: int,
                skip: int) -> np.ndarray:
    """Per-iteration seconds of one RMA op + ``Flush`` to ``(rank + 1) % N``."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    origin, result = bufs.pair(op, nbytes)
    target = (comm.Get_rank() + 1) % comm.Get_size()

    def accumulate() -> None:
        win.Accumulate(bufs.mpi(origin), target, op=MPI.SUM)
        win.Flush(target)

    def get() -> None:
        host = bufs.mpi(result, send=False)  # MPI writes it: nothing to copy out first
        win.Get(host, target)
        win.Flush(target)
        bufs.back(result, host)

    def get_accumulate() -> None:
        host = bufs.mpi(result, send=False)
        win.Get_accumulate(bufs.mpi(origin), host, target, op=MPI.SUM)
        win.Flush(target)
        bufs.back(result, host)

    body = {"rma-accumulate": accumulate, "rma-get": get,
            "rma-get-accumulate": get_accumulate}[op]
    win.Lock_all()
    try:
        samples = time_loop(comm, iterations, skip, body, barrier=False)
    finally:
        win.Unlock_all()
    comm.Barrier()
    return samples


def busy_chunk(work: np.ndarray) -> None:
    """One unit of the NumPy compute loop (a few microseconds)."""
    np.multiply(work, 1.0000001, out=work)
    np.add(work, 1e-7, out=work)


def calibrate_chunks(target_s: float, work: np.ndarray) -> int:
    """Number of :func:`busy_chunk` calls that take about ``target_s`` seconds."""
    reps = 200
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            busy_chunk(work)
        best = min(best, (time.perf_counter() - t0) / reps)
    return max(1, round(target_s / best))


def overlap_samples(comm: Any, bufs: Buffers, nbytes: int, iterations: int, skip: int,
                    target_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-iteration (overall, compute) seconds of Iallreduce overlapped with a busy loop.

    ``compute`` excludes the time spent in ``Test`` (osu_iallreduce's
    ``tcomp - test_time``).
    """
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    send, recv = bufs.pair("iallreduce", nbytes)
    work = np.ones(256)
    chunks = calibrate_chunks(target_s, work)
    overall = np.empty(iterations)
    compute = np.empty(iterations)
    if bufs.on_device:  # as training: in place, through the GPU backend's communicator
        device = bufs.communicator(comm)
        post, test, wait = (lambda: device.Iallreduce(recv)), device.Test, device.Wait
    else:
        post = partial(comm.Iallreduce, send, recv, op=MPI.SUM)

        def test(req: Any) -> None:
            req.Test()

        def wait(req: Any) -> None:
            req.Wait()
    comm.Barrier()
    for i in range(skip + iterations):
        t0 = MPI.Wtime()
        req = post()
        tc = MPI.Wtime()
        in_test = 0.0
        for _ in range(chunks):
            busy_chunk(work)
            tt = MPI.Wtime()
            test(req)
            in_test += MPI.Wtime() - tt
        tc = MPI.Wtime() - tc - in_test
        wait(req)
        if i >= skip:
            overall[i - skip] = MPI.Wtime() - t0
            compute[i - skip] = tc
        comm.Barrier()
    return overall, compute


def raw_allreduce_us(comm: Any, nbytes: int, iterations: int, skip: int) -> float:
    """Mean microseconds of a bare ``Allreduce`` loop (no per-iteration timers or barriers)."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    send = np.ones(nbytes // 4, np.float32)
    recv = np.zeros_like(send)
    for _ in range(skip):
        comm.Allreduce(send, recv, op=MPI.SUM)
    comm.Barrier()
    t0 = MPI.Wtime()
    for _ in range(iterations):
        comm.Allreduce(send, recv, op=MPI.SUM)
    mine = (MPI.Wtime() - t0) / iterations
    return comm.allreduce(mine, op=MPI.SUM) / comm.Get_size() * 1e6


# -- statistics and output -----------------------------------------------------

def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw of ``op`` on ``n`` ranks (doc/PERFORMANCE.md): the share
    of the buffer each rank must send and receive, whatever the algorithm.

    - allreduce, iallreduce: 2(n-1)/n (a reduce-scatter and an allgather, each
      (n-1)/n); iallreduce's bandwidths are of its pure Iallreduce + Wait.
    - bcast: 1 (nccl-tests' broadcast).
    - rma-accumulate, rma-get, rma-get-accumulate: 1. Each rank has one target,
      (rank + 1) % n: point-to-point, as nccl-tests' sendrecv (get-accumulate's
      size is its origin buffer; the result that comes back is as large).
    """
    if op not in OPS:
        raise ValueError(f"no bus factor for op {op!r}")
    return 2.0 * (n - 1) / n if op in ("allreduce", "iallreduce") else 1.0


def latency_stats(samples: np.ndarray, nbytes: int, factor: float = 1.0) -> dict[str, float]:
    """OSU statistics of gathered latencies ``samples[rank, iteration]`` (seconds).

    AlgBW = size / Avg (MB/s); ``factor`` is :func:`bus_factor`: BusBW = AlgBW x factor.
    """
    per_rank = samples.mean(axis=1) * 1e6
    avg = float(per_rank.mean())
    pooled = samples.ravel() * 1e6
    algbw = nbytes / avg if avg > 0 else math.nan
    return {"size": nbytes, "avg_us": avg, "min_us": float(per_rank.min()),
            "max_us": float(per_rank.max()), "iterations": samples.shape[1],
            "p50_us": float(np.percentile(pooled, 50)),
            "p99_us": float(np.percentile(pooled, 99)),
            "algbw_mbps": algbw, "busbw_mbps": algbw * factor}


def overlap_stats(pure_us: float, overall: np.ndarray, compute: np.ndarray) -> dict[str, float]:
    """osu_iallreduce's overlap from rank-gathered (overall, compute) seconds."""
    overall_us = float(overall.mean() * 1e6)
    compute_us = float(compute.mean() * 1e6)
    overlap = 100.0 * (1.0 - (overall_us - compute_us) / pure_us) if pure_us > 0 else 0.0
    return {"compute_us": compute_us, "overall_us": overall_us,
            "overlap_pct": min(100.0, max(0.0, overlap))}


def columns_of(op: str, check_raw: bool) -> dict[str, str]:
    """The printed columns of ``op`` (iallreduce: its bandwidths are of the pure
    Iallreduce + Wait, then osu_iallreduce's overlap columns)."""
    cols = dict(COLUMNS)
    if op == "iallreduce":
        cols.update(OVERLAP_COLUMNS)
    if check_raw:
        cols.update(RAW_COLUMNS)
    return cols


def header(cols: dict[str, str]) -> str:
    """OSU's header, ``# Size       Avg Latency(us) ...``: the size in 10 characters,
    then 18 each."""
    names = list(cols.values())
    return f"{'# ' + names[0]:<{SIZE_WIDTH}}" + "".join(f"{h:>{FIELD_WIDTH}}"
                                                        for h in names[1:])


def format_row(row: dict[str, float], cols: dict[str, str]) -> str:
    """One fixed-column row as OSU prints it: integers (size, iterations) as such, the
    rest with two decimals."""
    cells = [f"{int(row['size']):<{SIZE_WIDTH}d}"]
    cells += [f"{int(row[k]):>{FIELD_WIDTH}d}" if k in INTEGER_COLUMNS
              else f"{row[k]:>{FIELD_WIDTH}.2f}" for k in cols if k != "size"]
    return "".join(cells)


def gather(comm: Any, local: np.ndarray) -> np.ndarray | None:
    """Every rank's 1-D array stacked on rank 0 (``None`` elsewhere)."""
    everything = np.empty((comm.Get_size(), local.size)) if comm.Get_rank() == 0 else None
    comm.Gather(np.ascontiguousarray(local, dtype=np.float64), everything, root=0)
    return everything


def write_results(path: str, attrs: dict[str, Any], rows: list[dict[str, float]],
                  samples: list[np.ndarray]) -> None:
    """Rows as 1-D datasets (and each :data:`OLD_NAMES` name of a column they have),
    raw latencies as ``/samples_us`` [size, rank, iteration]."""
    from syncbench.bench.train.checkpoint import hdf5_image  # lazy: h5py, not the flags

    def build(f: Any) -> None:
        for key, value in attrs.items():
            f.attrs[key] = value
        keys = list(rows[0]) if rows else []
        keys += [old for old, new in OLD_NAMES.items() if new in keys]
        for key in keys:
            column = OLD_NAMES.get(key, key)
            f.create_dataset(key, data=np.array([r[column] for r in rows]))
        if samples:
            f.create_dataset("samples_us", data=np.stack(samples) * 1e6, compression="gzip")

    write_atomic(path, hdf5_image(build))


def read_results(path: str) -> dict[str, Any]:
    """``{"attrs": {...}, "<column>": array, ..., "samples_us": array}`` of a results file;
    a file written before a column was renamed (:data:`OLD_NAMES`) gets it too."""
    import h5py  # lazy: only --out and readers of results need it, not the flags

    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        out["attrs"] = {k: (v.decode() if isinstance(v, bytes) else
                            v.item() if hasattr(v, "item") and np.ndim(v) == 0 else v)
                        for k, v in f.attrs.items()}
        for key in f:
            out[key] = f[key][()]
    for old, new in OLD_NAMES.items():
        if old in out and new not in out:
            out[new] = out[old]
    return out


# -- driver ------------------------------------------------------------------

def measure_size(args: argparse.Namespace, comm: Any, bufs: Buffers, nbytes: int,
                 win: Any) -> tuple[dict[str, float] | None, np.ndarray | None]:
    """One row (on rank 0) and the gathered latencies for one message size."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    if args.op in RMA_OPS:
        local = rma_samples(args.op, comm, win, bufs, nbytes, args.iterations, args.skip)
    else:
        local = time_loop(comm, args.iterations, args.skip,
                          collective_body(args.op, comm, bufs, nbytes),
                          barrier=args.barrier or args.op == "iallreduce")
    extra: dict[str, float] = {}
    if args.op == "iallreduce":
        pure_s = comm.allreduce(float(local.mean()), op=MPI.SUM) / comm.Get_size()
        overall, compute = overlap_samples(comm, bufs, nbytes, args.iterations, args.skip,
                                           pure_s)
        g_overall, g_compute = gather(comm, overall), gather(comm, compute)
        if comm.Get_rank() == 0:
            extra = overlap_stats(pure_s * 1e6, g_overall, g_compute)
    if args.check_raw:
        raw = raw_allreduce_us(comm, nbytes, args.iterations, args.skip)
        extra["raw_us"] = raw
    everything = gather(comm, local)
    if comm.Get_rank() != 0:
        return None, None
    row = {**latency_stats(everything, nbytes, bus_factor(args.op, comm.Get_size())), **extra}
    if args.check_raw:
        row["ratio"] = row["avg_us"] / row["raw_us"] if row["raw_us"] > 0 else math.nan
    return row, everything


def validate(args: argparse.Namespace, comm: Any) -> tuple[list[int], Buffers]:
    """Flags and buffers, identically on every rank; ``ValueError`` with one line."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    if args.iterations < 1 or args.skip < 0:
        raise ValueError("--iterations must be >= 1 and --skip >= 0")
    if args.check_raw and args.op != "allreduce":
        raise ValueError("--check-raw applies to --op allreduce only")
    sizes = message_sizes(args.min_size, args.max_size)
    itemsize = element_type(args.op).itemsize
    kept = [s for s in sizes if s % itemsize == 0]
    if not kept:
        raise ValueError(f"--op {args.op} moves {itemsize}-byte elements: no size from "
                         f"{args.min_size} to {args.max_size} is a multiple of {itemsize}")
    if args.out:
        check_writable_parent("--out", args.out)
    local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    aware = args.cuda_aware == "yes"
    if args.cuda_aware == "auto" and args.buffer == "cupy":
        aware = detect_cuda_aware("auto").enabled
    bufs = make_buffers(args.buffer, aware, local_rank)
    return kept, bufs


def node_count(comm: Any) -> tuple[int, bool]:
    """The nodes ``comm`` spans (its shared-memory groups, ``MPI_COMM_TYPE_SHARED``), and
    whether this rank is its group's first."""
    from mpi4py import MPI  # lazy: importing mpi4py.MPI starts MPI; flags parse first

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = local.Get_rank() == 0
        return int(comm.allreduce(1 if leader else 0, op=MPI.SUM)), leader
    finally:
        local.Free()


def run(args: argparse.Namespace, comm: Any) -> list[dict[str, float]]:
    """Measure every size; rank 0 prints rows as they come and returns them."""
    from syncbench.bench.mpi.runtime import (  # lazy: imports mpi4py.MPI
        agree_on_setup,
        library_version,
    )

    sizes, bufs = agree_on_setup(comm, lambda: validate(args, comm), "comm")
    rank = comm.Get_rank()
    nodes, leader = node_count(comm)
    cols = columns_of(args.op, args.check_raw)
    if rank == 0:
        print(f"# syncbench comm: {args.op}, {comm.Get_size()} ranks on {nodes} "
              f"node{'s' if nodes > 1 else ''}, {args.buffer} buffers"
              f"{STAGING_WORDS[bufs.staging]}, "
              f"{element_type(args.op).name}, {args.iterations} iterations (skip {args.skip})")
        print(f"# MPI: {library_version()}")
        print(header(cols), flush=True)
    rows: list[dict[str, float]] = []
    samples: list[np.ndarray] = []
    win_cm = (rma_window(comm, max(sizes), element_type(args.op).itemsize)
              if args.op in RMA_OPS else contextlib.nullcontext())
    link = LinkCpu()
    link.start()
    with win_cm as win:
        for nbytes in sizes:
            row, everything = measure_size(args, comm, bufs, nbytes, win)
            if rank == 0:
                rows.append(row)
                samples.append(everything)
                print(format_row(row, cols), flush=True)
    cpu = link.stop(comm, leader)  # the host's interrupt seconds per byte the nodes sent
    if rank == 0 and math.isfinite(cpu.get("link_cpu_s_per_byte", math.nan)):
        print(f"# link CPU: {cpu['interrupt_s']:.2f} s of interrupts for "
              f"{cpu['link_tx_bytes'] / 1e6:.1f} MB sent: "
              f"{cpu['link_cpu_s_per_byte'] * 1e9:.1f} ns per byte", flush=True)
    if rank == 0 and args.out:
        write_results(args.out, {**result_attrs(args, comm, bufs), "nodes": nodes, **cpu},
                      rows, samples)
        print(f"# results -> {args.out}", flush=True)
    return rows


def result_attrs(args: argparse.Namespace, comm: Any, bufs: Buffers) -> dict[str, Any]:
    """Root attributes of the results file."""
    from syncbench.bench.mpi.runtime import library_version  # lazy: imports mpi4py.MPI

    return {"schema": SCHEMA, "op": args.op, "world_size": comm.Get_size(),
            "buffer": args.buffer, "staged": bufs.staged, "staging": bufs.staging,
            "dtype": element_type(args.op).name, "iterations": args.iterations,
            "skip": args.skip, "mpi_library": library_version(),
            "mpi4py_version": metadata.version("mpi4py"), "hostname": socket.gethostname(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
