"""D-PSGD against a serial re-computation of x <- W x - gamma G (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_dpsgd_mpi.py`` and with
``-n 4`` (and ``-n 3``: a ring that is not a power of two); the flag checks also run in a
plain serial pytest. The serial re-computation keeps N replicas in one process, each with
the batches its rank draws: every step the gradients at the pre-mix models, then
X <- W_t X, then each replica's optimizer step with its own gradient (plain SGD:
x_i <- sum_j W_ij x_j - gamma g_i, Lian et al. 2017, Alg. 1).

Split off this module: ``tests/unit/test_dpsgd_mpi_unit.py`` (its tests that need neither).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams

from syncbench.algorithms.averagers.compressed_gossip import (
    from_wire,
    gossip_codec,
    mix,
    to_wire,
)
from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.graphs import build_graph
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

BATCH, SEED, STEPS = 8, 3, 7
PLAIN = ("--lr", "0.1", "--momentum", "0", "--weight-decay", "0", "--dtype", "float64")
MOMENTUM = ("--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-3", "--dtype",
            "float64")
GRAPHS = ("ring", "torus", "exp", "onepeer-exp", "file")
#: An undirected graph file with weights: 0 - 1 - 2 - 3 - 0 and the chord 0 - 2.
FILE_4 = "0 1 0.25\n1 2 0.5\n2 3 0.25\n3 0 0.5\n0 2 0.25\n"


def graph_spec(name: str, size: int, folder) -> str:
    """``--graph`` for ``name`` on ``size`` ranks (the file is each rank's own copy)."""
    if name == "torus":
        return "torus" if size == 4 else f"torus:1x{size}"
    if name != "file":
        return name
    path = folder / "graph.txt"
    path_graph = "".join(f"{i} {i + 1}\n" for i in range(size - 1))  # Metropolis-Hastings
    path.write_text(FILE_4 if size == 4 else path_graph)
    return str(path)


def setup(graph: str, flags: tuple[str, ...], steps: int = STEPS, seeds=None,
          dtype=np.float64):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config(*flags, "--algorithm", "dpsgd", "--graph", graph)
    validate(get_algorithm("dpsgd"), config, size)
    seed = SEED if seeds is None else seeds[rank]
    model = build_model("mlp", data.input_shape, 10, dtype=dtype, seed=seed)
    budget = Budget(steps * BATCH * size, BATCH, size)
    algo = get_algorithm("dpsgd")(model, Communicator(world), config, budget)
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED, dtype=dtype)[rank]
    return algo, stream, data, config


def train(algo, stream) -> None:
    while not algo.done():
        algo.timer.reset()
        algo.step(*stream.next())
    algo.finish()


def serial_dpsgd(data, size: int, config, graph: str, steps: int, seeds=None,
                 dtype=np.float64) -> np.ndarray:
    """The N replicas after ``steps`` steps, one row each."""
    schedule = build_graph(graph, size)
    seeds = seeds or [SEED] * size
    models = [build_model("mlp", data.input_shape, 10, dtype=dtype, seed=s) for s in seeds]
    opts = [MomentumSGD(m.params, config.lr, config.momentum, config.weight_decay)
            for m in models]
    streams = rank_streams(data.train_x, data.train_y, size, BATCH, SEED, dtype=dtype)
    for t in range(steps):
        for k in range(size):
            models[k].loss_and_grad(*streams[k].next())
        x = np.stack([m.params for m in models])
        mixed = schedule.at(t).matrix() @ x
        for k in range(size):
            models[k].params[...] = mixed[k]
            opts[k].step(models[k].params, models[k].grads)
    return np.stack([m.params for m in models])


def on_rank0(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` computed on rank 0 and broadcast."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.bcast(fn(*args, **kwargs) if world.Get_rank() == 0 else None, root=0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("flags", [PLAIN, MOMENTUM], ids=["sgd", "momentum-wd"])
@pytest.mark.parametrize("name", GRAPHS)
def test_dpsgd_equals_the_serial_recomputation(name, flags, tmp_path):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    graph = graph_spec(name, size, tmp_path)
    algo, stream, data, config = setup(graph, flags)
    train(algo, stream)
    expected = on_rank0(serial_dpsgd, data, size, config, graph, STEPS)
    np.testing.assert_allclose(algo.model.params, expected[rank], rtol=0, atol=1e-10)
    mean = expected.mean(axis=0)
    np.testing.assert_allclose(algo.consensus_params(), mean, rtol=0, atol=1e-10)
    distance = float(np.mean(np.sum((expected - mean) ** 2, axis=1)))
    (logged,) = algo.replicas.consensus_log.values()
    assert logged == pytest.approx(distance, rel=1e-9, abs=1e-14)
    assert distance > 0  # the replicas differ (they saw different batches)
    assert algo.run_attributes["spectral_gap"] == build_graph(graph, size).spectral_gap()
    assert list(algo.run_attributes["consensus_samples"]) == [STEPS * BATCH * size]
    # each rank's own model scored (here by its first element): the mean and the worst
    algo.score_replicas(lambda params: float(params[0]))
    assert algo.run_attributes["replica_accuracy_mean"][0] == pytest.approx(
        expected[:, 0].mean(), abs=1e-10)
    assert algo.run_attributes["replica_accuracy_worst"][0] == pytest.approx(
        expected[:, 0].min(), abs=1e-10)
    algo.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["ring", "exp", "onepeer-exp"])
def test_consensus_contracts_at_the_spectral_gaps_rate(name):
    """With gamma = 0 only gossip moves the replicas: from different initial models the
    consensus distance shrinks by at least (1 - gap)^2 per step (per cycle for a
    time-varying graph), and the average is conserved."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    seeds = [SEED + 10 * k for k in range(size)]
    schedule = build_graph(name, size)
    period = len(schedule.cycle)
    rho = 1.0 - schedule.spectral_gap()
    algo, stream, _, _ = setup(name, ("--lr", "0", "--momentum", "0", "--dtype", "float64"),
                               steps=3 * period, seeds=seeds)
    start_mean, start = algo.averager.consensus()
    distances = [start]
    while not algo.done():
        for _ in range(period):
            algo.timer.reset()
            algo.step(*stream.next())
        distances.append(algo.averager.consensus()[1])
    mean, _ = algo.averager.consensus()
    np.testing.assert_allclose(mean, start_mean, rtol=0, atol=1e-12)
    for before, after in zip(distances, distances[1:]):
        assert after <= rho ** 2 * before * (1 + 1e-9) + 1e-24
    if rho == 0.0:  # a complete exchange (2 ranks; one-peer at a power of two): x_bar
        assert distances[-1] < 1e-24
    else:
        assert distances[-1] < distances[0]
    algo.close()


@pytest.mark.mpi(min_size=2)
def test_the_exchange_is_one_ineighbor_allgather_per_step_with_its_bytes():
    """One event per step; the bytes this rank sends: its model once per destination."""
    from mpi4py import MPI

    from syncbench.bench.train.events import EventLog

    size, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    algo, stream, _, _ = setup("exp", PLAIN, steps=3)
    log = EventLog()
    log.start()
    algo.comm.events = log
    train(algo, stream)
    cols = log.columns()
    destinations = len(build_graph("exp", size).cycle[0].destinations(rank))
    assert list(cols["kind"]) == [6, 6, 6]  # schema.EVENT_KINDS' ineighbor_allgather
    assert set(cols["bytes"].tolist()) == {algo.model.params.nbytes * destinations}
    algo.close()


def serial_dcd(data, size: int, config, graph: str, steps: int, seeds) -> np.ndarray:
    """DCD-PSGD's replicas after ``steps`` steps in float32, with the averager's own
    arithmetic (so equal to the bit): mix, optimizer step, x <- x + C(x' - x)."""
    schedule = build_graph(graph, size)
    codec = gossip_codec(config.gossip_codec)
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float32, seed=s)
              for s in seeds]
    opts = [MomentumSGD(m.params, config.lr, config.momentum, config.weight_decay)
            for m in models]
    streams = rank_streams(data.train_x, data.train_y, size, BATCH, SEED, dtype=np.float32)
    for t in range(steps):
        mixing = schedule.at(t)
        x = [m.params.copy() for m in models]
        for k in range(size):
            models[k].loss_and_grad(*streams[k].next())
            models[k].params[...] = mix(mixing.self_weights[k], x[k], mixing.weights(k),
                                        [x[j] for j in mixing.sources(k)])
            opts[k].step(models[k].params, models[k].grads)
            wire = to_wire(codec, models[k].params - x[k])
            models[k].params[...] = x[k] + from_wire(codec, wire, x[k].size)
    return np.stack([m.params for m in models])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8:1000"])
@pytest.mark.parametrize("name", ["ring", "onepeer-exp"])
def test_low_precision_gossip_equals_the_serial_dcd_psgd(name, codec):
    """Every rank's model equals its serial DCD-PSGD replica bit for bit: a neighbour's
    replica, kept from the codes alone, is its model exactly."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    seeds = [SEED + k for k in range(size)]  # different models: the first exchange matters
    flags = ("--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-3",
             "--gossip-codec", codec)
    algo, stream, data, config = setup(name, flags, seeds=seeds, dtype=np.float32)
    train(algo, stream)
    expected = on_rank0(serial_dcd, data, size, config, name, STEPS, seeds)
    np.testing.assert_array_equal(algo.model.params, expected[rank])
    exact = on_rank0(serial_dpsgd, data, size, config, name, STEPS, seeds, np.float32)
    assert not np.array_equal(expected[rank], exact[rank])  # the codec did round
    np.testing.assert_allclose(expected[rank], exact[rank], rtol=0, atol=0.05)
    algo.close()


# -- serial ---------------------------------------------------------------------------


@pytest.mark.mpi(min_size=2)
def test_low_precision_gossip_charges_its_codes_to_codec():
    """The encode of a step's change and the decode of the sources' codes are the codec
    phase (the second step receives the first's codes); without a codec it is zero."""
    for codec, charged in (("int8", True), ("none", False)):
        flags = ("--lr", "0.05", "--gossip-codec", codec)
        algo, stream, _, _ = setup("ring", flags, steps=2, dtype=np.float32)
        for _ in range(2):
            algo.timer.reset()
            algo.step(*stream.next())
            assert (algo.timer.totals["codec"] > 0) == charged
            assert algo.timer.totals["update"] > 0
        algo.close()
