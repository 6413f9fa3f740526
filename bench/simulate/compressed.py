"""SSGD with a compressing reducer (``--compress NAME[:ARG]``): its collectives, simulated.

The reducers of ``algorithms/reducers`` (:mod:`~syncbench.algorithms.reducers.compress`)
replace the Allreduce of the gradient (or, under ``--comm overlap``, each bucket's
Iallreduce) by a short chain of nonblocking collectives per bucket, each waited for
before the next is posted:

===================  ===============================================  ==================
codec                collectives of one bucket, in order              reducer
===================  ===============================================  ==================
fp16, bf16           ``Ialltoallv`` of 16-bit segments, then          ``HalfPrecisionReduce``
                     ``Iallgatherv`` of the 16-bit means
int8[:CHUNK]         the same, of MinMaxUInt8 codes (8 bytes a chunk)  ``ByteGradReduce``
powersgd:R           ``Iallreduce`` of P with the uncompressed         ``PowerSGDReduce``
                     tensors, then ``Iallreduce`` of Q (the first
                     ``--powersgd-start`` steps: one of the gradient)
topk:D               ``Iallgather`` of k indices + k values            ``TopKReduce``
randomk:D            ``Iallreduce`` of k values                        ``RandomKReduce``
===================  ===============================================  ==================

Every byte count is the reducer's own: :func:`reducer_for` makes the reducer class of the
spec with only what its byte-count methods read (the plan, the codec, the world size, the
tensor shapes), and its ``run_wire_bytes()`` (the run file's ``wire_bytes_per_step`` in
``train``) and per-segment counts size the flows; nothing is recomputed here.

MPICH's nonblocking algorithms, from its selection tree (``coll_selection.json``,
MPICH 4-5, as :mod:`.collectives` reads the allreduce's): ``Ialltoallv`` without
``MPI_IN_PLACE`` is ``MPIR_Ialltoallv_intra_sched_blocked``, which posts the exchanges
with :data:`ALLTOALL_THROTTLE` peers at a time (``MPIR_CVAR_ALLTOALL_THROTTLE``) and waits
for them before the next block (one stage each). ``Iallgather(v)`` is recursive doubling
on a power of two below 512 KiB in all, Bruck's below 80 KiB otherwise, else the ring.
The Iallreduces are :func:`.progress.allreduce_stages`' (MPI_Iallreduce's own choice).
Segments differ by at most one element, so each step carries the largest; a block of
the all-to-all above :data:`~.collectives.ALLTOALL_EXACT_MAX` ranks is timed as the mean
of the log-spaced shifts the ASGD pattern samples (:func:`alltoall_block_phases`).

Time composition: ``--comm blocking`` waits for each collective at once, so a step is
compute, the straggler's delay, the codec's work, then every stage back to back once the
last rank posts. ``--comm overlap`` (not PowerSGD, which SSGD refuses there) posts each
bucket's chain from the backward hook that finishes it, exactly as the plain bucketed
SSGD (:func:`.strategies.hook_plan`); a bucket's second collective is posted by a poll
after its first completed, which is how :mod:`.progress` issues any next stage.

Encode and decode (the reducers' ``codec`` phase) are the ``--workload`` run file's own
mean ``t_codec`` per step when it was itself run with the same ``--compress`` (a file
written before that column holds them in its ``update`` rows, replayed as they are);
otherwise ``--codec-seconds S`` per step and rank (default 0: left out; ``auto``: one
encode and decode timed on this host, which ``--validate`` uses). They are spent before
the first post under ``--comm blocking`` and after the ``Waitall`` under overlap,
recorded as the predicted ``t_codec``, and slowed by a node's CPU quota
(:func:`.quota.quota_codec`). The run file's ``simulation`` attribute says where they
came from (``codec_cost``).

With ``--calibrate-after-step FILE.json`` (:mod:`.after_step`) a blocking chain's
collectives take the times measured for their operation and size after a training step
in place of their stages back to back, plus the codec workload's own ``comm`` and
``wait`` per step (the harness around the calls); a collective the calibration does not
cover, ``--comm overlap`` and PowerSGD's plain steps before ``--powersgd-start`` keep
their stages (``after_step`` in the run file's ``simulation`` attribute says which).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from syncbench.algorithms.codecs.powersgd import ITEMSIZE, PowerSGD
from syncbench.algorithms.codecs.registry import parse_codec
from syncbench.algorithms.reducers.bytegrad import ByteGradReduce
from syncbench.algorithms.reducers.compress import NONE, REDUCERS
from syncbench.algorithms.reducers.compressed import CompressedReducer, segment_bounds
from syncbench.algorithms.reducers.halfprec import HalfPrecisionReduce
from syncbench.algorithms.reducers.powersgd import PowerSGDReduce
from syncbench.algorithms.reducers.sparse import RandomKReduce, TopKReduce
from syncbench.bench.simulate.after_step import load_after_step
from syncbench.bench.simulate.collectives import (
    ALLTOALL_EXACT_MAX,
    Phase,
    PhaseClock,
    _log_shifts,
    _pof2,
)
from syncbench.bench.simulate.progress import allreduce_stages
from syncbench.bench.simulate.quota import quota_codec
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline
from syncbench.bench.simulate.workload import Workload

#: ``MPIR_CVAR_ALLTOALL_THROTTLE``'s default: peers of one block of the blocked Ialltoallv.
ALLTOALL_THROTTLE = 32
#: ``collective=iallgather(v)``: recursive doubling below this total on a power of two,
IALLGATHER_RD_BYTES = 524288
#: and Bruck's below this one on other sizes (else the ring).
IALLGATHER_BRUCK_BYTES = 81920


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--codec-seconds``: the codec's work where no measured row holds it."""
    group = parser.add_argument_group("ssgd --compress (simulated)")
    group.add_argument("--codec-seconds", default="0", metavar="S|auto",
                       help="encode + decode seconds per step and rank of --compress (the "
                       "codec phase) unless the --workload run file was run with the same "
                       "--compress; auto: timed on this host on the workload's gradient "
                       "(the fastest of 5 encodes and decodes; --validate's default); "
                       "default 0: left out")
    group.add_argument("--calibrate-after-step", default=None, metavar="FILE.json",
                       help="a blocking chain's collectives at the times measured after a "
                       "training step (the after_idle micro-benchmark's --model NAME --out "
                       "FILE.json; docs/USAGE.md), where it covers their operation and size")


# -- the reducer's own byte counts ---------------------------------------------------

def reducer_for(spec: str, n: int, count: int, plan: Sequence[tuple[int, int]] | None,
                shapes: Sequence[Sequence[int]] | None = None,
                powersgd_start: int = 0) -> CompressedReducer:
    """The reducer class of ``spec`` holding only what its byte counts read.

    ``compressed_reducer`` needs a model and a communicator; the byte counts
    (``wire_bytes``, ``bucket_wire_bytes``, ``ByteGradReduce._segments``) read the plan,
    the codec, the world size, the element count and PowerSGD's tensor shapes, which
    are set here without allocating the gradient. PowerSGD compresses from
    ``powersgd_start`` on, as ``compressed_reducer`` builds it.
    """
    codec = parse_codec(spec)
    if isinstance(codec, PowerSGD):
        codec = PowerSGD(rank=codec.rank, start_iter=powersgd_start)
    cls = REDUCERS[codec.name]
    reducer = cls.__new__(cls)
    reducer.codec, reducer.count = codec, int(count)
    reducer.plan = [(int(a), int(b)) for a, b in plan] if plan is not None else [(0, int(count))]
    reducer.core = SimpleNamespace(comm=SimpleNamespace(size=int(n)))
    reducer.shapes = [tuple(int(d) for d in s) for s in shapes] if shapes is not None else []
    return reducer


def workload_shapes(w: Workload) -> tuple[list[tuple[int, ...]], str]:
    """(tensor shapes in flat-buffer order, where from): the model's, or assumed.

    A workload with a built model carries its shapes (``Workload.tensor_shapes``); a
    paper profile has none, so PowerSGD sees ``PROFILE_LAYERS``-like square weight
    matrices, one per layer of :meth:`Workload.offsets`, the remainder of each layer a
    vector (uncompressed), an assumption the run file names.
    """
    if w.tensor_shapes:
        return [tuple(s) for s in w.tensor_shapes], "the model's tensors"
    out: list[tuple[int, ...]] = []
    bounds = [*w.offsets(), w.params]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        size = hi - lo
        side = int(np.sqrt(size))
        if side > 1:
            out.append((side, side))
        if size - side * side > 0:
            out.append((size - side * side,))
    return out, "assumed: one square matrix per layer, the rest a vector"


# -- each collective's stages --------------------------------------------------------

class _BlockPhase(Phase):
    """One block of the blocked all-to-all on few ranks: rank i sends to i + s for every
    shift s in ``[arg, arg + ALLTOALL_THROTTLE)`` (s mod n != 0), all at once."""

    def pairs(self) -> list[tuple[int, int]]:
        shifts = [s for s in range(self.arg, min(self.arg + ALLTOALL_THROTTLE, self.n))
                  if s % self.n]
        return [(i, (i + s) % self.n) for i in range(self.n) for s in shifts]

    def key(self) -> tuple:
        return ("alltoall-block", self.arg, self.n)


def alltoall_block_phases(n: int, first: int, seg_bytes: float
                          ) -> list[tuple[Phase, float]]:
    """The block of ``MPIR_Ialltoallv_intra_sched_blocked`` whose peers are at shifts
    ``first .. first + 31`` as weighted phases: exactly up to ``ALLTOALL_EXACT_MAX``
    ranks; above, each rank's bytes of the block to one peer at each of the log-spaced
    shifts, averaged (what the ASGD pattern samples an all-to-all by)."""
    peers = len([s for s in range(first, min(first + ALLTOALL_THROTTLE, n)) if s % n])
    if peers == 0:
        return []
    if n <= ALLTOALL_EXACT_MAX:
        return [(_BlockPhase("alltoall-block", first, n, seg_bytes), 1.0)]
    shifts = _log_shifts(n)
    return [(Phase("shift", s, n, peers * seg_bytes), 1.0 / len(shifts)) for s in shifts]


def alltoallv_stages(n: int, seg_bytes: Sequence[int], time_phase: PhaseClock) -> np.ndarray:
    """Seconds of each block of the blocked Ialltoallv (every rank sends segment i to
    rank i; the largest segment timed)."""
    largest = float(max(seg_bytes))
    out = []
    for first in range(0, n, ALLTOALL_THROTTLE):
        phases = alltoall_block_phases(n, first, largest)
        if phases:
            out.append(sum(w * time_phase(p) for p, w in phases))
    return np.asarray(out, dtype=float)


def allgather_phases(n: int, seg_bytes: Sequence[int]) -> list[Phase]:
    """MPICH's Iallgather(v) of rank i's ``seg_bytes[i]``: recursive doubling, Bruck's or
    the ring, as ``collective=iallgatherv`` picks by total size and N."""
    if n <= 1:
        return []
    total, seg = float(sum(seg_bytes)), float(max(seg_bytes))
    pof2 = n == _pof2(n)
    if pof2 and total < IALLGATHER_RD_BYTES:
        steps = n.bit_length() - 1
        return [Phase("xor", 1 << k, n, (1 << k) * seg) for k in range(steps)]
    if not pof2 and total < IALLGATHER_BRUCK_BYTES:
        out, k = [], 1
        while k < n:  # step k: min(k, n - k) blocks to rank - k
            out.append(Phase("shift", n - k, n, min(k, n - k) * seg))
            k *= 2
        return out
    return [Phase("shift", 1, n, seg, repeat=n - 1)]


def allgather_stages(n: int, seg_bytes: Sequence[int], time_phase: PhaseClock) -> np.ndarray:
    phases = allgather_phases(n, seg_bytes)
    return np.repeat([time_phase(p) for p in phases], [p.repeat for p in phases]).astype(float)


def collectives(reducer: CompressedReducer, index: int, n: int, compressing: bool = True
                ) -> list[tuple[str, Any]]:
    """Bucket ``index``'s collectives in order: ``("alltoallv"|"allgatherv", segment
    bytes)``, ``("allgather", [bytes] * n)`` or ``("allreduce", bytes)``, sized by the
    reducer's own counts. ``compressing`` False: PowerSGD's plain step."""
    start, end = reducer.plan[index]
    if isinstance(reducer, HalfPrecisionReduce):
        b = segment_bounds(end - start, n)
        seg = [reducer.codec.wire_bytes(b[i + 1] - b[i]) for i in range(n)]
        return [("alltoallv", seg), ("allgatherv", seg)]
    if isinstance(reducer, ByteGradReduce):
        seg = reducer._segments(index)[1]
        return [("alltoallv", seg), ("allgatherv", seg)]
    if isinstance(reducer, TopKReduce):
        return [("allgather", [reducer.bucket_wire_bytes(index)] * n)]
    if isinstance(reducer, RandomKReduce):
        return [("allreduce", reducer.bucket_wire_bytes(index))]
    if isinstance(reducer, PowerSGDReduce):
        if not compressing:
            return [("allreduce", ITEMSIZE * reducer.count)]
        layout = reducer.codec.layout(reducer.shapes)
        return [("allreduce", ITEMSIZE * (layout.p_size + layout.uncompressed_size)),
                ("allreduce", ITEMSIZE * layout.q_size)]
    raise ValueError(f"--compress {reducer.codec.spec}: no simulated collectives")


def chain_stages(chain: list[tuple[str, Any]], n: int, algorithm: str,
                 time_phase: PhaseClock) -> np.ndarray:
    """Every stage of a bucket's collectives, one after another, at their back-to-back
    time. The links' token bucket (``--link-burst``) is left out, and with it a cost the
    model does not have. A short collective after compute passes under the bucket: 11 KB
    in 0.04 ms against 0.34 back to back at 200 Mbit/s (``python -m
    syncbench.bench.micro.after_idle``). But in training, each of the codecs' collectives
    took 0.08-0.14 ms from the later rank's post at 1 Gbit/s, and their comm and wait
    together 0.12-0.23 ms a step at either rate. With the bucket alone the validation left
    more configurations off, not fewer (docs/RESULTS.md, "A short collective after
    compute")."""
    parts = []
    for kind, size in chain:
        if kind == "alltoallv":
            parts.append(alltoallv_stages(n, size, time_phase))
        elif kind in ("allgatherv", "allgather"):
            parts.append(allgather_stages(n, size, time_phase))
        else:
            parts.append(allreduce_stages(float(size), n, algorithm, time_phase, ITEMSIZE))
    return np.concatenate(parts) if parts else np.zeros(0)


# -- the timeline --------------------------------------------------------------------

def codec_cost(cfg: argparse.Namespace, w: Workload, reducer: Any = None,
               n: int = 1) -> tuple[float, str]:
    """(seconds per step and rank to add for encode and decode, where they come from).

    A measured or timed cost is one of ``m`` ranks' (the codec workload's world size; 1
    for ``--codec-seconds auto``); top-k's decode adds every rank's k entries into the
    dense mean, one row per rank (``TopKReduce.reduction``), so ``n`` ranks pay
    ``n - m`` rows more (:func:`topk_row_seconds`). The other codecs' work per rank does
    not grow with N. A measured cost adds the codec run's time between phases beyond the
    workload's (:attr:`.workload.Workload.codec_between_s`): CPU work of the step, which a
    quota slows as it slows the codec."""
    measured = str(w.extra.get("compress", "") or "")
    if w.rows is not None and measured == cfg.compress:
        if w.mean_codec_s > 0:
            source = w.extra.get("codec_source", w.source)  # --validate's codec workload
            seconds, rows = _more_rows(reducer, w, n, int(w.extra.get("codec_world_size") or
                                                          w.extra.get("measured_world_size") or 1))
            between = (f", plus {1e3 * w.codec_between_s:.3f} ms of its time between "
                       "phases beyond the workload's" if w.codec_between_s > 0 else "")
            return w.mean_codec_s + w.codec_between_s + seconds, (
                f"measured: {1e3 * w.mean_codec_s:.3f} ms per step, the mean t_codec of "
                f"{source} (ran --compress {measured}){between}{rows}")
        return 0.0, (f"in the measured update rows ({w.source} ran --compress {measured} "
                     "and has no t_codec)")
    value = getattr(cfg, "codec_seconds", 0.0)
    if str(value).strip().lower() == "auto":
        shapes, _ = workload_shapes(w)
        seconds = _timed_codec(cfg.compress, w.params, tuple(map(tuple, shapes)))
        more, rows = _more_rows(reducer, w, n, 1)
        return seconds + more, (f"timed on this host: {1e3 * seconds:.3f} ms per encode and "
                                f"decode of the {w.params}-element gradient (--codec-seconds "
                                f"auto){rows}")
    try:
        seconds = float(value or 0.0)
    except (TypeError, ValueError):
        raise ValueError(f"--codec-seconds must be a number of seconds or auto, "
                         f"got {value!r}") from None
    if not seconds >= 0:
        raise ValueError(f"--codec-seconds must be >= 0, got {seconds}")
    return seconds, (f"--codec-seconds {seconds:g}" if seconds else "left out (--codec-seconds 0)")


def _more_rows(reducer: Any, w: Workload, n: int, m: int) -> tuple[float, str]:
    """Top-k's decode of ``n - m`` more ranks' rows than the cost was taken on (seconds,
    and the words for the cost's source); nothing for the other codecs."""
    if not isinstance(reducer, TopKReduce) or n <= m:
        return 0.0, ""
    k = sum(reducer.codec.k(end - start) for start, end in reducer.plan)
    row = topk_row_seconds(k, w.params)
    return (n - m) * row, (f", plus {n - m} more ranks' top-k rows at "
                           f"{1e6 * row:.1f} us each")


@functools.cache
def topk_row_seconds(k: int, count: int, repeats: int = 20) -> float:
    """Fastest seconds of adding one rank's ``k`` top-k entries into a ``count``-element
    dense sum, as ``TopKReduce.reduction`` does for each rank's row (NumPy's fancy-index
    add), timed on this host. mlp's top-k:0.01 (2,352 entries of 235,146), 2026-12-06 on
    the AMD EPYC VM: 13 us a row, so a 16,384-rank job would spend 0.2 s a step on it."""
    rng = np.random.default_rng(0)
    total = np.zeros(count, dtype=np.float32)
    idx = np.sort(rng.choice(count, size=min(k, count), replace=False)).astype(np.int32)
    values = rng.standard_normal(idx.size).astype(np.float32)
    total[idx] += values  # untimed: caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total[idx] += values
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def _timed_codec(spec: str, count: int, shapes: tuple[tuple[int, ...], ...]) -> float:
    """``--codec-seconds auto``'s timing, once per codec and gradient in a process: every
    run of a ``--validate`` table with that codec is charged the same figure."""
    from syncbench.bench.micro.codecs import codec_seconds

    return codec_seconds(spec, count, shapes)


def compressed_ssgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                    time_phase: PhaseClock) -> Timeline:
    """SSGD's timeline with ``--compress`` (module docstring)."""
    from syncbench.bench.simulate.strategies import _overlap_step, bucket_plan, hook_plan

    w, n = local.workload, local.n
    if cfg.compress == NONE:
        raise ValueError("compressed_ssgd needs --compress")
    overlap = cfg.comm == "overlap"
    plan = bucket_plan(w, cfg.bucket_mb) if overlap else None
    shapes, shapes_from = workload_shapes(w)
    start_iter = int(getattr(cfg, "powersgd_start", 0))
    reducer = reducer_for(cfg.compress, n, w.params, plan, shapes, start_iter)
    if overlap and not type(reducer).bucketed:
        raise ValueError(f"--compress {cfg.compress} reduces the whole gradient after "
                         "backward only: add --comm blocking")
    plain = isinstance(reducer, PowerSGDReduce)
    stages = [chain_stages(collectives(reducer, i, n), n, cfg.allreduce, time_phase)
              for i in range(len(reducer.plan))]
    plain_stages = (chain_stages(collectives(reducer, 0, n, False), n, cfg.allreduce,
                                 time_phase) if plain and start_iter > 0 else None)
    after = after_step_chains(cfg, reducer, n, w, overlap)
    if after is not None and after[0] is not None:
        stages = [np.array([seconds]) for seconds in after[0]]
    extra_s, cost_from = codec_cost(cfg, w, reducer, n)
    codec = quota_codec(extra_s, local.speeds, n)  # per rank: a quota slows the codec too
    split = w.compute_split()
    hooks = hook_plan(reducer.plan, split.offsets) if overlap else None
    rows, t = StepRows(n), np.zeros(n)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if overlap:
            arrive, end, poll_s = _overlap_step(cfg, split, hooks, stages, start + data, comp,
                                                delay, local.polled(comp, delay))
            wait, comm = np.maximum(end - arrive, 0.0), poll_s
            t = np.maximum(arrive, end) + upd + codec
        else:
            chain = plain_stages if plain_stages is not None and j < start_iter else stages[0]
            arrive = start + data + comp + delay + codec  # encoded before the first post
            end = float(arrive.max()) + float(chain.sum())
            comm, wait = end - arrive, np.zeros(n)
            t = end + upd
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_wait=wait, t_update=upd, t_codec=codec, t_delay=delay,
                 samples=w.batch_size)
    notes = {"buckets": len(reducer.plan), "compress": cfg.compress,
             "wire_bytes_per_step": int(reducer.run_wire_bytes(steps)), "codec_cost": cost_from}
    if plain:
        notes.update(powersgd_start=start_iter, tensor_shapes=shapes_from)
    if after is not None:
        notes["after_step"] = after[1]
    return Timeline(rows, float(t.max()), notes)


def after_step_chains(cfg: argparse.Namespace, reducer: CompressedReducer, n: int,
                      w: Workload, overlap: bool = False
                      ) -> tuple[list[float] | None, str] | None:
    """Each bucket's chain in seconds from ``--calibrate-after-step`` (plus the codec
    workload's harness cost per step, :attr:`.workload.Workload.mean_calls_s`, on the
    first bucket: blocking has one), and the words for the run file; None without the
    flag; ``(None, why)`` where it does not apply (under ``--comm overlap`` the chains
    are posted from the polls, not after a step; a collective it does not cover)."""
    path = getattr(cfg, "calibrate_after_step", None)
    if not path:
        return None
    calibration = load_after_step(str(path))
    if overlap:
        return None, "not applied: --comm overlap posts the chains during backward"
    chains = []
    for index in range(len(reducer.plan)):
        total = 0.0
        for kind, size in collectives(reducer, index, n):
            nbytes = max(size) if isinstance(size, (list, tuple)) else size
            seconds = calibration.seconds(kind, float(nbytes), n)
            if seconds is None:
                return None, (f"not applied: {calibration.source} does not cover {kind} of "
                              f"{int(nbytes)} B on {n} ranks")
            total += seconds
        chains.append(total)
    one_rank = w.extra.get("codec_source") and int(w.extra.get("codec_world_size") or 0) == 1
    harness = float(w.mean_calls_s) if one_rank else 0.0  # a 1-rank run moves nothing
    chains[0] += harness
    return chains, (f"{calibration.describe()}, plus {1e3 * harness:.3f} ms a step of the "
                    "codec workload's comm and wait")
