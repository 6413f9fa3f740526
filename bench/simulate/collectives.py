"""The communication phases of each collective, and their simulated cost.

A collective is a list of :class:`Phase`: in one phase every listed pair of
ranks exchanges ``nbytes`` at once, and the next phase starts when the
slowest flow of this one ends (the synchronous-step model used for
collective algorithms by Thakur, Rabenseifner and Gropp, "Optimization of
collective communication operations in MPICH", IJHPCA 2005). A phase
repeated ``repeat`` times (the 2(N-1) identical steps of a ring) is
simulated once: on an idle network it always takes the same time.

Allreduce algorithms, as MPICH 4 and 5 choose them for a built-in op (the
collective selection tree ``maint/tuning/coll/mpir/generic.json``, compiled
in as ``src/mpi/coll/coll_selection.json``: ``avg_msg_size<=8`` or
``count<pow2`` -> ``MPIR_Allreduce_intra_recursive_doubling``, else
``MPIR_Allreduce_intra_reduce_scatter_allgather``): recursive doubling for
messages up to 8 bytes or fewer elements than the largest power of two
<= N, Rabenseifner's reduce-scatter (recursive halving) + allgather
(recursive doubling) otherwise (MPICH 3's ``MPIR_Allreduce_intra_auto``
switched at ``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`` = 2048 bytes; the switch
measured: docs/RESULTS.md, "MPICH's allreduce switch"). The ring is selectable,
as with ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring``. For N not a power of two
both fold the first 2r ranks in pairs (r = N - pof2) before and unfold them
after, as MPICH does. MPI_Iallreduce has its own entry in the same tree
(:func:`choose_iallreduce`); ``tests/unit/test_simulate_network.py`` checks every
choice made here against the trees compiled into the installed ``libmpi.so``.
With several ranks on each of several nodes a blocking allreduce is node-aware,
as ch4 composes it (:func:`node_aware_phases`): a reduce inside each node, the
node roots' allreduce across the network, a bcast inside each node.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Largest message MPICH 4-5 reduce by recursive doubling whatever N (``avg_msg_size<=8``).
SHORT_MSG_BYTES = 8
#: The same for MPI_Iallreduce (``collective=iallreduce``: ``avg_msg_size<=2048``).
ISHORT_MSG_BYTES = 2048
#: MPIR reduce: binomial up to this size (``collective=reduce``: ``avg_msg_size<=2048``).
REDUCE_SHORT_MSG_BYTES = 2048
#: MPIR bcast: binomial up to this size on 8 ranks or more (``avg_msg_size<=12288``),
BCAST_SHORT_MSG_BYTES = 12288
#: scatter + recursive-doubling allgather up to this one on a power of two (``<=524288``),
BCAST_MEDIUM_MSG_BYTES = 524288
#: and binomial at any size below this many ranks (``comm_size<8``).
BCAST_MIN_PROCS = 8
#: MPICH's names (the leaves of ``coll_selection.json``) of the algorithms simulated.
MPICH_NAMES = {
    "MPIR_Allreduce_intra_recursive_doubling": "recursive-doubling",
    "MPIR_Allreduce_intra_reduce_scatter_allgather": "rabenseifner",
    "MPIR_Allreduce_intra_ring": "ring",
    "MPIR_Iallreduce_intra_sched_recursive_doubling": "recursive-doubling",
    "MPIR_Iallreduce_intra_sched_reduce_scatter_allgather": "rabenseifner",
    "MPIR_Iallreduce_intra_sched_ring": "ring",
    "MPIR_Reduce_intra_binomial": "binomial",
    "MPIR_Reduce_intra_reduce_scatter_gather": "reduce-scatter-gather",
    "MPIR_Bcast_intra_binomial": "binomial",
    "MPIR_Bcast_intra_scatter_recursive_doubling_allgather": "scatter-recursive-doubling-allgather",
    "MPIR_Bcast_intra_scatter_ring_allgather": "scatter-ring-allgather",
    "MPIDI_Allreduce_intra_composition_alpha": "alpha",
    "MPIDI_Allreduce_intra_composition_beta": "beta",
    "MPIDI_Allreduce_intra_composition_gamma": "gamma",
}
#: Largest N for which an all-to-all is simulated flow by flow.
ALLTOALL_EXACT_MAX = 64
#: Bytes of one fetch-and-op on the version counter.
COUNTER_BYTES = 8


@dataclass(frozen=True)
class Phase:
    """Every pair of :meth:`pairs` sends ``nbytes`` at once, ``repeat`` times in a row.

    ``block`` > 0: the pattern runs inside each block of ``block`` consecutive
    ranks of the ``n`` (the nodes: a node-local step), a last, smaller block
    keeping the pairs it has. ``stride`` > 1: the pattern runs on ``n`` ranks
    numbered 0, stride, 2 stride, ... (the node roots of a node-aware allreduce).
    """

    pattern: str  # see _PATTERNS
    arg: int
    n: int
    nbytes: float
    repeat: int = 1
    active: int = 0  # ranks taking part (0: all), evenly spread (ASGD's concurrency)
    block: int = 0
    stride: int = 1

    def key(self) -> tuple:
        base = (self.pattern, self.arg, self.n, self.active)
        return base if self.block <= 0 and self.stride == 1 else (*base, self.block, self.stride)

    def pairs(self) -> list[tuple[int, int]]:
        make = _PATTERNS.get(self.pattern)
        if make is None:
            raise ValueError(f"unknown phase pattern {self.pattern!r}")
        if self.block > 0:
            local = make(self.block, self.arg, self.active)
            return [(start + s, start + d) for start in range(0, self.n, self.block)
                    for s, d in local if start + max(s, d) < self.n]
        pairs = make(self.n, self.arg, self.active)
        if self.stride == 1:
            return pairs
        return [(s * self.stride, d * self.stride) for s, d in pairs]


def _pof2(n: int) -> int:
    """The largest power of two <= n (MPICH's ``MPL_pof2``)."""
    return 1 << (max(n, 1).bit_length() - 1)


def _real_ranks(n: int) -> list[int]:
    """The ranks that go on after the fold of a non-power of two, by their new rank.

    The first 2r ranks (r = n - pof2) pair up and one of each pair sits out;
    as ``MPIR_Reduce_intra_reduce_scatter_gather`` numbers them: new rank i is
    rank 2i for i < r, else i + r.
    """
    pof2 = _pof2(n)
    rem = n - pof2
    return [2 * i if i < rem else i + rem for i in range(pof2)]


def _spread(n: int, active: int, skip: int = -1) -> list[int]:
    """``active`` ranks evenly spread over 0..n-1 (all when 0 or >= n), avoiding ``skip``."""
    if active <= 0 or active >= n:
        return list(range(n))
    ranks = sorted({(k * n) // active for k in range(active)})
    return [r if r != skip else (r + 1) % n for r in ranks]


def _shift(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(i, (i + a) % n) for i in _spread(n, active)]


def _xor(n: int, a: int, active: int) -> list[tuple[int, int]]:
    real = _real_ranks(n)
    return [(real[i], real[i ^ a]) for i in range(len(real))]


def _fold(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(2 * i + 1, 2 * i) for i in range(n - _pof2(n))]


def _unfold(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(2 * i, 2 * i + 1) for i in range(n - _pof2(n))]


def _alltoall(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(i, j) for i in _spread(n, active) for j in range(n) if j != i]


def _gather(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(i, a) for i in _spread(n, active, skip=a) if i != a]


def _scatter(n: int, a: int, active: int) -> list[tuple[int, int]]:
    return [(a, i) for i in _spread(n, active, skip=a) if i != a]


def _tree_up(n: int, m: int, active: int) -> list[tuple[int, int]]:
    """Step ``m`` of a binomial tree towards rank 0: rank r sends to r - m (r = m mod 2m)."""
    return [(r, r - m) for r in range(m, n, 2 * m)]


def _tree_down(n: int, m: int, active: int) -> list[tuple[int, int]]:
    """Step ``m`` of a binomial tree from rank 0: rank r - m sends to r (r = m mod 2m)."""
    return [(r - m, r) for r in range(m, n, 2 * m)]


def _halves_in(n: int, m: int, active: int) -> list[tuple[int, int]]:
    """Step ``m`` of the gather after a reduce-scatter: new ranks m..2m-1 send to r - m."""
    real = _real_ranks(n)
    return [(real[r], real[r - m]) for r in range(m, 2 * m)]


_PATTERNS: dict[str, Callable[[int, int, int], list[tuple[int, int]]]] = {
    "shift": _shift, "xor": _xor, "fold": _fold, "unfold": _unfold, "alltoall": _alltoall,
    "gather": _gather,  # every active rank -> rank arg
    "scatter": _scatter,  # rank arg -> every active rank
    "tree-up": _tree_up, "tree-down": _tree_down, "halves-in": _halves_in,
}


def choose_allreduce(nbytes: float, n: int, itemsize: int = 4) -> str:
    """MPICH's default choice for a commutative SUM of ``nbytes`` on ``n`` ranks (MPI_Allreduce)."""
    if nbytes <= SHORT_MSG_BYTES or nbytes / itemsize < _pof2(n):
        return "recursive-doubling"
    return "rabenseifner"


def choose_iallreduce(nbytes: float, n: int, itemsize: int = 4) -> str:
    """The same for MPI_Iallreduce: recursive doubling up to 2048 bytes, not 8.

    ``coll_selection.json``'s ``collective=iallreduce``: ``avg_msg_size<=2048`` or
    ``count<pow2`` -> ``MPIR_Iallreduce_intra_sched_recursive_doubling``, else
    ``MPIR_Iallreduce_intra_sched_reduce_scatter_allgather``.
    """
    if nbytes <= ISHORT_MSG_BYTES or nbytes / itemsize < _pof2(n):
        return "recursive-doubling"
    return "rabenseifner"


def choose_composition(n: int, ranks_per_node: int) -> str:
    """ch4's composition of a blocking allreduce (commutative op): alpha, beta or gamma.

    ``maint/tuning/coll/ch4/generic.json``: ``comm_size=node_comm_size`` (one
    node) -> gamma; a parent communicator (some node holds several ranks:
    ``MPIR_Comm_commit`` creates the node and node-roots subcommunicators when
    ``num_external != local_size``, ``src/mpi/comm/commutil.c``) -> alpha; else
    beta (the netmod's allreduce on every rank).
    """
    g = max(1, int(ranks_per_node))
    if n <= 1 or g == 1:
        return "beta"
    return "gamma" if n <= g else "alpha"


def choose_reduce(nbytes: float, n: int, itemsize: int = 4) -> str:
    """MPIR's MPI_Reduce (commutative built-in op) on ``n`` ranks (``collective=reduce``)."""
    if nbytes <= REDUCE_SHORT_MSG_BYTES or nbytes / itemsize < _pof2(n):
        return "binomial"
    return "reduce-scatter-gather"


def choose_bcast(nbytes: float, n: int) -> str:
    """MPIR's MPI_Bcast on ``n`` ranks (``collective=bcast`` of ``coll_selection.json``)."""
    if n < BCAST_MIN_PROCS or nbytes <= BCAST_SHORT_MSG_BYTES:
        return "binomial"
    if n == _pof2(n) and nbytes <= BCAST_MEDIUM_MSG_BYTES:
        return "scatter-recursive-doubling-allgather"
    return "scatter-ring-allgather"


def _masks(n: int) -> list[int]:
    """1, 2, 4, ... below n: the steps of a binomial tree on n ranks."""
    return [1 << i for i in range(max(n - 1, 0).bit_length())]


def allreduce_phases(nbytes: float, n: int, algorithm: str = "auto", itemsize: int = 4, *,
                     nonblocking: bool = False, ranks_per_node: int = 1) -> list[Phase]:
    """The phases of an allreduce of ``nbytes`` on ``n`` ranks, ``ranks_per_node`` to a node.

    Rank r is on node r // ranks_per_node (:meth:`.engine.Network.host_of`).
    ``nonblocking``: MPI_Iallreduce, which ch4 hands to the netmod on every
    rank (``MPID_Iallreduce`` -> ``MPIR_Iallreduce_impl``): flat, chosen by
    :func:`choose_iallreduce`. Blocking: composition alpha with several ranks
    on each of several nodes (:func:`node_aware_phases`), else the flat
    algorithm on the ``n`` ranks (beta; gamma too, which under
    MPI_THREAD_MULTIPLE falls back to ``MPIR_Allreduce_impl`` on the node).
    ``algorithm`` other than ``auto`` is the flat or node roots' algorithm.
    """
    if n <= 1 or nbytes <= 0:
        return []
    if not nonblocking and choose_composition(n, ranks_per_node) == "alpha":
        return node_aware_phases(nbytes, n, algorithm, itemsize, ranks_per_node)
    if algorithm == "auto":
        choose = choose_iallreduce if nonblocking else choose_allreduce
        algorithm = choose(nbytes, n, itemsize)
    return flat_allreduce_phases(nbytes, n, algorithm)


def _ring(nbytes: float, n: int, stride: int) -> list[Phase]:
    """MPICH's ring: a reduce-scatter then an allgather, 2 (n - 1) shifts of nbytes / n."""
    return [Phase("shift", 1, n, nbytes / n, repeat=2 * (n - 1), stride=stride)]


def _recursive_doubling(nbytes: float, n: int, stride: int) -> list[Phase]:
    """log2(pof2) exchanges of the whole vector with the partner at distance 2^i."""
    steps = _pof2(n).bit_length() - 1
    return [Phase("xor", 1 << i, n, nbytes, stride=stride) for i in range(steps)]


def _rabenseifner(nbytes: float, n: int, stride: int) -> list[Phase]:
    """Reduce-scatter by recursive halving, then allgather by recursive doubling."""
    steps = _pof2(n).bit_length() - 1
    halving = [Phase("xor", 1 << i, n, nbytes / (2 << i), stride=stride) for i in range(steps)]
    return halving + halving[::-1]


#: The flat allreduce algorithms simulated, by name: the phases on the power-of-two
#: ranks (recursive ones) or all ranks (ring). A new one is a function and a line here;
#: ``--allreduce`` offers every key, and :data:`MPICH_NAMES` maps MPICH's leaf to it.
FLAT_ALLREDUCE: dict[str, Callable[[float, int, int], list[Phase]]] = {
    "ring": _ring, "recursive-doubling": _recursive_doubling, "rabenseifner": _rabenseifner,
}
#: Algorithms that run on all n ranks (no fold to a power of two first).
ALL_RANKS_ALLREDUCE = frozenset({"ring"})
ALLREDUCE_ALGORITHMS = ("auto", *FLAT_ALLREDUCE)


def flat_allreduce_phases(nbytes: float, n: int, algorithm: str, stride: int = 1) -> list[Phase]:
    """``algorithm`` (not ``auto``) on ``n`` ranks numbered 0, stride, 2 stride, ...

    Off a power of two, the recursive algorithms first fold the n - pof2 extra
    ranks into partners and unfold them at the end, as MPICH's recursive-doubling
    and reduce-scatter-allgather allreduces do.
    """
    if n <= 1 or nbytes <= 0:
        return []
    body = FLAT_ALLREDUCE.get(algorithm)
    if body is None:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    if algorithm in ALL_RANKS_ALLREDUCE or n == _pof2(n):
        return body(nbytes, n, stride)
    return ([Phase("fold", 0, n, nbytes, stride=stride)] + body(nbytes, n, stride)
            + [Phase("unfold", 0, n, nbytes, stride=stride)])


def node_aware_phases(nbytes: float, n: int, algorithm: str, itemsize: int,
                      ranks_per_node: int) -> list[Phase]:
    """Composition alpha (``MPIDI_Allreduce_intra_composition_alpha``, ``ch4_coll_impl.h``).

    An MPI_Reduce to each node's first rank on the node communicator, the
    netmod's allreduce among the M = ceil(n / G) node roots (ranks 0, G, 2G,
    ...), an MPI_Bcast from each node's first rank. syncbench starts MPI at
    MPI_THREAD_MULTIPLE (mpi4py's default level, ``bench/runtime.start_mpi``),
    and the POSIX release-gather reduce and bcast are only chosen with
    ``is_multi_threaded=no`` (``src/mpid/ch4/shm/posix/posix_coll.h`` falls
    back to ``MPIR_Reduce_impl`` / ``MPIR_Bcast_impl``), so the node's parts
    are MPIR's algorithms over shared-memory messages, on the loopback link.
    A last node with fewer ranks follows the full nodes' steps without its
    missing ranks.
    """
    g = max(1, int(ranks_per_node))
    roots = -(-n // g)
    if algorithm == "auto":
        algorithm = choose_allreduce(nbytes, roots, itemsize)
    return (node_reduce_phases(nbytes, n, g, itemsize)
            + flat_allreduce_phases(nbytes, roots, algorithm, stride=g)
            + node_bcast_phases(nbytes, n, g))


def node_reduce_phases(nbytes: float, n: int, g: int, itemsize: int = 4) -> list[Phase]:
    """MPI_Reduce to rank 0 of every node of ``g`` ranks, as :func:`choose_reduce` picks it.

    Binomial (``reduce_intra_binomial.c``): ceil(log2 g) steps, rank r sending
    all to r - m. Reduce-scatter-gather (``reduce_intra_reduce_scatter_gather.c``):
    fold (odd ranks < 2r to their left neighbour), recursive halving (S/2,
    S/4, ...), then a binomial gather of the halves to rank 0 (..., S/4, S/2).
    """
    if g <= 1 or nbytes <= 0:
        return []
    if choose_reduce(nbytes, g, itemsize) == "binomial":
        return [Phase("tree-up", m, n, nbytes, block=g) for m in _masks(g)]
    pof2 = _pof2(g)
    steps = pof2.bit_length() - 1
    fold = [Phase("fold", 0, n, nbytes, block=g)] if g != pof2 else []
    halving = [Phase("xor", 1 << i, n, nbytes / (2 << i), block=g) for i in range(steps)]
    gather = [Phase("halves-in", 1 << i, n, nbytes / (2 << i), block=g)
              for i in reversed(range(steps))]
    return fold + halving + gather


def node_bcast_phases(nbytes: float, n: int, g: int) -> list[Phase]:
    """MPI_Bcast from rank 0 of every node of ``g`` ranks, as :func:`choose_bcast` picks it.

    Binomial (``bcast_intra_binomial.c``): ceil(log2 g) steps of S, the largest
    subtree first. Scatter + allgather (``bcast_intra_scatter_ring_allgather.c``,
    ``..._recursive_doubling_allgather.c``): a binomial scatter of S/g chunks
    (a step's largest flow carries min(m, g - m) chunks), then a ring (g - 1
    steps of S/g) or recursive doubling (m chunks at step m).
    """
    if g <= 1 or nbytes <= 0:
        return []
    algorithm = choose_bcast(nbytes, g)
    down = _masks(g)[::-1]
    if algorithm == "binomial":
        return [Phase("tree-down", m, n, nbytes, block=g) for m in down]
    chunk = nbytes / g
    scatter = [Phase("tree-down", m, n, min(m, g - m) * chunk, block=g) for m in down]
    if algorithm == "scatter-ring-allgather":
        return scatter + [Phase("shift", 1, n, chunk, repeat=g - 1, block=g)]
    return scatter + [Phase("xor", m, n, m * chunk, block=g) for m in _masks(g)]


def allreduce_cost_terms(nbytes: float, n: int, algorithm: str = "auto") -> tuple[float, float]:
    """(k_L, k_B): the allreduce costs k_L latencies + k_B * nbytes / bandwidth, uncontended."""
    phases = allreduce_phases(nbytes, n, algorithm)
    k_l = float(sum(p.repeat for p in phases))
    k_b = float(sum(p.repeat * p.nbytes for p in phases)) / max(nbytes, 1.0)
    return k_l, k_b


def allreduce_link_terms(nbytes: float, n: int, nodes: int = 0) -> tuple[float, float]:
    """(k_L, k_B) of the part of MPICH's allreduce on ``n`` ranks that crosses node links.

    With one rank per node (``nodes`` = n, or 0: unknown) or every rank on one
    node, the flat algorithm on ``n`` ranks. With several ranks on each of
    several nodes, MPICH 4-5's ch4 runs ``MPIDI_Allreduce_intra_composition_alpha``
    for a commutative op on a parent communicator (``maint/tuning/coll/ch4/generic.json``;
    ``src/mpid/ch4/src/ch4_coll_impl.h``): a shared-memory reduce to each node's
    first rank, the netmod allreduce among the ``nodes`` node roots, a shared-memory
    bcast back. Only the middle one crosses the links: 2(M-1)/M x nbytes per node
    for M nodes (measured: 4 ranks on 2 nodes move nbytes each way per iteration,
    not the 1.5 x nbytes of a flat 4-rank ring).
    """
    ranks = nodes if 1 < nodes < n else n
    return allreduce_cost_terms(nbytes, ranks)


#: Simulated seconds of one phase (the network's clock, :meth:`.engine.Network.phase`).
PhaseClock = Callable[[Phase], float]


def cost(phases: Sequence[Phase], time_phase: PhaseClock) -> float:
    """Simulated seconds of a list of phases run one after the other."""
    return float(sum(time_phase(p) * p.repeat for p in phases))


@dataclass(frozen=True)
class PlacedClock:
    """A phase clock that also says how ranks sit on nodes: ``ranks_per_node`` consecutive ranks.

    What :mod:`.run` hands to the strategies, so that :func:`allreduce_time`
    composes a node-aware allreduce without the strategies knowing the platform.
    ``burst``: bytes of a token bucket on every link (``--link-burst``; 0: none), which
    a blocking collective after a compute phase finds full (:func:`burst_stages`).
    ``segment``: bytes of a flow one progress call moves (0: a transfer once issued runs
    on its own, as over RDMA; :func:`.progress.allreduce_stages`).
    """

    time: PhaseClock
    ranks_per_node: int = 1
    burst: float = 0.0
    segment: float = 0.0

    def __call__(self, phase: Phase) -> float:
        return self.time(phase)


def placed_phases(nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
                  itemsize: int = 4, nonblocking: bool = False) -> list[Phase]:
    """The phases of an MPI_Allreduce (``nonblocking``: MPI_Iallreduce, whose algorithm
    MPICH chooses apart) of ``nbytes``, on the ranks per node of ``time_phase`` (a
    :class:`PlacedClock`; 1 for a plain function)."""
    ranks_per_node = int(getattr(time_phase, "ranks_per_node", 1) or 1)
    return allreduce_phases(nbytes, n, algorithm, itemsize, nonblocking=nonblocking,
                            ranks_per_node=ranks_per_node)


def allreduce_time(nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
                   itemsize: int = 4, burst: float | None = None) -> float:
    """Simulated seconds of a blocking allreduce of ``nbytes``: its phases one after the
    other (:func:`placed_phases`), less what the links' token buckets pass at once
    (:func:`burst_stages`; ``burst`` None: the clock's, 0: a bucket another collective
    has just spent)."""
    phases = placed_phases(nbytes, n, algorithm, time_phase, itemsize)
    burst = burst_of(time_phase) if burst is None else burst
    return float(sum(burst_stages(phases, time_phase, burst)))


def refill_rate(phases: Sequence[Phase], time_phase: PhaseClock) -> float:
    """Bytes per second a link's token bucket refills at, taken as the wire's rate: the
    first phase of ``phases`` that crosses a link, its bytes over its time less a 1-byte
    message's (0: no phase crosses one)."""
    for phase in phases:
        if phase.nbytes > 0 and phase.block <= 0:
            wire = time_phase(phase) - time_phase(dataclasses.replace(phase, nbytes=1.0))
            return phase.nbytes / wire if wire > 0 else 0.0
    return 0.0


class RefilledAllreduce:
    """A blocking allreduce's seconds after the links were idle for a while.

    A ``tc tbf`` bucket refills at the link's rate, so after ``idle`` seconds without
    traffic it holds ``min(burst, idle x rate)`` bytes, not always ``burst``: a
    940 KB Allreduce every 1.5 ms (mlp, 2 emulated nodes at 1 Gbit/s, a 256 KB bucket,
    2.1 ms to refill) took 6.2-6.4 ms a step, against 5.7 predicted with the bucket full
    (docs/RESULTS.md). The seconds come from :func:`burst_stages`, memoised per KiB of
    credit."""

    def __init__(self, nbytes: float, n: int, algorithm: str, time_phase: PhaseClock,
                 itemsize: int = 4) -> None:
        self.phases = placed_phases(nbytes, n, algorithm, time_phase, itemsize)
        self.time_phase = time_phase
        self.burst = burst_of(time_phase)
        self.rate = refill_rate(self.phases, time_phase) if self.burst > 0 else 0.0
        self._seconds: dict[int, float] = {}

    def credit(self, idle: float) -> float:
        """Bytes in the bucket after ``idle`` seconds (inf: a bucket idle for long)."""
        if self.burst <= 0 or self.rate <= 0 or idle >= math.inf:
            return self.burst
        return min(self.burst, max(0.0, idle) * self.rate)

    def __call__(self, idle: float = math.inf) -> float:
        credit = self.credit(idle)
        # a full bucket is its own key; a partial one is taken to the nearest KiB below it
        key = -1 if credit >= self.burst else int(credit // 1024)
        if key not in self._seconds:
            credit = self.burst if key < 0 else key * 1024.0
            self._seconds[key] = float(sum(burst_stages(self.phases, self.time_phase, credit)))
        return self._seconds[key]


def segment_of(time_phase: PhaseClock) -> float:
    """Bytes of a flow one progress call moves (:class:`PlacedClock`'s ``segment``; 0: no
    limit)."""
    return float(getattr(time_phase, "segment", 0.0) or 0.0)


def burst_of(time_phase: PhaseClock) -> float:
    """Bytes of the links' token bucket (:class:`PlacedClock`'s ``burst``; 0: none)."""
    return float(getattr(time_phase, "burst", 0.0) or 0.0)


def burst_stages(phases: Sequence[Phase], time_phase: PhaseClock, burst: float) -> list[float]:
    """Seconds of each stage of ``phases`` (a phase's repeats one stage each) run after an
    idle spell on links shaped by a token bucket of ``burst`` bytes.

    A bucket full after a compute phase lets its bytes through at the wire's own speed
    (the emulated cluster's ``tc tbf``, ``syncbench cluster up --burst``; a cloud NIC's
    burst credits), and while a flow drains it faster than the rate it refills, so only
    the first stages gain: a stage whose flows send ``b`` bytes with ``c`` of credit left
    loses ``min(c, b) / b`` of its time on the wire (its time less that of a 1-byte
    message), and ``c`` falls by ``min(c, b)``; a node-local phase spends none. Measured
    on 2 emulated nodes at 1 Gbit/s (a 256 KB bucket): a 940 KB blocking Allreduce after
    compute took 5.96 ms, against 8.07 predicted from the back-to-back calibration
    (docs/RESULTS.md). Assumes the bucket refilled while the ranks computed (``burst`` /
    rate: 2.1 ms on the cluster; :class:`RefilledAllreduce` gives a shorter idle spell
    its share of the bucket)."""
    credit, out = max(0.0, burst), []
    for phase in phases:
        seconds = time_phase(phase)
        for _ in range(phase.repeat):
            # a node-local phase (``block``) crosses no shaped link and spends no credit
            free = min(credit, phase.nbytes) if phase.nbytes > 0 and phase.block <= 0 else 0.0
            if free > 0:  # the bytes' share of the stage, not its latency (a 1-byte one's)
                latency = time_phase(dataclasses.replace(phase, nbytes=1.0))
                wire = max(0.0, seconds - latency)
                out.append(seconds - wire * free / phase.nbytes)
            else:
                out.append(seconds)
            credit -= free
    return out


#: Most shift permutations sampled for a large all-to-all.
MAX_SHIFTS = 6


def _log_shifts(n: int) -> list[int]:
    """Up to ``MAX_SHIFTS`` log-spaced shifts from 1 to N/2, and N - 1."""
    powers, s = [], 1
    while s <= n // 2:
        powers.append(s)
        s *= 2
    if len(powers) > MAX_SHIFTS - 1:
        step = (len(powers) - 1) / (MAX_SHIFTS - 2)
        powers = [powers[round(i * step)] for i in range(MAX_SHIFTS - 1)]
    return sorted(set(powers) | {n - 1})


def weighted_cost(phases: Sequence[tuple[Phase, float]], time_phase: PhaseClock) -> float:
    return float(sum(w * time_phase(p) * p.repeat for p, w in phases))


def powers_of_two_upto(n: int) -> list[int]:
    """1, 2, 4, ..., and n itself."""
    out = [1 << i for i in range(int(math.log2(max(n, 1))) + 1)]
    return out if out[-1] == n else out + [n]
