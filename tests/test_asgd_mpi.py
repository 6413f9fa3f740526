"""ASGD through MPI RMA windows: atomic pushes, serial equivalence, DC-ASGD, end to end.

Under Open MPI (``make test-openmpi``) every test here holds; the same file runs
under both MPI libraries.

Run with ``mpiexec -n 2 python -m pytest --with-mpi tests/test_asgd_mpi.py``
(and ``-n 4``); the end-to-end tests launch their own ``mpiexec`` and run in a
plain serial ``pytest``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import rank_streams, run_mpi, train_config

from syncbench.algorithms.base import Budget
from syncbench.algorithms.not_lock_step import data_shard
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import get_algorithm, validate
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


def _serial_momentum_sgd(data, batch, seed, config, steps):
    """One process, one worker: plain momentum SGD on rank 0's batches of a 1-rank job."""
    model = build_model("mlp", data.input_shape, data.num_classes, dtype=np.float64, seed=seed)
    opt = MomentumSGD(model.params, config.lr, config.momentum, config.weight_decay)
    stream = rank_streams(data.train_x, data.train_y, 1, batch, seed)[0]
    for _ in range(steps):
        model.loss_and_grad(*stream.next())
        opt.step(model.params, model.grads)
    return model.params


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
    expected = _serial_momentum_sgd(data, batch, seed, config, steps)
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

def test_validate_rejects_bad_flags():
    cls = get_algorithm("asgd")
    with pytest.raises(ValueError, match="--delay-compensation"):
        validate(cls, train_config("--algorithm", "asgd", "--delay-compensation", "-1"), 2)
    with pytest.raises(ValueError, match="dedicated"):
        validate(cls, train_config("--algorithm", "asgd", "--ps-layout", "dedicated"), 1)
    with pytest.raises(ValueError, match="--worker-momentum"):
        validate(cls, train_config("--algorithm", "asgd", "--worker-momentum", "1"), 2)
    config = train_config("--algorithm", "asgd")
    assert config.ps_layout == "sharded" and config.delay_compensation == 0.0
    assert config.rma_assert == "nocheck"
    assert config.async_lr_scale == "none" and config.worker_momentum == 0.5
    validate(cls, train_config("--algorithm", "asgd", "--checkpoint-every", "5"), 2)


def test_worker_learning_rate_matches_the_effective_step_of_ssgd():
    from syncbench.algorithms.asgd import worker_learning_rate

    # equal momenta: the usual lr / W
    assert worker_learning_rate(0.05, 0.9, 0.9, 4, "workers") == pytest.approx(0.0125)
    # lower worker momentum: W pushes of lr_w / (1 - mu_w) make one lr / (1 - mu)
    lr_w = worker_learning_rate(0.05, 0.9, 0.5, 4, "workers")
    assert 4 * lr_w / (1 - 0.5) == pytest.approx(0.05 / (1 - 0.9))
    assert worker_learning_rate(0.05, 0.9, 0.5, 4, "none") == 0.05


def test_dedicated_layout_shards_the_data_over_the_workers():
    cls = get_algorithm("asgd")
    dedicated = train_config("--algorithm", "asgd", "--ps-layout", "dedicated")
    assert [data_shard(cls, dedicated, r, 4) for r in range(1, 4)] == [(0, 3), (1, 3), (2, 3)]
    sharded = train_config("--algorithm", "asgd")
    assert [data_shard(cls, sharded, r, 4) for r in range(4)] == [(r, 4) for r in range(4)]


def _train(tmp_path, np_, *flags, samples=1024, batch=32):
    from syncbench.analysis.runfile import read_run

    out = tmp_path / f"asgd{np_}.h5"
    proc = run_mpi(np_, "train", "--algorithm", "asgd", "--dataset", "synthetic",
                   "--synthetic-samples", str(samples), "--batch-size", str(batch),
                   "--epochs", "1", "--progress", "never", "--out", str(out), *flags,
                   timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "asgd: layout" in proc.stdout
    run = read_run(out)
    budget = (samples // np_ // batch) * batch * np_
    assert run.attrs["algorithm"] == "asgd" and run.world_size == np_
    assert sum(int(rows["samples"].sum()) for rows in run.ranks.values()) == budget
    assert run.eval["samples_seen"][-1] == budget
    return run


@pytest.mark.mpi_skip
def test_train_asgd_two_ranks_writes_staleness(tmp_path):
    run = _train(tmp_path, 2)
    for rank in (0, 1):
        rows = run.ranks[rank]
        assert "staleness" in rows and len(rows["staleness"]) == len(rows["step"]) > 0
        assert np.all(rows["staleness_min"] >= 0)
        assert np.all(rows["staleness_min"] <= rows["staleness"])
    assert run.summary["final_accuracy"] > 0.3


@pytest.mark.mpi_skip
def test_train_asgd_four_ranks_is_stale(tmp_path):
    run = _train(tmp_path, 4, samples=2048, batch=16)
    stale = np.concatenate([rows["staleness"] for rows in run.ranks.values()])
    lower = np.concatenate([rows["staleness_min"] for rows in run.ranks.values()])
    assert stale.max() > 0 and np.all(lower <= stale)


@pytest.mark.mpi_skip
def test_train_asgd_dedicated_host_takes_no_steps(tmp_path):
    run = _train(tmp_path, 2, "--ps-layout", "dedicated", "--delay-compensation", "0.1",
                 "--checkpoint-every", "1")
    assert len(run.ranks[0]["step"]) == 0
    assert np.all(run.ranks[1]["staleness"] == 0)  # one worker: never stale, by both bounds
    assert np.all(run.ranks[1]["staleness_min"] == 0)
    # the host takes no steps: the fractions are over the worker only
    rows = run.ranks[1]
    # a pause at every step (16): each rank's checkpoint time is off its clock, its steps
    # are on it, so the worker's phases fit in wall_s (subtracting rank 0's off-clock time,
    # which includes committing each checkpoint while the worker trains on, broke this);
    # 1 us per step covers the two clocks' (perf_counter, MPI.Wtime) granularity
    busy = sum(float(rows[f"t_{p}"].sum()) for p in ("data", "compute", "comm", "wait",
                                                      "update", "delay"))
    assert busy <= run.summary["wall_s"] + 1e-6 * len(rows["step"])
    assert run.summary["comm_fraction"] == pytest.approx(
        rows["t_comm"].sum() / run.summary["wall_s"])


@pytest.mark.mpi_skip
@pytest.mark.parametrize("np_,layout", [pytest.param(1, "sharded", marks=pytest.mark.slow),
                                        (2, "dedicated")])
def test_one_worker_resume_is_bit_identical(tmp_path, np_, layout):
    """Crash after a checkpoint pause, resume: the final window equals an uninterrupted run's."""
    flags = ["--algorithm", "asgd", "--dataset", "synthetic", "--synthetic-samples", "1024",
             "--batch-size", "16", "--epochs", "2", "--dtype", "float64", "--progress", "never",
             "--ps-layout", layout]
    worker = np_ - 1
    full = run_mpi(np_, "train", *flags, "--out", str(tmp_path / "full.h5"),
                   "--save-model", str(tmp_path / "full.npy"), timeout=120)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "crash.h5"
    crash = run_mpi(np_, "train", *flags, "--out", str(out), "--checkpoint-every", "30",
                    "--inject-fault", f"{worker}:75", timeout=120)
    assert crash.returncode != 0 and not out.exists()
    from syncbench.analysis.runfile import read_run
    from syncbench.bench.train.checkpoint import latest_checkpoint, load_state, parts_dir, read_rows

    # the rows the crashed run saved at its checkpoint and flushed before dying
    parts = parts_dir(out)
    saved = load_state(parts, worker, latest_checkpoint(parts, np_))["rows"]["t_start"]
    flushed_t_start = read_rows(parts, worker)[0]["t_start"]
    assert 0 < len(saved) <= len(flushed_t_start)
    np.testing.assert_array_equal(flushed_t_start[:len(saved)], saved)
    resumed = run_mpi(np_, "train", *flags, "--out", str(out), "--resume",
                      "--save-model", str(tmp_path / "resumed.npy"), timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "resumed.npy"),
                                  np.load(tmp_path / "full.npy"))
    a, b = read_run(tmp_path / "full.h5"), read_run(out)
    np.testing.assert_array_equal(a.ranks[worker]["loss"], b.ranks[worker]["loss"])
    assert b.complete and len(b.ranks[worker]["step"]) == 2 * (1024 // np_ // 16) * np_
    # resumed, not restarted: the steps before the checkpoint are the crashed run's
    # (their start times)
    t_start = b.ranks[worker]["t_start"]
    np.testing.assert_array_equal(t_start[:len(saved)], saved)
    assert not np.array_equal(t_start, a.ranks[worker]["t_start"])


@pytest.mark.mpi_skip
@pytest.mark.slow
def test_three_worker_run_resumes_into_the_same_accuracy_band(tmp_path):
    flags = ["--algorithm", "asgd", "--dataset", "synthetic", "--synthetic-samples", "2048",
             "--batch-size", "16", "--epochs", "2", "--lr", "0.02", "--progress", "never"]
    full = run_mpi(3, "train", *flags, "--out", str(tmp_path / "full.h5"), timeout=120)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "crash.h5"
    # a pause every 10 * 3 = 30 pushes, the fault at rank 2's 41st step: after the first
    # pause whatever the ranks' speeds (rank 2 has at most 30 steps there), and reached
    # even when rank 2 is the slowest (55-60 of the 256 steps under Open MPI, 2 cores)
    crash = run_mpi(3, "train", *flags, "--out", str(out), "--checkpoint-every", "10",
                    "--inject-fault", "2:40", timeout=120)
    assert crash.returncode != 0
    resumed = run_mpi(3, "train", *flags, "--out", str(out), "--resume", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    from syncbench.analysis.runfile import read_run

    a, b = read_run(tmp_path / "full.h5"), read_run(out)
    total = sum(int(rows["samples"].sum()) for rows in b.ranks.values())
    assert total == sum(int(rows["samples"].sum()) for rows in a.ranks.values())
    assert abs(a.summary["final_accuracy"] - b.summary["final_accuracy"]) < 0.1
