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
switched at ``MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`` = 2048 bytes). Measured
with MPICH 5.0.2 across two emulated nodes: 8 bytes take one exchange
(P50 11 us), 16 bytes two (21 us). The ring (2(N-1) steps of S/N bytes to the
next rank) is selectable, as with ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring``.
For N not a power of two both fold the first 2r ranks in pairs
(r = N - pof2) before and unfold them after, as MPICH does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ALLREDUCE_ALGORITHMS = ("auto", "ring", "recursive-doubling", "rabenseifner")
#: Largest message MPICH 4-5 reduce by recursive doubling whatever N (``avg_msg_size<=8``).
SHORT_MSG_BYTES = 8
#: Largest N for which an all-to-all is simulated flow by flow.
ALLTOALL_EXACT_MAX = 64
#: Bytes of one fetch-and-op on the version counter.
COUNTER_BYTES = 8


@dataclass(frozen=True)
class Phase:
    """Every pair of :meth:`pairs` sends ``nbytes`` at once, ``repeat`` times in a row."""

    pattern: str  # shift | xor | fold | unfold | alltoall | gather | scatter
    arg: int
    n: int
    nbytes: float
    repeat: int = 1
    active: int = 0  # ranks taking part (0: all), evenly spread (ASGD's concurrency)

    def key(self) -> tuple:
        return (self.pattern, self.arg, self.n, self.active)

    def pairs(self) -> list[tuple[int, int]]:
        n, a = self.n, self.arg
        if self.pattern == "shift":
            return [(i, (i + a) % n) for i in _spread(n, self.active)]
        if self.pattern in ("xor", "fold", "unfold"):
            pof2 = 1 << (n.bit_length() - 1)
            rem = n - pof2
            if self.pattern == "fold":
                return [(2 * i + 1, 2 * i) for i in range(rem)]
            if self.pattern == "unfold":
                return [(2 * i, 2 * i + 1) for i in range(rem)]
            real = [2 * i if i < rem else i + rem for i in range(pof2)]
            return [(real[i], real[i ^ a]) for i in range(pof2)]
        if self.pattern == "alltoall":
            ranks = _spread(n, self.active)
            return [(i, j) for i in ranks for j in range(n) if j != i]
        if self.pattern == "gather":  # every active rank -> rank a
            return [(i, a) for i in _spread(n, self.active, skip=a) if i != a]
        if self.pattern == "scatter":  # rank a -> every active rank
            return [(a, i) for i in _spread(n, self.active, skip=a) if i != a]
        raise ValueError(f"unknown phase pattern {self.pattern!r}")


def _spread(n: int, active: int, skip: int = -1) -> list[int]:
    """``active`` ranks evenly spread over 0..n-1 (all when 0 or >= n), avoiding ``skip``."""
    if active <= 0 or active >= n:
        return list(range(n))
    ranks = sorted({(k * n) // active for k in range(active)})
    return [r if r != skip else (r + 1) % n for r in ranks]


def choose_allreduce(nbytes: float, n: int, itemsize: int = 4) -> str:
    """MPICH's default choice for a commutative SUM of ``nbytes`` on ``n`` ranks."""
    pof2 = 1 << (max(n, 1).bit_length() - 1)
    if nbytes <= SHORT_MSG_BYTES or nbytes / itemsize < pof2:
        return "recursive-doubling"
    return "rabenseifner"


def allreduce_phases(nbytes: float, n: int, algorithm: str = "auto",
                     itemsize: int = 4) -> list[Phase]:
    """The phases of an allreduce of ``nbytes`` on ``n`` ranks."""
    if n <= 1 or nbytes <= 0:
        return []
    if algorithm == "auto":
        algorithm = choose_allreduce(nbytes, n, itemsize)
    if algorithm == "ring":
        return [Phase("shift", 1, n, nbytes / n, repeat=2 * (n - 1))]
    pof2 = 1 << (n.bit_length() - 1)
    fold = [Phase("fold", 0, n, nbytes)] if n != pof2 else []
    unfold = [Phase("unfold", 0, n, nbytes)] if n != pof2 else []
    steps = pof2.bit_length() - 1
    if algorithm == "recursive-doubling":
        body = [Phase("xor", 1 << i, n, nbytes) for i in range(steps)]
    elif algorithm == "rabenseifner":
        halving = [Phase("xor", 1 << i, n, nbytes / (2 << i)) for i in range(steps)]
        doubling = [Phase("xor", 1 << i, n, nbytes / (2 << i)) for i in reversed(range(steps))]
        body = halving + doubling
    else:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    return fold + body + unfold


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


PhaseTimer = Callable[[Phase], float]


def cost(phases: Sequence[Phase], time_phase: PhaseTimer) -> float:
    """Simulated seconds of a list of phases run one after the other."""
    return float(sum(time_phase(p) * p.repeat for p in phases))


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


def weighted_cost(phases: Sequence[tuple[Phase, float]], time_phase: PhaseTimer) -> float:
    return float(sum(w * time_phase(p) * p.repeat for p, w in phases))


def powers_of_two_upto(n: int) -> list[int]:
    """1, 2, 4, ..., and n itself."""
    out = [1 << i for i in range(int(math.log2(max(n, 1))) + 1)]
    return out if out[-1] == n else out + [n]
