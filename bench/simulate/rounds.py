"""The DiLoCo family's timelines: an outer step every H inner steps, whole or streamed.

* ``slowmo`` (:class:`~syncbench.algorithms.slowmo.SlowMo`, Wang et al. 2020, Alg. 1):
  rounds of ``--period`` local steps, each ended by one blocking ``Allreduce`` of the
  pseudo-gradient (a parameter-sized buffer) after the last rank's update, and the
  velocity's with ``--momentum-sync average``; the outer step is a few vector passes,
  left out as the local arithmetic of every collective is.
* ``diloco`` (:class:`~syncbench.algorithms.diloco.DiLoCo`, Douillard et al. 2023,
  Alg. 1): ``--sync-warmup`` steps of blocking SSGD (an ``Allreduce`` of the gradient
  after backward), then rounds of ``--inner-steps`` H, each ended as SlowMo's (no
  velocity sync: DiLoCo keeps its inner state). With H 1 this is blocking SSGD's
  pattern with the update before the Allreduce instead of after.
* Streaming DiLoCo (Douillard et al. 2025, Alg. 2; ``--fragments P``,
  ``--overlap-steps tau``, ``--mix``): the schedule is
  :class:`~syncbench.algorithms.averagers.streaming.StreamingAverager`'s, from its own
  :func:`~syncbench.algorithms.averagers.streaming.fragment_bounds` and
  :func:`~syncbench.algorithms.averagers.streaming.fragment_offsets`: counting inner
  steps s = 1, 2, ..., fragment p posts an ``Iallreduce`` of its bytes after the update
  of step ``o_p + kH`` and waits for it after the update of step ``o_p + kH + tau``
  (posts first, then waits, as ``after_step``). Between the two, every hook call of the
  inner steps' compute tests it (``local_step`` with ``poll``), as do the straggler's
  delay polls, so its stages advance as :mod:`.progress` models a nonblocking
  collective; the rest runs back to back in the ``Wait``. The last step completes what
  is in flight and syncs, blocking, every fragment that took inner steps since its
  last post (``final_sync``), charged to that step's ``comm``. With ``--quantize
  CODEC`` a fragment's stages are the codec's reduce-scatter and allgather of codes
  (:func:`fragment_stages`), not a float32 Iallreduce's.

Rows carry ``local_steps`` (H) and ``round`` as ``DiLoCo.step`` reports them; the notes
hold each fragment's post steps (``fragment_posts``, inner-step numbers) and the
warm-up length.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from syncbench.algorithms.averagers.streaming import fragment_bounds, fragment_offsets
from syncbench.bench.simulate.collectives import PhaseClock, allreduce_time
from syncbench.bench.simulate.compressed import chain_stages, collectives, reducer_for
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
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline


def momentum_sync_seconds(cfg: argparse.Namespace, nbytes: float, n: int,
                          time_phase: PhaseClock, itemsize: int) -> float:
    """``--momentum-sync average``: one more blocking Allreduce of the velocity per round."""
    if getattr(cfg, "momentum_sync", "keep") != "average":
        return 0.0
    # right after the parameters' Allreduce: the links' bucket is spent
    return allreduce_time(nbytes, n, cfg.allreduce, time_phase, itemsize, burst=0.0)


def outer_rounds(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                 time_phase: PhaseClock, period: int, warmup: int = 0,
                 round_extra_s: float = 0.0) -> Timeline:
    """``warmup`` blocking SSGD steps, then rounds of ``period`` local steps (the last
    one shorter, as ``PeriodicAverager.next_round_len``), each ended by a blocking
    Allreduce of the parameters after the last rank's update (+ ``round_extra_s``)."""
    w, n = local.workload, local.n
    t_all = allreduce_time(w.param_bytes, n, cfg.allreduce, time_phase, w.itemsize)
    warmup = min(int(warmup), steps)
    rows, t = StepRows(n), np.zeros(n)
    rnd, in_round = 0, 0
    round_len = min(period, steps - warmup)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        if j < warmup:  # DiLoCo's warm-up: BlockingAllreduce of the gradient, then update
            arrive = start + data + comp + delay
            end = float(arrive.max()) + t_all
            rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=end - arrive,
                     t_update=upd, t_delay=delay, samples=w.batch_size)
            t = end + upd
            continue
        t = start + data + comp + delay + upd
        comm: Any = 0.0
        in_round += 1
        if in_round >= round_len:
            end = float(t.max()) + t_all + round_extra_s
            comm, t = end - t, np.full(n, end)
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_update=upd, t_delay=delay, samples=w.batch_size, local_steps=round_len,
                 round=rnd)
        if in_round >= round_len:
            rnd, in_round = rnd + 1, 0
            round_len = min(period, steps - j - 1)
    return Timeline(rows, float(t.max()), {"warmup_steps": warmup, "rounds": rnd})


def slowmo(cfg: argparse.Namespace, local: LocalTimes, steps: int,
           time_phase: PhaseClock) -> Timeline:
    """SlowMo's timeline (module docstring): rounds of ``--period``."""
    w = local.workload
    extra = momentum_sync_seconds(cfg, w.param_bytes, local.n, time_phase, w.itemsize)
    return outer_rounds(cfg, local, steps, time_phase, int(cfg.period), 0, extra)


def streaming(cfg: argparse.Namespace) -> bool:
    """Whether DiLoCo's flags ask for Streaming DiLoCo (``DiLoCo.Options.streaming``)."""
    return int(cfg.fragments) > 1 or int(cfg.overlap_steps) > 0 or float(cfg.mix) > 0


def diloco(cfg: argparse.Namespace, local: LocalTimes, steps: int,
           time_phase: PhaseClock) -> Timeline:
    """DiLoCo's timeline: warm-up, then whole rounds or Streaming DiLoCo's fragments."""
    if streaming(cfg):
        return streaming_diloco(cfg, local, steps, time_phase)
    return outer_rounds(cfg, local, steps, time_phase, int(cfg.inner_steps),
                        int(cfg.sync_warmup))


def fragment_schedule(period: int, fragments: int, overlap: int, inner_steps: int
                      ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """(posts, waits): inner step s -> the fragments posted (waited for) after its update,
    for ``inner_steps`` inner steps, by ``StreamingAverager.after_step``'s rule; the
    final sync is not in it."""
    offsets = fragment_offsets(period, fragments)
    posts: dict[int, list[int]] = {}
    waits: dict[int, list[int]] = {}
    for p, o in enumerate(offsets):
        for s in range(o, inner_steps + 1, period):
            posts.setdefault(s, []).append(p)
            if s + overlap <= inner_steps:
                waits.setdefault(s + overlap, []).append(p)
    return posts, waits


def fragment_stages(cfg: argparse.Namespace, n: int, count: int, itemsize: int,
                    bounds: list[tuple[int, int]], time_phase: PhaseClock) -> list[np.ndarray]:
    """Each fragment's stages, in order: its float32 ``Iallreduce``'s, or with
    ``--quantize CODEC`` the codec's reducer's chain over that fragment as one of its
    buckets (``QuantizedReduction``: an ``Ialltoallv`` of the codes, then an
    ``Iallgatherv`` of the means' codes, each posted by a poll once the one before it
    completed, :func:`.compressed.collectives` with the reducer's own byte counts). The
    codec's encode and decode of a fragment (a few tens of microseconds on mlp) are left
    out."""
    spec = str(getattr(cfg, "quantize", "none") or "none")
    if spec == "none" or n < 2:
        return [allreduce_stages((hi - lo) * itemsize, n, cfg.allreduce, time_phase, itemsize)
                for lo, hi in bounds]
    reducer = reducer_for(spec, n, count, bounds)
    return [chain_stages(collectives(reducer, p, n), n, cfg.allreduce, time_phase)
            for p in range(len(bounds))]


def fragment_stage_bytes(cfg: argparse.Namespace, n: int, itemsize: int,
                         bounds: list[tuple[int, int]], time_phase: PhaseClock
                         ) -> list[np.ndarray | None]:
    """Bytes a flow of each stage of each fragment's float32 ``Iallreduce`` sends across a
    link (:func:`.progress.allreduce_stage_bytes`); None for a quantized fragment's chain,
    whose short collectives the links' bucket is left out of."""
    if str(getattr(cfg, "quantize", "none") or "none") != "none" and n >= 2:
        return [None] * len(bounds)
    return [allreduce_stage_bytes((hi - lo) * itemsize, n, cfg.allreduce, time_phase, itemsize)
            for lo, hi in bounds]


def streaming_diloco(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                     time_phase: PhaseClock) -> Timeline:
    """Streaming DiLoCo's timeline (module docstring)."""
    w, n = local.workload, local.n
    period, tau = int(cfg.inner_steps), int(cfg.overlap_steps)
    bounds = fragment_bounds(w.offsets(), w.params, int(cfg.fragments))
    stages = fragment_stages(cfg, n, w.params, w.itemsize, bounds, time_phase)
    sizes = fragment_stage_bytes(cfg, n, w.itemsize, bounds, time_phase)
    warmup = min(int(cfg.sync_warmup), steps)
    inner = steps - warmup
    posts, waits = fragment_schedule(period, len(bounds), tau, inner)
    head = outer_rounds(cfg, local, warmup, time_phase, period, warmup) if warmup else None
    rows = head.rows if head is not None else StepRows(n)
    t = np.full(n, head.wall_s) if head is not None else np.zeros(n)
    split = w.compute_split()
    shares = split.hooks
    wire, order = bucketed_wire(time_phase, w.param_bytes, n, cfg.allreduce, w.itemsize), 0
    pending: dict[int, Inflight] = {}
    posted_at = [0] * len(bounds)
    fragment_posts: dict[int, list[int]] = {p: [] for p in range(len(bounds))}
    for s in range(1, inner + 1):
        j = warmup + s - 1
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        cost_s = TESTALL_SECONDS if pending else 0.0
        polls, computed = compute_polls(start + data, comp, shares, cost_s)
        for c in pending.values():
            c.calendar.add_polls(polls)
            delay_polls(c.calendar, cfg, split, computed, local.polled(comp, delay), comp)
        after = computed + delay + upd
        for p in posts.get(s, []):
            order += 1
            pending[p] = Inflight(stages[p], float(after.max()), Calendar(n), order, sizes[p])
            posted_at[p] = s
            fragment_posts[p].append(s)
        leave = after.copy()
        for p in waits.get(s, []):
            leave = _wait(pending.pop(p), list(pending.values()), wire, leave)
        for p in sorted(pending) if s == inner else []:  # final_sync: what is in flight,
            leave = _wait(pending.pop(p), list(pending.values()), wire, leave)
        done = leave  # then a blocking sync of every fragment that moved since its post
        for p in range(len(bounds)) if s == inner else []:
            if s > posted_at[p]:
                end = max(float(done.max()), wire.free_at) + float(stages[p].sum())
                wire.spend_all(end)
                done = np.full(n, end)
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp,
                 t_comm=cost_s * len(shares) + (done - leave), t_wait=leave - after,
                 t_update=upd, t_delay=delay, samples=w.batch_size, local_steps=period,
                 round=s // period)
        leave = done
        t = leave
    notes = {"warmup_steps": warmup, "fragments": len(bounds), "overlap_steps": tau,
             "fragment_posts": {str(p): v for p, v in fragment_posts.items()}}
    return Timeline(rows, float(t.max()), notes)


def _wait(c: Inflight, others: list[Inflight], wire: Wire, arrive: np.ndarray) -> np.ndarray:
    """Every rank enters ``Wait(c)`` at ``arrive``; the instant each leaves it."""
    c.calendar.add_span(arrive, np.inf)
    advance([c, *others], wire, c)
    return np.maximum(arrive, c.end)
