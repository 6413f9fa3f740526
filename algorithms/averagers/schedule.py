"""Oscars' schedule arithmetic: each rank's local steps per round, from every rank's speed.

Pure integer and float arithmetic (no MPI): every rank computes the same schedule from
the same reduced speeds, and the simulator computes it too (ALGORITHMS.md, "Oscars";
Haddadpour et al. 2019, arXiv 1910.13598, the adaptive period)::

    T     = tau_0(r) * max_k c_k           # the slowest rank takes tau_0 steps
    tau_k = clamp(floor(T / c_k), 1, tau_max)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Slack for floor(T / c_k): T / c_max must give tau_0, not tau_0 - 1, after rounding.
_FLOOR_SLACK = 1e-9


def schedule(step_seconds: Sequence[float], tau0: float, tau_max: int) -> list[int]:
    """tau_k = clamp(floor(tau0 * max(c) / c_k), 1, tau_max) for every rank k.

    ``step_seconds`` are the ranks' seconds per local step (larger = slower);
    the slowest rank gets ``floor(tau0)``. Without a measurement for every rank
    (a value <= 0) every rank gets ``floor(tau0)``.
    """
    if not step_seconds or min(step_seconds) <= 0:
        return uniform_schedule(len(step_seconds), tau0, tau_max)
    horizon = tau0 * max(step_seconds)
    return [
        min(tau_max, max(1, math.floor(horizon / c + _FLOOR_SLACK))) for c in step_seconds
    ]


def uniform_schedule(world_size: int, tau0: float, tau_max: int) -> list[int]:
    """Every rank takes clamp(floor(tau0), 1, tau_max) steps (``--no-adaptive``)."""
    return [min(tau_max, max(1, math.floor(tau0 + _FLOOR_SLACK)))] * world_size


def fit_budget(taus: Sequence[int], remaining: int) -> list[int]:
    """The round's schedule, fitted to the steps left when it is the last round.

    If the round leaves at least N = len(taus) steps (or exactly none) it is
    returned unchanged. Otherwise it becomes the last round with exactly
    ``remaining`` (>= N) steps: one per rank, plus ``remaining - N`` shared in
    proportion to ``tau_k - 1`` (equally if all are 1) by largest remainder,
    ties to the lower rank. Pure integer arithmetic: identical on every rank.
    """
    n, total = len(taus), sum(taus)
    if remaining == total or remaining - total >= n:
        return list(taus)
    if remaining < n:
        raise ValueError(f"cannot fit {remaining} steps on {n} ranks (each needs >= 1)")
    weights = [t - 1 for t in taus]
    if sum(weights) == 0:
        weights = [1] * n
    wsum, target = sum(weights), remaining - n
    shares = [w * target // wsum for w in weights]
    order = sorted(range(n), key=lambda k: (-(weights[k] * target % wsum), k))
    for k in order[: target - sum(shares)]:
        shares[k] += 1
    return [1 + s for s in shares]


def tau_max_of(options: Any) -> int:
    """tau_max: ``--max-period``, default 8 * ``--period``."""
    return int(options.max_period or 8 * options.period)


def base_period(options: Any, round_index: int) -> float:
    """tau_0 of round ``round_index``: ``--period`` * (1 + ``--period-growth`` * round)."""
    return float(options.period) * (1.0 + options.period_growth * round_index)


def plan_round(taus: Sequence[int], total_steps: int, scheduled: int) -> list[int]:
    """A round's schedule fitted to the global steps left after the ``scheduled`` ones."""
    return fit_budget(taus, total_steps - scheduled)


def next_schedule(options: Any, speeds: Sequence[float], round_index: int) -> list[int]:
    """Round ``round_index``'s schedule from every rank's c_k (``--no-adaptive``: uniform).

    Pure: every rank (and the simulator) computes the same list from the same
    reduced speeds.
    """
    tau0, tau_max = base_period(options, round_index), tau_max_of(options)
    if options.adaptive == "off":
        return uniform_schedule(len(speeds), tau0, tau_max)
    return schedule(speeds, tau0, tau_max)
