"""The compressing reducers (``--compress``) on N ranks against their serial
re-computation of N ranks in one process (``compress_oracles``), under mpiexec.

Run with ``mpiexec -n 2 python -m pytest --only-mpi tests/mpi_inproc/test_compress_mpi.py`` (and
``-n 4``). Every rank draws every rank's gradient from one seed, reduces its own with
the reducer, and checks the mean against the oracle's: bit for bit where the reducer
sums by hand (fp16, bf16, int8, top-k), to float32 tolerance where MPI's Allreduce
sums (PowerSGD's P and Q, random-k's values; exact on two ranks, where a sum of two is
commutative); after backward, and bucket by bucket under overlap. Replicas apply the
same bits on every rank. Error feedback conserves the gradients, and a reducer restored
from :meth:`state` continues as the original.
"""

from __future__ import annotations

import numpy as np
import pytest
from compress_oracles import SerialDGC, SerialPowerSGD, SerialSparse, half_mean, int8_mean
from helpers import train_config

from syncbench.algorithms.base import Budget
from syncbench.algorithms.codecs import (
    BFloat16Codec,
    Float16Codec,
    MinMaxUInt8Codec,
    PowerSGD,
    RandomK,
    TopK,
)
from syncbench.algorithms.codecs.dgc import DGCOptions
from syncbench.algorithms.codecs.minmax import MinMaxUInt4Codec
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.reducers.buckets import model_bucket_plan
from syncbench.algorithms.reducers.compress import REDUCERS
from syncbench.algorithms.registry import get_algorithm
from syncbench.kernels.zoo import build_model

STEPS = 4


def core(model_name="lenet", dtype=np.float32):
    """An SSGD core (model, communicator, timer) on COMM_WORLD for a reducer."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    model = build_model(model_name, (1, 28, 28), 10, dtype=dtype, seed=5)
    config = train_config("--comm", "blocking")
    return get_algorithm("ssgd")(model, Communicator(world), config,
                                 Budget(64 * world.Get_size(), 8, world.Get_size()))


def rank_grads(count, ranks, step, seed=7):
    """Every rank's float32 gradient of ``step`` (the same on every rank that draws them)."""
    rng = np.random.default_rng([seed, step])
    scale = rng.uniform(0.01, 2.0, size=ranks)
    return [(rng.standard_normal(count) * s).astype(np.float32) for s in scale]


def reduce_on(algo, reducer, grads):
    """This rank's gradient through ``reducer``: the mean it returns, as float32."""
    algo.model.grads[...] = grads[algo.comm.rank]
    return np.array(reducer.complete(), dtype=np.float32)


def same_on_every_rank(algo, mean):
    for other in algo.comm.mpi_comm.allgather(mean):
        np.testing.assert_array_equal(other, mean)


def check(mean, expected, exact):
    if exact:
        np.testing.assert_array_equal(mean, expected)
    else:
        np.testing.assert_allclose(mean, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", [Float16Codec(), BFloat16Codec(), MinMaxUInt8Codec(),
                                   MinMaxUInt8Codec(1000), MinMaxUInt4Codec(1000)],
                         ids=lambda c: c.spec)
def test_quantized_reduction_equals_the_serial_one_bit_for_bit(codec):
    algo = core("mlp")
    reducer = REDUCERS[codec.name](algo, codec)
    size = algo.comm.size
    oracle = half_mean if codec.name in ("fp16", "bf16") else int8_mean
    for step in range(STEPS):
        grads = rank_grads(reducer.count, size, step)
        mean = reduce_on(algo, reducer, grads)
        np.testing.assert_array_equal(mean, oracle(codec, grads))
        same_on_every_rank(algo, mean)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_equals_n_serial_states(rank):
    """Plain steps, then compressed ones with warm-started Q and error feedback."""
    algo = core("lenet")
    codec = PowerSGD(rank=rank, start_iter=1)
    reducer = REDUCERS["powersgd"](algo, codec)
    size = algo.comm.size
    serial = SerialPowerSGD(codec, reducer.shapes, size)
    for step in range(STEPS):
        grads = rank_grads(reducer.count, size, step)
        mean = reduce_on(algo, reducer, grads)
        check(mean, serial.mean(grads), exact=size == 2)
        same_on_every_rank(algo, mean)
    # this rank's error is its own serial state's
    check(reducer.psgd.error, serial.states[algo.comm.rank].error, exact=size == 2)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", [TopK(0.01), TopK(0.3), RandomK(0.01), RandomK(0.3)],
                         ids=lambda c: c.spec)
def test_sparse_reduction_equals_the_serial_one(codec):
    algo = core("mlp")
    reducer = REDUCERS[codec.name](algo, codec)
    size = algo.comm.size
    serial = SerialSparse(codec, reducer.count, size)
    for step in range(STEPS):
        grads = rank_grads(reducer.count, size, step)
        mean = reduce_on(algo, reducer, grads)
        check(mean, serial.mean(grads), exact=codec.name == "topk" or size == 2)
        same_on_every_rank(algo, mean)
    np.testing.assert_array_equal(reducer.residual(), serial.feedback[algo.comm.rank].residual)


DGC_CODECS = [TopK(0.01, options=DGCOptions(0.9)), TopK(0.05, options=DGCOptions(0.5, 4)),
              RandomK(0.01, options=DGCOptions(0.9)), RandomK(0.05, options=DGCOptions(0.9, 6))]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", DGC_CODECS, ids=lambda c: c.spec)
@pytest.mark.parametrize("bucketed", [False, True], ids=["blocking", "buckets"])
def test_dgc_reduction_equals_the_serial_one(codec, bucketed):
    """Momentum correction (and warm-up): the means and this rank's velocity and residual
    are those of N ranks' DGC memories re-computed in NumPy; each bucket is its own
    (random-k: bucket j draws from seed j)."""
    algo = core("mlp")
    plan = model_bucket_plan(algo.model, 0.05) if bucketed else [(0, algo.model.grads.size)]
    reducer = REDUCERS[codec.name](algo, codec, plan if bucketed else None)
    assert reducer.applies_momentum
    size, rank = algo.comm.size, algo.comm.rank
    serial = [SerialDGC(type(codec)(codec.density, *([j] if codec.name == "randomk" else []),
                                    options=codec.options), end - start, size)
              for j, (start, end) in enumerate(plan)]
    for step in range(6):
        grads = rank_grads(reducer.count, size, step)
        mean = reduce_on(algo, reducer, grads)
        for j, (start, end) in enumerate(plan):
            check(mean[start:end], serial[j].mean([g[start:end] for g in grads]),
                  exact=codec.name == "topk" or size == 2)
        same_on_every_rank(algo, mean)
    for j, (start, end) in enumerate(plan):
        np.testing.assert_array_equal(reducer.velocity()[start:end], serial[j].velocity[rank])
        np.testing.assert_array_equal(reducer.residual()[start:end], serial[j].residual[rank])


@pytest.mark.mpi(min_size=2)
def test_ssgd_with_momentum_correction_steps_without_a_second_momentum():
    """SSGD with --compress topk:D,momentum=M: the reducer applies M and the update none,
    w <- w - lr (mean + wd w), the mean being the serial DGC re-computation's."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float32, seed=5)
    config = train_config("--comm", "blocking", "--compress", "topk:0.05,momentum=0.9",
                          "--weight-decay", "0.001")
    algo = get_algorithm("ssgd")(model, Communicator(MPI.COMM_WORLD), config,
                                 Budget(64 * size, 8, size))
    assert algo.reducer.applies_momentum and algo.optimizer.momentum == 0.0
    serial = SerialDGC(algo.reducer.codec, model.grads.size, size)
    rng = np.random.default_rng([11, algo.comm.rank])
    for _ in range(3):
        x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, size=8)
        grads = local_gradients(algo, "mlp", x, y)
        before = np.array(model.params, dtype=np.float32)
        mean = serial.mean(grads)
        algo.step(x, y)
        expected = before - np.float32(config.lr) * (mean + np.float32(0.001) * before)
        np.testing.assert_allclose(model.params, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", [TopK(0.05), RandomK(0.05)], ids=lambda c: c.spec)
def test_error_feedback_conserves_the_gradients(codec):
    """N x (sum of the applied means) + every rank's final residual = the sum of every
    gradient, in float64, to the float32 rounding of the additions."""
    algo = core("mlp")
    reducer = REDUCERS[codec.name](algo, codec)
    size = algo.comm.size
    applied = np.zeros(reducer.count)
    given = np.zeros(reducer.count)
    for step in range(8):
        grads = rank_grads(reducer.count, size, step)
        applied += reduce_on(algo, reducer, grads).astype(np.float64) * size
        given += np.sum(np.asarray(grads, dtype=np.float64), axis=0)
    residuals = algo.comm.mpi_comm.allreduce(reducer.residual().astype(np.float64))
    np.testing.assert_allclose(applied + residuals, given, rtol=0, atol=1e-4)
    # and the residual holds what was not sent: most of the signal at a low density
    assert np.linalg.norm(residuals) > 0.1 * np.linalg.norm(given)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", [PowerSGD(rank=2, start_iter=1), TopK(0.05),
                                   RandomK(0.05), Float16Codec(), MinMaxUInt8Codec(),
                                   TopK(0.05, options=DGCOptions(0.9, 4)),
                                   RandomK(0.05, options=DGCOptions(0.9, 4))],
                         ids=lambda c: c.spec)
@pytest.mark.parametrize("bucketed", [False, True], ids=["blocking", "buckets"])
def test_a_reducer_restored_from_its_state_continues_exactly(codec, bucketed):
    """state() after some steps, load_state() into a fresh reducer: the next steps give
    the same bits (error feedback, warm-started Q, the step of random-k's draw, DGC's
    velocity and the warm-up's stage)."""
    if bucketed and not REDUCERS[codec.name].bucketed:
        pytest.skip(f"{codec.spec} reduces after backward only")
    algo = core("lenet")
    size = algo.comm.size
    plan = model_bucket_plan(algo.model, 0.05) if bucketed else None
    first = REDUCERS[codec.name](algo, codec, plan)
    for step in range(3):
        reduce_on(algo, first, rank_grads(first.count, size, step))
    saved = {key: np.array(value, copy=True) for key, value in first.state().items()}
    second = REDUCERS[codec.name](algo, codec, plan)
    second.load_state(saved)
    for step in range(3, 6):
        grads = rank_grads(first.count, size, step)
        np.testing.assert_array_equal(reduce_on(algo, second, grads),
                                      reduce_on(algo, first, grads))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spec,ratio", [("fp16", 2.0), ("bf16", 2.0), ("int8", 4.0),
                                        ("topk:0.01", 50.0), ("randk:0.01", 100.0)])
def test_ssgd_declares_the_compressed_bytes(spec, ratio):
    """SSGD with --compress declares the codec's bytes per step (wire_bytes_per_step)."""
    from mpi4py import MPI

    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float32, seed=5)
    size = MPI.COMM_WORLD.Get_size()
    algo = get_algorithm("ssgd")(model, Communicator(MPI.COMM_WORLD),
                                 train_config("--comm", "blocking", "--compress", spec),
                                 Budget(64 * size, 8, size))
    declared = algo.run_attributes["wire_bytes_per_step"]
    assert declared == algo.reducer.wire_bytes()
    assert model.grads.nbytes / declared == pytest.approx(ratio, rel=0.01)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("start", [None, "2"])
def test_powersgd_declares_its_plain_steps_bytes_too(start):
    """PowerSGD's first --powersgd-start steps allreduce the plain gradient: over an 8-step
    run the declared bytes per step are the mean, all plain at the default start (1000),
    2 plain and 6 compressed at --powersgd-start 2."""
    from mpi4py import MPI

    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float32, seed=5)
    size = MPI.COMM_WORLD.Get_size()
    flags = ["--comm", "blocking", "--compress", "powersgd:2"]
    algo = get_algorithm("ssgd")(model, Communicator(MPI.COMM_WORLD),
                                 train_config(*flags, *(["--powersgd-start", start]
                                                        if start else [])),
                                 Budget(64 * size, 8, size))
    assert algo.budget.steps_per_rank == 8
    declared = algo.run_attributes["wire_bytes_per_step"]
    plain, compressed = model.grads.nbytes, algo.reducer.wire_bytes()
    assert compressed < plain / 10
    want = plain if start is None else round((2 * plain + 6 * compressed) / 8)
    assert declared == want


def local_gradients(algo, model_name, x, y):
    """Every rank's gradient of its (x, y) at the current parameters (a model copy)."""
    twin = build_model(model_name, (1, 28, 28), 10, dtype=np.float32, seed=5)
    twin.params[...] = algo.model.params
    twin.loss_and_grad(x, y)
    return [np.array(g, dtype=np.float32) for g in algo.comm.mpi_comm.allgather(twin.grads)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", [Float16Codec(), BFloat16Codec(), MinMaxUInt8Codec(500),
                                   TopK(0.05), RandomK(0.05)], ids=lambda c: c.spec)
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_bucket_by_bucket_under_overlap_equals_the_serial_reduction_of_each_bucket(
        codec, model_name):
    """--comm overlap: each bucket is reduced as backward finishes it; its mean is the
    serial reduction of that bucket (random-k: bucket j draws from seed j)."""
    algo = core(model_name)
    plan = model_bucket_plan(algo.model, 0.05)
    assert len(plan) >= 2
    reducer = REDUCERS[codec.name](algo, codec, plan)
    size, rank = algo.comm.size, algo.comm.rank
    if codec.name in ("topk", "randomk"):
        serial = [SerialSparse(type(codec)(codec.density, *([j] if codec.name == "randomk"
                                                              else [])), end - start, size)
                  for j, (start, end) in enumerate(plan)]
    rng = np.random.default_rng([11, rank])
    for _ in range(STEPS):
        x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, size=8)
        grads = local_gradients(algo, model_name, x, y)
        reducer.start()
        algo.compute_gradient(x, y, reducer.hooks())
        mean = np.array(reducer.complete(), dtype=np.float32)
        for j, (start, end) in enumerate(plan):
            part = [g[start:end] for g in grads]
            if codec.name in ("fp16", "bf16"):
                expected = half_mean(codec, part)
            elif codec.name == "int8":
                expected = int8_mean(codec, part)
            else:
                expected = serial[j].mean(part)
            check(mean[start:end], expected, exact=codec.name != "randomk" or size == 2)
        same_on_every_rank(algo, mean)
        assert not algo.comm.outstanding
    if codec.name in ("topk", "randomk"):  # the residual in flat-buffer order
        residual = reducer.residual()
        for j, (start, end) in enumerate(plan):
            np.testing.assert_array_equal(residual[start:end], serial[j].feedback[rank].residual)


@pytest.mark.mpi(min_size=2)
def test_powersgd_refuses_buckets():
    algo = core("mlp")
    with pytest.raises(ValueError, match="add --comm blocking"):
        REDUCERS["powersgd"](algo, PowerSGD(), model_bucket_plan(algo.model, 0.05))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("spec", ["fp16", "int8", "powersgd:1", "topk:0.01", "randk:0.01",
                                  "topk:0.01,momentum=0.9"])
def test_the_codecs_work_is_charged_to_codec_not_update(spec):
    """Encode, decode and the sum of codes are the codec phase; a compressing reduction
    leaves update (the optimizer's step, a plain reduction's 1/N) untouched."""
    from syncbench.algorithms.codecs.registry import parse_codec

    algo = core("mlp")
    codec = parse_codec(spec)
    if isinstance(codec, PowerSGD):
        codec = PowerSGD(rank=codec.rank, start_iter=0)
    reducer = REDUCERS[codec.name](algo, codec)
    grads = rank_grads(reducer.count, algo.comm.size, 0)
    algo.timer.reset()
    reduce_on(algo, reducer, grads)
    assert algo.timer.totals["codec"] > 0
    assert algo.timer.totals["update"] == 0.0


@pytest.mark.mpi(min_size=2)
def test_powersgds_plain_start_scales_in_update():
    """Before --powersgd-start the reduction is a plain Allreduce: its 1/N is update's."""
    algo = core("mlp")
    reducer = REDUCERS["powersgd"](algo, PowerSGD(rank=1, start_iter=1))
    algo.timer.reset()
    reduce_on(algo, reducer, rank_grads(reducer.count, algo.comm.size, 0))
    assert algo.timer.totals["update"] > 0
