"""DiLoCo and SlowMo against serial re-computations of every rank in one process.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/test_diloco_slowmo_mpi.py``
(and ``-n 4``); the option checks also run in a plain serial pytest. float64
throughout: the MPI job and the serial loop differ only in the order MPI sums, so they
agree to 1e-10 (the bound of every re-computation in this suite).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rank_streams, train_config

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.local_optimizer import build_local_optimizer
from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

BATCH, SEED = 8, 3
FLAGS = ("--lr", "0.01", "--momentum", "0.9", "--weight-decay", "1e-3", "--dtype", "float64")
#: DiLoCo H = 1 with a plain outer step of lr 1 against SSGD with the same inner
#: optimizer (momentum SGD), 12 steps: the two sum the same numbers in another order
#: (measured: 1.9e-16 on 2 ranks, 1.4e-16 on 4, weights below 0.23).
SSGD_ATOL = 1e-15


# -- serial ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--algorithm", "diloco", "--inner-steps", "0"], "--inner-steps must be >= 1, got 0"),
        (["--algorithm", "diloco", "--outer-lr", "0"], "--outer-lr must be > 0, got 0.0"),
        (["--algorithm", "diloco", "--outer-momentum", "1"],
         "--outer-momentum must be in [0, 1), got 1.0"),
        (["--algorithm", "diloco", "--sync-warmup", "-1"], "--sync-warmup must be >= 0, got -1"),
        (["--algorithm", "slowmo", "--period", "0"], "--period must be >= 1, got 0"),
        (["--algorithm", "slowmo", "--slow-lr", "-1"], "--slow-lr must be > 0, got -1.0"),
        (["--algorithm", "slowmo", "--slow-momentum", "1.5"],
         "--slow-momentum must be in [0, 1), got 1.5"),
    ],
)
def test_bad_options_are_one_line(flags, message):
    config = train_config(*flags)
    with pytest.raises(ValueError) as err:
        validate(get_algorithm(config.algorithm), config, 2)
    assert str(err.value) == message


# -- helpers -------------------------------------------------------------------------
def _setup(algorithm, steps_per_rank, *flags):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config(*FLAGS, "--algorithm", algorithm, *flags)
    validate(get_algorithm(algorithm), config, size)
    model = build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
    budget = Budget(steps_per_rank * BATCH * size, BATCH, size)
    algo = get_algorithm(algorithm)(model, Communicator(world), config, budget)
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED)[rank]
    return algo, stream, data, config


def _train(algo, stream):
    stats, points = [], []
    while not algo.done():
        algo.timer.reset()
        stats.append(algo.step(*stream.next()))
        points.append(algo.evaluation_point())
    algo.finish()
    return stats, points


def _on_rank0(fn, *args):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.bcast(fn(*args) if world.Get_rank() == 0 else None, root=0)


def _assert_identical_on_all_ranks(array):
    from mpi4py import MPI

    for other in MPI.COMM_WORLD.allgather(np.asarray(array)):
        np.testing.assert_array_equal(other, array)


def serial_outer_rounds(data, world, config, cls, steps, period, warmup, outer_lr, mu,
                        nesterov):
    """Every rank in one process: ``warmup`` synchronous steps (mean gradient, each
    rank's own local optimizer), then rounds of ``period`` local steps (the last one
    shorter) ended by the outer SGD step on Delta = anchor - mean_i theta_i:
    b <- Delta (first) or mu b + Delta; d <- Delta + mu b (Nesterov) or b;
    anchor <- anchor - lr d. Returns (anchor, b)."""
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
              for _ in range(world)]
    opts = [build_local_optimizer(m, config, cls.traits) for m in models]
    streams = rank_streams(data.train_x, data.train_y, world, BATCH, SEED)
    for _ in range(min(warmup, steps)):
        for m, s in zip(models, streams):
            m.loss_and_grad(*s.next())
        mean = sum(m.grads for m in models) * (1.0 / world)
        for m, o in zip(models, opts):
            o.step(m.params, mean.copy())
    anchor, buffer, done, outer_steps = models[0].params.copy(), None, min(warmup, steps), 0
    while done < steps:
        length = min(period, steps - done)
        for m, o, s in zip(models, opts, streams):
            m.params[...] = anchor
            for _ in range(length):
                m.loss_and_grad(*s.next())
                o.step(m.params, m.grads)
        done += length
        delta = -(sum(m.params - anchor for m in models) * (1.0 / world))
        if mu:
            buffer = delta.copy() if buffer is None else mu * buffer + delta
            direction = delta + mu * buffer if nesterov else buffer
        else:
            direction = delta
        anchor = anchor - outer_lr * direction
        outer_steps += 1
    return anchor, buffer


# -- DiLoCo ------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("optimizer", "warmup"), [("adamw", 0), ("adamw", 3), ("sgd", 2)])
def test_diloco_equals_serial_rounds_with_nesterov(optimizer, warmup):
    steps, period = 14, 4
    algo, stream, data, config = _setup(
        "diloco", steps, "--inner-steps", str(period), "--sync-warmup", str(warmup),
        "--optimizer", optimizer)
    stats, points = _train(algo, stream)
    size = algo.comm.size
    expected, buffer = _on_rank0(serial_outer_rounds, data, size, config,
                                 get_algorithm("diloco"), steps, period, warmup, 0.7, 0.9,
                                 True)
    np.testing.assert_allclose(algo.model.params, expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(algo.averager.outer.buffer, buffer, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)
    # rounds after the warm-up, the last one shorter; evaluation points at warm-up steps
    # and round boundaries only
    lengths = [min(period, steps - warmup - k) for k in range(0, steps - warmup, period)]
    assert [s.local_steps for s in stats] == [0] * warmup + [n for n in lengths for _ in range(n)]
    boundaries = set(range(1, warmup + 1)) | {warmup + sum(lengths[:k + 1])
                                              for k in range(len(lengths))}
    assert points == [(j + 1) * BATCH * size if j + 1 in boundaries else None
                      for j in range(steps)]
    assert algo.run_attributes["warmup_steps"] == warmup


@pytest.mark.mpi(min_size=2)
def test_diloco_with_one_inner_step_and_a_plain_outer_step_is_ssgd():
    steps = 12
    diloco, stream, _, _ = _setup("diloco", steps, "--inner-steps", "1", "--outer-lr", "1",
                                  "--outer-momentum", "0", "--optimizer", "sgd")
    _train(diloco, stream)
    ssgd, stream, _, _ = _setup("ssgd", steps, "--comm", "blocking")
    _train(ssgd, stream)
    from mpi4py import MPI

    np.testing.assert_allclose(diloco.model.params, ssgd.model.params, rtol=0, atol=SSGD_ATOL)
    # each rank's velocity sums its own gradients; their mean is SSGD's (the update is linear)
    mean_velocity = MPI.COMM_WORLD.allreduce(diloco.optimizer.velocity) / diloco.comm.size
    np.testing.assert_allclose(mean_velocity, ssgd.optimizer.velocity, rtol=0, atol=SSGD_ATOL)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("algorithm", "flags"), [
    ("diloco", ("--inner-steps", "4", "--sync-warmup", "2")),
    ("diloco", ("--inner-steps", "3", "--sync-warmup", "5")),  # saved during the warm-up
    ("slowmo", ("--period", "4", "--optimizer", "adamw", "--momentum-sync", "average")),
])
def test_state_round_trip_resumes_exactly(algorithm, flags):
    """Stop at an evaluation point, save state(), load it into a fresh instance, continue:
    the inner optimizer's moments and the outer buffer travel, the parameters end equal."""
    steps = 21
    whole, stream, _, _ = _setup(algorithm, steps, *flags)
    _train(whole, stream)
    first, stream, _, _ = _setup(algorithm, steps, *flags)
    while first.steps_taken < 4 or first.evaluation_point() is None:
        first.timer.reset()
        first.step(*stream.next())
    state = first.state()
    assert "outer_buffer" in state and "velocity" in state
    second, stream, _, _ = _setup(algorithm, steps, *flags)
    second.load_state(state)
    stream.seek(first.steps_taken)
    _train(second, stream)
    np.testing.assert_array_equal(second.model.params, whole.model.params)
    np.testing.assert_array_equal(second.averager.outer.buffer, whole.averager.outer.buffer)
    assert second.averager.round == whole.averager.round


# -- SlowMo ------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("extra", [(), ("--slow-lr", "1.3", "--slow-momentum", "0.7")])
def test_slowmo_equals_serial_rounds_with_slow_momentum(extra):
    steps, period = 11, 3
    algo, stream, data, config = _setup("slowmo", steps, "--period", str(period), *extra)
    _train(algo, stream)
    expected, buffer = _on_rank0(serial_outer_rounds, data, algo.comm.size, config,
                                 get_algorithm("slowmo"), steps, period, 0,
                                 config.slow_lr, config.slow_momentum, False)
    np.testing.assert_allclose(algo.model.params, expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(algo.averager.outer.buffer, buffer, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)


@pytest.mark.mpi(min_size=2)
def test_slowmo_with_alpha_1_and_no_momentum_is_localsgd():
    steps = 10
    slowmo, stream, _, _ = _setup("slowmo", steps, "--period", "4", "--slow-momentum", "0")
    _train(slowmo, stream)
    local, stream, _, _ = _setup("localsgd", steps, "--period", "4")
    _train(local, stream)
    np.testing.assert_allclose(slowmo.model.params, local.model.params, rtol=0, atol=1e-12)
