"""The gradient summed inside each node first, then across nodes (``--comm hierarchical``).

Horovod's hierarchical allreduce (``HOROVOD_HIERARCHICAL_ALLREDUCE``: a reduction
inside the node, an allreduce among one rank per node, a broadcast inside the node),
so that only one rank per node puts the gradient on the slow inter-node link. Here:
an ``Allreduce`` on the node's communicator (MPI libraries reduce through shared
memory there), an ``Allreduce`` among the node leaders (the ranks of node rank 0),
then a ``Bcast`` from the leader inside the node; then the 1/N scaling. Nodes are the
ranks that share memory (``MPI.COMM_TYPE_SHARED``), or blocks of ``group_size``
consecutive ranks, to stand in for nodes on one host (tests). Nodes of unequal size
are summed just as well; on one node it is the node's ``Allreduce`` (the leaders'
reduction is over one rank).
"""

from __future__ import annotations

import copy
from typing import Any

from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.reducers import GradientReducer, mean_in_place


def _wrap(core: Any, mpi_comm: Any) -> Any:
    """``mpi_comm`` as a communicator of the core's kind (same timer and events)."""
    wrapped = copy.copy(core.comm)
    wrapped.mpi_comm, wrapped.rank, wrapped.size, wrapped.outstanding = (
        mpi_comm, mpi_comm.Get_rank(), mpi_comm.Get_size(), [])
    return wrapped


class HierarchicalAllreduce(GradientReducer):
    """Node ``Allreduce``, leaders' ``Allreduce``, node ``Bcast``; then the mean."""

    def __init__(self, core: Any, group_size: int = 0) -> None:
        super().__init__(core)
        world = core.comm.mpi_comm
        rank = world.Get_rank()
        if group_size:
            node = world.Split(rank // group_size, rank)
        else:
            node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        leaders = world.Split(0 if node.Get_rank() == 0 else MPI.UNDEFINED, rank)
        self.node = _wrap(core, node)
        self.leaders = _wrap(core, leaders) if leaders != MPI.COMM_NULL else None
        #: Nodes in the job (the leaders' communicator's size, told to every rank).
        self.nodes = world.allreduce(1 if self.leaders is not None else 0)

    def complete(self) -> Any:
        core = self.core
        core.straggle()
        grads = core.model.grads
        self.node.Allreduce(grads)
        if self.leaders is not None:
            self.leaders.Allreduce(grads)
        self.node.Bcast(grads, root=0)
        return mean_in_place(core, grads)

