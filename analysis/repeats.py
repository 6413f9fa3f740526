"""Median (min–max) over repeats, the one place it is computed.

:func:`spread` is the statistic of every table that summarises repeats: the
median, min and max of a figure over the runs that have one (NaN left out;
infinities only when asked, for a time to target or a ratio of one, where a
run that missed counts as infinitely slow). :func:`group_rows` makes the
report's rows of ``--by`` groups from per-run rows, combining every
registered column as its entry says (:mod:`.columns`): labels keep their
common value, counts count, figures take the median and, where the column has a
spread, ``<key>_min`` / ``<key>_max``. A group with an incomplete run gets no
ratio to a baseline. The runner's cells
(:mod:`syncbench.bench.experiment.aggregate`) use the same :func:`spread`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .columns import Column, row_columns
from .completeness import incomplete_reason, is_incomplete
from .numbers import NAN, finite
from .scaling import group_value


def spread(values: Iterable[Any], keep_inf: bool = False) -> dict[str, Any]:
    """``{"median", "min", "max", "n"}`` of the values (None and NaN dropped; infinities
    dropped unless ``keep_inf``). None for every statistic when no value is left."""
    arr = np.array([float(v) for v in values if v is not None], dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if not keep_inf:
        arr = arr[np.isfinite(arr)]
    if not arr.size:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": float(np.median(arr)), "min": float(arr.min()),
            "max": float(arr.max()), "n": int(arr.size)}


def format_value(value: float | None, digits: int = 2) -> str:
    """``1.23``; ``inf``; ``-`` for None."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def format_spread(stats: dict[str, Any], digits: int = 2, single: bool = False) -> str:
    """``median (min–max)`` of a :func:`spread`, just the median when there is one value
    (or ``single``), or its status (``diverged``, ``not reached``) instead."""
    if stats.get("status"):
        return str(stats["status"])
    if stats.get("median") is None:
        return "-"
    med = format_value(stats["median"], digits)
    if single or stats.get("n", 0) <= 1 or stats["min"] == stats["max"]:
        return med
    return (f"{med} ({format_value(stats['min'], digits)}–"
            f"{format_value(stats['max'], digits)})")


def column_spread(values: Sequence[Any], missing_is_slow: bool = False
                  ) -> tuple[float, float, float]:
    """(median, min, max) of one column over a group's runs, NaN when there is none.

    Values that are not finite numbers are left out, or, with ``missing_is_slow``
    (time to target), count as infinitely slow (a median that is infinite is NaN).
    """
    if missing_is_slow:
        stats = spread((v if finite(v) else math.inf for v in values), keep_inf=True)
    else:
        stats = spread(v for v in values if finite(v))
    return tuple(NAN if v is None or not math.isfinite(v) else v  # type: ignore[return-value]
                 for v in (stats["median"], stats["min"], stats["max"]))


def _sort_key(values: tuple) -> tuple:
    return tuple((v is None, str(type(v).__name__), v if v is not None else 0) for v in values)


def _merge(g: dict[str, Any], entry: Column, values: list[Any]) -> None:
    """Set ``g[key]`` (and its spread) from a group's values of one column."""
    if entry.merge is not None:
        g[entry.key] = entry.merge(values)
        return
    med, lo, hi = column_spread(values, entry.missing_is_slow)
    g[entry.key] = med
    if entry.spread:
        g[f"{entry.key}_min"], g[f"{entry.key}_max"] = lo, hi


def group_rows(rows: Sequence[dict[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """One row per distinct value of the ``by`` keys, sorted by them.

    Every registered column is combined as its entry says; a diverged run is left
    out of the columns that say so (and is infinitely slow where a missing value
    is). A group with an incomplete run gets NaN for the ratios to a baseline (and
    their spreads); ``_incomplete`` lists its incomplete runs' reasons (for the
    notes; formatters drop it).
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(group_value(row, k) for k in by), []).append(row)
    out = []
    for values in sorted(groups, key=_sort_key):
        members = groups[values]
        g: dict[str, Any] = {}
        for entry in row_columns():
            column_values = [m[entry.key] for m in members]
            if entry.missing_is_slow or entry.diverged_excluded:
                # a diverged run never counts as faster (ttt: inf; speeds: left out)
                column_values = [NAN if m.get("diverged") else v
                                 for m, v in zip(members, column_values)]
            _merge(g, entry, column_values)
        reasons = [incomplete_reason(m.get("complete"), m.get("stopped_by"))
                   for m in members if is_incomplete(m)]
        if reasons:  # a group with an incomplete run gets no ratio to a baseline
            for entry in row_columns():
                if entry.baseline_ratio:
                    g[entry.key] = NAN
                    if entry.spread:
                        g[f"{entry.key}_min"] = g[f"{entry.key}_max"] = NAN
        g["_incomplete"] = reasons
        for key, value in zip(by, values, strict=True):
            if key not in g:
                g[key] = value
        out.append(g)
    return out


