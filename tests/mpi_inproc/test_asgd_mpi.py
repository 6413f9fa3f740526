"""ASGD through MPI RMA windows: atomic pushes, serial equivalence, DC-ASGD, end to end.

Under Open MPI (``make test-openmpi``) every test here holds; the same file runs
under both MPI libraries.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_asgd_mpi.py``
(and ``-n 4``); the end-to-end tests launch their own ``mpiexec`` and run in a
plain serial ``pytest``.

Split off this module: ``tests/unit/test_asgd_mpi_unit.py`` (its tests that need neither)
and ``tests/e2e/test_asgd_mpi_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams, serial_momentum_sgd

from syncbench.algorithms.base import Budget
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model

LOCKS = ("nocheck", "none")
LAYOUTS = ("sharded", "single", "dedicated")
SHAPE = (1, 12, 12)


def _wait_for_all(comm) -> None:
    """Barrier that keeps entering MPI (passive-target progress), politely."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-4)


def _pattern(n: int, rank: int, k: int) -> np.ndarray:
    """Integer-valued push of rank ``rank``'s k-th push (sums are exact in float64)."""
    return (rank + 1) * (k + 1) * (np.arange(n) % 7 + 1).astype(np.float64)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("lock", LOCKS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_concurrent_pushes_lose_nothing(layout, lock):
    from mpi4py import MPI

    from syncbench.algorithms.asgd import lock_assert
    from syncbench.algorithms.windows import Counters, ParamWindow

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    n, pushes = 1001, 25
    windows = ParamWindow(comm, n, np.float64, layout, lock_assert(lock))
    counters = Counters(comm, 1, lock_assert(lock))
    try:
        w0 = np.arange(n, dtype=np.float64)
        windows.set_local(w0)
        comm.Barrier()
        workers = range(1, size) if layout == "dedicated" else range(size)
        versions = []
        if rank in workers:
            for k in range(pushes):
                windows.push(_pattern(n, rank, k))
                versions.append(counters.fetch_add(0))
        _wait_for_all(comm)

        expected = w0 + sum(_pattern(n, r, k) for r in workers for k in range(pushes))
        np.testing.assert_array_equal(windows.gather(), expected)
        pulled = np.zeros(n)
        windows.pull(pulled)
        np.testing.assert_array_equal(pulled, expected)
        # Fetch_and_op handed out every version exactly once
        every = sorted(v for part in comm.allgather(versions) for v in part)
        assert every == list(range(pushes * len(workers)))
        assert counters.read(0) == pushes * len(workers)
        _wait_for_all(comm)
    finally:
        windows.Free()
        counters.Free()
        comm.Free()


def _sub_comm(size: int):
    """The first ``size`` ranks of the world (COMM_NULL on the others)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.Split(0 if world.Get_rank() < size else MPI.UNDEFINED, world.Get_rank())


def _asgd(comm, config, data, seed, budget):
    from syncbench.algorithms.communicator import Communicator

    model = build_model("mlp", data.input_shape, data.num_classes, dtype=np.float64, seed=seed)
    return get_algorithm("asgd")(model, Communicator(comm), config, budget)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dc", [0.0, 0.5])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_worker_equals_serial_momentum_sgd(layout, dc):
    """dedicated: a host and one worker on 2 ranks; sharded/single: COMM_SELF per rank."""
    from mpi4py import MPI

    steps, batch, seed = 7, 16, 5
    comm = _sub_comm(2) if layout == "dedicated" else MPI.COMM_SELF.Dup()
    if comm == MPI.COMM_NULL:
        return
    data = make_synthetic(256, 32, SHAPE, 10, seed=2)
    config = train_config("--algorithm", "asgd", "--ps-layout", layout,
                          "--delay-compensation", str(dc), "--lr", "0.1",
                          "--momentum", "0.9", "--worker-momentum", "0.9",
                          "--weight-decay", "1e-4")
    algo = _asgd(comm, config, data, seed, Budget(steps * batch, batch, 1))
    stream = rank_streams(data.train_x, data.train_y, 1, batch, seed)[0]
    stale = []
    try:
        while not algo.done():
            stats = algo.step(*stream.next())
            stale += [stats.staleness, stats.staleness_min]
        algo.finish()
        params = algo.consensus_params()
        version = algo.global_version()
    finally:
        algo.close()
        comm.Free()
    assert algo.worker_lr == config.lr  # one worker: --lr / 1
    assert len(stale) == (0 if algo.is_host else 2 * steps)
    assert stale == [0] * len(stale)
    assert version == steps
    expected = serial_momentum_sgd(data, batch, seed, config, steps)
    np.testing.assert_allclose(params, expected, rtol=0, atol=1e-10)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dc", [0.0, 0.5])
def test_stale_push_and_delay_compensation(dc):
    """Both workers pull W0; rank 0 pushes, then rank 1 pushes a gradient one version stale.

    W2 = W1 - lr_w*(g1 + dc*g1*g1*(W1 - W0)), W1 = W0 - lr_w*g0 (first-step momentum
    is g); ``--async-lr-scale workers`` makes lr_w = lr*(1 - 0.5)/((1 - 0.9)*2) (worker
    momentum 0.5, two workers). Rank 1's push is one version stale by both bounds: it
    pulled before rank 0 pushed.
    """
    from mpi4py import MPI

    comm = _sub_comm(2)
    if comm == MPI.COMM_NULL:
        return
    rank, batch, seed, lam = comm.Get_rank(), 16, 4, dc
    data = make_synthetic(128, 16, SHAPE, 10, seed=3)
    config = train_config("--algorithm", "asgd", "--delay-compensation", str(dc),
                          "--lr", "0.2", "--momentum", "0.9", "--async-lr-scale", "workers")
    algo = _asgd(comm, config, data, seed, Budget(2 * batch, batch, 2))
    streams = rank_streams(data.train_x, data.train_y, 2, batch, seed)
    try:
        algo.pull()
        comm.Barrier()
        for turn in (0, 1):
            if rank == turn:
                algo.compute(*streams[rank].next())
                bounds = algo.push()
            comm.Barrier()
        algo.finish()
        params = algo.consensus_params()
    finally:
        algo.close()
        comm.Free()
    assert bounds == (rank, rank)
    assert algo.staleness == [rank] and algo.staleness_min == [rank]
    lr_w = config.lr * (1 - 0.5) / ((1 - 0.9) * 2)
    assert algo.worker_lr == pytest.approx(lr_w)

    model = build_model("mlp", data.input_shape, 10, dtype=np.float64, seed=seed)
    w0 = model.params.copy()
    grads = []
    for fresh in rank_streams(data.train_x, data.train_y, 2, batch, seed):
        model.loss_and_grad(*fresh.next())
        grads.append(model.grads.copy())
    w1 = w0 - lr_w * grads[0]
    g1 = grads[1] + lam * grads[1] * grads[1] * (w1 - w0)
    w2 = w1 - lr_w * g1
    np.testing.assert_allclose(params, w2, rtol=0, atol=1e-10)


@pytest.mark.mpi(min_size=2)
def test_push_landed_before_the_pull_but_counted_after_it_is_not_stale():
    """The lower bound is a true lower bound.

    Rank 1's push starts and Accumulates, rank 0 then pulls (its weights contain
    that push), and only then is rank 1's push counted in ``version``. Rank 0's
    push is one version after its pre-pull read (upper bound 1), but no push
    started after its pull ended (lower bound 0); a version read after the pull
    would give 1.
    """
    from mpi4py import MPI

    comm = _sub_comm(2)
    if comm == MPI.COMM_NULL:
        return
    rank, batch, seed = comm.Get_rank(), 16, 4
    data = make_synthetic(128, 16, SHAPE, 10, seed=3)
    config = train_config("--algorithm", "asgd", "--lr", "0.1")
    algo = _asgd(comm, config, data, seed, Budget(2 * batch, batch, 2))
    stream = rank_streams(data.train_x, data.train_y, 2, batch, seed)[rank]
    try:
        algo.prepare()
        w0 = algo.windows.gather()
        if rank == 1:
            algo.pull()
            algo.compute(*stream.next())
            algo._update(algo.model.grads)
            algo.start_push()
            algo.land_push(algo.model.grads)
        _wait_for_all(comm)
        if rank == 0:
            algo.pull()
            pulled = algo.model.params.copy()
        _wait_for_all(comm)
        if rank == 1:
            assert algo.count_push() == (0, 0)
        _wait_for_all(comm)
        if rank == 0:
            algo.compute(*stream.next())
            bounds = algo.push()
        algo.finish()
    finally:
        algo.close()
        comm.Free()
    if rank == 0:
        assert not np.array_equal(pulled, w0)  # rank 1's push is in the pulled weights
        assert bounds == (1, 0)
        assert algo.staleness == [1] and algo.staleness_min == [0]
