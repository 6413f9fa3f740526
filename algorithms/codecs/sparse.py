"""``topk:D`` and ``randomk:D``: sparsifiers that send ``k = ceil(D n)`` entries.

Top-k keeps the ``k`` entries of largest magnitude (Stich, Cordonnier, Jaggi,
"Sparsified SGD with Memory", NeurIPS 2018; Lin et al., "Deep Gradient
Compression", arXiv 1712.01887); its supports differ between ranks, so the
indices travel with the values (int32 indices, float32 values: 8 bytes per
entry, gathered by Allgatherv). Random-k keeps ``k`` entries drawn without
replacement from a generator seeded by ``(seed, step)``: every rank draws the
same indices, so only the values travel (4 bytes per entry, summed by
Allreduce). Both are meant to run with :class:`~.feedback.ErrorFeedback`, or with
DGC's momentum correction and warm-up (``topk:D,momentum=M,warmup=S``: :mod:`.dgc`).

Compared with BytePS (``byteps/common/compressor/impl/topk.cc``,
``randomk.cc``): BytePS takes ``k = floor(D n)`` (at least 1) and draws
random-k indices with replacement; here ``k = ceil(D n)`` with ``D`` taken as
the decimal it was written as (``ceil(0.07 * 100)`` is 7, not 8), and indices
are distinct and sorted. BytePS scales random-k values by ``n / k`` when there
is no error feedback (an unbiased estimate); here values are sent unscaled,
as with error feedback. Top-k ties in magnitude are broken by
``numpy.argpartition``; the chosen indices are then sorted.

Top-k's selection of a float32 vector runs compiled where the library is built
(``kernels/cpu/codecs.c``: a radix select on the magnitudes' bits, then the indices
in order; :mod:`syncbench.kernels.cpu_native`); where entries equal in magnitude
straddle the k-th place, the set is not unique and the reference
(:meth:`TopK.select_reference`) chooses, so the indices always equal the reference's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from syncbench.algorithms.codecs.dgc import DGCOptions, warmup_density
from syncbench.kernels import cpu_native

#: Bytes per sent entry: int32 index + float32 value (top-k), float32 value (random-k).
TOPK_ENTRY_BYTES = 8
RANDOMK_ENTRY_BYTES = 4
INDEX_DTYPE = np.int32
VALUE_DTYPE = np.float32


def check_density(name: str, density: float) -> float:
    """``density`` as a float in (0, 1]; otherwise a one-line ValueError naming it."""
    if isinstance(density, bool) or not isinstance(density, (int, float, np.floating)):
        raise ValueError(f"{name} density {density!r} is not a number: "
                         f"give a fraction 0 < D <= 1 (e.g. {name}:0.01)")
    value = float(density)
    if not 0.0 < value <= 1.0:  # NaN fails this too
        raise ValueError(f"{name} density {density} is outside (0, 1]: "
                         f"give a fraction 0 < D <= 1 (e.g. {name}:0.01)")
    return value


def kept(density: float, count: int) -> int:
    """``ceil(density * count)`` with ``density`` read as its shortest decimal; 0 if count is 0."""
    if count == 0:
        return 0
    return min(count, max(1, math.ceil(Fraction(repr(float(density))) * count)))


@dataclass
class SparseCode:
    """``k`` entries of a vector of ``size`` elements: sorted int32 indices, float32 values."""

    indices: np.ndarray
    values: np.ndarray
    size: int

    def decode(self, out: np.ndarray | None = None) -> np.ndarray:
        """The dense float32 vector: the values at their indices, zero elsewhere."""
        if out is None:
            out = np.zeros(self.size, dtype=VALUE_DTYPE)
        else:
            out[...] = 0
        out[self.indices] = self.values
        return out

    def add_to(self, total: np.ndarray) -> np.ndarray:
        """``total[indices] += values`` (indices are distinct); returns ``total``."""
        total[self.indices] += self.values
        return total


def _vector(x: np.ndarray, who: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1 or x.dtype not in (np.float32, np.float64):
        raise ValueError(f"{who} encodes a 1-D float32 or float64 vector, got {x.dtype} {x.shape}")
    if x.size > np.iinfo(INDEX_DTYPE).max:
        raise ValueError(f"{who}: {x.size} elements do not fit int32 indices")
    return x


class TopK:
    """``topk:D``: the ``ceil(D n)`` entries of largest magnitude, indices and values.
    ``options``: DGC's momentum correction and warm-up (:mod:`.dgc`; the reducer's)."""

    name = "topk"

    def __init__(self, density: float, options: DGCOptions | None = None) -> None:
        self.density = check_density(self.name, density)
        self.options = options = options or DGCOptions()
        self.spec = f"{self.name}:{self.density!r}{options.spec_suffix()}"

    def density_at(self, step: int) -> float:
        """The density of ``step`` (the warm-up's, then :attr:`density`)."""
        return warmup_density(self.density, self.options.warmup, step)

    def k(self, count: int) -> int:
        """Entries kept of a vector of ``count`` elements."""
        return kept(self.density, count)

    def wire_bytes(self, count: int) -> int:
        """Bytes one rank hands to MPI (its Allgatherv contribution): 8 per kept entry."""
        return TOPK_ENTRY_BYTES * self.k(count)

    def select(self, x: np.ndarray) -> np.ndarray:
        """Sorted int32 indices of the ``k`` entries of ``x`` of largest magnitude
        (compiled where built and the set is unique, else :meth:`select_reference`)."""
        x = _vector(x, self.name)
        k = self.k(x.size)
        if 0 < k < x.size:
            idx = cpu_native.topk_indices(x, k)
            if idx is not None:
                return idx
        return self.select_reference(x)

    def select_reference(self, x: np.ndarray) -> np.ndarray:
        """:meth:`select` by ``numpy.argpartition`` (the reference)."""
        x = _vector(x, self.name)
        k = self.k(x.size)
        if k == x.size:
            return np.arange(x.size, dtype=INDEX_DTYPE)
        idx = np.argpartition(np.abs(x), x.size - k)[x.size - k:]
        idx.sort()
        return idx.astype(INDEX_DTYPE)

    def encode(self, x: np.ndarray) -> SparseCode:
        """The kept entries of ``x``; values cast to float32 (as they travel)."""
        idx = self.select(x)
        return SparseCode(idx, x[idx].astype(VALUE_DTYPE), x.size)


class RandomK:
    """``randomk:D``: ``ceil(D n)`` distinct indices drawn from ``(seed, step)``; values only."""

    name = "randomk"

    def __init__(self, density: float, seed: int = 0,
                 options: DGCOptions | None = None) -> None:
        self.density = check_density(self.name, density)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"randomk seed {seed!r} is not an integer >= 0")
        self.seed = int(seed)
        self.options = options = options or DGCOptions()
        self.spec = f"{self.name}:{self.density!r}{options.spec_suffix()}"

    def density_at(self, step: int) -> float:
        """The density of ``step`` (the warm-up's, then :attr:`density`)."""
        return warmup_density(self.density, self.options.warmup, step)

    def k(self, count: int) -> int:
        """Entries kept of a vector of ``count`` elements."""
        return kept(self.density, count)

    def wire_bytes(self, count: int) -> int:
        """Bytes one rank hands to MPI (its Allreduce buffer): 4 per kept entry."""
        return RANDOMK_ENTRY_BYTES * self.k(count)

    def indices(self, count: int, step: int) -> np.ndarray:
        """The sorted int32 indices of ``step``: the same on every rank with the same seed.

        A fresh ``numpy.random.default_rng([seed, step])`` draws them, so no
        generator state has to be kept or checkpointed; the draw is NumPy's
        (``Generator.choice`` without replacement), stable for one NumPy version.
        """
        if step < 0:
            raise ValueError(f"randomk step {step} is negative")
        k = self.k(count)
        if k == count:
            return np.arange(count, dtype=INDEX_DTYPE)
        rng = np.random.default_rng([self.seed, int(step)])
        idx = rng.choice(count, size=k, replace=False, shuffle=False)
        idx.sort()
        return idx.astype(INDEX_DTYPE)

    def encode(self, x: np.ndarray, step: int) -> SparseCode:
        """The entries of ``x`` at :meth:`indices` of ``step``; values as float32."""
        x = _vector(x, self.name)
        idx = self.indices(x.size, step)
        return SparseCode(idx, x[idx].astype(VALUE_DTYPE), x.size)
