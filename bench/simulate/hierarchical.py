"""Hierarchical patterns: averages inside a node and across nodes, and SSGD's
``--comm hierarchical``.

Ranks sit ``--gpus-per-node`` to a host, consecutive (:meth:`.engine.Network.host_of`;
:class:`.collectives.PlacedClock` hands the count to the patterns).

* ``hierarchical`` (``algorithms/hierarchical.py`` over
  ``averagers/hierarchical.py``'s ``HierarchicalAverager``): local steps; after step s,
  every rank's blocking ``Allreduce`` of the parameters (and of BatchNorm's running
  statistics, a second one) when H2 divides s or s is the budget's last step, else the
  group's when H1 divides s (PyTorch's ``HierarchicalModelAverager``: the largest period
  that divides the step). The group is the node (``--group-size 0``) or blocks of
  ``--group-size`` consecutive ranks; a group's ``Allreduce`` runs on its own
  communicator (MPICH's choice on that many ranks, node-aware where the group spans
  nodes: :func:`group_allreduce_phases`), every group at once, and waits for the group's
  last rank only. At 1 rank per node a node's average is free and the pattern is Local
  SGD's with ``--period`` H2; with H1 = H2 it is Local SGD's at any ranks per node.
* SSGD ``--comm hierarchical`` (``reducers/hierarchical.py``'s ``HierarchicalAllreduce``,
  Horovod's hierarchical allreduce): after the delay, the node's ``Allreduce``, the
  leaders' (one rank per node, so MPICH's flat algorithm on the nodes), the node's
  ``Bcast`` (:func:`hierarchical_allreduce_phases`). At 1 rank per node it is the
  leaders' ``Allreduce`` on every rank: SSGD's ``--comm blocking``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.bench.simulate.collectives import (
    PhaseClock,
    allreduce_phases,
    choose_allreduce,
    cost,
    flat_allreduce_phases,
    node_bcast_phases,
)
from syncbench.bench.simulate.decentralized import gossip_elements
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline


def ranks_per_node(time_phase: PhaseClock) -> int:
    """Ranks per host of the clock (:class:`.collectives.PlacedClock`; 1 for a plain one)."""
    return max(1, int(getattr(time_phase, "ranks_per_node", 1) or 1))


@dataclass(frozen=True)
class BlockPhase:
    """``inner`` (a phase on ``block`` ranks numbered 0..block-1) run at once in every
    block of ``block`` consecutive ranks of the ``n``: one collective on each group's
    communicator, every group at the same time. A last, smaller block keeps the pairs it
    has (as :class:`.collectives.Phase` does)."""

    inner: Any
    n: int
    block: int

    @property
    def nbytes(self) -> float:
        return self.inner.nbytes

    @property
    def repeat(self) -> int:
        return self.inner.repeat

    def key(self) -> tuple:
        return ("blocks", self.block, self.n, self.inner.key())

    def pairs(self) -> list[tuple[int, int]]:
        local = self.inner.pairs()
        return [(start + s, start + d) for start in range(0, self.n, self.block)
                for s, d in local if start + max(s, d) < self.n]


def check_groups(n: int, group: int, group_size: int) -> None:
    """One line unless the ranks form 2 or more groups of equal size (the code's rule,
    ``group_communicator``)."""
    if n % group or n // group < 2:
        what = f"groups of --group-size {group_size}" if group_size else \
            f"nodes of --gpus-per-node {group}"
        raise ValueError(f"hierarchical averaging needs 2 or more {what} ranks, all full; "
                         f"--np {n} gives {n / group:g} (on one node use localsgd)")


def group_allreduce_phases(nbytes: float, n: int, group: int, rpn: int, algorithm: str,
                           itemsize: int = 4) -> list[Any]:
    """A blocking ``Allreduce`` of ``nbytes`` on each group of ``group`` consecutive ranks
    at once, ``rpn`` ranks to a node: MPICH's phases on a ``group``-rank communicator (a
    group inside one node: flat, ch4's composition gamma; a group of whole nodes:
    node-aware, alpha), repeated in every group."""
    if group <= 1:
        return []
    inner = allreduce_phases(nbytes, group, algorithm, itemsize,
                             ranks_per_node=min(rpn, group))
    return [BlockPhase(p, n, group) for p in inner]


def hierarchical_allreduce_phases(nbytes: float, n: int, rpn: int, algorithm: str,
                                  itemsize: int = 4) -> list[Any]:
    """``HierarchicalAllreduce.complete``: the node's ``Allreduce`` (flat on the node's
    ranks), the leaders' ``Allreduce`` (ranks 0, rpn, 2 rpn, ...: one per node, flat),
    the node's ``Bcast`` from its leader."""
    g = max(1, min(rpn, n))
    nodes = -(-n // g)
    node = group_allreduce_phases(nbytes, n, g, g, algorithm, itemsize)
    lead = algorithm if algorithm != "auto" else choose_allreduce(nbytes, nodes, itemsize)
    leaders = flat_allreduce_phases(nbytes, nodes, lead, stride=g)
    return node + leaders + node_bcast_phases(nbytes, n, g)


def ssgd_hierarchical(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                      time_phase: PhaseClock) -> Timeline:
    """SSGD ``--comm hierarchical``: compute, delay, then the three collectives after the
    last rank arrives (the leaders' ``Allreduce`` joins every node), charged to ``comm``
    with the waiting, as a blocking call is."""
    w, n = local.workload, local.n
    phases = hierarchical_allreduce_phases(w.param_bytes, n, ranks_per_node(time_phase),
                                           cfg.allreduce, w.itemsize)
    t_all = cost(phases, time_phase)
    rows, t = StepRows(n), np.zeros(n)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        arrive = start + data + comp + delay
        end = float(arrive.max()) + t_all
        t = end + upd
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=end - arrive,
                 t_update=upd, t_delay=delay, samples=w.batch_size)
    return Timeline(rows, float(t.max()), {"buckets": 1, "hierarchical_allreduce_s": t_all})


def with_hierarchical_comm(ssgd: Callable[..., Timeline]) -> Callable[..., Timeline]:
    """SSGD's pattern with ``--comm hierarchical`` added (:func:`ssgd_hierarchical`);
    the other ``--comm`` modes are ``ssgd``'s."""

    @functools.wraps(ssgd)
    def pattern(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                time_phase: PhaseClock) -> Timeline:
        if getattr(cfg, "comm", "") == "hierarchical":
            return ssgd_hierarchical(cfg, local, steps, time_phase)
        return ssgd(cfg, local, steps, time_phase)

    return pattern


def average_seconds(nbytes: float, buffer_bytes: float, phases_of: Callable[[float], list],
                    time_phase: PhaseClock) -> float:
    """One average: the parameters' ``Allreduce`` and, with running statistics, theirs."""
    seconds = cost(phases_of(nbytes), time_phase)
    if buffer_bytes > 0:
        seconds += cost(phases_of(buffer_bytes), time_phase)
    return seconds


def hierarchical(cfg: argparse.Namespace, local: LocalTimes, steps: int,
                 time_phase: PhaseClock) -> Timeline:
    """Hierarchical Local SGD's timeline (``Hierarchical.step``, ``after_step``): see the
    module docstring."""
    w, n = local.workload, local.n
    h1, h2 = int(cfg.node_period), int(cfg.global_period)
    rpn = ranks_per_node(time_phase)
    group_size = int(getattr(cfg, "group_size", 0) or 0)
    group = group_size or rpn
    check_groups(n, group, group_size)
    buffer_bytes = float((gossip_elements(w) - w.params) * w.itemsize)
    algo = cfg.allreduce
    t_global = average_seconds(
        w.param_bytes, buffer_bytes,
        lambda b: allreduce_phases(b, n, algo, w.itemsize, ranks_per_node=rpn), time_phase)
    t_group = average_seconds(
        w.param_bytes, buffer_bytes,
        lambda b: group_allreduce_phases(b, n, group, rpn, algo, w.itemsize), time_phase)
    of_group = np.arange(n) // group
    rows, t = StepRows(n), np.zeros(n)
    for j in range(steps):
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        t = start + data + comp + delay + upd
        s = j + 1
        comm: Any = 0.0
        if s % h2 == 0 or s >= steps:
            end = np.full(n, float(t.max()) + t_global)
        elif s % h1 == 0:
            last = np.full(of_group.max() + 1, -np.inf)
            np.maximum.at(last, of_group, t)
            end = last[of_group] + t_group
        else:
            end = t
        comm, t = end - t, end
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp, t_comm=comm,
                 t_update=upd, t_delay=delay, samples=w.batch_size, local_steps=h2,
                 round=j // h2)
    return Timeline(rows, float(t.max()), {"group_ranks": group, "node_average_s": t_group,
                                           "global_average_s": t_global})

