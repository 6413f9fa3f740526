"""ASGD's simulated timeline: workers that pull, compute and push on their own clocks.

Every worker pulls, computes and pushes on its own clock;
tickets (the global budget) go to whichever worker asks first, as
ASGD's ``claims`` counter does; staleness is the number of pushes that
landed between a worker's pull and its push. Pull and push durations come
from a mean-field model of the concurrent traffic: with c the mean local
step and T(m) the pull + push time when m workers transfer at once
(simulated), m = round(W * T / (c + T)) is iterated to a fixed point.
``--delay-compensation`` adds the second read of the weights to the push.
"""

from __future__ import annotations

import argparse
import heapq
import math

import numpy as np

from syncbench.bench.simulate.collectives import asgd_phases, powers_of_two_upto, weighted_cost
from syncbench.bench.simulate.strategies import LocalTimes, PhaseTime, Rows, Timeline


def asgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
         time_phase: PhaseTime) -> Timeline:
    w, n = local.workload, local.n
    layout = cfg.ps_layout
    workers = list(range(1, n)) if layout == "dedicated" and n > 1 else list(range(n))
    total = steps * n
    local.ensure(max(8, 2 * steps))
    mean_local = float(local.cols[workers, :, :].sum(axis=2).mean())

    # DC-ASGD (--delay-compensation > 0) Gets the current weights again before its push.
    extra_get = 1.0 if float(cfg.delay_compensation) > 0 else 0.0

    def transfer(active: int) -> tuple[float, float]:
        pull, push = asgd_phases(w.param_bytes, n, layout, active)
        t_pull = weighted_cost(pull, time_phase)
        return t_pull, weighted_cost(push, time_phase) + extra_get * t_pull

    levels = powers_of_two_upto(len(workers))
    active = 1  # from the uncontended transfer, up to the fixed point
    for _ in range(6):  # mean-field fixed point of the concurrency
        t_pull, t_push = transfer(active)
        busy = (t_pull + t_push) / (mean_local + t_pull + t_push)
        want = max(1, round(busy * len(workers)))
        nxt = min(levels, key=lambda m: abs(math.log(m) - math.log(want)))
        if nxt == active:
            break
        active = nxt
    t_pull, t_push = transfer(active)
    rows = Rows(n)
    heap = [(0.0, k) for k in workers]
    heapq.heapify(heap)
    taken = dict.fromkeys(workers, 0)
    pulls, pushes = [], []
    for _ in range(total):
        now, k = heapq.heappop(heap)
        d, c, u, dl = local.rank(k, taken[k])
        pulled = now + t_pull
        pushed = pulled + d + c + dl + u + t_push
        rows.add(k, step=taken[k], t_start=now, t_data=d, t_compute=c, t_update=u, t_delay=dl,
                 t_comm=t_pull + t_push, samples=w.batch_size)
        pulls.append((k, taken[k], now, pulled))
        pushes.append(pushed)
        taken[k] += 1
        heapq.heappush(heap, (pushed, k))
    landed = np.sort(np.asarray(pushes))
    for (k, j, began, pulled), pushed in zip(pulls, pushes):
        before = int(np.searchsorted(landed, pushed, "left"))
        rows.cols[k]["staleness"][j] = before - int(np.searchsorted(landed, began, "right"))
        rows.cols[k]["staleness_min"][j] = before - int(np.searchsorted(landed, pulled, "right"))
    wall = float(max(pushes)) if pushes else 0.0
    return Timeline(rows, wall, {"asgd_active": active, "pull_s": t_pull, "push_s": t_push})
