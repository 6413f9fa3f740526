"""AD-PSGD against exact invariants and a serial re-computation (run under mpiexec).

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_adpsgd_mpi.py`` and
with ``-n 4``. With zero gradients (lr 0) the ranks run freely and the sum of all models
is conserved exactly (the values stay dyadic rationals with few bits: a lost or doubled
average, or an update that overwrote one, changes the sum). With 2 ranks the order of
the ranks' reads, averages and updates is forced through the emulated slowdown, which
every step calls between compute and the average: each step rank 1 reads its model, then
rank 0 averages with it and updates, then rank 1 applies the gradient of its stale read
to the averaged model; a serial re-computation of that order must agree within 1e-10,
and a run stopped half-way and resumed from its state must end bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import strategy_on_world, train_config
from oracles import rank_streams

from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.kernels.zoo import build_model

BATCH, SEED = 8, 3
MOMENTUM = ("--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-3", "--dtype",
            "float64")
#: Steps of the free-running test. A passive rank of the 4-rank ring takes part in the
#: averages of two active ranks: at most 2 x 20 fractional bits over 5 integer ones, so
#: every value fits a float64's 53 bits and no average rounds.
FREE_STEPS = 20


def _wait(request) -> None:
    """Complete ``request`` with tests (each drives the progress of RMA on our windows)."""
    while not request.Test():
        pass


def _barrier() -> None:
    from mpi4py import MPI

    _wait(MPI.COMM_WORLD.Ibarrier())


def _only_at(size: int) -> None:
    """Skip unless the job has ``size`` ranks (the test's order or graph is for those)."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != size:
        pytest.skip(f"written for {size} ranks")


def _models(algo) -> np.ndarray:
    """Every rank's model (its window), one row each, on every rank (collective)."""
    from mpi4py import MPI

    return np.stack(MPI.COMM_WORLD.allgather(algo.window.read_own()))


@pytest.mark.mpi(min_size=2)
def test_zero_gradients_conserve_the_sum_of_all_models_exactly():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    algo, stream, _, _ = strategy_on_world(
        "adpsgd", FREE_STEPS, ("--lr", "0", "--momentum", "0.9", "--dtype", "float64"), (),
        BATCH, SEED)
    start = float(4 * rank + 1)
    algo.window.set_own(np.full(algo.model.size, start))
    world.Barrier()
    while not algo.done():  # free running: no order between the ranks' steps
        algo.timer.reset()
        algo.step(*stream.next())
    algo.finish()
    models = _models(algo)
    assert (models == models[:, :1]).all(), "a model was torn"
    assert models[:, 0].sum() == world.allreduce(start)  # exact
    np.testing.assert_array_equal(algo.consensus_params(), models.mean(axis=0))
    assert not np.array_equal(models[:, 0], [4 * r + 1 for r in range(len(models))])  # averaged
    algo.close()


class ForcedOrder:
    """The emulated slowdown of a 2-rank run that forces, each step, rank 1's read before
    rank 0's average and rank 0's update before rank 1's (the barriers are tested, so they
    drive RMA progress)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __call__(self, _compute_s: float) -> float:
        _barrier()  # rank 0 averages only once rank 1 has read its model (it is computing)
        if self.rank == 1:
            _barrier()  # rank 1 updates only once rank 0's step has ended
        return 0.0

    def after_step(self) -> None:
        if self.rank == 0:
            _barrier()


def _forced_run(algo, stream, steps: int, order: ForcedOrder) -> list[int]:
    algo.slowdown = order
    staleness = []
    for _ in range(steps):
        algo.timer.reset()
        staleness.append(algo.step(*stream.next()).staleness)
        order.after_step()
    return staleness


def serial_forced_order(data, config, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Both models after ``steps`` steps of the forced order: rank 1 reads x1_hat, rank 0
    computes at x0, averages m = (x0 + x1) / 2 and steps from m with its gradient, rank 1
    steps from m with the gradient at x1_hat (each update computed at the model read, as
    a delta)."""
    models = [build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=SEED)
              for _ in range(2)]
    opts = [MomentumSGD(m.params, config.lr, config.momentum, config.weight_decay)
            for m in models]
    streams = rank_streams(data.train_x, data.train_y, 2, BATCH, SEED)
    x = [m.params.copy() for m in models]
    for _ in range(steps):
        deltas = []
        for k in range(2):
            read = x[k].copy()
            models[k].params[...] = read
            models[k].loss_and_grad(*streams[k].next())
            after = read.copy()
            opts[k].step(after, models[k].grads)
            after -= read
            deltas.append(after)
        mean = x[0] + x[1]
        mean *= 0.5
        x = [mean + deltas[0], mean + deltas[1]]
    return x[0], x[1]


@pytest.mark.mpi(min_size=2)
def test_two_ranks_in_a_forced_order_equal_the_serial_recomputation():
    from mpi4py import MPI

    _only_at(2)
    rank = MPI.COMM_WORLD.Get_rank()
    steps = 6
    algo, stream, data, config = strategy_on_world("adpsgd", steps, MOMENTUM, (), BATCH, SEED)
    staleness = _forced_run(algo, stream, steps, ForcedOrder(rank))
    assert staleness == [1] * steps  # rank 0: its own average; rank 1: rank 0's
    algo.finish()
    line = algo.report_line()
    assert (line is None) == (rank != 0)
    assert rank != 0 or line.endswith("staleness mean 1.00 (passive ranks 1.00) max 1")
    x0, x1 = serial_forced_order(data, train_config(*MOMENTUM), steps)
    models = _models(algo)
    np.testing.assert_allclose(models[0], x0, rtol=0, atol=1e-10)
    np.testing.assert_allclose(models[1], x1, rtol=0, atol=1e-10)
    assert not np.allclose(x0, x1)  # the replicas differ (different batches, stale steps)
    mean = (x0 + x1) / 2
    np.testing.assert_allclose(algo.consensus_params(), mean, rtol=0, atol=1e-10)
    (distance,) = algo.replicas.consensus_log.values()
    expected = float(np.mean([np.sum((x0 - mean) ** 2), np.sum((x1 - mean) ** 2)]))
    assert distance == pytest.approx(expected, rel=1e-9)
    assert list(algo.run_attributes["consensus_samples"]) == [steps * BATCH * 2]
    # each rank's own model scored (here by its first element): the mean and the worst
    algo.score_replicas(lambda params: float(params[0]))
    assert algo.run_attributes["replica_accuracy_mean"][0] == pytest.approx(
        (x0[0] + x1[0]) / 2, abs=1e-10)
    assert algo.run_attributes["replica_accuracy_worst"][0] == pytest.approx(
        min(x0[0], x1[0]), abs=1e-10)
    algo.close()


@pytest.mark.mpi(min_size=2)
def test_a_run_resumed_from_its_state_ends_bit_identical():
    from mpi4py import MPI

    _only_at(2)
    rank = MPI.COMM_WORLD.Get_rank()
    steps, half = 8, 4
    algo, stream, _, _ = strategy_on_world("adpsgd", steps, MOMENTUM, (), BATCH, SEED)
    order = ForcedOrder(rank)
    full_staleness = _forced_run(algo, stream, steps, order)
    algo.finish()
    full = _models(algo)
    full_totals = algo.staleness_totals.copy()
    algo.close()

    first, stream, _, _ = strategy_on_world("adpsgd", steps, MOMENTUM, (), BATCH, SEED)
    _forced_run(first, stream, half, order)
    first.consensus_params()  # an evaluation before the checkpoint: its logs are resumed
    first.score_replicas(lambda params: float(params[0]))
    scores = dict(first.replicas.scores.log)
    state = first.state()
    first.close()
    # a fresh strategy (another model seed: everything comes from the state)
    resumed, _, _, _ = strategy_on_world("adpsgd", steps, MOMENTUM, (), BATCH, SEED + 1)
    resumed.load_state(state)
    assert resumed.steps_taken == half
    staleness = _forced_run(resumed, stream, steps - half, order)
    resumed.finish()
    np.testing.assert_array_equal(_models(resumed), full)
    assert staleness == full_staleness[half:]
    np.testing.assert_array_equal(resumed.staleness_totals, full_totals)
    assert list(resumed.replicas.consensus_log) == [half * BATCH * 2]
    assert resumed.replicas.scores.log == scores
    resumed.close()


@pytest.mark.mpi(min_size=4)
def test_four_ranks_average_only_with_neighbours_of_the_other_parity():
    """The exponential graph on 4 ranks (0 - 1, 0 - 2, 0 - 3, ...): rank 0 averages with
    1 and 3 only (2 is active too), every peer drawn again from the same stream."""
    from syncbench.algorithms.adpsgd import peer_at

    _only_at(4)
    algo, _, _, _ = strategy_on_world("adpsgd", 1, MOMENTUM, ("--graph", "exp"), BATCH, SEED)
    expected = {0: [1, 3], 1: [0, 2], 2: [1, 3], 3: [0, 2]}
    assert algo.peers == expected[algo.rank]
    drawn = [peer_at(algo.peers, SEED, algo.rank, t) for t in range(50)]
    assert set(drawn) == set(algo.peers)
    assert drawn == [peer_at(algo.peers, SEED, algo.rank, t) for t in range(50)]
    _barrier()
    algo.close()

