"""Cross-rank fairness of a heterogeneous run: the straggler it got, and what it gave away.

An emulated straggler (``--slowdown``) is only a fair test when

* its *realised* factor matches the nominal one: the slow rank's busy time
  per step (compute + injected delay) over a normal rank's compute time; and
* it gives nothing away: the other ranks compute no faster while it is in its
  delay phase than otherwise (a sleeping rank on a shared machine frees its
  core, caches and turbo budget for them).

:func:`realised_factor` and :func:`interference_ratio` measure both from a
run file's per-step rows; :func:`throughput_ceiling` is the best throughput a
perfectly balancing strategy can keep, as a fraction of the homogeneous one
(sum_k 1/f_k over N). Definitions live here and nowhere else (see
ALGORITHMS.md, "Heterogeneity emulation").

Only NumPy: a run is anything with the ``ranks``, ``rank_attrs`` and
``attrs`` of :class:`syncbench.analysis.runfile.Run` (its ``packed`` table
too, else one is built from ``ranks``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .packed import PackedRows
from .schema import strategy_traits

NAN = float("nan")

#: Root attribute: leading warm-up steps per rank that every metric skips.
_WARMUP_ATTR = "warmup_steps"


class RunLike(Protocol):
    """What these functions read of a run (:class:`~syncbench.analysis.runfile.Run`)."""

    attrs: dict[str, Any]
    ranks: dict[int, dict[str, np.ndarray]]
    rank_attrs: dict[int, dict[str, Any]]


def nominal_factors(run: RunLike) -> dict[int, float]:
    """rank -> its base factor: the ``slowdown`` rank attribute (1.0 when absent) over
    ``node_speed`` (the CPU share its node was throttled to by the kernel; 1.0 when
    absent), so a rank on a node of speed 0.25 is nominally 4x slower."""
    out = {}
    for rank in run.ranks:
        attrs = run.rank_attrs.get(rank, {})
        try:
            factor = float(attrs.get("slowdown", 1.0))
        except (TypeError, ValueError):
            factor = 1.0
        try:
            speed = float(attrs.get("node_speed", 1.0))
        except (TypeError, ValueError):
            speed = 1.0
        out[rank] = factor / speed if 0 < speed <= 1 else factor
    return out


def warmup_steps(run: RunLike) -> int:
    """Leading steps per rank to leave out: the root attribute ``warmup_steps``
    (OD-SGD's blocking warm-up); 0 if absent or not a number. Every metric here
    and the report's steady-state columns (:mod:`syncbench.analysis.tables`) skip them."""
    try:
        return max(0, int(run.attrs.get(_WARMUP_ATTR, 0) or 0))
    except (TypeError, ValueError):
        return 0


def _col(run: RunLike, rank: int, name: str) -> np.ndarray:
    """One column of one rank after the warm-up steps (float64; empty if absent)."""
    rows = run.ranks[rank]
    if name not in rows:
        return np.zeros(0)
    return np.asarray(rows[name], dtype=np.float64)[warmup_steps(run):]


def _table(run: RunLike) -> PackedRows:
    """The run's rows as one table: ``Run.packed``, else built from ``ranks`` (the
    driver's gathered rows)."""
    table = getattr(run, "packed", None)
    return table if isinstance(table, PackedRows) else PackedRows.from_ranks(run.ranks)


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else NAN


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if values.size else NAN


_STATISTICS = {"mean": _mean, "median": _median}


def realised_factors(run: RunLike, statistic: str = "mean") -> dict[int, float]:
    """rank -> realised factor, for every rank whose nominal factor is above 1.

    Realised factor = the rank's mean (``t_compute`` + ``t_delay``) per step
    over the median across the unslowed ranks of their mean ``t_compute`` per
    step. NaN when no rank is unslowed. Warm-up steps are skipped.

    ``statistic="median"`` takes per-rank medians instead of means. On a
    machine shared with other jobs, preemption adds the same absolute noise n
    to every rank's compute whatever its speed, so the mean-based factor
    reads (f*c + n)/(c + n), below f, even for a perfect emulation; the
    median-based one is the check that is robust to that.
    """
    if statistic not in _STATISTICS:
        raise KeyError(statistic)
    factors = nominal_factors(run)
    if not any(f > 1.0 for f in factors.values()):
        return {}
    # every rank at once (one per-rank statistic over the rows past the warm-up)
    table = _table(run)
    stat = table.mean if statistic == "mean" else table.median
    keep = table.position >= warmup_steps(run)
    compute = table.column("t_compute")
    own = stat(compute, keep)
    busy = stat(compute + table.column("t_delay"), keep)
    where = {rank: i for i, rank in enumerate(table.ranks.tolist())}
    normal = np.array([own[where[r]] for r, f in factors.items() if f <= 1.0])
    normal = normal[np.isfinite(normal)]
    reference = float(np.median(normal)) if normal.size else NAN
    return {rank: float(busy[where[rank]]) / reference if reference > 0 else NAN
            for rank, factor in factors.items() if factor > 1.0}


def realised_factor(run: RunLike, statistic: str = "mean") -> float:
    """The realised factor of the rank with the largest nominal factor (NaN if none > 1).

    See :func:`realised_factors`.
    """
    factors = nominal_factors(run)
    slowed = realised_factors(run, statistic)
    if not slowed:
        return NAN
    slowest = max(slowed, key=lambda r: (factors[r], -r))
    return slowed[slowest]


def _pre_phases(run: RunLike, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(seconds from a step's start to its compute, to its delay) per step of ``rank``.

    Derived from the one phase-order table, the strategy's ``step_order`` trait (the trace
    draws from it too): the phases the strategy runs before ``compute`` come
    before it, and ``delay`` follows compute right away (``Strategy.straggle``).
    A phase run twice in a step around compute (its ``split_phases`` trait: ASGD's
    pull and push, both charged to ``comm`` and moving the whole parameter
    vector) counts with its share before compute. Polls inside compute are
    charged to ``comm`` and are small; they are not placed.
    """
    traits = strategy_traits(run.attrs)
    order, split = traits.step_order, traits.split_phases
    before = np.zeros_like(_col(run, rank, "t_compute"))
    for phase in order[:order.index("compute")]:
        values = _col(run, rank, f"t_{phase}")
        if values.size == before.size:
            before = before + split.get(phase, 1.0) * values
    for phase, share in split.items():
        if phase in order[order.index("compute"):]:
            before = before + share * _col(run, rank, f"t_{phase}")
    return before, before + _col(run, rank, "t_compute")


def delay_intervals(run: RunLike) -> np.ndarray:
    """Merged ``[start, end)`` seconds (shape (k, 2)) when some slowed rank was in ``delay``."""
    spans = []
    for rank, factor in nominal_factors(run).items():
        delay = _col(run, rank, "t_delay")
        if factor <= 1.0 or not delay.size:
            continue
        _, to_delay = _pre_phases(run, rank)
        start = _col(run, rank, "t_start") + to_delay
        keep = delay > 0
        spans.append(np.stack([start[keep], start[keep] + delay[keep]], axis=1))
    if not spans:
        return np.zeros((0, 2))
    spans_all = np.concatenate(spans)
    spans_all = spans_all[np.argsort(spans_all[:, 0], kind="stable")]
    merged: list[list[float]] = []
    for start, end in spans_all:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([float(start), float(end)])
    return np.asarray(merged, dtype=np.float64).reshape(-1, 2)


def round_first_steps(run: RunLike, rank: int) -> np.ndarray:
    """Mask of ``rank``'s steps (after the warm-up) that open a synchronisation round.

    A round is a value of the ``round`` column of a round-based strategy (some
    row with ``local_steps > 0``); all False for step-synchronous strategies.
    """
    rounds = _col(run, rank, "round")
    local = _col(run, rank, "local_steps")
    if not rounds.size or not np.any(local > 0):
        return np.zeros(rounds.size, dtype=bool)
    first = np.ones(rounds.size, dtype=bool)
    first[1:] = rounds[1:] != rounds[:-1]
    return first


#: :func:`interference_ratio` needs at least this share of the unslowed ranks' steps
#: on each side (else a few steps misplaced by noise would make a ratio).
MIN_SHARE = 0.05


def interference_ratio(run: RunLike, min_share: float = MIN_SHARE) -> float:
    """Unslowed ranks' mean compute while a slowed rank is in delay, over their mean otherwise.

    A step of an unslowed rank counts as "during delay" when its compute
    phase starts (``t_start`` + the phases before compute) inside a delay
    interval of some slowed rank (see :func:`delay_intervals`). The start,
    not the midpoint: a compute stretched by preemption would otherwise move
    into the next interval and bias the ratio. 1.0 means the delay gives nothing away; below 1
    the other ranks ran faster while the straggler was idle. NaN when either
    set holds less than ``min_share`` of the steps: lock-step SSGD's fast
    ranks wait, they do not compute, while the straggler is in its delay.

    Round-based strategies (Oscars, Local SGD: rows with ``local_steps > 0``):
    each rank's first step of every ``round`` is left out of both sets
    (:func:`round_first_steps`). It runs right after the averaging and is
    slower than the later ones even with no straggler (measured at 2 ranks:
    median compute 0.74-0.77 ms against 0.65 ms for the rest of the round),
    and it mostly falls outside a delay, so keeping it would make the ratio
    read below 1 from that alone.
    """
    intervals = delay_intervals(run)
    during: list[np.ndarray] = []
    otherwise: list[np.ndarray] = []
    for rank, factor in nominal_factors(run).items():
        if factor > 1.0:
            continue
        compute = _col(run, rank, "t_compute")
        if not compute.size:
            continue
        to_compute, _ = _pre_phases(run, rank)
        begin = _col(run, rank, "t_start") + to_compute
        inside = np.zeros(begin.size, dtype=bool)
        if intervals.size:
            i = np.searchsorted(intervals[:, 0], begin, side="right") - 1
            ok = i >= 0
            inside[ok] = begin[ok] < intervals[i[ok], 1]
        keep = ~round_first_steps(run, rank)
        during.append(compute[inside & keep])
        otherwise.append(compute[~inside & keep])
    if not during:
        return NAN
    inside, outside = np.concatenate(during), np.concatenate(otherwise)
    total = inside.size + outside.size
    if min(inside.size, outside.size) < max(1.0, min_share * total):
        return NAN
    a, b = _mean(inside), _mean(outside)
    return a / b if b > 0 else NAN


def throughput_ceiling(factors: Sequence[float] | Mapping[Any, float]) -> float:
    """sum_k(1/f_k)/N: the largest heterogeneous/homogeneous throughput ratio possible.

    A rank slowed by f delivers 1/f of a normal rank's samples per second;
    no strategy can beat perfect balancing of that capacity. NaN for no ranks.
    """
    values = list(factors.values()) if isinstance(factors, Mapping) else list(factors)
    if not values:
        return NAN
    if any(not (math.isfinite(float(f)) and float(f) > 0) for f in values):
        raise ValueError(f"slowdown factors must be finite and > 0, got {values}")
    return float(sum(1.0 / float(f) for f in values) / len(values))
