"""Hierarchical Local SGD against a serial re-computation of every rank in one process.

Run with ``mpiexec -n 2`` and ``-n 4 ... python -m pytest --only-mpi
tests/mpi_inproc/test_hierarchical_mpi.py``; every rank here shares one host, so ``--group-size``
stands in for nodes (1 on two ranks, 2 on four). The option checks also run serially.

Split off this module: ``tests/unit/test_hierarchical_mpi_unit.py`` (its tests that need
neither).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import strategy_on_world
from oracles import rank_streams

from syncbench.algorithms.local_optimizer import build_local_optimizer
from syncbench.algorithms.registry import get_algorithm
from syncbench.kernels.zoo import build_model

BATCH, SEED = 8, 3
FLAGS = ("--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4", "--dtype", "float64")


def _setup(algorithm, steps_per_rank, *flags):
    return strategy_on_world(algorithm, steps_per_rank, FLAGS, flags, BATCH, SEED)


def _train(algo, stream):
    points = []
    while not algo.done():
        algo.timer.reset()
        algo.step(*stream.next())
        points.append(algo.evaluation_point())
    algo.finish()
    return points


def _group_size():
    from mpi4py import MPI

    return 1 if MPI.COMM_WORLD.Get_size() < 4 else 2


def serial_hierarchical(data, world, config, steps, h1, h2, g):
    """Every rank in one process: local steps; at step s, the mean of every rank if H2
    divides s or s is the last step, else of each block of g ranks if H1 divides s."""
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
              for _ in range(world)]
    opts = [build_local_optimizer(m, config, get_algorithm("hierarchical").traits)
            for m in models]
    streams = rank_streams(data.train_x, data.train_y, world, BATCH, SEED)
    for s in range(1, steps + 1):
        for m, o, st in zip(models, opts, streams):
            m.loss_and_grad(*st.next())
            o.step(m.params, m.grads)
        if s % h2 == 0 or s == steps:
            groups = [list(range(world))]
        elif s % h1 == 0:
            groups = [list(range(k, k + g)) for k in range(0, world, g)]
        else:
            continue
        for group in groups:
            mean = sum(models[k].params for k in group) * (1.0 / len(group))
            for k in group:
                models[k].params[...] = mean
    return [m.params for m in models]


@pytest.mark.mpi(min_size=2)
def test_hierarchical_equals_serial_two_level_averaging():
    from mpi4py import MPI

    steps, h1, h2, g = 15, 2, 6, _group_size()
    algo, stream, data, config = _setup("hierarchical", steps, "--node-period", str(h1),
                                        "--global-period", str(h2), "--group-size", str(g))
    points = _train(algo, stream)
    world = algo.comm.size
    expected = MPI.COMM_WORLD.bcast(
        serial_hierarchical(data, world, config, steps, h1, h2, g)
        if algo.comm.rank == 0 else None, root=0)
    np.testing.assert_allclose(algo.model.params, expected[algo.comm.rank], rtol=0, atol=1e-10)
    weights = algo.model.params.nbytes + algo.model.buffers.nbytes
    assert algo.run_attributes["wire_bytes_per_outer_step"] == (h2 // h1) * weights
    assert algo.run_attributes["outer_period_steps"] == h2
    assert points == [(s * BATCH * world if s % h2 == 0 or s == steps else None)
                      for s in range(1, steps + 1)]


@pytest.mark.mpi(min_size=4)
def test_node_averages_make_a_nodes_replicas_equal_and_leave_other_nodes_apart():
    """On four ranks in two groups, after a node average (step 2 of 8) replicas are equal
    inside a group and differ across groups."""
    from mpi4py import MPI

    algo, stream, _, _ = _setup("hierarchical", 8, "--node-period", "2", "--global-period",
                                "8", "--group-size", "2")
    for _ in range(2):
        algo.timer.reset()
        algo.step(*stream.next())
    every = MPI.COMM_WORLD.allgather(np.array(algo.model.params))
    np.testing.assert_array_equal(every[0], every[1])
    np.testing.assert_array_equal(every[2], every[3])
    assert not np.array_equal(every[0], every[2])
    assert algo.evaluation_point() is None


@pytest.mark.mpi(min_size=2)
def test_equal_periods_are_local_sgd_bit_for_bit():
    steps = 9
    hier, stream, _, _ = _setup("hierarchical", steps, "--node-period", "3", "--global-period",
                                "3", "--group-size", str(_group_size()))
    _train(hier, stream)
    local, stream, _, _ = _setup("localsgd", steps, "--period", "3")
    _train(local, stream)
    np.testing.assert_array_equal(hier.model.params, local.model.params)


@pytest.mark.mpi(min_size=2)
def test_state_round_trip_resumes_exactly():
    flags = ("--node-period", "2", "--global-period", "4", "--group-size", str(_group_size()))
    steps = 13
    whole, stream, _, _ = _setup("hierarchical", steps, *flags)
    _train(whole, stream)
    first, stream, _, _ = _setup("hierarchical", steps, *flags)
    while first.steps_taken < 5 or first.evaluation_point() is None:
        first.timer.reset()
        first.step(*stream.next())
    state = first.state()
    second, stream, _, _ = _setup("hierarchical", steps, *flags)
    second.load_state(state)
    stream.seek(first.steps_taken)
    _train(second, stream)
    np.testing.assert_array_equal(second.model.params, whole.model.params)


# -- SSGD --comm hierarchical ------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_ssgd_hierarchical_on_one_node_is_the_blocking_allreduce():
    """Every rank here shares one host: one node, whose Allreduce is the whole sum."""
    steps = 6
    hier, stream, _, _ = _setup("ssgd", steps, "--comm", "hierarchical")
    _train(hier, stream)
    assert hier.reducer.nodes == 1
    plain, stream, _, _ = _setup("ssgd", steps, "--comm", "blocking")
    _train(plain, stream)
    np.testing.assert_allclose(hier.model.params, plain.model.params, rtol=0, atol=1e-15)


@pytest.mark.mpi(min_size=2)
def test_hierarchical_reducer_over_groups_standing_in_for_nodes_sums_every_rank():
    """Groups of 1 rank (2 ranks) or 2 (4 ranks) as nodes: node sum, leaders' sum,
    broadcast give every rank the blocking Allreduce's mean, to rounding (the sum's
    order differs), and every rank the same bits."""
    from syncbench.algorithms.reducers.hierarchical import HierarchicalAllreduce

    steps, g = 6, _group_size()
    hier, stream, _, _ = _setup("ssgd", steps, "--comm", "blocking")
    hier.reducer = HierarchicalAllreduce(hier, group_size=g)
    assert hier.reducer.nodes == hier.comm.size // g
    _train(hier, stream)
    plain, stream, _, _ = _setup("ssgd", steps, "--comm", "blocking")
    _train(plain, stream)
    np.testing.assert_allclose(hier.model.params, plain.model.params, rtol=0, atol=1e-12)
    from mpi4py import MPI

    for other in MPI.COMM_WORLD.allgather(np.array(hier.model.params)):
        np.testing.assert_array_equal(other, hier.model.params)
