"""DiLoCo and SlowMo against serial re-computations of every rank in one process.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_diloco_slowmo_mpi.py``
(and ``-n 4``); the option checks also run in a plain serial pytest. float64
throughout: the MPI job and the serial loop differ only in the order MPI sums, so they
agree to 1e-10 (the bound of every re-computation in this suite).

Split off this module: ``tests/unit/test_diloco_slowmo_mpi_unit.py`` (its tests that need
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
FLAGS = ("--lr", "0.01", "--momentum", "0.9", "--weight-decay", "1e-3", "--dtype", "float64")
#: DiLoCo H = 1 with a plain outer step of lr 1 against SSGD with the same inner
#: optimizer (momentum SGD), 12 steps: the two sum the same numbers in another order
#: (measured: 1.9e-16 on 2 ranks, 1.4e-16 on 4, weights below 0.23).
SSGD_ATOL = 1e-15


# -- helpers -------------------------------------------------------------------------
def _setup(algorithm, steps_per_rank, *flags):
    return strategy_on_world(algorithm, steps_per_rank, FLAGS, flags, BATCH, SEED)


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


def _serial_warmup(data, world, config, cls, warmup):
    """Every rank's model, local optimizer and batches, after ``warmup`` synchronous steps
    (the mean gradient, each rank's own optimizer)."""
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
              for _ in range(world)]
    opts = [build_local_optimizer(m, config, cls.traits) for m in models]
    streams = rank_streams(data.train_x, data.train_y, world, BATCH, SEED)
    for _ in range(warmup):
        for m, s in zip(models, streams):
            m.loss_and_grad(*s.next())
        mean = sum(m.grads for m in models) * (1.0 / world)
        for m, o in zip(models, opts):
            o.step(m.params, mean.copy())
    return models, opts, streams


def serial_outer_rounds(data, world, config, cls, steps, period, warmup, outer_lr, mu,
                        nesterov, mean=None):
    """Every rank in one process: ``warmup`` synchronous steps (mean gradient, each
    rank's own local optimizer), then rounds of ``period`` local steps (the last one
    shorter) ended by the outer SGD step on Delta = anchor - mean_i theta_i:
    b <- Delta (first) or mu b + Delta; d <- Delta + mu b (Nesterov) or b;
    anchor <- anchor - lr d. ``mean``: how the ranks' pseudo-gradients are averaged
    (default: summed and scaled by 1/N). Returns (anchor, b)."""
    models, opts, streams = _serial_warmup(data, world, config, cls, min(warmup, steps))
    anchor, buffer, done, outer_steps = models[0].params.copy(), None, min(warmup, steps), 0
    while done < steps:
        length = min(period, steps - done)
        for m, o, s in zip(models, opts, streams):
            m.params[...] = anchor
            for _ in range(length):
                m.loss_and_grad(*s.next())
                o.step(m.params, m.grads)
        done += length
        delta = -(mean([m.params - anchor for m in models]) if mean is not None
                  else sum(m.params - anchor for m in models) * (1.0 / world))
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
    # the paper's inner schedule: the count of the cosine travels with the moments
    ("diloco", ("--inner-steps", "4", "--lr-schedule", "cosine", "--lr-warmup", "3")),
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


# -- Streaming DiLoCo --------------------------------------------------------------
def _local_step_everywhere(models, opts, streams):
    for m, o, st in zip(models, opts, streams):
        m.loss_and_grad(*st.next())
        o.step(m.params, m.grads)


def _mixed(alpha, local, global_):
    """alpha * local + (1 - alpha) * global (alpha 0: the global fragment itself)."""
    return alpha * local + (1 - alpha) * global_ if alpha else global_


def serial_streaming(data, world, config, cls, steps, period, fragments, tau, alpha, warmup,
                     mean=None):
    """Every rank in one process, on torchft's schedule (module docstring of
    ``averagers/streaming.py``): fragment p posts its pseudo-gradient at
    s = o_p + kH, completes it tau inner steps later with its own Nesterov buffer and
    merges by alpha; at the end in-flight fragments complete, fragments with steps since
    their post sync once more, and every replica is the global model. ``mean``: how
    the ranks' fragments are averaged (default: summed and scaled by 1/N). Returns
    (global model, every fragment's outer buffer)."""
    from syncbench.algorithms.averagers.streaming import fragment_bounds, fragment_offsets

    models, opts, streams = _serial_warmup(data, world, config, cls, min(warmup, steps))
    bounds = fragment_bounds(models[0].layer_offsets, models[0].size, fragments)
    offsets = fragment_offsets(period, fragments)
    anchor = models[0].params.copy()
    buffers: list = [None] * fragments
    sent: list = [None] * fragments
    posted_at = [0] * fragments

    def post(p, s):
        lo, hi = bounds[p]
        deltas = [m.params[lo:hi] - anchor[lo:hi] for m in models]
        sent[p] = mean(deltas) if mean is not None else sum(deltas) * (1.0 / world)
        posted_at[p] = s

    def complete(p, a):
        lo, hi = bounds[p]
        delta = -sent[p]
        sent[p] = None
        buffers[p] = delta.copy() if buffers[p] is None else 0.9 * buffers[p] + delta
        anchor[lo:hi] = anchor[lo:hi] - 0.7 * (delta + 0.9 * buffers[p])
        for m in models:
            m.params[lo:hi] = _mixed(a, m.params[lo:hi], anchor[lo:hi])

    s = 0
    for _ in range(steps - min(warmup, steps)):
        _local_step_everywhere(models, opts, streams)
        s += 1
        for p, o_p in enumerate(offsets):
            if s >= o_p and (s - o_p) % period == 0:
                post(p, s)
        for p, o_p in enumerate(offsets):
            if sent[p] is not None and (s - o_p - tau) % period == 0:
                complete(p, alpha)
    for p in range(fragments):
        if sent[p] is not None:
            complete(p, alpha)
        if s > posted_at[p]:
            post(p, s)
            complete(p, 0.0)
    return anchor, buffers


STREAMING = [
    # (steps, H, P, tau, alpha, warm-up)
    (17, 6, 3, 1, 0.5, 0),
    (13, 4, 2, 1, 0.0, 2),
    (16, 6, 3, 0, 0.25, 0),
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("steps", "period", "fragments", "tau", "alpha", "warmup"), STREAMING)
def test_streaming_diloco_equals_serial_fragments(steps, period, fragments, tau, alpha, warmup):
    algo, stream, data, config = _setup(
        "diloco", steps, "--inner-steps", str(period), "--fragments", str(fragments),
        "--overlap-steps", str(tau), "--mix", str(alpha), "--sync-warmup", str(warmup),
        "--optimizer", "adamw")
    points, globals_at_points = [], []
    while not algo.done():
        algo.timer.reset()
        algo.step(*stream.next())
        point = algo.evaluation_point()
        points.append(point)
        if point is not None:
            globals_at_points.append(np.array(algo.consensus_params()))
    algo.finish()
    size = algo.comm.size
    expected, buffers = _on_rank0(serial_streaming, data, size, config,
                                  get_algorithm("diloco"), steps, period, fragments, tau,
                                  alpha, warmup)
    np.testing.assert_allclose(algo.model.params, expected, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(algo.model.params, algo.consensus_params())
    for outer, buffer in zip(algo.averager.outers, buffers):
        np.testing.assert_allclose(outer.buffer, buffer, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)
    for model in globals_at_points:  # the global model is every rank's at every point
        _assert_identical_on_all_ranks(model)
    # points: every step but those with a fragment in flight (tau steps after each post)
    from syncbench.algorithms.averagers.streaming import fragment_offsets

    busy = {warmup + o + k * period + d for o in fragment_offsets(period, fragments)
            for k in range(steps) for d in range(tau)}
    assert points == [None if j + 1 in busy and j + 1 < steps else (j + 1) * BATCH * size
                      for j in range(steps)]


@pytest.mark.mpi(min_size=2)
def test_streaming_with_one_fragment_no_overlap_and_no_mixing_is_diloco():
    from syncbench.algorithms.averagers.streaming import StreamingAverager
    from syncbench.algorithms.outer.sgd import OuterSGD

    steps, period = 14, 4
    plain, stream, _, _ = _setup("diloco", steps, "--inner-steps", str(period))
    _train(plain, stream)
    streamed, stream, _, _ = _setup("diloco", steps, "--inner-steps", str(period))
    streamed.averager = StreamingAverager(streamed, period, 1, 0, 0.0,
                                          lambda like: OuterSGD(0.7, 0.9, True, like))
    _train(streamed, stream)
    np.testing.assert_array_equal(streamed.model.params, plain.model.params)
    np.testing.assert_array_equal(streamed.averager.outers[0].buffer,
                                  plain.averager.outer.buffer)


@pytest.mark.mpi(min_size=2)
def test_streaming_state_round_trip_resumes_exactly_between_fragments():
    flags = ("--inner-steps", "6", "--fragments", "3", "--overlap-steps", "1", "--mix", "0.5")
    steps = 20
    whole, stream, _, _ = _setup("diloco", steps, *flags)
    _train(whole, stream)
    first, stream, _, _ = _setup("diloco", steps, *flags)
    while first.steps_taken < 7 or first.evaluation_point() is None:
        first.timer.reset()
        first.step(*stream.next())
    assert first.steps_taken % 6  # inside a round: replicas differ from the global model
    state = first.state()
    second, stream, _, _ = _setup("diloco", steps, *flags)
    second.load_state(state)
    stream.seek(first.steps_taken)
    _train(second, stream)
    np.testing.assert_array_equal(second.model.params, whole.model.params)
