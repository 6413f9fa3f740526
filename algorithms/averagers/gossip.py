"""Gossip averaging over a graph: each rank mixes its replica with its neighbours' only.

D-PSGD (Lian et al., NeurIPS 2017, "Can decentralized algorithms outperform centralized
algorithms?", arXiv 1705.09056, Alg. 1): at step t every rank i computes its gradient g_i
at its own x_i while the models travel between neighbours, then

    x_i <- sum_j W_ij x_j - gamma g_i

with the graph's mixing matrix W (:mod:`syncbench.algorithms.graphs`). As Bagua's
``DecentralizedAlgorithm`` (``bagua/torch_api/algorithms/decentralized.py``) the local
optimizer then steps the mixed weights with the gradient of the pre-mix ones (with plain
SGD and no weight decay this is the update above exactly; momentum and weight decay act
on the mixed weights, as in Bagua).

The models travel by one ``MPI_Ineighbor_allgather`` on a distributed graph communicator
(``MPI_Dist_graph_create_adjacent``: sources are the ranks j with W_ij > 0, destinations
the ranks k with W_ki > 0), made once per matrix of the graph's cycle (one for a static
graph, tau for the one-peer exponential graph) before training. :meth:`post` starts it
before compute and :meth:`average` completes it after, so the exchange overlaps the
gradient as in the paper's implementation. BatchNorm's running statistics travel in the
same message and take the same mixing, their local update of this step kept
(``r <- r + (sum_j W_ij r_j - r_i)``, the pre-step values mixed).

No global collective is made while training; :meth:`consensus` (evaluation only) reduces
the average model x_bar and the consensus distance (1/N) sum_i ||x_i - x_bar||^2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.averagers import ModelAverager
from syncbench.algorithms.graphs import GraphSchedule
from syncbench.algorithms.mpi import MPI


class GossipAverager(ModelAverager):
    """Mixes this rank's replica with its in-neighbours' by the graph's weights."""

    def __init__(self, core: Any, schedule: GraphSchedule) -> None:
        super().__init__(core)
        if schedule.size != core.comm.size:
            raise ValueError(f"--graph {schedule.name} has {schedule.size} ranks, the run "
                             f"{core.comm.size}")
        self.schedule = schedule
        rank, model = core.comm.rank, core.model
        if model.backend.is_gpu:
            raise ValueError("--algorithm dpsgd runs on the CPU backend only (the neighbour "
                             "exchange has no GPU path yet)")
        xp = model.backend.xp
        #: Per matrix of the cycle: (graph communicator, source weights, W_ii, out-degree).
        self.graphs: list[tuple[Any, Any, float, int]] = []
        for mixing in schedule.cycle:  # collective, in the same order on every rank
            sources, destinations = mixing.sources(rank), mixing.destinations(rank)
            graph = core.comm.Create_dist_graph_adjacent(sources, destinations)
            weights = xp.asarray(mixing.weights(rank), dtype=model.params.dtype)
            self.graphs.append((graph, weights, mixing.self_weights[rank], len(destinations)))
        self.n_params = int(model.params.size)
        width = self.n_params + int(model.buffers.size)
        degree = max((len(w) for _, w, _, _ in self.graphs), default=0)
        #: This rank's pre-step model (parameters, then running statistics), as sent.
        self.send = xp.empty(width, dtype=model.params.dtype)
        #: The sources' models, one row each, in the order of the sources.
        self.recv = xp.empty((degree, width), dtype=model.params.dtype)
        self.request: Any = None

    def current(self) -> tuple[Any, Any, float, int]:
        """The graph of the step being taken (``steps_taken`` counts the steps before it)."""
        return self.graphs[self.core.steps_taken % len(self.graphs)]

    def post(self) -> None:
        """Snapshot this rank's model and start sending it to the step's destinations while
        receiving the sources' (before compute)."""
        core = self.core
        graph, weights, _, destinations = self.current()
        p = self.n_params
        with core.timer.phase("comm"):
            self.send[:p] = core.model.params
            self.send[p:] = core.model.buffers
        self.request = core.comm.Ineighbor_allgather(graph, self.send,
                                                     self.recv[:len(weights)], destinations)

    def poll(self) -> None:
        """Drive the exchange's progress (between layers)."""
        self.core.comm.poll()

    def average(self) -> None:
        """Complete the exchange, then mix: ``x_i <- W_ii x_i + sum_j W_ij x_j`` from the
        pre-step models, the running statistics' own step update kept."""
        core = self.core
        core.comm.Wait(self.request)
        self.request = None
        _, weights, own, _ = self.current()
        model, p, recv = core.model, self.n_params, self.recv[:len(weights)]
        with core.timer.phase("update"):
            mixed = self.send * own
            if len(weights):
                mixed += weights @ recv
            model.params[...] = mixed[:p]
            if model.buffers.size:
                model.buffers += mixed[p:] - self.send[p:]

    def after_update(self) -> None:
        """After the local optimizer's step: nothing (the exchange sends exact models)."""

    def state(self) -> dict[str, Any]:
        """Nothing to resume (no exchange is in flight between steps)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """The inverse of :meth:`state`."""

    def consensus(self) -> tuple[Any, float]:
        """x_bar and the consensus distance (:func:`consensus`)."""
        return consensus(self.core)

    def close(self) -> None:
        """Free the graph communicators (an exchange still in flight after an error
        completes before MPI frees its communicator: MPI-3.1 section 6.4.3)."""
        for graph, *_ in self.graphs:
            graph.Free()
        self.graphs = []


def consensus(core: Any) -> tuple[Any, float]:
    """x_bar = (1/N) sum_i x_i on every rank, and the consensus distance
    (1/N) sum_i ||x_i - x_bar||^2 of ``core``'s replicas (collective; evaluation-time
    bookkeeping, not training traffic: neither timed nor recorded as events)."""
    params, n = core.model.params, core.comm.size
    average = params.copy()
    core.comm.mpi_comm.Allreduce(MPI.IN_PLACE, average, op=MPI.SUM)
    average *= 1.0 / n
    diff = core.model.backend.to_numpy(params - average).astype(np.float64)
    total = np.array([float(np.dot(diff, diff))])
    core.comm.mpi_comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return average, float(total[0]) / n
