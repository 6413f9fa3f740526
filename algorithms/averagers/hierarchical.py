"""Two-level periodic averaging: inside a node every H1 steps, across every rank every H2.

PyTorch's ``HierarchicalModelAverager``
(``torch/distributed/algorithms/model_averaging/hierarchical_model_averager.py``): a
period per group, checked from the largest down, the first that divides the step
count averaging its group. Here the two groups are this rank's node (the ranks that
share memory, ``MPI.COMM_TYPE_SHARED``, or consecutive blocks of ``--group-size`` ranks
to stand in for nodes on one host) and every rank. The cheap intra-node average keeps
replicas close between the expensive inter-node ones (Lin et al. 2020, "Don't use large
mini-batches, use local SGD", hierarchical local SGD, Sec. 4). The last step of the
budget always averages every rank, so the final model is a consensus; ``--momentum-sync``
applies at the global averages only.
"""

from __future__ import annotations

import copy
from typing import Any

from syncbench.algorithms.averagers import ModelAverager, average_over_ranks, sync_momentum
from syncbench.algorithms.mpi import MPI


def group_communicator(core: Any, group_size: int) -> Any:
    """This rank's group as a communicator of the core's kind (same timer and events):
    blocks of ``group_size`` consecutive ranks, or its node's ranks (``group_size`` 0).
    ``ValueError`` (every rank: the sizes are gathered) where there are fewer than two
    groups or they are not all of one size."""
    world = core.comm.mpi_comm
    if group_size:
        sub = world.Split(world.Get_rank() // group_size, world.Get_rank())
    else:
        sub = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    sizes = world.allgather(sub.Get_size())
    leaders = world.allgather(world.Get_rank() if sub.Get_rank() == 0 else -1)
    groups = sum(1 for r in leaders if r >= 0)
    if groups < 2 or len(set(sizes)) != 1:
        sub.Free()
        what = "nodes" if not group_size else f"groups of --group-size {group_size}"
        each = "/".join(str(n) for n in sorted(set(sizes)))
        raise ValueError(f"hierarchical averaging needs 2 or more {what} of equal size; "
                         f"this job's ranks form {groups} of {each} ranks (on one node use "
                         "localsgd)")
    group = copy.copy(core.comm)
    group.mpi_comm, group.rank, group.size, group.outstanding = (
        sub, sub.Get_rank(), sub.Get_size(), [])
    return group


class HierarchicalAverager(ModelAverager):
    """Counts local steps; every ``global_period`` (and at the budget's end) averages every
    rank, else every ``node_period`` this rank's group."""

    def __init__(self, core: Any, node_period: int, global_period: int, group: Any,
                 momentum_sync: str) -> None:
        super().__init__(core)
        self.node_period, self.global_period = int(node_period), int(global_period)
        self.group, self.momentum_sync = group, momentum_sync
        self.last_global = core.steps_taken

    def after_step(self) -> str:
        """After a local step: ``"global"``, ``"node"`` or ``""`` (what it averaged)."""
        core = self.core
        s = core.steps_taken
        if s % self.global_period == 0 or s >= core.budget.steps_per_rank:
            self.average()
            return "global"
        if s % self.node_period == 0:
            self.average_group()
            return "node"
        return ""

    def _average(self, owner: Any) -> None:
        model = self.core.model
        average_over_ranks(owner, model.params)
        if model.buffers.size:
            average_over_ranks(owner, model.buffers)

    def average(self) -> None:
        """Every rank's average (blocking Allreduce), then ``--momentum-sync``."""
        self._average(self.core)
        sync_momentum(self.core, self.momentum_sync)
        self.last_global = self.core.steps_taken

    def average_group(self) -> None:
        """This group's average (blocking Allreduce on the group's communicator)."""
        self._average(_GroupView(self.core, self.group))

    def close(self) -> None:
        self.group.mpi_comm.Free()


class _GroupView:
    """The core as :func:`average_over_ranks` sees it, with the group's communicator."""

    def __init__(self, core: Any, group: Any) -> None:
        self.comm, self.timer = group, core.timer
