"""DGC's momentum correction and warm-up for ``topk`` and ``randomk``
(``algorithms/codecs/dgc.py``, ``algorithms/reducers/sparse.py``): N ranks' memories
against a float32 NumPy re-computation (``compress_oracles.SerialDGC``), the warm-up's
densities, the spec's options and their one-line errors, SSGD's checks of the run.

The reductions themselves, under mpiexec, are ``tests/mpi_inproc/test_compress_mpi.py``'s.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from compress_oracles import SerialDGC
from helpers import train_args

from syncbench.algorithms.codecs import RandomK, TopK, parse_codec
from syncbench.algorithms.codecs.dgc import DGCOptions, MomentumCorrection, warmup_density
from syncbench.algorithms.codecs.sparse import kept
from syncbench.algorithms.reducers.compress import REDUCERS, compress_momentum
from syncbench.bench.train.config import build_train_config

RANKS, STEPS, COUNT = 3, 7, 1000


def grads_of(step, seed=3):
    rng = np.random.default_rng([seed, step])
    return [(rng.standard_normal(COUNT) * s).astype(np.float32)
            for s in rng.uniform(0.01, 2.0, size=RANKS)]


def memories_mean(codec, memories, grads, step):
    """The ranks' sparse means through :class:`MomentumCorrection` and the codec at the
    step's density, as the reducers run them (sums in rank order)."""
    density = codec.density_at(step)
    total = np.zeros(COUNT, dtype=np.float32)
    values = []
    if codec.name == "randomk":
        idx = RandomK(density, codec.seed).indices(COUNT, step)
    for memory, g in zip(memories, grads):
        acc = memory.accumulate(g)
        if codec.name == "topk":
            idx = TopK(density).select(acc)
        values.append((idx, acc[idx].astype(np.float32)))
        memory.mask(idx)
    if codec.name == "topk":
        for idx, v in values:
            total[idx] += v
    else:
        summed = values[0][1].copy()
        for _, v in values[1:]:
            summed += v
        total[values[0][0]] = summed
    total *= np.float32(1.0 / RANKS)
    return total


@pytest.mark.parametrize("spec", ["topk:0.01,momentum=0.9", "topk:0.05,momentum=0.5,warmup=4",
                                  "randomk:0.01,momentum=0.9",
                                  "randomk:0.05,momentum=0.9,warmup=6"])
def test_n_ranks_dgc_memories_equal_the_numpy_recomputation_bit_for_bit(spec):
    codec = parse_codec(spec)
    memories = [MomentumCorrection(COUNT, codec.options.momentum) for _ in range(RANKS)]
    serial = SerialDGC(codec, COUNT, RANKS)
    for step in range(STEPS):
        grads = grads_of(step)
        np.testing.assert_array_equal(memories_mean(codec, memories, grads, step),
                                      serial.mean(grads))
        for r in range(RANKS):
            np.testing.assert_array_equal(memories[r].velocity, serial.velocity[r])
            np.testing.assert_array_equal(memories[r].residual, serial.residual[r])
    # momentum factor masking: where a rank sent last, its velocity and residual are 0
    assert all(np.count_nonzero(m.velocity == 0) >= kept(codec.density, COUNT)
               for m in memories)


def test_momentum_correction_is_dgc_algorithm_1_on_a_hand_example():
    """u = M u + g; v = v + u; top-1 of v sent; u and v zeroed there."""
    codec = TopK(0.25, options=DGCOptions(momentum=0.5))  # k = 1 of 4
    memory = MomentumCorrection(4, 0.5)
    g = np.array([1.0, -3.0, 2.0, 0.5], dtype=np.float32)
    acc = memory.accumulate(g)
    idx = codec.select(acc)
    assert idx.tolist() == [1]
    memory.mask(idx)
    assert memory.velocity.tolist() == [1.0, 0.0, 2.0, 0.5]
    assert memory.residual.tolist() == [1.0, 0.0, 2.0, 0.5]
    acc = memory.accumulate(g)  # u = [1.5, -3, 3, .75]; v = [2.5, -3, 5, 1.25]
    assert memory.velocity.tolist() == [1.5, -3.0, 3.0, 0.75]
    assert acc.tolist() == [2.5, -3.0, 5.0, 1.25]
    assert codec.select(acc).tolist() == [2]


def test_warmup_densities_fall_exponentially_in_four_stages():
    d = 0.001
    got = [warmup_density(d, 8, step) for step in range(10)]
    want = [d ** 0.2, d ** 0.2, d ** 0.4, d ** 0.4, d ** 0.6, d ** 0.6, d ** 0.8, d ** 0.8,
            d, d]
    assert got == want
    # the paper's 25%, 6.25%, 1.5625%, 0.4%, then 0.1%, to the authors' coefficient
    assert [round(x, 4) for x in sorted(set(got), reverse=True)] == \
        [0.2512, 0.0631, 0.0158, 0.004, 0.001]
    # a warm-up shorter than four stages skips stages; none leaves the density alone
    assert [warmup_density(d, 2, s) for s in range(3)] == [d ** 0.2, d ** 0.6, d]
    assert warmup_density(d, 0, 0) == d
    codec = parse_codec("topk:0.01,warmup=4")
    assert [codec.k(1000)] + [kept(codec.density_at(s), 1000) for s in range(5)] == \
        [10, 399, 159, 64, 26, 10]


@pytest.mark.parametrize("spec,momentum,warmup,normal", [
    ("topk:0.01,momentum=0.9", 0.9, 0, "topk:0.01,momentum=0.9"),
    ("randk:0.05,warmup=40,momentum=0.5", 0.5, 40, "randomk:0.05,momentum=0.5,warmup=40"),
    ("randomk:0.05,momentum=0,warmup=0", 0.0, 0, "randomk:0.05"),
    ("topk:0.01", 0.0, 0, "topk:0.01"),
])
def test_options_parse_and_the_spec_writes_them(spec, momentum, warmup, normal):
    codec = parse_codec(spec)
    assert (codec.options.momentum, codec.options.warmup, codec.spec) == \
        (momentum, warmup, normal)
    assert parse_codec(codec.spec).spec == codec.spec
    assert compress_momentum(spec) == momentum


@pytest.mark.parametrize("spec,message", [
    ("topk:0.01,momentum=1", "topk momentum=1.0 is outside [0, 1): give a momentum factor "
                             "0 <= M < 1 (e.g. momentum=0.9)"),
    ("randk:0.01,momentum=-0.1", "randk momentum=-0.1 is outside [0, 1): give a momentum "
                                 "factor 0 <= M < 1 (e.g. momentum=0.9)"),
    ("topk:0.01,momentum=fast", "topk momentum 'fast' is not a number: give 0 <= M < 1 "
                                "(e.g. momentum=0.9)"),
    ("topk:0.01,warmup=-4", "topk warmup=-4 is not a step count >= 0 (e.g. warmup=400)"),
    ("randomk:0.01,warmup=2.5", "randomk warmup '2.5' is not an integer: give a step count "
                                ">= 0 (e.g. warmup=400)"),
    ("topk:0.01,nesterov=1", "topk option 'nesterov=1' is not momentum=M or warmup=STEPS "
                             "(e.g. topk:0.01,momentum=0.9,warmup=400)"),
    ("topk:0.01,momentum", "topk option 'momentum' is not momentum=M or warmup=STEPS "
                           "(e.g. topk:0.01,momentum=0.9,warmup=400)"),
    ("topk:0.01,warmup=4,warmup=8", "topk option warmup is given twice "
                                    "(e.g. topk:0.01,momentum=0.9,warmup=400)"),
    ("topk:fast,momentum=0.9", "topk density 'fast' is not a number: give a fraction "
                               "0 < D <= 1 (e.g. topk:0.01)"),
])
def test_a_bad_option_is_one_line(spec, message):
    with pytest.raises(ValueError) as err:
        parse_codec(spec)
    assert str(err.value) == message


@pytest.mark.parametrize(("flags", "message"), [
    (["--compress", "topk:0.01,momentum=0.5"],
     "--compress topk:0.01,momentum=0.5 corrects momentum 0.5 but --momentum is 0.9: give "
     "--momentum 0.5 (the update then applies none)"),
    (["--compress", "randk:0.01,momentum=0.9", "--optimizer", "adamw"],
     "--compress randk:0.01,momentum=0.9 applies momentum SGD's momentum in the reducer: "
     "it needs --optimizer sgd, not adamw"),
])
def test_ssgd_refuses_a_second_momentum_in_one_line(flags, message):
    with pytest.raises(ValueError) as err:
        build_train_config(train_args("--algorithm", "ssgd", *flags), 2)
    assert str(err.value) == message


def test_ssgd_takes_dgc_with_its_momentum():
    config = build_train_config(train_args("--algorithm", "ssgd", "--compress",
                                           "randk:0.01,momentum=0.5", "--momentum", "0.5"), 2)
    assert config.compress == "randk:0.01,momentum=0.5"


def reducer_of(spec, count=COUNT, plan=None):
    """The reducer of ``spec`` over a core that has a gradient and nothing else (no
    reduction runs here)."""
    core = SimpleNamespace(model=SimpleNamespace(grads=np.zeros(count, dtype=np.float32)),
                           comm=SimpleNamespace(size=2))
    codec = parse_codec(spec)
    return REDUCERS[codec.name](core, codec, plan)


def test_the_reducer_declares_it_applies_the_momentum_and_keeps_the_velocity():
    plain = reducer_of("topk:0.01")
    assert not plain.applies_momentum and "compress_velocity" not in plain.state()
    dgc = reducer_of("randk:0.01,momentum=0.9", plan=[(600, 1000), (0, 600)])
    assert dgc.applies_momentum
    dgc.feedback[0].velocity[:] = np.arange(400, dtype=np.float32)
    dgc.feedback[1].residual[:] = -1
    state = dgc.state()
    np.testing.assert_array_equal(state["compress_velocity"][600:], np.arange(400))
    np.testing.assert_array_equal(state["compress_residual"][:600], -1)
    again = reducer_of("randk:0.01,momentum=0.9", plan=[(600, 1000), (0, 600)])
    again.load_state(state)
    np.testing.assert_array_equal(again.velocity(), dgc.velocity())
    np.testing.assert_array_equal(again.residual(), dgc.residual())
    with pytest.raises(ValueError, match="--resume: saved velocity of 5 elements"):
        again.load_state({**state, "compress_velocity": np.zeros(5)})
