"""Table values that may be missing (NaN, None, not a number at all), and keys of them.

A column value is *finite* when it is a real number (not a bool) that is not NaN or
infinite; ratios, sums and medians of values that are not finite are NaN, so that a
missing figure never turns into a made-up one. :func:`hashable` and :func:`name_list`
turn recorded values into parts of a grouping key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

NAN = float("nan")


def finite(value: Any) -> bool:
    """A real number (int or float, not bool) that is neither NaN nor infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def ratio(num: Any, den: Any) -> float:
    """num / den, NaN when either is not finite or den is 0."""
    if not (finite(num) and finite(den)) or den == 0:
        return NAN
    return float(num) / float(den)


def sum_finite(a: Any, b: Any) -> float:
    """a + b, NaN unless both are finite."""
    return float(a) + float(b) if finite(a) and finite(b) else NAN


def median(values: Iterable[Any]) -> float:
    """The median of the finite values; NaN when there is none."""
    arr = np.array([v for v in values if finite(v)], dtype=np.float64)
    return float(np.median(arr)) if arr.size else NAN


def hashable(value: Any) -> Any:
    """A recorded value as part of a dict key: lists and dicts as tuples, NaN as "nan"."""
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def name_list(value: Any) -> set[str] | None:
    """A recorded JSON list of names (or an already decoded list); None if absent or bad."""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return set(value)
    return None
