"""The rows of a simulated run: each rank's local step times, and its per-step phase rows.

:class:`LocalTimes` draws what a rank does alone (data, compute, update, and the
straggler's delay from ``--slowdown`` and ``--stragglers``) in blocks for every
rank at once; :class:`StepRows` collects the phase rows a strategy's timeline
(:mod:`.strategies`, :mod:`.asgd`) adds, one block of ranks at a time, in the
columns of ``schema.RANK_COLUMNS``; :class:`Timeline` is a timeline's result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from syncbench.analysis import schema
from syncbench.bench.simulate.quota import quota_delay
from syncbench.bench.simulate.workload import Stragglers, Workload, delay_factors


class LocalTimes:
    """Per rank and step: data, compute, update and delay seconds (drawn in blocks).

    The delay is the measured run's own (a ``--workload RUN.h5`` rank that
    was slowed) plus compute x (factor - 1), the factor from ``--slowdown``
    and ``--stragglers`` (:func:`.workload.delay_factors`, >= 1), plus
    a node's CPU quota on data and update (``speeds``, :mod:`.quota`).
    """

    def __init__(self, workload: Workload, n: int, slowdown: list[float],
                 stragglers: Stragglers, seed: int,
                 speeds: list[float] | None = None) -> None:
        self.workload, self.n = workload, n
        self.slowdown = np.asarray(slowdown, dtype=float)
        #: Each rank's node share under a CPU quota (None: none): its data and update are
        #: slowed too (:mod:`.quota`); its compute by the factor in ``slowdown``.
        self.speeds = speeds
        self.stragglers = stragglers
        self.rng = np.random.default_rng(seed)
        self.offsets = workload.replay_offsets(self.rng, n)
        self.cols = np.zeros((n, 0, 4))
        #: The furthest step asked for (any rank), and what is told when it grows: the
        #: progress line's step count (``ticker``), whatever the strategy's loop.
        self.reached = 0
        self.on_step: Callable[[int], None] | None = None
        if stragglers.persistent_share > 0:  # the same slow ranks for the whole run
            only = Stragglers(persistent_share=stragglers.persistent_share,
                              persistent_factor=stragglers.persistent_factor)
            self.slowdown = self.slowdown * delay_factors(only, np.ones(n), self.rng, (n, 1))[:, 0]
            self.stragglers = Stragglers(every_sigma=stragglers.every_sigma,
                                         transient_share=stragglers.transient_share,
                                         transient_sigma=stragglers.transient_sigma)

    def quota_stretch(self) -> np.ndarray:
        """Per rank, how much longer its node's CPU quota makes its compute on the wall:
        ``1 / speed`` (1 without a quota). The quota freezes the process a millisecond at
        a time, so a stretched compute still polls at its hooks (:func:`.asgd.poll_gaps`,
        :class:`.asgd.Polls`)."""
        if self.speeds is None:
            return np.ones(self.n)
        return 1.0 / np.asarray(self.speeds, dtype=float)

    def polled_delay(self, ranks: list[int] | slice, steps: int) -> float:
        """Mean seconds a step of ``ranks`` (their first ``steps``) spends in an emulated
        slowdown, ``compute x (factor - 1)`` without a node quota's part: a slowdown keeps
        polling MPI (``bench/train/slowdown.py``), a frozen process does not. The factor
        is the persistent one (``--slowdown`` and persistent ``--stragglers``); a transient
        straggler's delay and a replayed run's own delay count as not polled."""
        return float(self.polled(self.cols[ranks, :steps, 1].mean(axis=1), ranks=ranks).mean())

    def polled(self, compute: np.ndarray, delay: np.ndarray | float = math.inf,
               ranks: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Per rank of ``ranks``, the seconds of a step's ``delay`` that poll MPI, for that
        step's ``compute``: an emulated slowdown's ``compute x (factor - 1)``, at most the
        delay; a node quota's freezes and a transient straggler's delay do not poll (a
        frozen process cannot)."""
        factors = self.slowdown[ranks]
        if self.speeds is not None:
            factors = factors * np.asarray(self.speeds, dtype=float)[ranks]
        return np.minimum(delay, np.asarray(compute, dtype=float)
                          * np.maximum(factors - 1.0, 0.0))

    def ensure(self, steps: int) -> None:
        """Draw every rank's local times up to step ``steps`` (exclusive)."""
        have = self.cols.shape[1]
        if steps <= have:
            return
        more = max(steps - have, have, 8)
        block = self.workload.draw(self.rng, self.n, have, more, self.offsets)
        factor = delay_factors(self.stragglers, self.slowdown, self.rng, (self.n, more))
        block[..., 3] += block[..., 1] * (factor - 1.0)
        if self.speeds is not None:
            block[..., 3] += quota_delay(block, self.speeds)
        self.cols = np.concatenate([self.cols, block], axis=1)

    def _reach(self, j: int) -> None:
        if j > self.reached:
            self.reached = j
            if self.on_step is not None:
                self.on_step(j)

    def step(self, j: int) -> tuple[np.ndarray, ...]:
        """(data, compute, update, delay) of step ``j`` for every rank."""
        self._reach(j)
        self.ensure(j + 1)
        c = self.cols[:, j]
        return c[:, 0], c[:, 1], c[:, 2], c[:, 3]

    def steps(self, ranks: np.ndarray, js: np.ndarray) -> tuple[np.ndarray, ...]:
        """(data, compute, update, delay) of step ``js[i]`` of rank ``ranks[i]``."""
        if len(js):
            self._reach(int(js.max()))
        self.ensure(int(js.max()) + 1 if len(js) else 0)
        c = self.cols[ranks, js]
        return c[:, 0], c[:, 1], c[:, 2], c[:, 3]

    def rank(self, k: int, j: int) -> np.ndarray:
        self._reach(j)
        self.ensure(j + 1)
        return self.cols[k, j]


class StepRows:
    """Per-rank rows added as blocks: one row for each of a set of ranks at once.

    The vectorised strategies add a block per step (every rank) or per
    local step of a round (the ranks still in it); :meth:`arrays` sorts the
    rows by rank, keeping each rank's rows in the order they were added.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.blocks: list[tuple[np.ndarray, dict[str, Any]]] = []

    def add(self, ranks: np.ndarray | None = None, **values: Any) -> None:
        """One row for each of ``ranks`` (None: every rank); arrays per rank, scalars shared."""
        ranks = np.arange(self.n) if ranks is None else np.asarray(ranks, dtype=np.int64)
        self.blocks.append((ranks, values))

    def arrays(self) -> dict[int, dict[str, np.ndarray]]:
        if not self.blocks:
            return {k: {name: np.zeros(0, dtype=d) for name, d in schema.RANK_COLUMNS.items()}
                    for k in range(self.n)}
        ranks = np.concatenate([r for r, _ in self.blocks])
        order = np.argsort(ranks, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(ranks, minlength=self.n))]).tolist()
        spans = list(zip(bounds[:-1], bounds[1:]))
        columns = {}
        for name, dtype in schema.RANK_COLUMNS.items():
            parts = [np.broadcast_to(np.asarray(v.get(name, _default(name)), dtype=dtype),
                                     (len(r),)) for r, v in self.blocks]
            column = np.concatenate(parts)[order]
            columns[name] = [column[a:b] for a, b in spans]
        return {k: {name: columns[name][k] for name in columns} for k in range(self.n)}


def _default(name: str) -> Any:
    return math.nan if name == "loss" else schema.RANK_COLUMN_DEFAULTS.get(name, 0)


@dataclass
class Timeline:
    """A strategy's simulated run: its rows, its wall time and notes for the run file."""

    rows: StepRows
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)
