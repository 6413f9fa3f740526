"""OD-SGD under MPI equals a serial float64 re-computation of its recurrence.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_odsgd_mpi.py``
(and ``-n 4``); the end-to-end ``syncbench train`` test launches its own
``mpiexec`` and so runs only in a plain serial ``pytest``.

Split off this module: ``tests/unit/test_odsgd_mpi_unit.py`` (its tests that need neither)
and ``tests/e2e/test_odsgd_mpi_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

STEPS, WARMUP, BATCH, SEED = 8, 3, 8, 3
FLAGS = ("--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4",
         "--warmup-steps", str(WARMUP), "--lr-local", "0.07", "--dc-lambda", "0.5",
         "--cadc-lambda", "20", "--cadc-m", "0.5")
LOCAL_MOMENTUM = ("--local-momentum", "0.1")  # the paper's fit.py default
# the compiled kernel's scalars: LAMBDA := D (per element: --wd-exempt), decay := 1/(b*N);
# a larger weight decay so that the compensation term shows at the tolerance
CADC_LAUNCHED = ("--cadc-args", "launched", "--weight-decay", "0.05", "--wd-exempt")


class SerialLocalStep:
    """One rank's local step of ALGORITHMS.md (float64), with its optimizer's state."""

    def __init__(self, config, world, decay):
        self.config, self.world, self.decay = config, world, decay  # decay: D
        self.w_g_prev = self.mean_square = self.mom = None

    def compensated(self, g_n, w_g):
        """LocalOpt(g/N) and the decay coefficient of the local step."""
        config, local_decay = self.config, self.decay
        if config.local_opt == "dc":  # lambda*(g/N)^2*(W_g(t) - W_g(t-1)), as MXNet
            if self.w_g_prev is None:
                self.w_g_prev = w_g.copy()
            local = g_n + config.dc_lambda * g_n * g_n * (w_g - self.w_g_prev)
        elif config.local_opt == "cadc":  # CADCASGD: ms_update, then adc_sgd_update
            if self.mean_square is None:
                self.mean_square, self.w_g_prev = np.zeros_like(w_g), w_g.copy()
            m, lam = config.cadc_m, config.cadc_lambda
            self.mean_square = m * self.mean_square + (1 - m) * g_n * g_n + 1e-7
            if config.cadc_args == "launched":  # the fork's launch order of the scalars
                lam, local_decay = self.decay, 1.0 / (BATCH * self.world)
            local = g_n + lam / np.sqrt(self.mean_square) * g_n * g_n * (w_g - self.w_g_prev)
        else:
            local = g_n
        self.w_g_prev = w_g.copy()
        return local, local_decay

    def w_loc(self, g, w_g, velocity):
        """W_loc after this rank's local step from the pulled W_g with its own gradient g."""
        config = self.config
        local, local_decay = self.compensated(g / self.world, w_g)  # g/N: rescaled by 1/(b*N)
        if config.local_lookahead == "on":
            step = -config.lr_local * local
            extra = -config.lr * (config.momentum * velocity + self.decay * w_g)
        else:  # the paper's: -lr_local * (LocalOpt(g/N) + D*W_g)
            step, extra = -config.lr_local * (local + local_decay * w_g), 0.0
        if config.local_momentum:  # MXNet SGD: mom = mu_l*mom + step, kept across steps
            self.mom = step if self.mom is None else config.local_momentum * self.mom + step
            step = self.mom
        return w_g + step + extra


def serial_odsgd(model_name, data, world, config, steps):
    """The OD-SGD recurrence of ALGORITHMS.md, all ranks in one process (float64).

    Returns ``(trajectory, final_w_global)``; ``trajectory[t]`` is
    ``(W_g, [W_loc of each rank])`` after step t.
    """
    models = [build_model(model_name, data.input_shape, data.num_classes,
                          dtype=np.float64, seed=SEED) for _ in range(world)]
    w_g = models[0].params.copy()
    mask = models[0].decay_mask() if config.wd_exempt else None
    global_opt = MomentumSGD(w_g, config.lr, config.momentum, config.weight_decay, mask)
    decay = config.weight_decay if mask is None else config.weight_decay * mask
    local_steps = [SerialLocalStep(config, world, decay) for _ in range(world)]
    streams = rank_streams(data.train_x, data.train_y, world, BATCH, SEED)
    in_flight = None  # the averaged gradient of the previous step, not yet applied
    trajectory = []
    for t in range(steps):
        grads = []
        for model, stream in zip(models, streams):
            model.loss_and_grad(*stream.next())
            grads.append(model.grads.copy())
        average = sum(grads) / world
        if t < config.warmup_steps:
            global_opt.step(w_g, average)
            for model in models:
                model.params[...] = w_g
        else:
            if in_flight is not None:
                global_opt.step(w_g, in_flight)
            in_flight = average
            for model, g, local_step in zip(models, grads, local_steps):
                model.params[...] = local_step.w_loc(g, w_g, global_opt.velocity)
        trajectory.append((w_g.copy(), [m.params.copy() for m in models]))
    if in_flight is not None:
        global_opt.step(w_g, in_flight)
    return trajectory, w_g


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("model_name,local_opt,lookahead,extra", [
    ("mlp", "sgd", "off", ()), ("mlp", "dc", "off", ()), ("mlp", "sgd", "on", ()),
    ("mlp", "dc", "on", ()), ("lenet", "sgd", "off", ()), ("lenet", "dc", "on", ()),
    ("mlp", "sgd", "off", LOCAL_MOMENTUM), ("mlp", "sgd", "on", LOCAL_MOMENTUM),
    ("mlp", "cadc", "off", ()), ("mlp", "cadc", "on", ()), ("lenet", "cadc", "off", ()),
    ("mlp", "cadc", "off", CADC_LAUNCHED),
])
def test_odsgd_trajectory_equals_serial_recurrence(model_name, local_opt, lookahead, extra):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(512, 64, (1, 28, 28), 10, seed=1)
    config = train_config("--algorithm", "odsgd", "--local-opt", local_opt,
                          "--local-lookahead", lookahead, *FLAGS, *extra)
    model = build_model(model_name, data.input_shape, 10, dtype=np.float64, seed=SEED)
    algo = get_algorithm("odsgd")(model, Communicator(world), config,
                                  Budget(STEPS * BATCH * size, BATCH, size))
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED)[rank]
    expected, expected_final = serial_odsgd(model_name, data, size, config, STEPS)
    for t in range(STEPS):
        algo.step(*stream.next())
        w_g, w_locs = expected[t]
        np.testing.assert_allclose(algo.w_global, w_g, rtol=0, atol=1e-10, err_msg=f"W_g {t}")
        np.testing.assert_allclose(model.params, w_locs[rank], rtol=0, atol=1e-10,
                                   err_msg=f"W_loc step {t}")
        # the one-step delay: after the warm-up exactly one reduction is in flight
        assert (algo.pending is not None) == (t >= WARMUP)
        assert algo.evaluation_point() == (t + 1) * BATCH * size
    assert algo.done()
    # after the warm-up the local weights really differ across ranks
    assert not np.array_equal(expected[-1][1][0], expected[-1][1][1])

    algo.finish()
    assert algo.pending is None and not algo.comm.outstanding
    final = algo.consensus_params()
    assert final is algo.w_global
    np.testing.assert_allclose(final, expected_final, rtol=0, atol=1e-10)
    for other in world.allgather(np.asarray(final)):
        assert np.array_equal(other, final)  # W_g is bit-identical on every rank
    algo.close()


@pytest.mark.mpi(min_size=2)
def test_odsgd_without_warmup_and_float32_runs_in_lock_step():
    """``--warmup-steps 0`` starts delayed at step 0; float32 replicas of W_g agree."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(256, 32, (1, 28, 28), 10, seed=2)
    config = train_config("--algorithm", "odsgd", "--warmup-steps", "0")
    model = build_model("mlp", data.input_shape, 10, seed=SEED)
    algo = get_algorithm("odsgd")(model, Communicator(world), config,
                                  Budget(4 * BATCH * size, BATCH, size))
    stream = rank_streams(data.train_x, data.train_y, size, BATCH, SEED, np.float32)[rank]
    while not algo.done():
        stats = algo.step(*stream.next())
        assert stats.staleness == 1 and algo.pending is not None
    algo.finish()
    assert np.array_equal(model.params, algo.w_global)
    for other in world.allgather(np.asarray(algo.w_global)):
        assert np.array_equal(other, algo.w_global)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("flags", [("--local-opt", "dc"), ("--local-opt", "cadc"),
                                   ("--local-opt", "sgd", *LOCAL_MOMENTUM)])
def test_odsgd_state_resumes_the_same_trajectory(flags):
    """A checkpoint taken with a reduction in flight resumes bit-identically (the local
    optimizer's state included: dc's W_g(t-1), cadc's MS and W_g(t-1), the local momentum)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    data = make_synthetic(256, 32, (1, 28, 28), 10, seed=2)
    config = train_config("--algorithm", "odsgd", *FLAGS, *flags)
    budget = Budget(STEPS * BATCH * size, BATCH, size)
    batches = [rank_streams(data.train_x, data.train_y, size, BATCH, SEED)[rank].next()
               for _ in range(STEPS)]

    def fresh():
        model = build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
        return get_algorithm("odsgd")(model, Communicator(world), config, budget)

    straight, resumed = fresh(), fresh()
    for t in range(STEPS):
        straight.step(*batches[t])
        if t == WARMUP + 1:
            saved = straight.state()
    resumed.load_state(saved)
    assert {"w_g_prev", "cadc_ms", "local_mom"} <= set(saved)
    for t in range(WARMUP + 2, STEPS):
        resumed.step(*batches[t])
    for algo in (straight, resumed):
        algo.finish()
    assert np.array_equal(resumed.w_global, straight.w_global)
    assert np.array_equal(resumed.model.params, straight.model.params)


@pytest.mark.mpi(min_size=2)
def test_default_local_learning_rate_follows_the_lookahead():
    """Plain --lr by default (the paper); N*lr with the look-ahead (W_loc predicts W_g)."""
    from mpi4py import MPI

    from syncbench.algorithms.base import Budget
    from syncbench.algorithms.communicator import Communicator
    from syncbench.kernels.zoo import build_model

    size = MPI.COMM_WORLD.Get_size()
    cls = get_algorithm("odsgd")
    for flags, expected in (((), 0.3), (("--local-lookahead", "on"), 0.3 * size),
                            (("--local-lookahead", "on", "--lr-local", "0.2"), 0.2)):
        config = train_config("--algorithm", "odsgd", "--lr", "0.3", *flags)
        model = build_model("mlp", (1, 28, 28), 10, dtype=np.float64)
        algo = cls(model, Communicator(MPI.COMM_WORLD), config, Budget(64 * size, 8, size))
        assert algo.lr_local == pytest.approx(expected)
