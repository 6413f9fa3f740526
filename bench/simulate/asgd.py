"""ASGD's simulated traffic and timeline: the code's RMA epochs, its counter, its accumulates.

What one step of a worker does is ``ASGD.step``'s (``algorithms/asgd.py``: the
pull, compute, the push, on ``algorithms/windows.py``'s ``ParamWindow.epoch`` and
``Counters.Fetch_and_op``), costed in three parts:

* **Rank 0's counter**: four epochs per step (``read(VERSION)``,
  ``read(STARTED)``, ``fetch_add(STARTED)``, ``version`` and ``claims`` += 1),
  five atomics (:data:`COUNTER_EPOCHS`, :data:`COUNTER_ATOMICS`). MPI makes
  accumulate-type calls on one location atomic with each other (MPI 4.1 section
  12.7.1, "Atomicity"), so rank 0 serves them one at a time: simulated exactly,
  as one FIFO queue of every request (:func:`counter_timeline`), which bounds the
  job at 1 / (5 x service) steps per second however many ranks it has
  (:func:`counter_bound`).
* **A pull and a push are one epoch per owner** (``len(shard_layout(...))``, the
  code's own function): with ``MPI_MODE_NOCHECK`` MPICH sends no lock or unlock
  message, so the round trips to different owners overlap and what adds up is
  the origin's work per owner, serial (:meth:`RmaCosts.per_owner`); an access
  takes ``max(E x per-owner + L, T_bw) + L`` (:func:`access_seconds`), the
  per-owner part in closed form (N x E messages flow by flow are out of reach at
  16,384 ranks), the bandwidth part T_bw SimGrid's (:func:`asgd_phases`).
* **The owners' accumulate rate**: a target reduces an Accumulate at
  ``--accumulate-rate`` bytes/s (``--calibrate-rma`` fits it to ``syncbench comm
  --op rma-accumulate``), which bounds the job at E R / P steps per second
  (:func:`accumulate_seconds`). ``--delay-compensation`` adds the push's second
  read of the weights.

* **Up to 64 workers the polls are followed request by request** (:class:`Polls`): a
  target in MPI serves at once, a busy one at its next poll or when it enters MPI, and an
  Accumulate takes one poll per 64 KiB after its first, so alike ranks lock into one
  phase as they do on the emulated cluster. Above 64 workers, the mean-field waits below.
  **So are the pairs' connections** (:meth:`_Followed.queue`, either layout of shards):
  over TCP each pair of ranks has one stream each way, so a shard's bytes, another
  rank's shard and a counter request or reply that cross it go one after the other, a
  small message behind the bytes queued before it, and the links' token bucket
  (``--link-burst``) passes a sender's first bytes after an idle spell at once, so they
  hold the stream less. Measured on 2 emulated nodes (mlp at 1 Gbit/s): a counter trip
  of rank 1 posted while rank 0 pushes ended when that push ended (docs/RESULTS.md,
  "ASGD's counter epochs recorded"); the mean-field share in place of the streams
  predicted ASGD there up to 17% slow, 6 of 18 configurations off by more than 15% (none
  with the streams; docs/RESULTS.md, "A pair's connection, one stream each way").
* **Targets serve at their polls** (``--rma-progress polls``; ``auto``, the default,
  where the platform is ``--calibrate``'d from measured links): over a
  transport without hardware one-sided operations (MPICH's CH4 over UCX's or
  libfabric's TCP), a Get, an Accumulate or a counter atomic is an active message
  that the target handles only inside an MPI call. A target inside its own
  accesses serves at once; while it loads data, computes or updates it serves at
  ``ProgressPoll``'s ``Iprobe`` in the model's hooks (:func:`poll_gaps`), so a
  request waits for the target's next poll: a mean-field expected residual of that
  owner's own gaps (:func:`target_wait`), the largest of the owners' for an access to
  several (:func:`origin_waits`: a slow owner's requesters wait longer).
  Measured before this term on 2 emulated nodes at 1 Gbit/s (quiet repeats):
  ASGD's sync was 13.3 ms per step on mlp and 14.1 on lenet against 8.1 and 2.3
  predicted (docs/RESULTS.md, "The simulator's validation on the emulated
  cluster"). ``--rma-progress immediate`` (``auto`` on the modelled platforms) keeps
  the old assumption (native atomics, or a progress thread).

Staleness is the code's, read from the simulated counter when rank 0 serves the
request. The transfers' concurrency is a mean-field fixed point (:func:`_accesses`):
pulls meet pulls and pushes meet pushes in its phases, and with the parameters sharded
a pull also shares its links with the other workers' pushes for the share of the time
they push, and a push with their pulls (:func:`cross_traffic`), where the connections
are not followed.
Assumptions: rank 0 serves queued atomics back to back and owners serve accesses
as they arrive (native atomics, or a progress engine that keeps up), so the
counter's bound is optimistic; the default costs are one machine's
(docs/RESULTS.md, "ASGD's simulated RMA costs").
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.algorithms.windows import POLL_MIN_GAP_S, shard_layout
from syncbench.bench.simulate.collectives import (
    ALLTOALL_EXACT_MAX,
    Phase,
    PhaseClock,
    _log_shifts,
    burst_of,
    powers_of_two_upto,
    weighted_cost,
)
from syncbench.bench.simulate.platform import comm_timings, fit_link
from syncbench.bench.simulate.progress import PROGRESS_SEGMENT_BYTES
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline

# The defaults below are measured on one machine through shared memory (MPICH 5.0.2;
# docs/RESULTS.md, "ASGD's simulated RMA costs"); on a network each message and its
# completion cost the origin at least as much.
#: Origin microseconds per owner of one passive-target epoch (Lock, the operation,
#: Unlock), serial.
DEFAULT_EPOCH_US = 2.0
#: Rank 0's microseconds per atomic on the counter (an upper bound of the part that
#: rank 0's window serialises).
DEFAULT_SERVICE_US = 1.5
#: Bytes per second a target reduces an ``Accumulate(SUM)`` of float32 into its window.
DEFAULT_ACCUMULATE_RATE = 2.7e9
#: Bytes of one counter request or reply.
COUNTER_BYTES = 8

#: The counter epochs of one worker, in the code's order, and their atomics:
#: the first ticket (``done``), then per step ``read(VERSION)``, ``read(STARTED)``,
#: ``fetch_add(STARTED)`` and ``Fetch_and_op([(VERSION, +1), (CLAIMS, +1)])``.
CLAIM, READ_VERSION, READ_STARTED, START, COUNT = range(5)
COUNTER_OPS = (1, 1, 1, 1, 2)
#: A pull's and a push's requests reaching their owners (:class:`Polls`' event model).
PULL_AT, PUSH_AT = 5, 6
#: Most workers whose polls :func:`counter_timeline` follows one by one (:class:`Polls`);
#: above, an access waits for the mean-field residual of its owners' gaps
#: (:func:`origin_waits`).
POLLS_EVENT_MAX = 64
#: Per step: round trips to rank 0, and atomics rank 0 serves.
COUNTER_EPOCHS = 4
COUNTER_ATOMICS = sum(COUNTER_OPS[READ_VERSION:])


@dataclass(frozen=True)
class RmaCosts:
    """The MPI costs of ASGD's traffic that the network does not give."""

    epoch_s: float = DEFAULT_EPOCH_US * 1e-6
    service_s: float = DEFAULT_SERVICE_US * 1e-6
    accumulate_rate: float = DEFAULT_ACCUMULATE_RATE
    nocheck: bool = True
    rate_from: str = ""

    def per_owner(self, one_way: float) -> float:
        """Serial origin seconds per owner: the overhead, and without NOCHECK the
        lock's and the unlock's handshakes (two round trips).

        With ``MPI_MODE_NOCHECK`` (``--rma-assert nocheck``, the default) MPICH's
        ``MPIDIG_mpi_win_lock`` (``src/mpid/ch4/src/mpidig_win.h``) sends no lock
        request (it only marks the target locked), and ``MPIDIG_mpi_win_unlock``
        sends no unlock message: it completes the target's operations (the
        netmod's and shared memory's ``target_cmpl_hook``, an endpoint flush, then
        a progress loop until the target's completion counters are zero). As every
        operation is posted before the first ``Unlock``, the round trips to
        different owners overlap; what adds up is the origin's own work per owner
        (three MPI calls, a message and its completion). Without NOCHECK each
        ``Lock`` waits for the target's grant and each ``Unlock`` for its
        acknowledgement, one owner after the other.
        """
        return self.epoch_s + (0.0 if self.nocheck else 4.0 * one_way)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``syncbench simulate``'s flags for ASGD's RMA costs."""
    group = parser.add_argument_group("asgd traffic (simulated)")
    group.add_argument("--rma-epoch-us", type=float, default=DEFAULT_EPOCH_US,
                       help="origin microseconds per owner of one RMA epoch (Lock, "
                       f"operation, Unlock), serial (default {DEFAULT_EPOCH_US})")
    group.add_argument("--counter-service-us", type=float, default=DEFAULT_SERVICE_US,
                       help="microseconds rank 0 takes per atomic on ASGD's counter "
                       f"(default {DEFAULT_SERVICE_US}; 5 per step, one at a time)")
    group.add_argument("--accumulate-rate", type=float, default=None, metavar="B/s",
                       help="bytes/s a target reduces Accumulates into its window (default "
                       f"{DEFAULT_ACCUMULATE_RATE:.3g}, measured with syncbench comm "
                       "--op rma-accumulate)")
    group.add_argument("--rma-progress", choices=("auto", "polls", "immediate"),
                       default="auto",
                       help="when a target serves one-sided requests: at its polls between "
                       "layers (MPICH over TCP) or at once (native RMA, a progress thread); "
                       "auto (default): polls on a platform --calibrate'd from measured "
                       "links, at once on the modelled ones")
    group.add_argument("--calibrate-rma", default=None, metavar="COMM.h5",
                       help="the accumulate rate fitted to `syncbench comm --op "
                       "rma-accumulate --out` results")


def calibrate_rma(path: str) -> tuple[float, dict[str, Any]]:
    """(bytes/s, details) of an Accumulate + Flush fitted to ``syncbench comm`` results.

    Each size is ``t = L + S / R`` (one epoch's latency, the reduction at rate
    R); :func:`.platform.fit_link` takes L from the small sizes' medians and R
    from the large sizes' means.
    """
    attrs, sizes, mean, median, _, keep = comm_timings(path, "rma-accumulate", "--calibrate-rma")
    if keep.sum() < 2:
        raise ValueError(f"--calibrate-rma {path}: needs >= 2 message sizes")
    try:
        latency, rate, details = fit_link(sizes[keep], mean[keep], [(1.0, 1.0)] * int(keep.sum()),
                                          median[keep])
    except ValueError as exc:
        raise ValueError(f"--calibrate-rma {path}: {exc}") from None
    details.update(latency_s=latency, mpi_library=attrs.get("mpi_library", ""))
    return rate, details


def costs_from(cfg: argparse.Namespace) -> RmaCosts:
    """:class:`RmaCosts` from the flags (a namespace without them gets the defaults)."""
    epoch_us = float(getattr(cfg, "rma_epoch_us", DEFAULT_EPOCH_US))
    service_us = float(getattr(cfg, "counter_service_us", DEFAULT_SERVICE_US))
    rate = getattr(cfg, "accumulate_rate", None)
    path = getattr(cfg, "calibrate_rma", None)
    if rate is not None and path:
        raise ValueError("give --accumulate-rate or --calibrate-rma, not both")
    if path:
        rate = calibrate_rma(path)[0]
    rate = DEFAULT_ACCUMULATE_RATE if rate is None else float(rate)
    if not (epoch_us >= 0 and service_us >= 0 and rate > 0):
        raise ValueError("--rma-epoch-us and --counter-service-us must be >= 0 and "
                         "--accumulate-rate > 0")
    return RmaCosts(epoch_s=epoch_us * 1e-6, service_s=service_us * 1e-6,
                    accumulate_rate=rate, nocheck=getattr(cfg, "rma_assert", "nocheck") != "none",
                    rate_from=path or "")


# -- the pieces of a step -------------------------------------------------------------

def asgd_phases(nbytes: float, n: int, layout: str,
                active: int = 0) -> tuple[list[tuple[Phase, float]], list[tuple[Phase, float]]]:
    """(pull, push): the bytes of one access as weighted SimGrid phases.

    A transfer's time is sum(weight * phase time). ``active`` workers pull or
    push at the same time (0: all of them). ``sharded``: up to
    ``ALLTOALL_EXACT_MAX`` ranks the all-to-all flow by flow (rank r owns the
    r-th 1/N); above that, the mean over log-spaced shift permutations (rank
    i -> i + s) each carrying a rank's whole volume (an all-to-all is the
    union of the N - 1 shifts; up to six from 1 to N/2, and N - 1, cover every
    level of a fat tree). ``single``/``dedicated``: rank 0 owns all. The
    counter's traffic is not here (:func:`counter_timeline`).
    """
    if n <= 1:
        return [], []
    if layout == "sharded":
        if n <= ALLTOALL_EXACT_MAX:
            one = Phase("alltoall", 0, n, nbytes / n, active=active)
            return [(one, 1.0)], [(one, 1.0)]
        volume = nbytes * (n - 1) / n
        shifts = _log_shifts(n)
        weight = 1.0 / len(shifts)
        # A push to the owners mirrors the pull (shift s reversed is shift N - s, which
        # also is in the sample): the same phases, simulated once.
        pull = [(Phase("shift", s, n, volume, active=active), weight) for s in shifts]
        return pull, list(pull)
    if layout in ("single", "dedicated"):
        return ([(Phase("scatter", 0, n, nbytes, active=active), 1.0)],
                [(Phase("gather", 0, n, nbytes, active=active), 1.0)])
    raise ValueError(f"unknown --ps-layout {layout!r}")


def epochs_per_access(params: int, n: int, layout: str) -> int:
    """Owners a pull or push locks, reads or updates and unlocks: ``len(shard_layout(...))``."""

    return len(shard_layout(params, n, layout))


def access_seconds(epochs: int, one_way: float, bandwidth_s: float, costs: RmaCosts,
                   reduce_s: float = 0.0) -> float:
    """One pull or push: ``max(E x per-owner + L, T_bw, reduce + L) + L``.

    The origin posts its E epochs one after another (``costs.per_owner`` each);
    the last owner's operation reaches it one latency L after being posted and
    its completion returns one L later. ``bandwidth_s`` (SimGrid's, one L
    included) is the bytes' time on the network, ``reduce_s`` the reduction
    at the owners (:func:`accumulate_seconds`, after the data's L).
    """
    if epochs <= 0:
        return 0.0
    return max(epochs * costs.per_owner(one_way) + one_way, bandwidth_s,
               reduce_s + one_way if reduce_s > 0 else 0.0) + one_way


def accumulate_seconds(nbytes: float, epochs: int, workers: int, rate: float,
                       think_s: float) -> float:
    """Seconds a push's data spends being reduced at its owners.

    Each of the E owners reduces P/E bytes of every push at ``rate``: b = P/(E R)
    alone. W workers push once per cycle each, so an owner has W b of work
    per cycle; when the rest of a worker's cycle (``think_s``) is shorter than
    that, the owners are saturated and the closed loop gives each push
    W b - think (its share of the owner's queue).
    """
    if epochs <= 0 or nbytes <= 0:
        return 0.0
    alone = nbytes / (epochs * rate)
    return max(alone, workers * alone - think_s)


def rma_progress(cfg: argparse.Namespace) -> str:
    """``polls`` or ``immediate``: ``--rma-progress``, where ``auto`` is ``polls`` on a
    platform fitted to measured links (``--calibrate``: this suite's runs over MPICH's
    TCP transports) and ``immediate`` on the modelled ones (fat tree, dragonfly, torus,
    crossbar: clusters whose RDMA serves one-sided operations without the target)."""
    mode = getattr(cfg, "rma_progress", "auto")
    if mode == "auto":
        return "polls" if getattr(cfg, "calibrate", None) else "immediate"
    return mode


def poll_gaps(data: float, compute: float, update: float, delay: float,
              hooks: Sequence[float], min_gap: float = POLL_MIN_GAP_S,
              polled: float | None = None, stretch: float = 1.0) -> np.ndarray:
    """Seconds between a rank's chances to serve while it is outside its own accesses.

    One step outside MPI is data, compute (``ProgressPoll`` at each hook share of
    ``hooks``, at most one per ``min_gap``: ``algorithms/windows.py``), then the delay,
    polled as compute is for its first ``polled`` seconds (None: all of it): an emulated
    slowdown of a strategy that drives progress in it (AD-PSGD's ``drive_progress``;
    ``--slowdown-mode work`` runs the model's passes with their hooks,
    ``bench/train/slowdown.py``; ``spin`` and ``sleep`` poll more often still, rate-limited
    to ``min_gap`` by ``ProgressPoll``). The rest of the delay does not poll: a transient
    straggler's, and all of an ASGD worker's (its ``drive_progress`` is a no-op). A node
    quota's freezes do not poll either, but they fall between the compute's hooks (a 1 ms
    freeze every 2 ms at speed 0.5, :mod:`.quota`), not in one block after them:
    ``stretch`` (``1 / speed``) spreads the hooks over ``compute x stretch`` and takes the
    quota's ``compute x (stretch - 1)`` out of the delay (as :class:`Polls` does for ASGD's
    owners), and a slowdown's polled seconds are stretched alike. Then the update (no
    polls); it is entered and left inside MPI (the step's pull and push). Measured before
    the delay's polls were in the model (AD-PSGD, resnet8, 2 emulated nodes at 200
    Mbit/s, a 2x slower rank in work mode): the active rank's averages took 14.5-15.3 ms
    a step, as without the slowdown, against 31-32 ms predicted (docs/RESULTS.md, "A
    quota's first burst, AD-PSGD's bucket and the polls of a slowdown"; at a quota:
    "A passive peer's polls at a quota")."""
    points = [0.0]

    def poll(at: float) -> None:
        if at - points[-1] >= min_gap:
            points.append(at)

    frozen = min(max(compute * (stretch - 1.0), 0.0), delay)
    compute, delay = compute + frozen, delay - frozen
    for share in hooks:
        poll(data + share * compute)
    start = data + compute
    polled = delay if polled is None else min(max(polled, 0.0) * stretch, delay)
    passes = math.ceil(polled / compute) if compute > 0 and polled > 0 else 0
    for k in range(passes):
        for share in hooks:
            at = start + (k + share) * compute
            if at >= start + polled:  # the first check past the deadline polls, then ends it
                poll(start + polled)
                break
            poll(at)
    end = data + compute + delay + update
    points.append(end)
    gaps = np.diff(np.asarray(points, dtype=float))
    return gaps[gaps > 0]


def poll_offsets(compute: float, hooks: Sequence[float],
                 min_gap: float = POLL_MIN_GAP_S) -> np.ndarray:
    """Seconds into a compute phase of ``compute`` seconds at which ``ProgressPoll`` polls:
    at each hook share of ``hooks``, at most one per ``min_gap`` since its own last
    ``Iprobe`` (``algorithms/windows.py``), so the first hook of a phase polls: the last
    one was in the step before, at least the access between ago."""
    points, last = [], -math.inf
    for share in hooks:
        at = share * compute
        if at - last >= min_gap:
            points.append(at)
            last = at
    return np.asarray(points, dtype=float)


def target_wait(gaps: np.ndarray, outside: float, owners: int = 1) -> float:
    """Expected seconds a request waits for the largest of ``owners`` targets' next poll.

    A target is outside MPI a share ``outside`` of its cycle; a request that comes
    then falls in gap i with probability g_i / sum(g) and waits uniformly up to g_i,
    so P(wait <= r) = 1 - outside + outside * sum(min(r, g_i)) / sum(g), and the
    largest of m independent waits has the expectation of integral(1 - P^m) dr."""
    gaps = np.asarray(gaps, dtype=float)
    if owners <= 0 or not len(gaps) or outside <= 0:
        return 0.0
    r = np.linspace(0.0, float(gaps.max()), 513)
    return float(np.trapezoid(1.0 - _wait_cdf(gaps, outside, r) ** owners, r))


def _wait_cdf(gaps: np.ndarray, outside: float, r: np.ndarray) -> np.ndarray:
    """P(a request's wait for this target's next poll <= r), at each of ``r``
    (:func:`target_wait`)."""
    gaps = np.asarray(gaps, dtype=float)
    if not len(gaps) or outside <= 0:
        return np.ones_like(r)
    return 1.0 - outside + outside * np.minimum(r[:, None], gaps[None, :]).sum(axis=1) / gaps.sum()


def origin_waits(gaps: Sequence[np.ndarray], outside: Sequence[float],
                 owners: Sequence[int], origins: Sequence[int]) -> list[float]:
    """Each origin's expected wait for the largest of its remote owners' next polls.

    ``gaps[j]`` and ``outside[j]`` are rank j's own (:func:`poll_gaps`, the share of its
    cycle it spends outside MPI); origin k's accesses wait for every rank of ``owners``
    but itself. The owners' waits are independent, so P(max <= r) is the product of
    their :func:`_wait_cdf`. A mean over the ranks (what :func:`target_wait` takes) gives
    a fast rank's accesses to a slow owner the mean of a slow and a fast rank's gaps: with
    one rank 2x slower in work mode (resnet8, 2 emulated nodes at 200 Mbit/s) the fast
    rank's unpolled gap is the slow rank's whole delay, 29 ms, not half of it, and the
    slow rank's accesses wait for the fast rank's short gaps only (docs/RESULTS.md)."""
    top = max((float(np.max(g)) for g in gaps if len(g)), default=0.0)
    if top <= 0 or not owners:
        return [0.0] * len(origins)
    r = np.linspace(0.0, top, 513)
    curves: dict[tuple[bytes, float], np.ndarray] = {}

    def key_of(j: int) -> tuple[bytes, float]:
        # ranks alike share one curve (a homogeneous job: one); the share to 0.001
        return np.asarray(gaps[j], dtype=float).tobytes(), round(float(outside[j]), 3)

    def log_cdf(key: tuple[bytes, float]) -> np.ndarray:
        if key not in curves:
            g = np.frombuffer(key[0], dtype=float)
            curves[key] = np.log(np.maximum(_wait_cdf(g, key[1], r), 1e-300))
        return curves[key]

    owner_set = set(owners)
    total = np.sum([log_cdf(key_of(j)) for j in owner_set], axis=0)
    waits, done = [], {}
    for k in origins:
        if owner_set == {k}:
            waits.append(0.0)
            continue
        mine = key_of(k) if k in owner_set else None
        if mine not in done:
            rest = total - log_cdf(mine) if mine is not None else total
            done[mine] = float(np.trapezoid(1.0 - np.exp(rest), r))
        waits.append(done[mine])
    return waits


def counter_bound(service_s: float) -> float:
    """Steps per second the whole job can make through rank 0's counter (inf if free)."""
    return math.inf if service_s <= 0 else 1.0 / (COUNTER_ATOMICS * service_s)


# -- the counter, request by request ---------------------------------------------------

StepTimes = Callable[[int, int], Sequence[float]]


@dataclass
class CounterRun:
    """What :func:`counter_timeline` returns: per-step records and the counters' end state."""

    worker: np.ndarray
    step: np.ndarray
    cols: dict[str, np.ndarray]
    wall_s: float
    version: int
    started: int
    claims: int
    busy_s: float
    #: Mean seconds an access waited for its owners, and a counter request of a worker
    #: other than rank 0 for rank 0 (:class:`Polls`' event model; None without it).
    owner_wait_s: float | None = None
    counter_wait_s: float | None = None


#: Columns of :class:`CounterRun`'s records, after the worker and its step.
RECORD_COLS = ("t_start", "t_data", "t_compute", "t_update", "t_delay", "t_comm",
               "staleness", "staleness_min")
#: The counter epoch that follows each one (a step ends with COUNT, then READ_VERSION).
NEXT = (READ_VERSION, READ_STARTED, START, COUNT, READ_VERSION)


@dataclass(frozen=True)
class Polls:
    """Where each rank serves the one-sided requests it owns, followed request by request.

    Over a transport without hardware one-sided operations a target serves a request
    inside an MPI call only: at once while it is in its own accesses or counter trips
    (where it waits in MPI), else at its compute's next ``ProgressPoll`` (``hooks``, at
    most one per ``min_gap``: :func:`poll_offsets`), or when its local work ends; its
    data loading, its emulated slowdown's delay and its update do not poll, and a
    quota's freezes fall between its hooks, which spread over the stretched compute
    (``stretch``). Followed rank by rank, the waits couple the ranks' paces: an origin that
    waits for its owner's poll or for the owner's own access leaves that access with the
    owner, so two alike ranks lock into one phase and serve each other in their
    accesses. Measured on 2 emulated nodes at 1 Gbit/s (resnet8, homogeneous, 3 runs):
    every step of rank 1 began within a tenth of rank 0's cycle of a step of rank 0,
    and rank 1's sync was 4.3-5.3 ms a step where independent phases (the mean-field
    residual of rank 0's 2.7-7.1 ms gaps for each of its six requests) gave 14.8
    (docs/RESULTS.md). ``owners[k]``: the ranks worker k's pull and push wait for (its
    shards' owners but itself; none for a dedicated server, which serves from its MPI
    loop); the counter's owner is rank 0."""

    hooks: tuple[float, ...]
    owners: tuple[tuple[int, ...], ...]
    #: Polls of owner j a push to it needs (:func:`push_polls`), by rank; 1 for a pull.
    push_polls: tuple[int, ...] = ()
    min_gap: float = POLL_MIN_GAP_S
    #: By rank, how much longer its node's CPU quota makes its compute on the wall
    #: (``1 / speed``; none or 1: no quota). The quota freezes the process for a
    #: millisecond at a time (a 1 ms quota every 2 ms at speed 0.5), so its hooks still
    #: poll, spread over the stretched compute, not bunched before one long freeze.
    stretch: tuple[float, ...] = ()
    #: Seconds a pull's and a push's bytes hold each connection they cross, at the
    #: calibrated rate (0 for both: the connections are not followed, :class:`_Followed`).
    conn_pull: float = 0.0
    conn_push: float = 0.0
    #: The links' token bucket (``--link-burst``) in seconds at that rate: after an idle
    #: spell a sender's link passes that much of its bytes at once, refilled at the rate.
    bucket_s: float = 0.0


def push_polls(nbytes: float, segment: float = PROGRESS_SEGMENT_BYTES) -> int:
    """Polls of a target outside MPI that an ``Accumulate`` of ``nbytes`` needs: the
    first takes the request and a first part, each further one a ``segment`` (a progress
    call's part of a flow over TCP, :data:`.progress.PROGRESS_SEGMENT_BYTES`). Measured on
    2 emulated nodes at 1 Gbit/s and 200 Mbit/s, the target spinning between ``Iprobe``
    polls 2 or 4 ms apart: 16 KB took 1 poll, 64 KiB 2, 155 KB 3, 459 KiB 8-9; a
    ``Get_accumulate`` (ASGD's pull) of any of these sizes took 1 (docs/RESULTS.md, "What a
    target's polls move")."""
    return 1 + int(max(0.0, nbytes) // segment)


def served_at(span: tuple[float, float, Sequence[float]], t: float,
              need: int = 1) -> tuple[float, float]:
    """When a target has served a request that reaches it at ``t`` with ``need`` of its
    chances, and the share of the request's bytes still to move then.

    ``span`` is the target's last span outside MPI: (start, end, its polls, sorted). Outside
    it the target is in MPI and serves at once; inside, the request takes the target's
    next ``need`` polls (:func:`push_polls`), and when the span ends first, the polls it
    lacked leave their share of the bytes to move after (:class:`Polls`)."""
    a, b, points = span
    if not a <= t < b:
        return t, 0.0
    i = bisect.bisect_left(points, t)
    last = i + need - 1
    if last < len(points) and points[last] < b:
        return points[last], 0.0
    polled = sum(1 for p in points[i:] if p < b)
    return b, (need - polled) / need


def counter_timeline(workers: Sequence[int], total: int, t_pull: float | Sequence[float],
                     t_push: float | Sequence[float], step_times: StepTimes,
                     one_way: Sequence[float], costs: RmaCosts,
                     serve_wait: Sequence[float] | None = None,
                     polls: Polls | None = None) -> CounterRun:
    """Every worker's steps, with each counter request queued at rank 0 in arrival order.

    ``step_times(k, j)`` is worker k's (data, compute, update, delay) of its
    j-th step, ``one_way[k]`` its one-way latency to rank 0 (0 for rank 0
    itself), ``t_pull``/``t_push`` the window accesses (:func:`access_seconds`), one for
    every worker or one per rank (a slow owner's requesters wait longer).
    A request leaves after the epoch's overhead (``costs.epoch_s``; without
    NOCHECK also the lock's round trip), reaches rank 0 one latency later,
    waits until rank 0 has served every earlier arrival, takes
    ``costs.service_s`` per atomic, and its reply returns one latency later
    (without NOCHECK, then the unlock's round trip). A step is: data, the
    pull (``read(VERSION)``, the window, ``read(STARTED)``), compute, delay
    and update, the push (``fetch_add(STARTED)``, the window, ``version``
    and ``claims`` += 1), as ``ASGD.step`` runs them. Tickets go to whoever
    claims first, so exactly ``total`` pushes are made, and the counters are
    read where the code reads them; the requests are handled in arrival
    order, which is rank 0's order of service (one heap of arrivals).
    ``serve_wait[k]`` is added to each of worker k's requests before rank 0 serves
    it (rank 0's next poll, :func:`target_wait`; 0 for rank 0's own). With ``polls``
    the waits are followed instead (:class:`Polls`): a counter request is served from
    rank 0's next chance to serve, and a pull or a push (``t_pull``/``t_push`` without
    waits) is longer by its owners' latest chance after its requests reach them; where
    ``polls`` gives the connections' times, every message also queues behind the bytes
    before it on its pair's connection (:meth:`_Followed.queue`, :meth:`_Followed.behind`).
    """
    pulls, pushes = (list(t) if isinstance(t, Sequence) else [float(t)] * len(one_way)
                     for t in (t_pull, t_push))
    pre, back = _trip_times(costs, one_way, serve_wait)
    size = max(workers, default=-1) + 1
    taken, t0, sent, comm, v_pre, s_post = ([0] * size, [0.0] * size, [0.0] * size,
                                            [0.0] * size, [0] * size, [0] * size)
    local: list[Sequence[float]] = [()] * size
    records: list[tuple] = []
    heap = sorted((pre[k], k, k, CLAIM) for k in workers)  # a sorted list is a heap
    version = claims = started = 0
    free = wall = 0.0
    seq, service, pushpop = size, costs.service_s, heapq.heappushpop
    follow = _Followed(polls, size, pulls, pushes, max(one_way, default=0.0))
    item = heapq.heappop(heap) if heap else None
    while item is not None:
        arrival, _, k, phase = item
        if phase >= PULL_AT:  # an access's requests reach its owners (polls followed)
            item = pushpop(heap, follow.access_item(k, phase, arrival, seq, pre[k]))
            seq += 1
            continue
        free = max(follow.counter_start(k, follow.behind(k, 0, arrival)), free) \
            + COUNTER_OPS[phase] * service
        now = follow.behind(0, k, free) + back[k]
        if phase == READ_VERSION:
            v_pre[k] = version
            nxt = now + pulls[k]
        elif phase == READ_STARTED:
            s_post[k] = started
            comm[k] = now - sent[k]
            d, c, u, dl = local[k]
            nxt = sent[k] = now + c + dl + u
            follow.leave(k, now, nxt, c)  # compute polls at its hooks; delay, update do not
        elif phase == START:
            started += 1
            nxt = now + pushes[k]
        else:  # CLAIM (done() before the first step) or COUNT (the end of a push)
            if phase == COUNT:
                d, c, u, dl = local[k]
                records.append((k, taken[k], t0[k], d, c, u, dl, comm[k] + now - sent[k],
                                version - v_pre[k], max(0, version - s_post[k])))
                version += 1
                taken[k] += 1
            claims += 1
            if claims > total:  # the ticket is past the budget: this worker is done
                wall = max(wall, now)
                item = heapq.heappop(heap) if heap else None
                continue
            local[k] = step = step_times(k, taken[k])
            t0[k] = now
            nxt = sent[k] = now + step[0]
            follow.leave(k, now, nxt)  # loading data polls nothing
        # the next request, and the earliest of all (often this one: one sift, not two);
        # with the polls followed, a pull's or push's requests reaching the owners
        item = pushpop(heap, follow.post(k, now, seq, phase) if follow.on and phase in (
            READ_VERSION, START) else (nxt + pre[k], seq, k, NEXT[phase]))
        seq += 1
    return follow.stamp(_counter_run(records, wall, version, started, claims,
                                     (claims + (COUNTER_ATOMICS - 1) * version) * service))


def _trip_times(costs: RmaCosts, one_way: Sequence[float],
                serve_wait: Sequence[float] | None) -> tuple[list[float], list[float]]:
    """Per rank, a counter request's seconds from its send to its arrival at rank 0 (and,
    over TCP, rank 0's next poll: ``serve_wait``), and from the end of its service to the
    reply at the worker; without NOCHECK the lock's and unlock's handshakes too."""
    trips = 1.0 if costs.nocheck else 3.0
    waits = list(serve_wait) if serve_wait is not None else [0.0] * len(one_way)
    return ([costs.epoch_s + trips * lat + wait for lat, wait in zip(one_way, waits)],
            [trips * lat for lat in one_way])


class _Followed:
    """Where each rank serves, as :func:`counter_timeline` goes (:class:`Polls`; with
    ``polls`` None every request is served at once and nothing is followed): each rank's
    last span outside MPI, when its access was posted, and the waits met."""

    def __init__(self, polls: Polls | None, size: int, pulls: list[float],
                 pushes: list[float], reach: float) -> None:
        self.polls, self.on = polls, polls is not None
        self.pulls, self.pushes, self.reach = pulls, pushes, reach
        self.spans: list[tuple[float, float, list[float]]] = [(0.0, 0.0, [])] * size
        self.posted = [0.0] * size
        #: When each connection (a, b) has sent the bytes queued on it.
        self.conn: dict[tuple[int, int], float] = {}
        #: Per sender: its bucket's credit (seconds at the rate) and when its link went idle.
        self.credit: dict[int, tuple[float, float]] = {}
        self.fifo = polls is not None and (polls.conn_pull > 0 or polls.conn_push > 0)
        self.owner_wait = self.counter_wait = 0.0
        self.accesses = self.requests = 0

    def leave(self, k: int, start: float, end: float, compute: float = 0.0) -> None:
        """Rank k is outside MPI from ``start`` to ``end``, polling in its first
        ``compute`` seconds at its hooks."""
        if self.on:
            stretch = self.polls.stretch[k] if k < len(self.polls.stretch) else 1.0
            compute = min(compute * stretch, end - start)
            points = start + poll_offsets(compute, self.polls.hooks, self.polls.min_gap) \
                if compute > 0 else np.zeros(0)
            self.spans[k] = (start, end, points.tolist())

    def behind(self, a: int, b: int, t: float) -> float:
        """When a small message (a counter request or reply, an access's request) from
        rank a to rank b that leaves at ``t`` is on its way: after the bytes queued before
        it on that connection, one TCP stream a pair in MPICH's CH4 over UCX."""
        if not self.fifo or a == b:
            return t
        return max(t, self.conn.get((a, b), 0.0))

    def queue(self, a: int, b: int, t: float, hold: float) -> float:
        """Queue ``hold`` seconds of bytes from rank a to rank b from ``t``; when they
        start. The sender's bucket passes its credit's worth at once (``bucket_s``,
        refilled while its link is idle), so they hold the connection that much less.
        Where the connections are not followed, nothing queues: ``t``."""
        if not self.fifo:
            return t
        start = max(t, self.conn.get((a, b), 0.0))
        full = self.polls.bucket_s
        if full > 0:
            left, idle_since = self.credit.get(a, (full, 0.0))
            credit = min(full, left + max(0.0, start - idle_since))
            saved = min(credit, hold)
            hold = hold - saved
            # the link is idle after the last bytes of all its connections
            self.credit[a] = (credit - saved, max(idle_since, start + hold))
        self.conn[a, b] = start + hold
        return start

    def counter_start(self, k: int, arrival: float) -> float:
        """When rank 0 takes up worker k's counter request (its own: at once)."""
        if not self.on or k == 0:
            return arrival
        start = served_at(self.spans[0], arrival)[0]
        self.counter_wait += start - arrival
        self.requests += 1
        return start

    def post(self, k: int, now: float, seq: int, phase: int) -> tuple[float, int, int, int]:
        """The heap item of worker k's pull (after READ_VERSION) or push (after START)
        posted at ``now``: its requests reaching the owners."""
        self.posted[k] = now
        return (now + self.reach, seq, k, PULL_AT if phase == READ_VERSION else PUSH_AT)

    def access_item(self, k: int, phase: int, arrival: float, seq: int,
                    pre: float) -> tuple[float, int, int, int]:
        """The heap item after worker k's access (:meth:`access_done`): its next counter
        request, ``pre`` seconds after the access ends."""
        done = self.access_done(k, phase, arrival)
        return (done + pre, seq, k, READ_STARTED if phase == PULL_AT else COUNT)

    def access_done(self, k: int, phase: int, arrival: float) -> float:
        """When worker k's pull or push whose requests reach its owners at ``arrival`` ends:
        a read is served at each owner's first chance, then crosses the wire; accumulates
        move at their owners' polls (:func:`push_polls`), or after they enter MPI."""
        owners = self.polls.owners[k]
        wire = self.pulls[k] if phase == PULL_AT else self.pushes[k]
        if phase == PULL_AT:
            # k's request queues behind k's bytes to j, j's reply behind j's bytes to k
            start = max((self.queue(j, k, served_at(
                self.spans[j], self.behind(k, j, arrival))[0], self.polls.conn_pull)
                for j in owners), default=arrival)
            done = self.posted[k] + wire + start - arrival
        else:
            done = self.posted[k] + wire
            # k's bytes queue on its connection to each owner
            late = max((self.queue(k, j, self.posted[k], self.polls.conn_push)
                        - self.posted[k] for j in owners), default=0.0)
            done += late
            arrival += late
            for j in owners:
                need = self.polls.push_polls[j] if j < len(self.polls.push_polls) else 1
                at, left = served_at(self.spans[j], arrival, need)
                done = max(done, at + left * wire)
        self.owner_wait += done - self.posted[k] - wire
        self.accesses += 1
        return done

    def stamp(self, run: CounterRun) -> CounterRun:
        """``run`` with the mean seconds an access waited for its owners and a counter
        request for rank 0 (left None where nothing was followed)."""
        if self.on:
            run.owner_wait_s = self.owner_wait / max(1, self.accesses)
            run.counter_wait_s = self.counter_wait / max(1, self.requests)
        return run


def _counter_run(records: list[tuple], wall: float, version: int, started: int, claims: int,
                 busy: float) -> CounterRun:
    table = np.asarray(records, dtype=float).reshape(-1, 2 + len(RECORD_COLS))
    cols = {name: table[:, 2 + i].astype(int if name.startswith("staleness") else float)
            for i, name in enumerate(RECORD_COLS)}
    return CounterRun(table[:, 0].astype(int), table[:, 1].astype(int), cols, wall, version,
                      started, claims, busy)


# -- the strategy -----------------------------------------------------------------------

@dataclass
class _Access:
    """Pull and push seconds at one concurrency, with their parts."""

    active: int
    pull_s: float
    push_s: float
    bw_pull_s: float
    bw_push_s: float
    reduce_s: float
    cycle_s: float
    #: Seconds an access waits for its remote owners' polls, and a counter request for
    #: rank 0's, the workers' mean (:func:`origin_waits`; 0 with --rma-progress immediate).
    owner_wait_s: float = 0.0
    counter_wait_s: float = 0.0
    #: Per rank (0 for a rank that is not a worker): a pull's and a push's seconds, its
    #: owner waits inside them, and its counter requests' wait.
    pulls: tuple[float, ...] = ()
    pushes: tuple[float, ...] = ()
    counter_waits: tuple[float, ...] = ()


def _rank_gaps(local: LocalTimes, workers: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each worker's mean seconds a step outside MPI, and its :func:`poll_gaps`: an access
    waits for its owners' own gaps (a slow owner's, not the workers' mean). Ranks whose
    mean phases and node shares agree (phases to 3 significant digits) share their gaps
    (a homogeneous job computes them once); a throttled owner's hooks spread over its
    stretched compute (:func:`poll_gaps`' ``stretch``)."""
    per_rank = local.cols[workers, :, :].mean(axis=1)
    hooks = local.workload.compute_split().hooks
    stretches = local.quota_stretch()[workers]
    gaps_of: dict[tuple[tuple[float, ...], float], np.ndarray] = {}
    rank_gaps = []
    for row, stretch in zip(per_rank, stretches):
        key = tuple(float(f"{x:.3g}") for x in row)
        if (key, stretch) not in gaps_of:
            # an ASGD worker does not poll in an emulated slowdown's delay: its
            # drive_progress is NotLockStep's no-op (algorithms/not_lock_step.py;
            # docs/ALGORITHMS.md); a quota's freezes fall between its hooks
            gaps_of[key, stretch] = poll_gaps(*key, hooks, polled=0.0, stretch=float(stretch))
        rank_gaps.append(gaps_of[key, stretch])
    return per_rank.sum(axis=1), rank_gaps


def follows_polls(cfg: argparse.Namespace, n: int, workers: list[int]) -> bool:
    """Whether :func:`counter_timeline` follows the targets' polls request by request
    (:class:`Polls`): targets that serve at their polls, no dedicated server, and up to
    :data:`POLLS_EVENT_MAX` workers."""
    return (rma_progress(cfg) == "polls" and n > 1 and cfg.ps_layout != "dedicated"
            and len(workers) <= POLLS_EVENT_MAX)


def _accesses(cfg: argparse.Namespace, local: LocalTimes, workers: list[int], costs: RmaCosts,
              time_phase: PhaseClock, follow: bool = False) -> tuple[_Access, int, float]:
    """The mean-field fixed point of the transfers' concurrency; (access, E, one-way L).
    ``follow``: the polls' waits are left to :func:`counter_timeline` (:class:`Polls`)."""
    w, n = local.workload, local.n
    nbytes, count = w.param_bytes, len(workers)
    epochs = epochs_per_access(w.params, n, cfg.ps_layout)
    one_way = time_phase(Phase("shift", n - 1, n, COUNTER_BYTES, active=1)) if n > 1 else 0.0
    # DC-ASGD (--delay-compensation > 0) Gets the current weights again before its push.
    extra_get = 1.0 if float(cfg.delay_compensation) > 0 else 0.0
    counter_s = COUNTER_EPOCHS * (costs.epoch_s + 2.0 * one_way) + COUNTER_ATOMICS * costs.service_s
    floor = count / counter_bound(costs.service_s)  # the counter's cycle
    polls = rma_progress(cfg) == "polls" and n > 1 and not follow
    rank_local, rank_gaps = _rank_gaps(local, workers)
    mean_local = float(rank_local.mean())
    # the owners an access waits for (sharded: every shard's owner but the origin; single:
    # rank 0); the dedicated server and rank 0's counter under it serve from their MPI
    # loop at once
    dedicated = cfg.ps_layout == "dedicated"
    shards = [] if dedicated else shard_layout(w.params, n, cfg.ps_layout)
    owners = [shard.owner for shard in shards]
    position = {k: i for i, k in enumerate(workers)}

    # sharded: the link from owner i to worker j carries j's pulls from i and i's pushes
    # to j, which the phases (pulls with pulls, pushes with pushes) never pair; followed,
    # each connection carries them one after the other instead (_Followed.queue)
    crossed = cfg.ps_layout == "sharded" and count > 1

    def by_rank(values: np.ndarray) -> tuple[float, ...]:
        """Per-worker values by rank (0 for a rank that is not a worker)."""
        out = [0.0] * n
        for k, v in zip(workers, values):
            out[k] = float(v)
        return tuple(out)

    def waits(outside: Sequence[float], of: list[int]) -> np.ndarray:
        if not polls or dedicated or not of:
            return np.zeros(count)
        return np.asarray(origin_waits(rank_gaps, outside, [position[j] for j in of],
                                       list(range(count))))

    def at(active: int, outside: Sequence[float], busy: tuple[float, float] = (0.0, 0.0)
           ) -> tuple[_Access, np.ndarray]:
        pull, push = asgd_phases(nbytes, n, cfg.ps_layout, active)
        bw_pull, bw_push = weighted_cost(pull, time_phase), weighted_cost(push, time_phase)
        bw_pull, bw_push = cross_traffic(bw_pull, bw_push, *busy)
        owner_wait, counter_wait = waits(outside, owners), waits(outside, [0])
        t_pull = access_seconds(epochs, one_way, bw_pull, costs) + owner_wait
        counter_all = counter_s + COUNTER_EPOCHS * counter_wait
        think = max(mean_local + float(t_pull.mean()) * (1.0 + extra_get)
                    + float(counter_all.mean()) + 2.0 * one_way, floor)
        reduce_s = accumulate_seconds(nbytes, epochs, count, costs.accumulate_rate, think)
        t_push = (access_seconds(epochs, one_way, bw_push, costs, reduce_s) + owner_wait
                  + extra_get * t_pull)
        cycles = np.maximum(rank_local + t_pull + t_push + counter_all, floor)
        return _Access(active, float(t_pull.mean()), float(t_push.mean()), bw_pull, bw_push,
                       reduce_s, float(cycles.mean()), float(owner_wait.mean()),
                       float(counter_wait.mean()), by_rank(t_pull), by_rank(t_push),
                       by_rank(counter_wait)), cycles

    levels = powers_of_two_upto(count)
    acc, cycles = at(1, [1.0] * count)  # from the uncontended transfer, up to the fixed point
    busy = (0.0, 0.0)
    for _ in range(24):
        want = max(1, round(count * (acc.bw_pull_s + acc.bw_push_s) / acc.cycle_s))
        nxt = min(levels, key=lambda m: abs(math.log(m) - math.log(want)))
        # each owner outside MPI the share of its own cycle its local work takes
        outside = np.minimum(1.0, rank_local / np.maximum(cycles, 1e-12)).tolist()
        if crossed and not follow and acc.cycle_s > 0:
            # halfway to the last cycle's shares: no swinging
            seen = (acc.bw_pull_s / acc.cycle_s, acc.bw_push_s / acc.cycle_s)
            busy = tuple(0.5 * (a + b) for a, b in zip(busy, seen))
        new, cycles = at(nxt, outside, busy)
        if nxt == acc.active and abs(new.cycle_s - acc.cycle_s) <= 1e-3 * acc.cycle_s:
            acc = new
            break
        acc = new
    return acc, epochs, one_way


def cross_traffic(pull_s: float, push_s: float, pulling: float,
                  pushing: float) -> tuple[float, float]:
    """A pull's and a push's time on the wire beside the other workers' pushes and pulls.

    With the parameters sharded, the link from owner i to worker j carries j's pulls from
    i and i's pushes to j. ``pulling`` and ``pushing`` are the shares of a cycle a worker
    spends in each; a pull then finds a push on its links that share of the time and, the
    two sharing the rate while both last, takes ``1 + pushing`` times as long (a push,
    ``1 + pulling``). Measured on 2 emulated nodes at 200 Mbit/s (mlp, 470 KB a shard):
    pulls and pushes took 22 ms at the median and 42-55 ms at the 90th percentile, the
    doubled ones those that met the other rank's transfer (docs/RESULTS.md)."""
    return pull_s * (1.0 + min(pushing, 0.9)), push_s * (1.0 + min(pulling, 0.9))


def _rows(run: CounterRun, n: int, batch: int) -> Any:
    """The records of :func:`counter_timeline` as per-rank rows (each rank's in step order):
    one block of :class:`.timeline.StepRows`, which fills the columns ASGD does not set."""
    rows = StepRows(n)
    order = np.lexsort((run.step, run.worker))
    rows.add(run.worker[order], step=run.step[order], samples=batch,
             **{name: values[order] for name, values in run.cols.items()})
    return rows


def asgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
         time_phase: PhaseClock) -> Timeline:
    """ASGD's timeline: ``steps`` x N pushes by the workers, each at its own pace."""
    n = local.n
    workers = list(range(1, n)) if cfg.ps_layout == "dedicated" and n > 1 else list(range(n))
    costs = costs_from(cfg)
    local.ensure(max(8, 2 * steps))
    follow = follows_polls(cfg, n, workers)
    acc, epochs, one_way = _accesses(cfg, local, workers, costs, time_phase, follow)
    lat = [0.0 if k == 0 else one_way for k in range(n)]
    polls = None
    if follow:
        shards = shard_layout(local.workload.params, n, cfg.ps_layout)
        owners = {shard.owner for shard in shards}
        per_param = local.workload.param_bytes / max(1, local.workload.params)
        need = [1] * n
        for shard in shards:
            need[shard.owner] = push_polls((shard.hi - shard.lo) * per_param)
        hooks = tuple(float(h) for h in local.workload.compute_split().hooks)
        stretch = tuple(float(x) for x in local.quota_stretch())
        # a shard's bytes hold its connection for the access's time on the wire
        shard_bytes = max(1.0, local.workload.param_bytes / max(1, len(shards)))
        polls = Polls(hooks, tuple(tuple(sorted(owners - {k})) for k in range(n)), tuple(need),
                      stretch=stretch, conn_pull=acc.bw_pull_s, conn_push=acc.bw_push_s,
                      bucket_s=burst_of(time_phase) * acc.bw_pull_s / shard_bytes)
    run = counter_timeline(workers, steps * n, acc.pulls, acc.pushes,
                           lambda k, j: local.rank(k, j).tolist(), lat, costs,
                           acc.counter_waits, polls)
    if follow:
        acc.owner_wait_s, acc.counter_wait_s = run.owner_wait_s, run.counter_wait_s
    rows = _rows(run, n, local.workload.batch_size)
    bound = counter_bound(costs.service_s)
    notes = {"asgd_active": acc.active, "pull_s": acc.pull_s, "push_s": acc.push_s,
             "pull_bandwidth_s": acc.bw_pull_s, "push_bandwidth_s": acc.bw_push_s,
             "push_reduce_s": acc.reduce_s, "epochs_per_access": epochs,
             "rma_progress": rma_progress(cfg), "owner_poll_wait_s": acc.owner_wait_s,
             "counter_poll_wait_s": acc.counter_wait_s,
             "one_way_latency_s": one_way, "rma_epoch_s": costs.epoch_s,
             "counter_service_s": costs.service_s,
             "counter_busy_share": run.busy_s / run.wall_s if run.wall_s > 0 else 0.0,
             "counter_bound_steps_per_s": bound if math.isfinite(bound) else None,
             "accumulate_rate": costs.accumulate_rate,
             "accumulate_rate_from": costs.rate_from or "default"}
    return Timeline(rows, run.wall_s, notes)
