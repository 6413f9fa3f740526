"""One simulated timeline per strategy: per-rank, per-step phase rows.

Each function composes a strategy's rank timelines from its local step
times (:class:`LocalTimes`) and the simulated durations of its collectives
(:mod:`.collectives` timed by :class:`.engine.Network`), following the rule
of its module in ``algorithms/`` (ALGORITHMS.md):

* ``ssgd``: ``--comm blocking``: one Allreduce of the gradient after
  backward; it starts when the last rank arrives (charged to ``comm`` with
  the waiting, as a blocking MPI call is). ``--comm overlap``: buckets of
  ``--bucket-mb`` become ready during backward (its last 2/3 of compute) in
  reverse order; each bucket's Iallreduce starts when every rank posted it
  and the previous bucket is done; the ``wait`` is the Waitall after
  compute and delay.
* ``localsgd``: ``--period`` local steps, then a blocking Allreduce of the
  parameters (the last round shorter, as in ``LocalSGD._next_round_len``),
  and of the velocity too with ``--momentum-sync average`` (also Oscars).
* ``odsgd``: ``--warmup-steps`` SSGD steps, then step t's Iallreduce
  overlaps step t+1's compute and is waited on before t+1's update.
* ``oscars``: rounds whose local steps come from ``uniform_schedule()``,
  ``next_schedule()`` and ``plan_round()`` of ``algorithms/oscars.py`` and
  whose speed estimates from ``Oscars._update_speed`` (all called), then
  one packed Iallreduce of params + N + 1 floats (``--overlap``: the next
  round's first step runs while it is in flight).
* ``asgd``: :mod:`.asgd`.

Compute is never contended (each rank has its own device); MPI progress is
assumed (an Iallreduce advances while the rank computes), and the time a
spinning MPI wait takes from other ranks on a shared core is left out.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from syncbench.analysis import schema
from syncbench.bench.simulate.collectives import Phase, allreduce_phases, cost
from syncbench.bench.simulate.workload import BACKWARD_SHARE, Stragglers, Workload, delay_factors

PhaseTime = Callable[[Phase], float]


class LocalTimes:
    """Per rank and step: data, compute, update and delay seconds (drawn in blocks)."""

    def __init__(self, workload: Workload, n: int, slowdown: list[float],
                 stragglers: Stragglers, seed: int) -> None:
        self.workload, self.n = workload, n
        self.slowdown = np.asarray(slowdown, dtype=float)
        self.stragglers = stragglers
        self.rng = np.random.default_rng(seed)
        self.offsets = workload.replay_offsets(self.rng, n)
        self.cols = np.zeros((n, 0, 4))
        if stragglers.persistent_share > 0:  # the same slow ranks for the whole run
            only = Stragglers(persistent_share=stragglers.persistent_share,
                              persistent_factor=stragglers.persistent_factor)
            self.slowdown = self.slowdown * delay_factors(only, np.ones(n), self.rng, (n, 1))[:, 0]
            self.stragglers = Stragglers(every_sigma=stragglers.every_sigma,
                                         transient_share=stragglers.transient_share,
                                         transient_sigma=stragglers.transient_sigma)

    def ensure(self, steps: int) -> None:
        have = self.cols.shape[1]
        if steps <= have:
            return
        more = max(steps - have, have, 8)
        block = self.workload.draw(self.rng, self.n, have, more, self.offsets)
        factor = delay_factors(self.stragglers, self.slowdown, self.rng, (self.n, more))
        block[..., 3] += block[..., 1] * (factor - 1.0)  # a measured delay, and the factor's
        self.cols = np.concatenate([self.cols, block], axis=1)

    def step(self, j: int) -> tuple[np.ndarray, ...]:
        """(data, compute, update, delay) of step ``j`` for every rank."""
        self.ensure(j + 1)
        c = self.cols[:, j]
        return c[:, 0], c[:, 1], c[:, 2], c[:, 3]

    def rank(self, k: int, j: int) -> np.ndarray:
        self.ensure(j + 1)
        return self.cols[k, j]


@dataclass
class Rows:
    """Growable per-rank rows of the run-file columns."""

    n: int
    cols: list[dict[str, list]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cols = [{name: [] for name in schema.RANK_COLUMNS} for _ in range(self.n)]

    def add_all(self, **values: Any) -> None:
        """One row for every rank; array values are per rank, scalars shared."""
        for name in schema.RANK_COLUMNS:
            v = values.get(name, _default(name))
            if np.ndim(v):
                for k in range(self.n):
                    self.cols[k][name].append(v[k])
            else:
                for k in range(self.n):
                    self.cols[k][name].append(v)

    def add(self, k: int, **values: Any) -> None:
        for name in schema.RANK_COLUMNS:
            self.cols[k][name].append(values.get(name, _default(name)))

    def arrays(self) -> dict[int, dict[str, np.ndarray]]:
        return {k: {name: np.asarray(col, dtype=schema.RANK_COLUMNS[name])
                    for name, col in cols.items()}
                for k, cols in enumerate(self.cols)}


def _default(name: str) -> Any:
    return math.nan if name == "loss" else schema.RANK_COLUMN_DEFAULTS.get(name, 0)


@dataclass
class Timeline:
    rows: Rows
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)


def allreduce_time(nbytes: float, n: int, algorithm: str, time_phase: PhaseTime) -> float:
    return cost(allreduce_phases(nbytes, n, algorithm), time_phase)


# -- SSGD -------------------------------------------------------------------------

def bucket_plan(workload: Workload, bucket_mb: Any) -> list[tuple[int, int]]:
    """SSGD's buckets ``[start, end)`` in posting order, by SSGD's own functions."""
    from syncbench.algorithms.ssgd import bucket_bytes, plan_buckets  # noqa: PLC0415

    elems = max(1, bucket_bytes(bucket_mb, workload.params * workload.itemsize)
                // workload.itemsize)
    return plan_buckets(workload.offsets(), workload.params, elems)


def ssgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
         time_phase: PhaseTime) -> Timeline:
    w, n = local.workload, local.n
    rows, t = Rows(n), np.zeros(n)
    blocking = cfg.comm == "blocking"
    algo = cfg.allreduce
    if blocking:
        t_all = allreduce_time(w.param_bytes, n, algo, time_phase)
    else:
        plan = bucket_plan(w, cfg.bucket_mb)
        durations = [allreduce_time((hi - lo) * w.itemsize, n, algo, time_phase)
                     for lo, hi in plan]
        # A bucket is final when backward (last layer first) has reached its start.
        ready_share = [(w.params - lo) / w.params for lo, _ in plan]
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        arrive = start + data + comp + delay
        if blocking:
            end = float(arrive.max()) + t_all
            comm, wait = end - arrive, np.zeros(n)
        else:
            fwd = start + data + comp * (1 - BACKWARD_SHARE)
            end = 0.0
            for share, dur in zip(ready_share, durations):
                posted = float((fwd + comp * BACKWARD_SHARE * share).max())
                end = max(posted, end) + dur
            wait = np.maximum(end - arrive, 0.0)
            comm = np.zeros(n)
        t = np.maximum(arrive, end) + upd
        rows.add_all(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                     t_wait=wait, t_update=upd, t_delay=delay, samples=w.batch_size)
    return Timeline(rows, float(t.max()), {"buckets": 1 if blocking else len(durations)})


# -- Local SGD ----------------------------------------------------------------------

def momentum_sync_time(cfg: argparse.Namespace, w: Workload, n: int,
                       time_phase: PhaseTime) -> float:
    """``--momentum-sync average``: one more blocking Allreduce, of the velocity, per round."""
    if cfg.momentum_sync != "average":
        return 0.0
    return allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase)


def localsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
             time_phase: PhaseTime) -> Timeline:
    w, n = local.workload, local.n
    period = int(cfg.period)
    t_avg = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase)
    t_avg += momentum_sync_time(cfg, w, n, time_phase)
    rows, t = Rows(n), np.zeros(n)
    rnd, in_round = 0, 0
    round_len = min(period, steps)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        t = start + data + comp + delay + upd
        comm = np.zeros(n)
        in_round += 1
        if in_round >= round_len:
            end = float(t.max()) + t_avg
            comm, t = end - t, np.full(n, end)
        rows.add_all(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                     t_update=upd, t_delay=delay, samples=w.batch_size, local_steps=round_len,
                     round=rnd)
        if in_round >= round_len:
            rnd, in_round = rnd + 1, 0
            round_len = min(period, steps - j - 1)
    return Timeline(rows, float(t.max()))


# -- OD-SGD -------------------------------------------------------------------------

def odsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
          time_phase: PhaseTime) -> Timeline:
    w, n = local.workload, local.n
    warmup = min(int(cfg.warmup_steps), steps)
    t_all = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase)
    rows, t = Rows(n), np.zeros(n)
    prev_end = 0.0  # end of the previous step's reduction (none yet: the start of time)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        arrive = start + data + comp + delay
        if j < warmup:
            end = float(arrive.max()) + t_all
            comm, wait = end - arrive, np.zeros(n)
            t = end + upd
        else:
            end_this = max(float(arrive.max()), prev_end) + t_all
            done = np.maximum(arrive, prev_end)
            wait, comm = done - arrive, np.zeros(n)
            t = done + upd
            prev_end = end_this
        rows.add_all(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                     t_wait=wait, t_update=upd, t_delay=delay, samples=w.batch_size)
    wall = max(float(t.max()), prev_end)
    return Timeline(rows, wall, {"warmup_steps": warmup})


# -- Oscars -------------------------------------------------------------------------

def oscars(cfg: argparse.Namespace, local: LocalTimes, steps: int,
           time_phase: PhaseTime) -> Timeline:
    from syncbench.algorithms.oscars import (  # noqa: PLC0415 - the strategy's own rules
        Oscars,
        next_schedule,
        plan_round,
        tau_max_of,
        uniform_schedule,
    )

    w, n = local.workload, local.n
    total = steps * n
    t_red = allreduce_time((w.params + n + 1) * w.itemsize, n, cfg.allreduce, time_phase)
    t_mom = momentum_sync_time(cfg, w, n, time_phase)
    # Each rank's speed state, updated by Oscars' own method on a plain namespace.
    state = [SimpleNamespace(options=cfg, step_seconds=0.0, _window=[0.0, 0])
             for _ in range(n)]
    rows, t = Rows(n), np.zeros(n)
    taken = np.zeros(n, dtype=int)
    consumed, rnd = 0, 0  # every round is planned and consumed in the same iteration
    plan = uniform_schedule(n, float(cfg.period), tau_max_of(cfg))
    pending_end = None
    while consumed < total:
        taus = plan_round(plan, total, consumed)
        post = np.zeros(n)
        for k in range(n):
            tk = t[k]
            for i in range(taus[k]):
                d, c, u, dl = local.rank(k, int(taken[k]))
                start = tk
                tk = start + d + c + dl + u
                wait = 0.0
                if i == 0 and pending_end is not None:  # overlapped: wait after this step
                    wait = max(0.0, pending_end - tk)
                    tk += wait
                rows.add(k, step=int(taken[k]), t_start=start, t_data=d, t_compute=c,
                         t_update=u, t_delay=dl, t_wait=wait, samples=w.batch_size,
                         local_steps=taus[k], round=rnd, speed=state[k].step_seconds)
                state[k]._window[0] += d + c + dl + u
                state[k]._window[1] += 1
                taken[k] += 1
            post[k] = tk
        for s in state:
            Oscars._update_speed(s)
        speeds = [s.step_seconds for s in state]
        end = float(post.max()) + t_red + t_mom  # the velocity's Allreduce follows
        consumed += sum(taus)
        rnd += 1
        last = consumed >= total
        if cfg.overlap and not last:
            t, pending_end = post.copy(), end
        else:
            for k in range(n):  # the blocking part of the Wait lands on the round's last row
                rows.cols[k]["t_wait"][-1] += end - t_mom - post[k]
                rows.cols[k]["t_comm"][-1] += t_mom  # the velocity's blocking Allreduce
            t, pending_end = np.full(n, end), None
        plan = next_schedule(cfg, speeds, rnd)
    return Timeline(rows, float(t.max()), {"rounds": rnd})


from syncbench.bench.simulate.asgd import asgd  # noqa: E402 - it builds on the helpers above

SIMULATORS: dict[str, Callable[..., Timeline]] = {
    "ssgd": ssgd, "asgd": asgd, "localsgd": localsgd, "oscars": oscars, "odsgd": odsgd,
}
