"""One simulated timeline per strategy: per-rank, per-step phase rows.

Each function composes a strategy's rank timelines from its local step
times (:class:`LocalTimes`) and the simulated durations of its collectives
(:mod:`.collectives` timed by :class:`.engine.Network`), following its
module in ``algorithms/`` (ALGORITHMS.md). Every step is one vector
operation over the ranks (no Python loop over ranks and steps):

* ``ssgd``: ``--comm blocking`` (``SSGD.reduce_gradients``): compute, the
  straggler's delay, one Allreduce of the gradient that starts when the last
  rank arrives (charged to ``comm`` with the waiting, as a blocking MPI call
  is). ``--comm overlap``: the buckets of ``plan_buckets()`` are posted
  from ``SSGD._on_grads_ready``, the hook backward calls after each layer
  (:class:`.workload.ComputeSplit` gives where), and the hook that posts
  the LAST bucket spends the delay first (after posting the buckets that
  hook posts before it); a hook that posts nothing polls (``Testall``);
  the ``wait`` is the ``Waitall`` after the last hook.
* ``localsgd`` (``LocalSGD.step``, ``local_step``): compute, delay, update;
  after ``--period`` local steps a blocking Allreduce of the parameters
  (the last round shorter, as in ``LocalSGD._next_round_len``), and of the
  velocity too with ``--momentum-sync average`` (also Oscars).
* ``odsgd`` (``ODSGD.step``): ``--warmup-steps`` SSGD steps (compute, delay,
  blocking Allreduce), then compute with a ``Testall`` at every hook call
  (``ODSGD._poll``), delay, the post of step t's Iallreduce, and the
  ``Wait`` for step t-1's (``_delayed_update``, ``_apply_pending``); the
  last one is waited for after the last step (``finish``).
* ``oscars``: rounds whose local steps come from ``uniform_schedule()``,
  ``next_schedule()`` and ``plan_round()`` of ``algorithms/oscars.py`` and
  whose speed estimates from ``Oscars._update_speed`` (all called); a
  round's last step posts one packed Iallreduce of params + N + 1 floats
  (``_start_reduction``) and waits for it at once, or with ``--overlap``
  takes the next round's first step (compute with a ``Testall`` at every
  hook call, delay, update) before the ``Wait`` (``Oscars.step``,
  ``_complete``); ``--momentum-sync average`` adds the velocity's blocking
  Allreduce after the Wait.
* ``asgd``: :mod:`.asgd`.

Progress only at polls (:class:`Inflight`, :func:`advance`): MPI advances a
nonblocking collective only inside an MPI call (``Communicator.poll``'s
``Testall``, a ``Wait``, the polls of the straggler's delay). MPICH runs an
Iallreduce as a schedule of stages (each exchange of recursive doubling or
halving, each step of a ring; the stages of :func:`allreduce_stages`); a
stage's sends are posted only once the previous stage completed and the
rank is in MPI. So stage 1 is issued when the last rank posts the
collective, and stage k+1 at the first instant at or after stage k's end
at which every rank is inside MPI (:class:`Calendar`): a ``Testall`` at a
hook call, a poll of the delay, or any time in a ``Wait``, where what is
left runs back to back. A stage is one synchronous step over all ranks
(as every phase here, :mod:`.collectives`). The network carries one stage
at a time: of the collectives in flight whose next stage is issued, the
one posted first goes first. Each ``Testall`` with a request outstanding
takes :data:`TESTALL_SECONDS` on the rank's clock between its layers,
charged to ``comm`` as ``Communicator.poll`` charges it. The straggler's
delay polls as ``bench/train/slowdown.py`` does in the mode ``--slowdown-mode
auto`` resolves to on the simulated nodes (:func:`resolve_mode` with
``--gpus-per-node`` ranks per node): ``sleep`` every ``PROGRESS_INTERVAL_S``,
``work`` at the hook calls of the passes it repeats.

Compute is never contended (each rank has its own device), the local
arithmetic of a stage's reduction is left out (as in the blocking
collectives), an update's parts before a post (OD-SGD's copy of the
gradient, Oscars' packing) are counted after it, and the time a spinning
MPI wait takes from other ranks on a shared core is left out.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from syncbench.analysis import schema
from syncbench.bench.simulate.collectives import (
    Phase,
    allreduce_time,
    placed_phases,
)
from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload, delay_factors

PhaseTime = Callable[[Phase], float]

#: Seconds one ``MPI.Request.Testall`` takes with an Iallreduce in flight
#: (``Communicator.poll``). Measured on this machine (MPICH 5 wheel, 2 ranks on the
#: 2 cores, shared with other jobs, load average 2.6-5), ELEMS = 235146 (mlp's
#: gradient) and 61706 (lenet's), 3 runs each; each rank times the 12 polls, 50 us
#: apart, of each of 300 in-place Iallreduces (the first 10 left out) while the
#: request is in flight::
#:
#:     .venv/bin/mpiexec -n 2 .venv/bin/python -c '
#:     import sys, time, numpy as np
#:     from mpi4py import MPI
#:     c, b, t = MPI.COMM_WORLD, np.ones(int(sys.argv[1]), np.float32), []
#:     for i in range(300):
#:         c.Barrier(); r = [c.Iallreduce(MPI.IN_PLACE, b)]; done = False
#:         for _ in range(12):
#:             e = time.perf_counter() + 5e-5
#:             while time.perf_counter() < e: pass
#:             t0 = time.perf_counter(); f = MPI.Request.Testall(r)
#:             dt = time.perf_counter() - t0
#:             if i >= 10 and not done: t.append(dt)
#:             done = done or f
#:         MPI.Request.Waitall(r)
#:     print(c.rank, np.median(t), np.mean(t))' ELEMS
#:
#: Medians 1.1-3.4 us per poll (mlp), 1.5-2.9 us (lenet); 0.9-1.1 us once the
#: request completed. The means (8-64 us) hold the polls that run a stage's local
#: reduction and the other jobs' preemptions; the reduction's arithmetic is left
#: out of every collective here, so a poll costs the median, rounded.
TESTALL_SECONDS = 2.0e-6


# -- local step times -----------------------------------------------------------

class LocalTimes:
    """Per rank and step: data, compute, update and delay seconds (drawn in blocks).

    The delay is the measured run's own (a ``--workload RUN.h5`` rank that
    was slowed) plus compute x (factor - 1), the factor from ``--slowdown``
    and ``--stragglers`` (:func:`.workload.delay_factors`, >= 1).
    """

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
        """Draw every rank's local times up to step ``steps`` (exclusive)."""
        have = self.cols.shape[1]
        if steps <= have:
            return
        more = max(steps - have, have, 8)
        block = self.workload.draw(self.rng, self.n, have, more, self.offsets)
        factor = delay_factors(self.stragglers, self.slowdown, self.rng, (self.n, more))
        block[..., 3] += block[..., 1] * (factor - 1.0)
        self.cols = np.concatenate([self.cols, block], axis=1)

    def step(self, j: int) -> tuple[np.ndarray, ...]:
        """(data, compute, update, delay) of step ``j`` for every rank."""
        self.ensure(j + 1)
        c = self.cols[:, j]
        return c[:, 0], c[:, 1], c[:, 2], c[:, 3]

    def steps(self, ranks: np.ndarray, js: np.ndarray) -> tuple[np.ndarray, ...]:
        """(data, compute, update, delay) of step ``js[i]`` of rank ``ranks[i]``."""
        self.ensure(int(js.max()) + 1 if len(js) else 0)
        c = self.cols[ranks, js]
        return c[:, 0], c[:, 1], c[:, 2], c[:, 3]

    def rank(self, k: int, j: int) -> np.ndarray:
        self.ensure(j + 1)
        return self.cols[k, j]


# -- rows -------------------------------------------------------------------------

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

    add_all = add

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
    rows: StepRows
    wall_s: float
    notes: dict[str, Any] = field(default_factory=dict)


# -- collectives ------------------------------------------------------------------

def allreduce_stages(nbytes: float, n: int, algorithm: str, time_phase: PhaseTime,
                     itemsize: int = 4) -> np.ndarray:
    """Seconds of each stage of a nonblocking allreduce of ``nbytes``, in order.

    The stages are the phases of the Iallreduce (:func:`.collectives.placed_phases`), each
    repeat of a phase (a step of a ring) a stage of its own: the schedule of
    MPICH's Iallreduce advances one such exchange per progress call.
    """
    phases = placed_phases(nbytes, n, algorithm, time_phase, itemsize, nonblocking=True)
    return np.repeat([time_phase(p) for p in phases], [p.repeat for p in phases]).astype(float)


class Calendar:
    """When each rank is inside MPI (so can issue a collective's next stage).

    Made of per-rank segments: poll instants (an ``(n, P)`` array, sorted
    along each row), spans ``[a, b]`` (inside a ``Wait``: every instant),
    and periodic polls ``a + period * (m + grid)`` for ``m = 0, 1, ...``
    within ``[a, b]`` (a straggler's delay). :meth:`next` is vectorised over
    the ranks.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.polls: list[np.ndarray] = []
        self.spans: list[tuple[np.ndarray, np.ndarray]] = []
        self.periodic: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.version = 0

    def add_polls(self, instants: np.ndarray) -> None:
        if instants.size:
            self.polls.append(instants)
            self.version += 1

    def add_span(self, a: Any, b: Any) -> None:
        self.spans.append((np.broadcast_to(np.asarray(a, float), (self.n,)),
                           np.broadcast_to(np.asarray(b, float), (self.n,))))
        self.version += 1

    def add_periodic(self, a: np.ndarray, b: np.ndarray, period: np.ndarray | float,
                     grid: np.ndarray) -> None:
        """Polls at ``a + period * (m + grid[i])`` up to ``b`` (``grid`` sorted, in [0, 1))."""
        period = np.broadcast_to(np.asarray(period, float), (self.n,))
        keep = (b > a) & (period > 0)
        if keep.any():
            self.periodic.append((a, np.where(keep, b, -np.inf), np.where(keep, period, 1.0),
                                  np.asarray(grid, float)))
            self.version += 1

    def next(self, e: float) -> np.ndarray:
        """Per rank, the first instant >= ``e`` at which the rank is in MPI (inf: none)."""
        out = np.full(self.n, np.inf)
        for instants in self.polls:
            out = np.minimum(out, np.where(instants >= e, instants, np.inf).min(axis=1))
        for a, b in self.spans:
            t = np.maximum(a, e)
            out = np.minimum(out, np.where(t <= b, t, np.inf))
        for a, b, period, grid in self.periodic:
            u = np.maximum(e - a, 0.0) / period
            whole = np.floor(u)
            idx = np.searchsorted(grid, u - whole - 1e-12)
            wrap = idx >= len(grid)
            frac = grid[np.where(wrap, 0, idx)] + wrap
            t = np.maximum(a + period * (whole + frac), e)
            out = np.minimum(out, np.where(t <= b, t, np.inf))
        return out

    def continuous_until(self, e: float) -> float:
        """Until when every rank is inside a ``Wait`` span holding ``e`` (-inf: some is not)."""
        until = np.full(self.n, -np.inf)
        for a, b in self.spans:
            until = np.maximum(until, np.where((a <= e) & (e <= b), b, -np.inf))
        return float(until.min())


@dataclass
class Inflight:
    """A nonblocking collective in flight: its stages and how far it has got."""

    stages: np.ndarray
    posted: float  # when its last rank posted it (stage 1 issued)
    calendar: Calendar  # when its ranks are in MPI after the post
    order: int  # posting order: the earlier goes first on the network
    done_stages: int = 0
    last_end: float = -np.inf
    _ready: tuple[int, int, float] | None = None

    @property
    def done(self) -> bool:
        return self.done_stages >= len(self.stages)

    @property
    def end(self) -> float:
        """When its last stage ended (its post, without stages)."""
        return self.last_end if len(self.stages) else self.posted

    def ready(self) -> float:
        """When its next stage is issued (every rank in MPI after the previous one ended)."""
        if self.done_stages == 0:
            return self.posted
        key = (self.done_stages, self.calendar.version)
        if self._ready is None or self._ready[:2] != key:
            self._ready = (*key, float(self.calendar.next(self.last_end).max()))
        return self._ready[2]


@dataclass
class Wire:
    """The network: free from ``free_at`` on (it carries one stage at a time)."""

    free_at: float = 0.0


def advance(active: Sequence[Inflight], wire: Wire, target: Inflight) -> None:
    """Run stages of ``active`` collectives until ``target`` is done.

    The next stage on the network is, among the collectives whose next
    stage is issued by the time the network is free, the earliest posted;
    else the one issued first. While every rank is inside a ``Wait`` the
    earliest posted collective's stages run back to back.
    """
    while not target.done:
        pending = [c for c in active if not c.done]
        ready = [(c.ready(), c.order, c) for c in pending]
        issued = [r for r in ready if r[0] <= wire.free_at]
        when, _, pick = (min(issued, key=lambda r: r[1]) if issued
                         else min(ready, key=lambda r: r[:2]))
        start = max(when, wire.free_at)
        end = start + float(pick.stages[pick.done_stages])
        count = 1
        if pick.order == min(c.order for c in pending):  # back to back while all wait
            until = pick.calendar.continuous_until(start)
            if until >= end:
                ends = start + np.cumsum(pick.stages[pick.done_stages:])
                count = min(len(ends), int(np.searchsorted(ends, until, "right")) + 1)
                end = float(ends[count - 1])
        pick.done_stages += count
        pick.last_end = wire.free_at = end


def delay_polls(calendar: Calendar, cfg: argparse.Namespace, split: ComputeSplit,
                begin: np.ndarray, delay: np.ndarray, compute: np.ndarray) -> None:
    """Add the polls of the straggler's delay ``[begin, begin + delay]`` to ``calendar``.

    ``bench/train/slowdown.py``: the mode is ``auto``'s (``resolve_mode`` with
    ``--gpus-per-node`` ranks per node); ``sleep`` (and ``spin``) call the
    progress hook every ``PROGRESS_INTERVAL_S`` and once at the deadline,
    ``work`` (``ModelWork``) before each pass of the model copy and at each
    of its hook calls (a pass takes the rank's compute time).
    """
    from syncbench.bench.train.slowdown import PROGRESS_INTERVAL_S, resolve_mode

    end = begin + delay
    if resolve_mode("auto", int(getattr(cfg, "gpus_per_node", 1) or 1)) == "work":
        grid = np.unique(np.concatenate([[0.0], split.hooks % 1.0]))
        calendar.add_periodic(begin, end, compute, grid)
    else:
        calendar.add_periodic(begin, end, PROGRESS_INTERVAL_S, np.zeros(1))
    slowed = delay > 0
    calendar.add_span(np.where(slowed, end, np.inf), np.where(slowed, end, -np.inf))


def compute_polls(begin: np.ndarray, compute: np.ndarray, shares: np.ndarray,
                  cost_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(instants of a ``Testall`` at each hook call, end of compute) for every rank.

    Poll i starts after the compute up to its hook and the i polls before it.
    """
    count = len(shares)
    instants = begin[:, None] + compute[:, None] * shares[None, :] + cost_s * np.arange(count)
    return instants, begin + compute + cost_s * count


# -- SSGD -------------------------------------------------------------------------

def bucket_plan(workload: Workload, bucket_mb: Any) -> list[tuple[int, int]]:
    """SSGD's buckets ``[start, end)`` in posting order, by SSGD's own functions."""
    from syncbench.algorithms.ssgd import bucket_bytes, plan_buckets

    elems = max(1, bucket_bytes(bucket_mb, workload.params * workload.itemsize)
                // workload.itemsize)
    return plan_buckets(workload.offsets(), workload.params, elems)


@dataclass(frozen=True)
class HookPlan:
    """What each backward hook call of an SSGD overlap step does (``SSGD._on_grads_ready``).

    ``posts[h]``: the buckets hook h posts; ``straggle``: the hook that spends
    the delay (before posting the last bucket; None: after the last hook, as
    ``reduce_gradients`` does when no bucket is left); ``polls``: the hooks
    that call ``Testall`` with a request outstanding (they post nothing).
    """

    posts: tuple[tuple[int, ...], ...]
    straggle: int | None
    polls: tuple[int, ...]


def hook_plan(plan: Sequence[tuple[int, int]], offsets: Sequence[int]) -> HookPlan:
    """Replay ``SSGD._on_grads_ready``'s rule over the offsets backward reports."""
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
                  delay: np.ndarray) -> tuple[np.ndarray, float, float]:
    """One SSGD overlap step from the end of data loading: (arrive at Waitall, end, comm)."""
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
        delay_polls(calendar, cfg, split, at[:, hooks.straggle], delay, comp)
    calendar.add_span(arrive, np.inf)
    wire, colls = Wire(), []
    for h, buckets in enumerate(hooks.posts):
        for b in buckets:
            posted = at[:, h] + (delay if h == hooks.straggle and b == len(stages) - 1 else 0)
            colls.append(Inflight(stages[b], float(posted.max()), calendar, b))
    for c in colls:
        advance(colls, wire, c)
    end = max((c.end for c in colls), default=0.0)
    return arrive, end, TESTALL_SECONDS * float(polls_before[-1])


def ssgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
         time_phase: PhaseTime) -> Timeline:
    """SSGD's timeline (``SSGD.reduce_gradients``, ``SSGD._on_grads_ready``): see the module."""
    w, n = local.workload, local.n
    rows, t = StepRows(n), np.zeros(n)
    blocking = cfg.comm == "blocking"
    algo = cfg.allreduce
    if blocking:
        t_all = allreduce_time(w.param_bytes, n, algo, time_phase, w.itemsize)
    else:
        plan = bucket_plan(w, cfg.bucket_mb)
        split = w.compute_split()
        hooks = hook_plan(plan, split.offsets)
        stages = [allreduce_stages((hi - lo) * w.itemsize, n, algo, time_phase, w.itemsize)
                  for lo, hi in plan]
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if blocking:
            arrive = start + data + comp + delay
            end = float(arrive.max()) + t_all
            comm, wait = end - arrive, np.zeros(n)
        else:
            arrive, end, poll_s = _overlap_step(cfg, split, hooks, stages, start + data, comp,
                                                delay)
            wait, comm = np.maximum(end - arrive, 0.0), poll_s
        t = np.maximum(arrive, end) + upd
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_wait=wait, t_update=upd, t_delay=delay, samples=w.batch_size)
    return Timeline(rows, float(t.max()), {"buckets": 1 if blocking else len(stages)})


# -- Local SGD ----------------------------------------------------------------------

def momentum_sync_time(cfg: argparse.Namespace, w: Workload, n: int,
                       time_phase: PhaseTime) -> float:
    """``--momentum-sync average``: one more blocking Allreduce, of the velocity, per round."""
    if cfg.momentum_sync != "average":
        return 0.0
    return allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)


def localsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
             time_phase: PhaseTime) -> Timeline:
    """Local SGD's timeline (``LocalSGD.step``, ``local_step``): compute, delay and update,
    then at a round's end the blocking Allreduce(s) after the last rank's update."""
    w, n = local.workload, local.n
    period = int(cfg.period)
    t_avg = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    t_avg += momentum_sync_time(cfg, w, n, time_phase)
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
          time_phase: PhaseTime) -> Timeline:
    """OD-SGD's timeline (``ODSGD.step``): warm-up steps as blocking SSGD, then step t's
    compute polls step t-1's Iallreduce at every hook call (``ODSGD._poll``), the delay
    follows (``straggle``), step t's Iallreduce is posted and step t-1's waited for
    (``_delayed_update``, ``_apply_pending``); the last one is waited for by ``finish``.
    A delayed step's row has ``staleness`` 1, as ``ODSGD.step`` reports it."""
    w, n = local.workload, local.n
    warmup = min(int(cfg.warmup_steps), steps)
    t_all = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    stages = allreduce_stages(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    split = w.compute_split()
    shares = split.hooks
    rows, t = StepRows(n), np.zeros(n)
    wire, pending = Wire(), None  # step t-1's Iallreduce, in flight
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if j < warmup:
            arrive = start + data + comp + delay
            end = float(arrive.max()) + t_all
            rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=end - arrive,
                     t_update=upd, t_delay=delay, samples=w.batch_size)
            t = end + upd
            wire.free_at = end
            continue
        cost_s = TESTALL_SECONDS if pending is not None else 0.0  # nothing outstanding yet
        polls, computed = compute_polls(start + data, comp, shares, cost_s)
        posted = computed + delay
        fresh = Calendar(n)
        fresh.add_span(posted, np.inf)
        current = Inflight(stages, float(posted.max()), fresh, j)
        wait = np.zeros(n)
        if pending is not None:
            pending.calendar.add_polls(polls)
            delay_polls(pending.calendar, cfg, split, computed, delay, comp)
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
    """Every rank's c_k after ``Oscars._update_speed`` on this round's window."""
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
    delay_polls(pending.calendar, cfg, split, computed, dl, c)
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
           time_phase: PhaseTime) -> Timeline:
    """Oscars' timeline (``Oscars.step``), round by round, each local step one vector
    operation over the ranks still in the round; see the module docstring."""
    from syncbench.algorithms.oscars import (
        Oscars,
        next_schedule,
        plan_round,
        tau_max_of,
        uniform_schedule,
    )

    w, n = local.workload, local.n
    total = steps * n
    nbytes = (w.params + n + 1) * w.itemsize
    stages = allreduce_stages(nbytes, n, cfg.allreduce, time_phase, w.itemsize)
    t_red = float(stages.sum())
    t_mom = momentum_sync_time(cfg, w, n, time_phase)
    # Each rank's speed state, updated by Oscars' own method on a plain namespace.
    state = [SimpleNamespace(options=cfg, step_seconds=0.0, _window=[0.0, 0])
             for _ in range(n)]
    speeds = np.zeros(n)
    rows, t, taken = StepRows(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    consumed, rnd, wire = 0, 0, Wire()
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
        speeds = _oscars_speeds(state, window, count, Oscars._update_speed)
        consumed += int(taus.sum())
        rnd += 1
        posted = t.copy()
        if cfg.overlap and consumed < total:
            pending = Inflight(stages, float(posted.max()), Calendar(n), rnd)
        else:  # _complete at once: the Wait, then the velocity's blocking Allreduce
            end = max(float(posted.max()), wire.free_at) + t_red
            wire.free_at = end + t_mom
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


from syncbench.bench.simulate.asgd import asgd  # noqa: E402 - it builds on the helpers above

SIMULATORS: dict[str, Callable[..., Timeline]] = {
    "ssgd": ssgd, "asgd": asgd, "localsgd": localsgd, "oscars": oscars, "odsgd": odsgd,
}
