"""One simulated timeline per communication pattern: per-rank, per-step phase rows.

Each function composes a pattern's rank timelines from its local step times
(:class:`.timeline.LocalTimes`) and the simulated durations of its collectives
(:mod:`.collectives`, timed by :class:`.engine.Network`; a nonblocking one
progresses as :mod:`.progress` models it), following the strategy's module in
``algorithms/`` (ALGORITHMS.md) and calling its pure functions, never copying
them. Every step is one vector operation over the ranks (no Python loop over
ranks and steps). ASGD's pattern is :mod:`.asgd`.

A strategy names the pattern it is simulated by (its ``simulation`` trait,
``Strategy.traits``): :data:`SIMULATORS` is keyed by pattern and
:func:`simulator_for` finds a registered strategy's, so a strategy derived from
SSGD simulates as SSGD with no edit here.

Compute is never contended (each rank has its own device), the local
arithmetic of a stage's reduction is left out (as in the blocking
collectives), an update's parts before a post (OD-SGD's copy of the
gradient, Oscars' packing) are counted after it, and the time a spinning
MPI wait takes from other ranks on a shared core is left out.

The strategies' modules and their parts import without MPI
(:mod:`syncbench.algorithms.mpi`), so the simulator imports their functions directly.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from syncbench.algorithms.averagers.adaptive import AdaptiveAverager
from syncbench.algorithms.averagers.schedule import (
    next_schedule,
    plan_round,
    tau_max_of,
    uniform_schedule,
)
from syncbench.algorithms.reducers.buckets import bucket_bytes, plan_buckets
from syncbench.algorithms.registry import ALGORITHMS, get_algorithm
from syncbench.bench.simulate.asgd import asgd
from syncbench.bench.simulate.collectives import PhaseClock, RefilledAllreduce, allreduce_time
from syncbench.bench.simulate.compressed import compressed_ssgd
from syncbench.bench.simulate.decentralized import adpsgd, dpsgd
from syncbench.bench.simulate.hierarchical import hierarchical, with_hierarchical_comm
from syncbench.bench.simulate.progress import (
    TESTALL_SECONDS,
    Calendar,
    Inflight,
    Wire,
    advance,
    allreduce_stage_bytes,
    allreduce_stages,
    bucketed_wire,
    compute_polls,
    delay_polls,
)
from syncbench.bench.simulate.rounds import diloco, momentum_sync_seconds, slowmo
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline
from syncbench.bench.simulate.workload import ComputeSplit, Workload


def bucket_plan(workload: Workload, bucket_mb: Any) -> list[tuple[int, int]]:
    """SSGD's buckets ``[start, end)`` in posting order, by SSGD's own functions."""
    elems = max(1, bucket_bytes(bucket_mb, workload.params * workload.itemsize)
                // workload.itemsize)
    return plan_buckets(workload.offsets(), workload.params, elems)


@dataclass(frozen=True)
class HookPlan:
    """What each backward hook call of an SSGD overlap step does
    (``BucketedIallreduce.on_grads_ready``).

    ``posts[h]``: the buckets hook h posts; ``straggle``: the hook that spends
    the delay (before posting the last bucket; None: after the last hook, as
    ``BucketedIallreduce.complete`` does when no bucket is left); ``polls``: the hooks
    that call ``Testall`` with a request outstanding (they post nothing).
    """

    posts: tuple[tuple[int, ...], ...]
    straggle: int | None
    polls: tuple[int, ...]


def hook_plan(plan: Sequence[tuple[int, int]], offsets: Sequence[int]) -> HookPlan:
    """Replay ``BucketedIallreduce.on_grads_ready``'s rule over the offsets backward reports."""
    posts, polls, straggle, nxt = [], [], None, 0
    for h, offset in enumerate(offsets):
        mine = []
        while nxt < len(plan) and plan[nxt][0] >= offset:
            if nxt == len(plan) - 1:
                straggle = h
            mine.append(nxt)
            nxt += 1
        posts.append(tuple(mine))
        if not mine and nxt > 0:  # Communicator.poll tests only with requests outstanding
            polls.append(h)
    return HookPlan(tuple(posts), straggle, tuple(polls))


def _overlap_step(cfg: argparse.Namespace, split: ComputeSplit, hooks: HookPlan,
                  stages: list[np.ndarray], begin: np.ndarray, comp: np.ndarray,
                  delay: np.ndarray, polled: np.ndarray,
                  stage_bytes: list[np.ndarray] | None = None,
                  wire: Wire | None = None) -> tuple[np.ndarray, float, float]:
    """One SSGD overlap step from the end of data loading: (arrive at Waitall, end, comm);
    ``polled``: each rank's part of ``delay`` that polls (:meth:`.LocalTimes.polled`)."""
    n = len(begin)
    shares = np.asarray(split.backward)
    polls_before = np.cumsum([0] + [1 if h in hooks.polls else 0 for h in range(len(shares))])
    base = begin[:, None] + comp[:, None] * shares + TESTALL_SECONDS * polls_before[:-1]
    after = np.arange(len(shares)) > (hooks.straggle if hooks.straggle is not None
                                      else len(shares))
    at = base + delay[:, None] * after  # each hook's instant, shifted by the delay after it
    calendar = Calendar(n)
    calendar.add_polls(at[:, list(hooks.polls)])
    arrive = begin + comp + TESTALL_SECONDS * polls_before[-1] + delay
    if hooks.straggle is not None:
        delay_polls(calendar, cfg, split, at[:, hooks.straggle], polled, comp)
    calendar.add_span(arrive, np.inf)
    wire, colls = wire or Wire(), []
    for h, buckets in enumerate(hooks.posts):
        for b in buckets:
            posted = at[:, h] + (delay if h == hooks.straggle and b == len(stages) - 1 else 0)
            colls.append(Inflight(stages[b], float(posted.max()), calendar, b,
                                  stage_bytes[b] if stage_bytes else None))
    for c in colls:
        advance(colls, wire, c)
    end = max((c.end for c in colls), default=0.0)
    return arrive, end, TESTALL_SECONDS * float(polls_before[-1])


def ssgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
         time_phase: PhaseClock) -> Timeline:
    """SSGD's timeline (``SSGD.step`` with ``BucketedIallreduce``).

    ``--comm blocking``: compute, the straggler's delay, one Allreduce of the
    gradient that starts when the last rank arrives (charged to ``comm`` with the
    waiting, as a blocking MPI call is). ``--comm overlap``: the buckets of
    ``plan_buckets()`` are posted from the hook backward calls after each layer
    (:class:`.workload.ComputeSplit` gives where), and the hook that posts the LAST
    bucket spends the delay first (after posting the buckets that hook posts before
    it); a hook that posts nothing polls (``Testall``); the ``wait`` is the
    ``Waitall`` after the last hook.
    """
    if cfg.comm not in ("blocking", "overlap"):
        raise ValueError(f"--comm {cfg.comm} is not simulated (blocking and overlap are)")
    if getattr(cfg, "compress", "none") != "none":  # a compressing reducer's collectives
        return compressed_ssgd(cfg, local, steps, time_phase)
    w, n = local.workload, local.n
    rows, t = StepRows(n), np.zeros(n)
    blocking = cfg.comm == "blocking"
    algo = cfg.allreduce
    if blocking:
        # the links refill their bucket while the ranks compute, from the last Allreduce
        t_all = RefilledAllreduce(w.param_bytes, n, algo, time_phase, w.itemsize)
        last_end = -math.inf
    else:
        plan = bucket_plan(w, cfg.bucket_mb)
        split = w.compute_split()
        hooks = hook_plan(plan, split.offsets)
        stages = [allreduce_stages((hi - lo) * w.itemsize, n, algo, time_phase, w.itemsize)
                  for lo, hi in plan]
        stage_bytes = [allreduce_stage_bytes((hi - lo) * w.itemsize, n, algo, time_phase,
                                             w.itemsize) for lo, hi in plan]
        # the links' bucket refills from one step's last stage to the next step's first
        wire = bucketed_wire(time_phase, w.param_bytes, n, algo, w.itemsize)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if blocking:
            arrive = start + data + comp + delay
            begin = float(arrive.max())
            end = last_end = begin + t_all(begin - last_end)
            comm, wait = end - arrive, np.zeros(n)
        else:
            arrive, end, poll_s = _overlap_step(cfg, split, hooks, stages, start + data, comp,
                                                delay, local.polled(comp, delay),
                                                stage_bytes, wire)
            wait, comm = np.maximum(end - arrive, 0.0), poll_s
        t = np.maximum(arrive, end) + upd
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_wait=wait, t_update=upd, t_delay=delay, samples=w.batch_size)
    return Timeline(rows, float(t.max()), {"buckets": 1 if blocking else len(stages)})


# -- Local SGD ----------------------------------------------------------------------

def localsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
             time_phase: PhaseClock) -> Timeline:
    """Local SGD's timeline (``LocalSGD.step``, ``local_step``): compute, delay and update;
    after ``--period`` local steps (the last round shorter, as in
    ``LocalSGD._next_round_len``) the blocking Allreduce of the parameters after the last
    rank's update, and of the velocity too with ``--momentum-sync average``."""
    w, n = local.workload, local.n
    period = int(cfg.period)
    t_avg = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    t_avg += momentum_sync_seconds(cfg, w.param_bytes, n, time_phase, w.itemsize)
    rows, t = StepRows(n), np.zeros(n)
    rnd, in_round = 0, 0
    round_len = min(period, steps)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        t = start + data + comp + delay + upd
        comm: Any = 0.0
        in_round += 1
        if in_round >= round_len:
            end = float(t.max()) + t_avg
            comm, t = end - t, np.full(n, end)
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_update=upd, t_delay=delay, samples=w.batch_size, local_steps=round_len,
                 round=rnd)
        if in_round >= round_len:
            rnd, in_round = rnd + 1, 0
            round_len = min(period, steps - j - 1)
    return Timeline(rows, float(t.max()))


# -- OD-SGD -------------------------------------------------------------------------

def odsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
          time_phase: PhaseClock) -> Timeline:
    """OD-SGD's timeline (``ODSGD.step``): warm-up steps as blocking SSGD, then step t's
    compute polls step t-1's Iallreduce at every hook call (``ODSGD._poll``), the delay
    follows (``straggle``), step t's Iallreduce is posted and step t-1's waited for
    (``_delayed_update``, ``_apply_pending``); the last one is waited for by ``finish``.
    A delayed step's row has ``staleness`` 1, as ``ODSGD.step`` reports it."""
    w, n = local.workload, local.n
    warmup = min(int(cfg.warmup_steps), steps)
    t_all = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    stages = allreduce_stages(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    sizes = allreduce_stage_bytes(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    split = w.compute_split()
    shares = split.hooks
    rows, t = StepRows(n), np.zeros(n)
    # step t-1's Iallreduce, in flight
    wire, pending = bucketed_wire(time_phase, w.param_bytes, n, cfg.allreduce, w.itemsize), None
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if j < warmup:
            arrive = start + data + comp + delay
            end = float(arrive.max()) + t_all
            rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=end - arrive,
                     t_update=upd, t_delay=delay, samples=w.batch_size)
            t = end + upd
            wire.spend_all(end)  # OD-SGD's warm-up: a blocking Allreduce
            continue
        cost_s = TESTALL_SECONDS if pending is not None else 0.0  # nothing outstanding yet
        polls, computed = compute_polls(start + data, comp, shares, cost_s)
        posted = computed + delay
        fresh = Calendar(n)
        fresh.add_span(posted, np.inf)
        current = Inflight(stages, float(posted.max()), fresh, j, sizes)
        wait = np.zeros(n)
        if pending is not None:
            pending.calendar.add_polls(polls)
            delay_polls(pending.calendar, cfg, split, computed,
                        local.polled(comp, delay), comp)
            pending.calendar.add_span(posted, np.inf)  # Wait(req_{t-1}) after the post
            advance([pending, current], wire, pending)
            wait = np.maximum(pending.end - posted, 0.0)
        left = posted + wait
        fresh.spans[-1] = (posted, left)  # the ranks leave the Wait: later stages need polls
        fresh.version += 1
        pending = current
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp,
                 t_comm=cost_s * len(shares), t_wait=wait, t_update=upd, t_delay=delay,
                 samples=w.batch_size, staleness=1)
        t = left + upd
    wall = float(t.max())
    if pending is not None:  # finish(): the last reduction is waited for
        pending.calendar.add_span(t, np.inf)
        advance([pending], wire, pending)
        wall = max(wall, pending.end)
    return Timeline(rows, wall, {"warmup_steps": warmup})


# -- Oscars -------------------------------------------------------------------------

def _oscars_speeds(state: list[SimpleNamespace], window: np.ndarray, count: np.ndarray,
                   update_speed: Callable[[Any], None]) -> np.ndarray:
    """Every rank's c_k after ``AdaptiveAverager._update_speed`` on this round's window."""
    for k, s in enumerate(state):
        s._window = [float(window[k]), int(count[k])]
        update_speed(s)
    return np.array([s.step_seconds for s in state])


def _oscars_overlapped(cfg: argparse.Namespace, local: LocalTimes, pending: Inflight,
                       wire: Wire, t: np.ndarray, taken: np.ndarray,
                       t_mom: float) -> dict[str, Any]:
    """The first step of a round while the previous round's Iallreduce is in flight.

    ``Oscars.step``: a local step polling at every hook call
    (``_local_step`` with ``comm.poll``), the delay, the update, then
    ``_complete``: the Wait, and the velocity's Allreduce (``--momentum-sync
    average``).
    """
    n = local.n
    ranks = np.arange(n)
    d, c, u, dl = local.steps(ranks, taken)
    split = local.workload.compute_split()
    polls, computed = compute_polls(t + d, c, split.hooks, TESTALL_SECONDS)
    pending.calendar.add_polls(polls)
    delay_polls(pending.calendar, cfg, split, computed, local.polled(c, dl), c)
    stepped = computed + dl + u
    pending.calendar.add_span(stepped, np.inf)
    advance([pending], wire, pending)
    left = np.maximum(stepped, pending.end)
    after = float(left.max()) + t_mom if t_mom > 0 else left
    wire.free_at = max(wire.free_at, float(np.max(after)))
    comm = TESTALL_SECONDS * len(split.hooks) + (after - left)
    return {"ranks": ranks, "t_start": t.copy(), "t_data": d, "t_compute": c, "t_update": u,
            "t_delay": dl, "t_wait": left - stepped, "t_comm": comm,
            "_end": np.broadcast_to(after, (n,)).copy()}


def oscars(cfg: argparse.Namespace, local: LocalTimes, steps: int,
           time_phase: PhaseClock) -> Timeline:
    """Oscars' timeline (``Oscars.step``), round by round, each local step one vector
    operation over the ranks still in the round.

    A round's local steps come from ``uniform_schedule()``, ``next_schedule()`` and
    ``plan_round()`` of ``algorithms/oscars.py``, its speed estimates from
    ``AdaptiveAverager._update_speed`` (all called); its last step posts one packed Iallreduce
    of params + N + 1 floats (``_start_reduction``) and waits for it at once, or with
    ``--overlap`` takes the next round's first step (compute with a ``Testall`` at
    every hook call, delay, update) before the ``Wait`` (``_complete``);
    ``--momentum-sync average`` adds the velocity's blocking Allreduce after the Wait.
    """
    w, n = local.workload, local.n
    total = steps * n
    nbytes = (w.params + n + 1) * w.itemsize
    stages = allreduce_stages(nbytes, n, cfg.allreduce, time_phase, w.itemsize)
    sizes = allreduce_stage_bytes(nbytes, n, cfg.allreduce, time_phase, w.itemsize)
    t_red = float(stages.sum())
    t_mom = momentum_sync_seconds(cfg, w.param_bytes, n, time_phase, w.itemsize)
    # Each rank's speed state, updated by Oscars' own method on a plain namespace.
    state = [SimpleNamespace(options=cfg, step_seconds=0.0, _window=[0.0, 0])
             for _ in range(n)]
    speeds = np.zeros(n)
    rows, t, taken = StepRows(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    consumed, rnd = 0, 0
    wire = bucketed_wire(time_phase, nbytes, n, cfg.allreduce, w.itemsize)
    plan = uniform_schedule(n, float(cfg.period), tau_max_of(cfg))
    pending: Inflight | None = None
    while consumed < total:
        taus = np.asarray(plan_round(plan, total, consumed))
        window, count = np.zeros(n), np.zeros(n, dtype=np.int64)
        blocks = []
        for i in range(int(taus.max())):
            if i == 0 and pending is not None:
                block = _oscars_overlapped(cfg, local, pending, wire, t, taken, t_mom)
                end = block.pop("_end")
                pending = None
            else:
                ranks = np.flatnonzero(taus > i)
                d, c, u, dl = local.steps(ranks, taken[ranks])
                end = t[ranks] + d + c + dl + u
                block = {"ranks": ranks, "t_start": t[ranks].copy(), "t_data": d,
                         "t_compute": c, "t_update": u, "t_delay": dl,
                         "t_wait": np.zeros(len(ranks)), "t_comm": np.zeros(len(ranks))}
            ranks = block["ranks"]
            window[ranks] += block["t_data"] + block["t_compute"] + block["t_delay"] \
                + block["t_update"]
            count[ranks] += 1
            t[ranks] = end
            taken[ranks] += 1
            block.update(step=taken[ranks] - 1, local_steps=taus[ranks], round=rnd,
                         speed=speeds[ranks])
            blocks.append(block)
        # _start_reduction: every rank's c_k, then the packed Iallreduce
        speeds = _oscars_speeds(state, window, count, AdaptiveAverager._update_speed)
        consumed += int(taus.sum())
        rnd += 1
        posted = t.copy()
        if cfg.overlap and consumed < total:
            pending = Inflight(stages, float(posted.max()), Calendar(n), rnd, sizes)
        else:  # _complete at once: the Wait, then the velocity's blocking Allreduce
            end = max(float(posted.max()), wire.free_at) + t_red
            wire.spend_all(end + t_mom)
            for i, block in enumerate(blocks):  # the Wait is on each rank's last row
                last = taus[block["ranks"]] == i + 1
                block["t_wait"] = block["t_wait"] + np.where(last, end - posted[block["ranks"]],
                                                             0.0)
                block["t_comm"] = block["t_comm"] + np.where(last, t_mom, 0.0)
            t = np.full(n, end + t_mom)
        for block in blocks:
            rows.add(block.pop("ranks"), samples=w.batch_size, **block)
        plan = next_schedule(cfg, list(speeds), rnd)
    return Timeline(rows, float(t.max()), {"rounds": rnd})

#: Communication pattern (a strategy's ``simulation`` trait) -> its timeline.
SIMULATORS: dict[str, Callable[..., Timeline]] = {
    f.__name__: f for f in (with_hierarchical_comm(ssgd), asgd, localsgd, oscars, odsgd, dpsgd,
                            adpsgd, hierarchical, slowmo, diloco)}


def pattern_of(name: str) -> str:
    """The communication pattern registered strategy ``name`` is simulated by ("": none)."""
    return get_algorithm(name).traits.simulation


def simulated_strategies() -> list[str]:
    """The registered strategies whose pattern the simulator knows, in registry order."""
    return [name for name, cls in ALGORITHMS.items()
            if cls.traits.simulation in SIMULATORS]


def simulator_for(name: str) -> Callable[..., Timeline]:
    """The timeline of registered strategy ``name``; ``ValueError`` if it has none."""
    pattern = pattern_of(name)
    if pattern not in SIMULATORS:
        raise ValueError(f"strategy {name!r} has no simulated communication pattern "
                         f"(simulation trait {pattern!r}); simulated: "
                         f"{', '.join(simulated_strategies())}")
    return SIMULATORS[pattern]
