"""Every rank's step rows as one table: flat columns, rank after rank, and a row count per rank.

This is what the packed run-file layout stores (``schema.RANK_LAYOUT_PACKED``)
and what analysis reduces per rank: a per-rank sum, mean, median or maximum is
one NumPy call over all rows (:meth:`PackedRows.sum`, ...) instead of one
Python iteration per rank, which at 16,384 ranks cost more than a second of
``syncbench report``. ``Run.packed`` gives it for files of either layout
(read as stored for a packed file, concatenated once from the per-rank columns
otherwise), so every table is computed the same way from both.

Rows are in rank order, each rank's in its recorded order: rank ``ranks[k]``
owns rows ``starts[k]`` to ``starts[k] + counts[k]``. A rank may have no rows
(a partial run, a serving rank); its reductions are NaN (0 for a sum).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

NAN = float("nan")


@dataclass(frozen=True, eq=False)
class PackedRows:
    """Rows of every rank in flat columns (module docstring)."""

    #: The ranks, ascending (int64).
    ranks: np.ndarray
    #: Rows of each rank (int64, one entry per rank).
    counts: np.ndarray
    #: Column -> its rows, rank after rank (1-D, ``counts.sum()`` long).
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_ranks(cls, ranks: Mapping[int, Mapping[str, np.ndarray]],
                   names: Iterable[str] | None = None) -> PackedRows:
        """The table of per-rank columns (``Run.ranks``), ranks sorted; ``names``: the
        columns to keep (default: those every rank has, in the first rank's order)."""
        order = sorted(ranks)
        if names is None:
            names = [n for n in (ranks[order[0]] if order else ())
                     if all(n in ranks[r] for r in order)]
        names = list(names)
        columns = {n: np.concatenate([np.asarray(ranks[r][n]) for r in order]) if order
                   else np.zeros(0) for n in names}
        if order and names:
            key = "step" if "step" in names else names[0]
            counts = np.fromiter((np.asarray(ranks[r][key]).size for r in order),
                                 dtype=np.int64, count=len(order))
        else:
            counts = np.zeros(len(order), dtype=np.int64)
        return cls(np.asarray(order, dtype=np.int64), counts, columns)

    @cached_property
    def starts(self) -> np.ndarray:
        """Index of each rank's first row."""
        return np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64) \
            if self.counts.size else np.zeros(0, dtype=np.int64)

    @property
    def rows(self) -> int:
        """Rows of all ranks together."""
        return int(self.counts.sum())

    @cached_property
    def uniform(self) -> bool:
        """Every rank has the same, non-zero number of rows (a lock-step run)."""
        return bool(self.counts.size and self.counts.min() == self.counts.max() > 0)

    @cached_property
    def row_rank(self) -> np.ndarray:
        """Index (into ``ranks``) of the rank of every row."""
        return np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts)

    @cached_property
    def position(self) -> np.ndarray:
        """Place of every row among its rank's rows, from 0."""
        return np.arange(self.rows, dtype=np.int64) - np.repeat(self.starts, self.counts)

    def column(self, name: str, dtype: str | np.dtype = np.float64) -> np.ndarray:
        """Column ``name`` as ``dtype`` (no copy when it already is); KeyError if absent."""
        return np.asarray(self.columns[name], dtype=dtype)

    def split(self, values: np.ndarray) -> dict[int, np.ndarray]:
        """rank -> its rows of ``values`` (views)."""
        ends = self.starts + self.counts
        return {int(r): values[s:e] for r, s, e in
                zip(self.ranks.tolist(), self.starts.tolist(), ends.tolist())}

    # -- per-rank reductions (one entry per rank; ``keep``: a mask of the rows to use)

    def _kept(self, values: np.ndarray, keep: np.ndarray | None, dtype: Any = np.float64
              ) -> tuple[np.ndarray, np.ndarray, bool]:
        values = np.asarray(values, dtype=dtype)
        if keep is None:
            return values, self.counts, self.uniform
        counts = np.bincount(self.row_rank[keep], minlength=self.counts.size).astype(np.int64)
        return values[keep], counts, bool(counts.size and counts.min() == counts.max() > 0)

    def sum(self, values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per-rank sums of ``values`` (in their dtype; 0 for a rank without rows)."""
        values, counts, uniform = self._kept(values, keep, None)
        if uniform:
            return values.reshape(counts.size, -1).sum(axis=1)
        return _reduceat(np.add, values, counts, 0.0)

    def mean(self, values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per-rank means (NaN for a rank without rows)."""
        values, counts, uniform = self._kept(values, keep)
        if uniform:
            return values.reshape(counts.size, -1).mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = _reduceat(np.add, values, counts, NAN) / counts
        return out

    def max(self, values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per-rank maxima (NaN for a rank without rows; NaN propagates, as ``np.max``)."""
        values, counts, uniform = self._kept(values, keep)
        if uniform:
            return values.reshape(counts.size, -1).max(axis=1)
        return _reduceat(np.maximum, values, counts, NAN)

    def any(self, values: np.ndarray) -> np.ndarray:
        """Per rank: some row of ``values`` is true (False for a rank without rows)."""
        return _reduceat(np.logical_or, np.asarray(values, dtype=bool), self.counts, False)

    def distinct(self, values: np.ndarray) -> np.ndarray:
        """Per rank: how many distinct values its rows of ``values`` hold."""
        values = np.asarray(values)
        if not values.size:
            return np.zeros(self.counts.size, dtype=np.int64)
        order = np.lexsort((values, self.row_rank))
        v, k = values[order], self.row_rank[order]
        new = np.ones(v.size, dtype=bool)
        new[1:] = (v[1:] != v[:-1]) | (k[1:] != k[:-1])
        return np.bincount(k[new], minlength=self.counts.size).astype(np.int64)

    def median(self, values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per-rank medians, as ``np.median`` of each rank's rows (NaN for a rank without
        rows, or with a NaN among them)."""
        values, counts, uniform = self._kept(values, keep)
        if uniform:
            return np.median(values.reshape(counts.size, -1), axis=1)
        out = np.full(counts.size, NAN)
        has = counts > 0
        if not has.any():
            return out
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        owner = np.repeat(np.arange(counts.size), counts)
        ordered = values[np.lexsort((values, owner))]  # NaN sort last within a rank
        lo = starts + (counts - 1) // 2
        hi = starts + counts // 2
        lo, hi = np.where(has, lo, 0), np.where(has, hi, 0)
        if ordered.size:
            out[has] = ((ordered[lo] + ordered[hi]) / 2)[has]
            nan = _reduceat(np.logical_or, np.isnan(values), counts, False).astype(bool)
            out[nan] = NAN
        return out


def _reduceat(ufunc: np.ufunc, values: np.ndarray, counts: np.ndarray,
              empty: float | bool) -> np.ndarray:
    """``ufunc.reduceat`` over consecutive segments of ``counts`` rows; ``empty`` for a
    segment without rows (``reduceat`` would give the next row's value)."""
    out = np.full(counts.size, empty, dtype=values.dtype if values.dtype != bool else bool)
    has = counts > 0
    if has.any():
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        out[has] = ufunc.reduceat(values, starts[has])
    return out
