"""D-PSGD: decentralized parallel SGD, gossip with the neighbours of a graph.

Lian et al., NeurIPS 2017 (arXiv 1705.09056), Alg. 1: each step every rank computes the
gradient of its mini-batch at its own model while exchanging models with its graph
neighbours, then ``x_i <- sum_j W_ij x_j - gamma g_i``. No rank waits on all others and
no link carries everyone's traffic; the replicas differ, by the consensus distance.

A composition of two parts over the lock-step core: the gossip averager
(:class:`~syncbench.algorithms.averagers.gossip.GossipAverager`, one
``Ineighbor_allgather`` per step on the graph's communicator, posted before compute and
completed after it) and the local optimizer (momentum SGD, stepping the mixed model with
the gradient of the pre-mix one, as Bagua's decentralized SGD). ``--gossip-codec``
swaps the averager for the low-precision one
(:class:`~syncbench.algorithms.averagers.compressed_gossip.CompressedGossipAverager`:
replicas of the neighbours, each step's compressed change on the wire).

``--graph``: ``ring``, ``torus`` (or ``torus:RxC``), ``exp``, ``onepeer-exp`` or a file
(:mod:`syncbench.algorithms.graphs`). The run file's root attribute ``spectral_gap`` is the
graph's (of the cycle's product for ``onepeer-exp``). Every step is an evaluation point
(all ranks take the same steps); the model evaluated is the average x_bar (one
``Allreduce`` at evaluation time only), and each evaluation's consensus distance
(1/N) sum_i ||x_i - x_bar||^2 is kept in the root attributes ``consensus_distance``, with
``consensus_samples`` the global samples of each (the ``/eval`` rows' ``samples_seen``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers.compressed_gossip import (
    CompressedGossipAverager,
    gossip_codec,
)
from syncbench.algorithms.averagers.gossip import GossipAverager
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.graphs import build_graph, graph_arg
from syncbench.algorithms.replica_scores import ReplicaReport
from syncbench.algorithms.traits import StrategyTraits


@dataclass(frozen=True)
class GraphOptions(StrategyOptions):
    """``--graph``: the option of every decentralized strategy (D-PSGD's and AD-PSGD's
    ``Options`` inherit it, so that one flag names it)."""

    graph: str = option(
        "ring", "D-PSGD and AD-PSGD communication graph: ring, torus (or torus:RxC), exp "
        "(static exponential), onepeer-exp (one-peer exponential, time-varying) or a file of "
        "edges 'i j [weight]' (Metropolis-Hastings weights when none are given)",
        type=graph_arg, metavar="GRAPH")


class DPSGD(Strategy):
    name = "dpsgd"
    summary = ("decentralized SGD (D-PSGD): gossip with graph neighbours by "
               "Ineighbor_allgather, overlapping compute")
    #: The exchange is posted before compute and completed after it (the simulator's
    #: ``dpsgd`` pattern, ``bench/simulate/decentralized.py``).
    traits = StrategyTraits(simulation="dpsgd", stop_vote_lag=2)

    @dataclass(frozen=True)
    class Options(GraphOptions):
        """D-PSGD's options."""

        gossip_codec: str = option(
            "none", "D-PSGD low-precision gossip (DCD-PSGD, as Bagua's): send each step's "
            "model change through this codec (fp16, bf16, int8[:CHUNK]) to neighbours that "
            "keep replicas; none (default): exact models", metavar="CODEC")

        def __post_init__(self) -> None:
            gossip_codec(self.gossip_codec)

        def check_run(self, config: Any, world_size: int) -> None:
            build_graph(self.graph, world_size)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        schedule = build_graph(self.options.graph, self.comm.size)
        codec = gossip_codec(self.options.gossip_codec)
        self.averager: GossipAverager | CompressedGossipAverager = (
            GossipAverager(self, schedule) if codec is None
            else CompressedGossipAverager(self, schedule, codec))
        self.run_attributes["spectral_gap"] = schedule.spectral_gap()
        # the buffer this rank hands to its Ineighbor_allgather each step (its model, or
        # the codec's code of its change): SSGD's measure, an Allreduce's buffer; MPI
        # sends it once to every destination of the step's graph
        self.run_attributes["wire_bytes_per_step"] = int(
            self.averager.wire_bytes if codec is not None
            else self.model.params.size * self.model.params.dtype.itemsize)
        #: The consensus distance and the ranks' own models' scores of every evaluation.
        self.replicas = ReplicaReport(self.run_attributes)

    def step(self, x: Any, y: Any) -> StepStats:
        self.averager.post()
        poll = self.averager.poll
        loss = self.compute_gradient(x, y, {"on_grads_ready": lambda _offset: poll(),
                                            "poll": poll})
        self.straggle()
        grads = self.model.grads  # at the pre-mix model
        self.averager.average()
        with self.timer.phase("update"):
            self.optimizer.step(self.model.params, grads)
        self.averager.after_update()
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]))

    def consensus_params(self) -> Any:
        """x_bar, the average of every rank's model (collective; once per evaluation
        point), its consensus distance logged."""
        return self.replicas.consensus(self.steps_taken, self.evaluation_point,
                                       self.averager.consensus)

    def score_replicas(self, score: Any) -> None:
        """Every rank's own model scored; their mean and worst kept (collective)."""
        samples = self.steps_taken * self.budget.batch_size * self.comm.size
        self.replicas.score(self.comm.mpi_comm, samples, self.model.params, score)

    def state(self) -> dict[str, Any]:
        return {**super().state(), **self.averager.state(), **self.replicas.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.load_state(state)
        self.replicas.load_state(state)

    def close(self) -> None:
        self.averager.close()
