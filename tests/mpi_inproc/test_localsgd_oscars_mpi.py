"""Local SGD and Oscars against serial re-computations (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_localsgd_oscars_mpi.py``
(and ``-n 4``). The pure schedule tests also run in a plain serial pytest.

Split off this module: ``tests/unit/test_localsgd_oscars_mpi_unit.py`` (its tests that need
neither).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import strategy_on_world
from oracles import rank_streams

from syncbench.algorithms.averagers.schedule import fit_budget, schedule
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.bench.train.slowdown import make_slowdown, parse_slowdown, parse_slowdown_schedule
from syncbench.kernels.zoo import build_model

BATCH, SEED = 8, 3
FLAGS = ("--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4", "--dtype", "float64")


# -- helpers -------------------------------------------------------------------
def _setup(algorithm, steps_per_rank, *flags, model_name="mlp"):
    return strategy_on_world(algorithm, steps_per_rank, FLAGS, flags, BATCH, SEED, model_name)


def _train(algo, stream, max_steps=10_000):
    """The driver's loop: reset the per-step timer, step until done; returns step stats."""
    stats = []
    while not algo.done() and len(stats) < max_steps:
        algo.timer.reset()
        stats.append(algo.step(*stream.next()))
    algo.finish()
    return stats


def serial_rounds(data, world, config, schedules, averaging="weighted", overlap=False):
    """Serial Oscars/Local SGD on the same batches: every rank k takes taus[k] steps per round.

    Weighted: W_start += glr * sum_k tau_k*delta_k / sum_k tau_k; uniform: sum_k delta_k / N.
    With ``overlap`` the first step of each later round is taken on the rank's
    pre-average weights and its progress is added to the new average.
    """
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
              for _ in range(world)]
    opts = [MomentumSGD(m.params, config.lr, config.momentum, config.weight_decay)
            for m in models]
    streams = rank_streams(data.train_x, data.train_y, world, BATCH, SEED)
    glr = getattr(config, "global_lr", 1.0)

    def local(k):
        m = models[k]
        m.loss_and_grad(*streams[k].next())
        opts[k].step(m.params, m.grads)

    w_start = models[0].params.copy()
    for r, taus in enumerate(schedules):
        deltas = []
        for k in range(world):
            done_already = 0
            if overlap and r > 0:  # the overlapped first step, from pre-average weights
                before = models[k].params.copy()
                local(k)
                models[k].params[...] = w_start + (models[k].params - before)
                done_already = 1
            else:
                models[k].params[...] = w_start
            for _ in range(taus[k] - done_already):
                local(k)
            deltas.append(models[k].params - w_start)
        if averaging == "weighted":
            avg = sum(t * d for t, d in zip(taus, deltas)) / sum(taus)
        else:
            avg = sum(deltas) / world
        w_start = w_start + glr * avg
    return w_start


def _on_rank0(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` computed once, on rank 0, and broadcast (saves CPU)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.bcast(fn(*args, **kwargs) if world.Get_rank() == 0 else None, root=0)


def _assert_identical_on_all_ranks(array):
    from mpi4py import MPI

    for other in MPI.COMM_WORLD.allgather(np.asarray(array)):
        assert np.array_equal(other, array)


# -- Local SGD ------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_localsgd_equals_serial_periodic_averaging():
    steps, period = 10, 4
    algo, stream, data, config = _setup("localsgd", steps, "--period", str(period))
    evaluation_points = []
    stats = []
    while not algo.done():
        algo.timer.reset()
        stats.append(algo.step(*stream.next()))
        evaluation_points.append(algo.evaluation_point())
    size = algo.comm.size
    schedules = [[4] * size, [4] * size, [2] * size]
    expected = _on_rank0(serial_rounds, data, size, config, schedules, averaging="uniform")
    np.testing.assert_allclose(algo.consensus_params(), expected, rtol=0, atol=1e-10)
    _assert_identical_on_all_ranks(algo.model.params)
    assert [s.round for s in stats] == [0] * 4 + [1] * 4 + [2] * 2
    assert [s.local_steps for s in stats] == [4] * 8 + [2] * 2
    samples = BATCH * size
    assert evaluation_points == [None, None, None, 4 * samples,
                                 None, None, None, 8 * samples, None, 10 * samples]


# -- Oscars ----------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("steps", [10, 12])
def test_oscars_adaptive_off_equals_localsgd(steps):
    local, stream, _, _ = _setup("localsgd", steps, "--period", "4")
    local_stats = _train(local, stream)
    osc, stream, _, _ = _setup("oscars", steps, "--period", "4", "--adaptive", "off")
    osc_stats = _train(osc, stream)
    np.testing.assert_allclose(osc.model.params, local.model.params, rtol=0, atol=1e-10)
    np.testing.assert_allclose(osc.consensus_params(), local.consensus_params(),
                               rtol=0, atol=1e-10)
    assert osc.steps_taken == local.steps_taken == steps
    assert [s.round for s in osc_stats] == [s.round for s in local_stats]
    assert [s.local_steps for s in osc_stats] == [s.local_steps for s in local_stats]
    _assert_identical_on_all_ranks(osc.model.params)


def _fixed_speeds(algo):
    """Deterministic speeds: the last rank 4x slower (seconds per step 4 vs 1)."""
    slow = algo.comm.rank == algo.comm.size - 1
    algo.averager.measured_step_seconds = lambda: 4.0 if slow else 1.0


def _expected_schedules(size, steps_per_rank, tau0=4, tau_max=32):
    total, done, rounds = steps_per_rank * size, 0, []
    taus = [tau0] * size
    while done < total:
        taus = fit_budget(taus, total - done)
        rounds.append(taus)
        done += sum(taus)
        taus = schedule([1.0] * (size - 1) + [4.0], tau0, tau_max)
    return rounds


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    ("averaging", "extra"),
    [("weighted", ()), ("uniform", ()), ("weighted", ("--global-lr", "0.7")),
     ("weighted", ("--overlap",))],
)
def test_oscars_averaging_is_exact_and_identical(averaging, extra):
    steps = 25
    algo, stream, data, config = _setup("oscars", steps, "--period", "4",
                                        "--averaging", averaging, *extra)
    _fixed_speeds(algo)
    stats = _train(algo, stream)
    size = algo.comm.size
    expected_schedules = _expected_schedules(size, steps)
    assert algo.averager.history == expected_schedules
    assert expected_schedules[1][0] == 16 and expected_schedules[1][-1] == 4
    for other in algo.comm.mpi_comm.allgather(algo.averager.history):
        assert other == algo.averager.history
    # the budget is consumed exactly, and each rank took its scheduled steps
    assert sum(sum(t) for t in algo.averager.history) == steps * size
    # the bytes of a round (the packed [delta | speeds | tau]; float64) over its mean steps
    rounds = len(algo.averager.history)
    assert algo.run_attributes["wire_bytes_per_outer_step"] == 8 * (algo.model.size + size + 1)
    assert algo.run_attributes["outer_period_steps"] == steps * size / (size * rounds)
    assert algo.steps_taken == len(stats) == sum(t[algo.comm.rank] for t in algo.averager.history)
    assert [s.round for s in stats] == [r for r, t in enumerate(algo.averager.history)
                                        for _ in range(t[algo.comm.rank])]
    assert [s.local_steps for s in stats] == [t[algo.comm.rank] for t in algo.averager.history
                                              for _ in range(t[algo.comm.rank])]
    # the speed each step's schedule used: none measured in round 0, then this rank's c_k
    mine = 4.0 if algo.comm.rank == size - 1 else 1.0
    assert [s.speed for s in stats] == [0.0 if s.round == 0 else mine for s in stats]
    expected = _on_rank0(serial_rounds, data, size, config, expected_schedules, averaging,
                             overlap="--overlap" in extra)
    np.testing.assert_allclose(algo.consensus_params(), expected, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(algo.model.params, algo.consensus_params())
    _assert_identical_on_all_ranks(algo.model.params)
    assert algo.evaluation_point() == steps * size * BATCH


@pytest.mark.mpi(min_size=2)
def test_oscars_schedule_follows_a_slowdown_schedule_change():
    """Real sleeps: the last rank is 11x slower, then (at 0.6 s) rank 0 instead of it."""
    from mpi4py import MPI

    tau0, change_at = 2, 0.6
    algo, stream, _, _ = _setup("oscars", 100_000, "--period", str(tau0), "--max-period", "16",
                                "--speed-ema", "0.5")
    size, rank = algo.comm.size, algo.comm.rank
    factors = parse_slowdown(",".join(["1"] * (size - 1) + ["11"]), size)
    changes = parse_slowdown_schedule(f"{change_at}s:{size - 1}=1,0=11", size)
    slowdown = make_slowdown(factors, changes, rank)
    if slowdown is not None:
        # a fixed nominal compute time of 5 ms, so the sleeps (50 ms) dominate the noise
        # of an oversubscribed machine
        algo.slowdown = lambda _seconds: slowdown(0.005)
    MPI.COMM_WORLD.Barrier()
    if slowdown is not None:
        slowdown.start()
    started = time.perf_counter()
    change_round = None
    while algo.averager.round < 100:
        algo.timer.reset()
        algo.step(*stream.next())
        if algo.averager.round_steps == 0 and change_round is None:  # a round boundary (collective)
            late = time.perf_counter() - started > change_at
            if MPI.COMM_WORLD.allreduce(late, op=MPI.LAND):
                change_round = algo.averager.round
        if change_round is not None and algo.averager.round >= change_round + 6:
            break
    assert change_round is not None and change_round >= 4, algo.averager.history
    before = algo.averager.history[2:change_round - 1]
    after = algo.averager.history[change_round + 2:]

    def mostly(rounds, slow, fast):
        hits = [t[slow] == tau0 and np.mean([t[k] for k in fast]) >= 2 * tau0 for t in rounds]
        return np.mean(hits) >= 0.75

    assert mostly(before, size - 1, range(size - 1)), algo.averager.history
    assert mostly(after, 0, range(1, size)), algo.averager.history


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["oscars", "localsgd"])
def test_state_round_trip_resumes_exactly(algorithm):
    """Stop at a round boundary, save state(), load it into a fresh instance, continue."""
    steps = 25
    whole, stream, _, _ = _setup(algorithm, steps, "--period", "4")
    _fixed_speeds(whole)
    _train(whole, stream)

    first, stream, _, _ = _setup(algorithm, steps, "--period", "4")
    _fixed_speeds(first)
    while first.steps_taken < 6 or first.evaluation_point() is None:
        first.timer.reset()
        first.step(*stream.next())
    state = first.state()
    second, stream, _, _ = _setup(algorithm, steps, "--period", "4")
    _fixed_speeds(second)
    second.load_state(state)
    stream.seek(first.steps_taken)
    _train(second, stream)
    np.testing.assert_array_equal(second.model.params, whole.model.params)
    assert second.steps_taken == whole.steps_taken
    if algorithm == "oscars":
        assert second.averager.history == whole.averager.history


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["localsgd", "oscars"])
@pytest.mark.parametrize("sync", ["keep", "zero", "average"])
def test_momentum_sync_at_averaging(algorithm, sync):
    """keep: velocities stay local (differ); zero: restarted; average: one common mean."""
    from mpi4py import MPI

    steps = 8
    fixed = ("--adaptive", "off") if algorithm == "oscars" else ()  # Oscars' own flag
    algo, stream, _, config = _setup(algorithm, steps, "--period", "4", *fixed,
                                     "--momentum-sync", sync)
    assert config.momentum_sync == sync
    _train(algo, stream)
    velocity = np.asarray(algo.optimizer.velocity)
    every = MPI.COMM_WORLD.allgather(velocity)
    if sync == "zero":
        assert not np.any(velocity)
    elif sync == "average":
        assert np.any(velocity)
        for other in every:
            np.testing.assert_allclose(other, velocity, rtol=0, atol=1e-14)
    else:
        assert not np.allclose(every[0], every[1])
