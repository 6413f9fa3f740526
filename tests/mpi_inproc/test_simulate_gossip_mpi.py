"""The simulated D-PSGD exchange against the real averager's: the same messages, the same
bytes (run under mpiexec at any N >= 2; ``--only-mpi``).

``bench/simulate/decentralized.py`` sends, per step, one message of
``exchange_bytes(workload)`` along each flow of ``Adjacency.flows()``; the real
``GossipAverager`` sends its ``send`` buffer to the destinations of its distributed graph
communicators (what MPI itself reports by ``Get_dist_neighbors``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import strategy_on_world, train_config

from syncbench.bench.simulate.decentralized import Adjacency, exchange_bytes, gossip_plan
from syncbench.bench.simulate.workload import Workload


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("graph", ["ring", "exp", "onepeer-exp"])
def test_simulated_gossip_sends_what_the_averager_sends(graph):
    # resnet8: BatchNorm's running statistics travel with the parameters
    algo, _, _, config = strategy_on_world("dpsgd", 1, ("--dtype", "float64"),
                                           ("--graph", graph), 8, 0, model_name="resnet8")
    try:
        averager, rank = algo.averager, algo.comm.rank
        model = algo.model
        workload = Workload(name="resnet8", params=int(model.params.size), batch_size=8,
                            dataset_samples=512, itemsize=8, extra={"dataset": "synthetic"})
        assert exchange_bytes(workload) == averager.send.nbytes
        assert averager.send.nbytes == 8 * (model.params.size + model.buffers.size)
        for mixing, (comm, _, _, degree) in zip(averager.schedule.cycle, averager.graphs):
            sources, destinations, _ = comm.Get_dist_neighbors()
            flows = Adjacency.of(mixing).flows()
            assert sorted(d for s, d in flows if s == rank) == sorted(destinations)
            assert sorted(s for s, d in flows if d == rank) == sorted(sources)
            assert degree == len(destinations)
    finally:
        algo.close()


@pytest.mark.mpi(min_size=2)
def test_simulated_low_precision_gossip_sends_what_its_averager_sends():
    import numpy as np
    from mpi4py import MPI

    from syncbench.algorithms.base import Budget
    from syncbench.algorithms.communicator import Communicator
    from syncbench.algorithms.registry import get_algorithm
    from syncbench.kernels.zoo import build_model

    world = MPI.COMM_WORLD
    config = train_config("--algorithm", "dpsgd", "--graph", "onepeer-exp", "--gossip-codec",
                          "int8")
    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float32, seed=0)
    algo = get_algorithm("dpsgd")(model, Communicator(world), config,
                                  Budget(8 * world.Get_size(), 8, world.Get_size()))
    try:
        averager, rank = algo.averager, algo.comm.rank
        workload = Workload(name="mlp", params=int(model.params.size), batch_size=8,
                            dataset_samples=512)
        cfg = SimpleNamespace(gossip_codec="int8")  # simulate's flag
        adj, nbytes, first = gossip_plan(cfg, workload, averager.schedule)
        assert nbytes == averager.send.nbytes and first == 1
        sources, destinations, _ = averager.graph.Get_dist_neighbors()
        assert adj[0].destinations(rank) == sorted(destinations)
        assert adj[0].sources(rank) == sorted(sources)
    finally:
        algo.close()
