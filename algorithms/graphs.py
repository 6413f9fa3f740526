"""Communication graphs of decentralized SGD, their mixing matrices and spectral gaps.

A graph of N ranks is a mixing matrix W: rank i's next model is ``sum_j W_ij x_j``, so
rank i receives from the ranks j != i with ``W_ij > 0`` (its *sources*) and sends to the
ranks k with ``W_ki > 0`` (its *destinations*), exactly the two lists that
``MPI_Dist_graph_create_adjacent`` takes. A time-varying graph is a cycle of such
matrices, W^(t mod T) at step t. No MPI here: the simulator, the flag checks and the
unit tests build graphs without it.

Graphs (``--graph``):

- ``ring``: i <-> i +- 1 (mod N), undirected.
- ``torus`` / ``torus:RxC``: the 2-D torus of R rows and C columns (R*C = N; ``torus``
  alone takes the most square factorisation with R, C >= 2), i <-> its four neighbours.
- ``exp``: the static exponential graph of Ying et al. (NeurIPS 2021, arXiv 2110.13363,
  eq. (3)): rank i receives from i + 2^k (mod N), k = 0 .. tau-1, tau = ceil(log2 N),
  each weight 1/(tau+1) (directed, circulant: doubly stochastic). As Bluefog's
  ``topology_util.ExponentialTwoGraph``.
- ``onepeer-exp``: the one-peer exponential graph (ibid., eq. (5)): at step t rank i
  averages with i + 2^(t mod tau) only, weights 1/2; over tau steps the product of the
  matrices is the exact average when N is a power of two (ibid., Lemma 1).
- a file: one undirected edge per line, ``i j`` or ``i j w`` (W_ij = W_ji = w; every edge
  weighted or none), ``#`` comments; W_ii = 1 - sum_j W_ij.

Undirected graphs without weights get Metropolis-Hastings weights (Xiao and Boyd 2004,
"Fast linear iterations for distributed averaging"; Bluefog's default):
``W_ij = 1 / (1 + max(d_i, d_j))`` on an edge, ``W_ii = 1 - sum_j W_ij``, symmetric and
doubly stochastic for any connected graph. Every graph is validated (ranks in range,
non-negative weights, rows and columns summing to 1, connected) with one-line errors.

The spectral gap is ``1 - ||W - J||_2`` (J = 11^T/N): the rate at which gossip contracts
the disagreement ``x - x_bar`` (Lian et al. 2017, rho; for symmetric W the second largest
eigenvalue magnitude), and of the cycle's product for a time-varying graph. Ring, torus
and the exponential graphs are circulant on a 1-D or 2-D grid, so W is diagonalised by
the discrete Fourier transform and the gap needs no dense matrix (16,384 ranks and more).
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The named graphs of ``--graph`` (else a file's path; ``torus:RxC`` also names one).
GRAPHS = ("ring", "torus", "exp", "onepeer-exp")

#: Tolerance of the doubly-stochastic check (weights from a file are decimal text).
STOCHASTIC_TOL = 1e-9


@dataclass(frozen=True)
class Mixing:
    """One mixing matrix W over ``size`` ranks, row by row: ``rows[i]`` maps each source
    j != i of rank i to W_ij; ``self_weights[i]`` is W_ii.

    ``stencil``/``grid``: for a graph circulant on a grid (ring, torus, exponential),
    W_ij = ``stencil[offset]`` where j = i + offset on the grid, which gives the spectrum
    by the DFT; None for a graph read from a file.
    """

    size: int
    rows: tuple[dict[int, float], ...]
    self_weights: tuple[float, ...]
    stencil: dict[tuple[int, ...], float] | None = None
    grid: tuple[int, ...] | None = None

    def sources(self, rank: int) -> list[int]:
        """The ranks whose models rank ``rank`` receives, ascending."""
        return sorted(self.rows[rank])

    def weights(self, rank: int) -> list[float]:
        """W_ij of :meth:`sources`, in their order."""
        row = self.rows[rank]
        return [row[j] for j in self.sources(rank)]

    def destinations(self, rank: int) -> list[int]:
        """The ranks that receive rank ``rank``'s model, ascending."""
        return [k for k in range(self.size) if rank in self.rows[k]]

    def matrix(self) -> np.ndarray:
        """W as a dense float64 matrix (small N: tests and file graphs)."""
        w = np.diag(np.asarray(self.self_weights, dtype=np.float64))
        for i, row in enumerate(self.rows):
            for j, value in row.items():
                w[i, j] = value
        return w

    def eigenvalues(self) -> np.ndarray:
        """The eigenvalues of a circulant W, one per grid frequency (by the DFT).

        For j = i + o, ``(W x)_i = sum_o s_o x_{i+o}``, so the Fourier mode k has
        eigenvalue ``sum_o s_o exp(2 pi i k.o / n)``.
        """
        if self.stencil is None or self.grid is None:
            raise ValueError("eigenvalues by the DFT need a circulant graph")
        kernel = np.zeros(self.grid, dtype=np.float64)
        for offset, weight in self.stencil.items():
            kernel[tuple(-o % n for o, n in zip(offset, self.grid, strict=True))] += weight
        # fftn(kernel)[k] = sum_m kernel[m] e^{-2 pi i k.m/n}, with m = -o: the eigenvalue
        return np.fft.fftn(kernel)


@dataclass(frozen=True)
class GraphSchedule:
    """The mixing matrix of every step: ``cycle[t % len(cycle)]`` at step t."""

    name: str
    cycle: tuple[Mixing, ...]

    @property
    def size(self) -> int:
        return self.cycle[0].size

    def at(self, step: int) -> Mixing:
        """W at step ``step``."""
        return self.cycle[step % len(self.cycle)]

    def spectral_gap(self) -> float:
        """``1 - ||W_{T-1} ... W_0 - J||_2`` (T = 1 for a static graph)."""
        return spectral_gap(self.cycle)


# -- the named graphs -------------------------------------------------------------------


def circulant(size: int, grid: tuple[int, ...], stencil: dict[tuple[int, ...], float]) -> Mixing:
    """The circulant W on ``grid`` (rank = row-major index) with W_ij = stencil[j - i]."""
    merged: dict[tuple[int, ...], float] = {}
    for offset, weight in stencil.items():  # offsets equal modulo the grid are one edge
        key = tuple(o % n for o, n in zip(offset, grid, strict=True))
        merged[key] = merged.get(key, 0.0) + weight
    index = np.arange(size).reshape(grid)
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    selfs = [0.0] * size
    for offset, weight in merged.items():
        # target[c] = the rank at c + offset on the grid (np.roll by -offset)
        target = np.roll(index, tuple(-o for o in offset), axis=tuple(range(len(grid))))
        for i, j in enumerate(target.ravel().tolist()):
            if j == i:
                selfs[i] += weight
            else:
                rows[i][j] = rows[i].get(j, 0.0) + weight
    return Mixing(size, tuple(rows), tuple(selfs), merged, grid)


def metropolis_hastings(size: int, edges: set[tuple[int, int]]) -> Mixing:
    """Metropolis-Hastings weights of the undirected graph ``edges`` (pairs i < j)."""
    degree = [0] * size
    for i, j in edges:
        degree[i] += 1
        degree[j] += 1
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    for i, j in edges:
        w = 1.0 / (1 + max(degree[i], degree[j]))
        rows[i][j] = rows[j][i] = w
    return Mixing(size, tuple(rows), tuple(1.0 - math.fsum(r.values()) for r in rows))


def _regular_mh(size: int, grid: tuple[int, ...], offsets: list[tuple[int, ...]]) -> Mixing:
    """A regular undirected circulant graph: its distinct neighbours' offsets, each with the
    Metropolis-Hastings weight 1/(1 + degree) (every degree equal)."""
    distinct = {tuple(o % n for o, n in zip(off, grid, strict=True)) for off in offsets}
    distinct.discard(tuple(0 for _ in grid))
    weight = 1.0 / (1 + len(distinct))
    stencil = {off: weight for off in distinct}
    stencil[tuple(0 for _ in grid)] = 1.0 - weight * len(distinct)
    return circulant(size, grid, stencil)


def ring(size: int) -> Mixing:
    """i <-> i +- 1 (mod N), Metropolis-Hastings weights (1/3 each; 1/2 at N = 2)."""
    return _regular_mh(size, (size,), [(1,), (-1,)])


def torus_shape(size: int, shape: str = "") -> tuple[int, int]:
    """(R, C) of ``torus`` (the most square R*C = N with R, C >= 2) or ``torus:RxC``."""
    if shape:
        try:
            r, c = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise ValueError(f"--graph torus:{shape}: expected torus:RxC, e.g. torus:4x4") from None
        if r < 1 or c < 1 or r * c != size:
            raise ValueError(f"--graph torus:{shape} does not fit {size} ranks (R*C must be "
                             f"{size})")
        return r, c
    r = max((d for d in range(2, math.isqrt(size) + 1) if size % d == 0), default=0)
    if r == 0:
        raise ValueError(f"--graph torus does not fit {size} ranks (no R x C = {size} with "
                         f"R, C >= 2); use torus:1x{size}, ring or exp")
    return r, size // r


def torus(size: int, shape: str = "") -> Mixing:
    """The 2-D torus, i <-> up, down, left, right, Metropolis-Hastings weights (1/5 each
    when R, C >= 3; a side of 2 has one neighbour along it)."""
    r, c = torus_shape(size, shape)
    return _regular_mh(size, (r, c), [(1, 0), (-1, 0), (0, 1), (0, -1)])


def exp_tau(size: int) -> int:
    """tau = ceil(log2 N): the exponential graph's out-degree (0 at N = 1)."""
    return (size - 1).bit_length()


def exponential(size: int) -> Mixing:
    """Static exponential graph: W_ij = 1/(tau+1) for j = i + 2^k, k < tau, and j = i."""
    tau = exp_tau(size)
    stencil = {(0,): 1.0 / (tau + 1)}
    for k in range(tau):
        stencil[(2 ** k,)] = 1.0 / (tau + 1)
    return circulant(size, (size,), stencil)


def one_peer_exponential(size: int) -> tuple[Mixing, ...]:
    """The one-peer exponential cycle: W^(t)_ij = 1/2 for j = i + 2^(t mod tau) and j = i."""
    tau = exp_tau(size)
    if tau == 0:
        return (circulant(size, (size,), {(0,): 1.0}),)
    return tuple(circulant(size, (size,), {(0,): 0.5, (2 ** k,): 0.5}) for k in range(tau))


def one_peer_offset(step: int, size: int) -> int:
    """The one-peer exponential graph's offset at ``step``: 2^(step mod tau) (0 at N = 1)."""
    tau = exp_tau(size)
    return 2 ** (step % tau) if tau else 0


# -- a graph from a file ------------------------------------------------------------------


def read_graph_file(path: str | Path, size: int) -> Mixing:
    """The undirected graph of a file (see the module's docstring) over ``size`` ranks."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--graph {path}: cannot read it ({exc.strerror or exc})") from None
    edges: dict[tuple[int, int], float | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        i, j, w = _edge(path, number, line, size)
        key = (min(i, j), max(i, j))
        if key in edges:
            raise ValueError(f"--graph {path}:{number}: edge {i} {j} is listed twice")
        edges[key] = w
    if not edges and size > 1:
        raise ValueError(f"--graph {path}: no edges")
    weighted = {w is not None for w in edges.values()}
    if len(weighted) > 1:
        raise ValueError(f"--graph {path}: give a weight on every edge or on none")
    if weighted != {True}:
        return metropolis_hastings(size, set(edges))
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    for (i, j), w in edges.items():
        rows[i][j] = rows[j][i] = float(w)
    return Mixing(size, tuple(rows), tuple(1.0 - math.fsum(r.values()) for r in rows))


def _edge(path: str | Path, number: int, line: list[str],
          size: int) -> tuple[int, int, float | None]:
    where = f"--graph {path}:{number}"
    if len(line) not in (2, 3):
        raise ValueError(f"{where}: expected 'i j' or 'i j weight', got {' '.join(line)!r}")
    try:
        i, j = int(line[0]), int(line[1])
        w = float(line[2]) if len(line) == 3 else None
    except ValueError:
        raise ValueError(f"{where}: not numbers: {' '.join(line)!r}") from None
    for r in (i, j):
        if not 0 <= r < size:
            raise ValueError(f"{where}: rank {r} is out of range for {size} ranks")
    if i == j:
        raise ValueError(f"{where}: a self-loop {i} {i} (W_ii is 1 - the row's other weights)")
    if w is not None and not (w > 0 and math.isfinite(w)):
        raise ValueError(f"{where}: weight {line[2]} must be positive")
    return i, j, w


# -- validation and the spectral gap --------------------------------------------------------


def validate(mixing: Mixing, label: str) -> None:
    """Raise ``ValueError`` (one line) unless W is doubly stochastic with non-negative
    entries."""
    n = mixing.size
    cols = np.zeros(n)
    for i, row in enumerate(mixing.rows):
        own = mixing.self_weights[i]
        if own < -STOCHASTIC_TOL or any(w < 0 for w in row.values()):
            raise ValueError(f"--graph {label}: weights are not doubly stochastic (rank {i}'s "
                             f"weights sum to {math.fsum(row.values()):.6g} > 1)")
        total = own + math.fsum(row.values())
        if abs(total - 1.0) > STOCHASTIC_TOL:
            raise ValueError(f"--graph {label}: weights are not doubly stochastic (row {i} "
                             f"sums to {total:.12g})")
        cols[i] += own
        for j, w in row.items():
            if not 0 <= j < n:
                raise ValueError(f"--graph {label}: rank {j} is out of range for {n} ranks")
            cols[j] += w
    worst = int(np.argmax(np.abs(cols - 1.0))) if n else 0
    if n and abs(cols[worst] - 1.0) > STOCHASTIC_TOL:
        raise ValueError(f"--graph {label}: weights are not doubly stochastic (column "
                         f"{worst} sums to {cols[worst]:.12g})")


def check_connected(cycle: tuple[Mixing, ...], label: str) -> None:
    """Raise ``ValueError`` unless every rank reaches every other over the union of the
    cycle's edges (information from each rank reaches all: the product is eventually
    positive, so gossip converges to the average)."""
    n = cycle[0].size
    succ: list[set[int]] = [set() for _ in range(n)]
    for mixing in cycle:
        for i, row in enumerate(mixing.rows):
            for j, w in row.items():
                if w > 0:
                    succ[j].add(i)  # x_j flows to i
    for adjacency in (succ, _reversed(succ)):
        seen = {0}
        todo = deque([0])
        while todo:
            for k in adjacency[todo.popleft()] - seen:
                seen.add(k)
                todo.append(k)
        if len(seen) != n:
            missing = min(set(range(n)) - seen)
            raise ValueError(f"--graph {label}: the graph is disconnected (rank {missing} is "
                             f"not reached from rank 0)")


def _reversed(succ: list[set[int]]) -> list[set[int]]:
    pred: list[set[int]] = [set() for _ in succ]
    for j, targets in enumerate(succ):
        for i in targets:
            pred[i].add(j)
    return pred


def spectral_gap(cycle: tuple[Mixing, ...] | list[Mixing]) -> float:
    """``1 - ||W_{T-1} ... W_0 - J||_2``: by the DFT when every matrix is circulant on the
    same grid (their product's eigenvalues are the products of theirs; circulants are
    normal, so the norm is the largest magnitude over the non-zero frequencies), else
    dense."""
    cycle = list(cycle)
    n = cycle[0].size
    if n == 1:
        return 1.0
    grids = {m.grid for m in cycle}
    if all(m.stencil is not None for m in cycle) and len(grids) == 1:
        product = np.ones(cycle[0].grid, dtype=np.complex128)
        for mixing in cycle:
            product *= mixing.eigenvalues()
        magnitudes = np.abs(product).ravel()
        rho = float(magnitudes[1:].max())  # frequency 0 (all-ones) is the average
    else:
        product = np.eye(n)
        for mixing in cycle:
            product = mixing.matrix() @ product
        rho = float(np.linalg.norm(product - np.full((n, n), 1.0 / n), 2))
    return 1.0 - rho


# -- --graph ------------------------------------------------------------------------------


def graph_arg(spec: str) -> str:
    """``--graph``'s argparse type: a named graph, ``torus:RxC``, or a file that exists."""
    if spec in GRAPHS or spec.startswith("torus:") or Path(spec).is_file():
        return spec
    raise argparse.ArgumentTypeError(
        f"not one of {', '.join(GRAPHS)}, torus:RxC, or a file that exists: {spec!r}")


def build_graph(spec: str, size: int) -> GraphSchedule:
    """The validated schedule of ``--graph spec`` over ``size`` ranks (``ValueError``: one
    line naming the problem)."""
    if spec == "ring":
        cycle: tuple[Mixing, ...] = (ring(size),)
    elif spec == "torus" or spec.startswith("torus:"):
        cycle = (torus(size, spec.partition(":")[2]),)
    elif spec == "exp":
        cycle = (exponential(size),)
    elif spec == "onepeer-exp":
        cycle = one_peer_exponential(size)
    else:
        cycle = (read_graph_file(spec, size),)
    for mixing in cycle:
        validate(mixing, spec)
    check_connected(cycle, spec)
    return GraphSchedule(spec, cycle)
