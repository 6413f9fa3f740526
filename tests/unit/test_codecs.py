"""Gradient codecs (``syncbench.algorithms.codecs``): exact roundings, error bounds,
PowerSGD's algebra, error-feedback conservation, N ranks re-computed serially, specs.

Pure NumPy, no MPI, no processes. Tolerances are stated where arithmetic rounds:
``u`` is the codec's unit roundoff (2**-8 bf16, 2**-11 fp16), float32 sums add
``2**-24`` per addition.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import syncbench.algorithms.codecs as codecs
from syncbench.algorithms.codecs import (
    CODECS,
    BFloat16Codec,
    ErrorFeedback,
    Float16Codec,
    MinMaxCode,
    MinMaxUInt8Codec,
    PowerSGD,
    RandomK,
    TopK,
    bf16_decode,
    bf16_encode,
    orthogonalize,
    parse_codec,
    sum_decoded,
    tensor_shapes,
)
from syncbench.algorithms.codecs.sparse import kept

F32_EPS = 2.0**-24


def bits(*words: int) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


# ----------------------------------------------------------------------------- 16-bit


def nearest_bf16_reference(x: np.ndarray) -> np.ndarray:
    """Independent oracle: the nearer of the two bfloat16 neighbours, by float64 distance."""
    b = x.view(np.uint32).astype(np.uint64)
    lo = (b >> 16).astype(np.uint64)
    hi = lo + 1
    down = (lo << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    up = (hi << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    # beyond the largest finite bfloat16, "up" is the infinity code: compare with the
    # midpoint to the next (non-existent) finite value, as IEEE overflow does
    up_finite = np.where(np.isinf(up), np.sign(down) * 2.0**128, up)
    d_down, d_up = np.abs(xd - down), np.abs(up_finite - xd)
    pick_up = (d_up < d_down) | ((d_up == d_down) & (lo % 2 == 1))
    return np.where(pick_up, hi, lo).astype(np.uint16)


def test_bf16_rounds_ties_to_even_and_keeps_specials():
    x = bits(0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties down/up, above/below
             0x00008000, 0x00018000, 0x00000001,               # subnormal ties and the tiniest
             0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF,               # overflow to inf, just below
             0x7F800000, 0xFF800000, 0x80000000,               # +inf, -inf, -0
             0x7FC00000, 0xFFC12345, 0x7F800001)               # NaNs
    expect = [0x3F80, 0x3F82, 0x3F81, 0x3F80,
              0x0000, 0x0002, 0x0000,
              0x7F80, 0xFF80, 0x7F7F,
              0x7F80, 0xFF80, 0x8000,
              0xFFFF, 0xFFFF, 0xFFFF]
    np.testing.assert_array_equal(bf16_encode(x), np.array(expect, dtype=np.uint16))
    assert np.isnan(bf16_decode(bf16_encode(x[-3:]))).all()


def test_bf16_equals_an_independent_nearest_even_oracle_on_random_bit_patterns():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    np.testing.assert_array_equal(bf16_encode(x), nearest_bf16_reference(x))


@pytest.mark.parametrize("codec", [Float16Codec(), BFloat16Codec()], ids=["fp16", "bf16"])
def test_every_16_bit_code_round_trips(codec):
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = codec.decode(codes)
    assert values.dtype == np.float32
    finite_or_inf = ~np.isnan(values)
    np.testing.assert_array_equal(codec.encode(values)[finite_or_inf], codes[finite_or_inf])
    assert np.isnan(codec.decode(codec.encode(values[~finite_or_inf]))).all()


def test_fp16_is_numpys_float16_cast():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-9, 6, 10_000)).astype(np.float32)
    with np.errstate(over="ignore"):  # values past 65504 become infinite in both
        expect = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(Float16Codec().encode(x), expect)


@pytest.mark.parametrize("codec, u, tiny", [(Float16Codec(), 2.0**-11, 2.0**-25),
                                             (BFloat16Codec(), 2.0**-8, 0.0)],
                         ids=["fp16", "bf16"])
def test_n_ranks_summing_decoded_codes_match_float64_sums(codec, u, tiny):
    """Serial re-computation of a 16-bit reduce: N ranks' codes decoded and summed in
    float32 in rank order. Against the float64 sum of the original values:
    |S - S64| <= (u + (N - 1) 2**-24 (1 + u)) sum_i |x_i| + N tiny, where tiny is half
    the smallest subnormal step (fp16's 2**-25; none for bf16 at these magnitudes)."""
    ranks, n = 6, 50_000
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(n).astype(np.float32) * 1e-2 for _ in range(ranks)]
    codes = [codec.encode(g) for g in grads]
    total = sum_decoded(codec, codes)
    serial = codec.decode(codes[0]).copy()
    for c in codes[1:]:
        serial += codec.decode(c)
    np.testing.assert_array_equal(total, serial)  # same order, same bits
    out = np.full(n, 7.0, dtype=np.float32)
    assert sum_decoded(codec, codes, out=out) is out
    np.testing.assert_array_equal(out, serial)
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    scale = np.sum([np.abs(g.astype(np.float64)) for g in grads], axis=0)
    bound = (u + (ranks - 1) * F32_EPS * (1 + u)) * scale + ranks * tiny
    assert np.all(np.abs(total - exact) <= bound)
    assert codec.wire_bytes(n) == 2 * n == codes[0].nbytes


def test_16_bit_codecs_refuse_other_dtypes():
    with pytest.raises(ValueError, match="bf16 encodes float32 values, got float64"):
        BFloat16Codec().encode(np.zeros(3))
    with pytest.raises(ValueError, match="fp16 encodes float32 values, got float64"):
        Float16Codec().encode(np.zeros(3))


# ----------------------------------------------------------------------------- int8


def bagua_scalar(x: np.ndarray, lo: np.float32, hi: np.float32,
                 levels: float = 255.0) -> tuple[list[int], list[float]]:
    """Element-by-element float32 re-computation of Bagua's MinMaxUInt8 kernels (``levels``
    15: the same arithmetic with 4-bit codes)."""
    f = np.float32
    scale = f(levels) / (f(hi - lo) + f(1e-7))
    upper = f(np.rint(f(hi * scale)))
    lower = f(upper - f(levels))
    codes, values = [], []
    for v in x:
        level = min(f(np.rint(f(v * scale))), upper)
        code = int(min(max(f(level - lower), f(0)), f(levels)))
        codes.append(code)
        values.append(float(f(f(f(code) + lower) / scale)))
    return codes, values


def test_int8_rounds_half_to_even_as_rintf():
    # [0, 255]: scale = 255 / (255 + 1e-7) = 1 in float32, lower = 0
    x = np.array([0.0, 2.5, 3.5, 254.5, 255.0], dtype=np.float32)
    code = MinMaxUInt8Codec(chunk=8).encode(x)
    np.testing.assert_array_equal(code.codes, [0, 2, 4, 254, 255])
    np.testing.assert_array_equal(code.minmax, [[0.0, 255.0]])


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_int8_equals_bagua_per_element_and_stays_within_half_a_step(chunk):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(1000) * 3 + 1).astype(np.float32)
    codec = MinMaxUInt8Codec(chunk)
    code = codec.encode(x)
    decoded = codec.decode(code)
    assert code.minmax.shape == (codec.chunks(x.size), 2)
    for c in range(codec.chunks(x.size)):
        part = x[c * chunk:(c + 1) * chunk]
        lo, hi = part.min(), part.max()
        codes, values = bagua_scalar(part, lo, hi)
        np.testing.assert_array_equal(code.codes[c * chunk:c * chunk + part.size], codes)
        got = decoded[c * chunk:c * chunk + part.size]
        np.testing.assert_array_equal(got, np.array(values, dtype=np.float32))
        # half a step, plus float32 rounding of x*scale and of the division (a few ulps)
        step = (float(hi) - float(lo) + 1e-7) / 255.0
        slack = 4 * np.spacing(np.float32(max(abs(lo), abs(hi))))
        assert np.all(np.abs(got.astype(np.float64) - part) <= step / 2 + slack)


def test_int8_constant_and_zero_chunks_decode_close_and_pack_round_trips():
    codec = MinMaxUInt8Codec(chunk=4)
    x = np.array([0, 0, 0, 0, 1.5, 1.5, 1.5, 1.5, -2, 5, 0.25], dtype=np.float32)
    code = codec.encode(x)
    decoded = codec.decode(code)
    np.testing.assert_array_equal(decoded[:4], 0)
    np.testing.assert_allclose(decoded[4:8], 1.5, rtol=1e-6)
    packed = code.pack()
    assert packed.dtype == np.uint8 and packed.size == codec.wire_bytes(x.size) == 11 + 3 * 8
    again = MinMaxCode.unpack(packed, x.size, 4)
    np.testing.assert_array_equal(codec.decode(again), decoded)
    with pytest.raises(ValueError, match="int8 buffer holds 34 bytes, expected 35"):
        MinMaxCode.unpack(packed[:-1], x.size, 4)


def test_int8_n_ranks_decode_sum_matches_float64_within_the_quantization_steps():
    """A serial decode-sum of N ranks' codes against the float64 sum: within the sum
    of each rank's half step plus float32 accumulation."""
    ranks, n, chunk = 4, 10_240, 256
    rng = np.random.default_rng(5)
    codec = MinMaxUInt8Codec(chunk)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(ranks)]
    total = np.zeros(n, dtype=np.float32)
    bound = np.zeros(n)
    for g in grads:
        total += codec.decode(codec.encode(g))
    np.testing.assert_array_equal(sum_decoded(codec, [codec.encode(g) for g in grads]), total)
    for g in grads:
        spans = (g.reshape(-1, chunk).max(1).astype(np.float64)
                 - g.reshape(-1, chunk).min(1) + 1e-7) / 510
        bound += np.repeat(spans, chunk) + 4 * np.spacing(np.float32(np.abs(g).max()))
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    bound += ranks * F32_EPS * np.sum([np.abs(g) for g in grads], axis=0)
    assert np.all(np.abs(total - exact) <= bound)


# ----------------------------------------------------------------------------- PowerSGD


def simulate_powersgd(states, grads):
    """One call on N ranks in one process: the two sums are plain float32 sums in rank order."""
    ms = [s.prepare(g) for s, g in zip(states, grads)]
    p_sum = np.sum([s.p_buffer(m) for s, m in zip(states, ms)], axis=0, dtype=np.float32)
    u_sum = np.sum([s.uncompressed_buffer(m) for s, m in zip(states, ms)], axis=0,
                   dtype=np.float32)
    q_sum = np.sum([s.q_buffer(m, p_sum) for s, m in zip(states, ms)], axis=0, dtype=np.float32)
    return ms, [s.finish(m, q_sum, u_sum, len(states)) for s, m in zip(states, ms)]


@pytest.mark.parametrize("method", ["gram-schmidt", "qr"])
def test_orthogonalize_gives_orthonormal_columns_spanning_the_same_space(method):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((50, 4)).astype(np.float32)
    p = a.copy()
    orthogonalize(p, method=method)
    np.testing.assert_allclose(p.T @ p, np.eye(4), atol=2e-6)
    # same span: projecting a onto span(p) gives a back
    np.testing.assert_allclose(p @ (p.T @ a), a, atol=2e-5)


def test_orthogonalize_leaves_a_zero_column_zero_and_epsilon_divides_as_pytorch():
    p = np.zeros((5, 2), dtype=np.float32)
    p[:, 1] = 1.0
    orthogonalize(p)
    np.testing.assert_array_equal(p[:, 0], 0)
    np.testing.assert_allclose(p[:, 1], 1 / math.sqrt(5), rtol=1e-6)
    q = np.full((4, 1), 2.0, dtype=np.float32)  # norm 4
    orthogonalize(q, epsilon=1.0)
    np.testing.assert_array_equal(q, np.float32(2) / np.float32(5))


def test_layout_follows_pytorchs_should_compress_rule():
    shapes = [(784, 128), (128,), (8, 3, 3, 3), (8,), (3, 3), (10, 2)]
    layout = PowerSGD(rank=2, start_iter=0).layout(shapes)
    assert [s.compressed for s in layout.slots] == [True, False, True, False, False, False]
    assert [(s.rows, s.cols, s.rank) for s in layout.slots][2] == (8, 27, 2)
    # (10 + 2) * 2 * 2 = 48 < 20 fails; with min rate 0.5, 12 < 20 holds, (3 + 3) * 2 * 0.5
    # = 6 < 9 holds, and a vector, (n + 1) * 0.5 < n, is compressed too, as in PyTorch
    loose = PowerSGD(rank=2, min_compression_rate=0.5).layout(shapes)
    assert all(s.compressed for s in loose.slots)
    assert layout.p_size == 784 * 2 + 8 * 2 and layout.q_size == 128 * 2 + 27 * 2
    assert layout.uncompressed_size == 128 + 8 + 9 + 20


def test_powersgd_recovers_an_exactly_rank_r_matrix_in_one_call():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((60, 3))
    b = rng.standard_normal((40, 3))
    m = (a @ b.T).astype(np.float32)
    state = PowerSGD(rank=3, start_iter=0, seed=11).state([m.shape])
    _, (out,) = simulate_powersgd([state], [m.reshape(-1)])
    np.testing.assert_allclose(out.reshape(m.shape), m, atol=1e-4 * np.abs(m).max())
    assert np.abs(state.error).max() <= 1e-4 * np.abs(m).max()


def float64_powersgd(ms, qs0, layout, world):
    """The same call in float64 from the same initial Q (orthogonalized the same way)."""
    out = np.empty(layout.size)
    u = layout.uncompressed_index
    out[u] = np.mean([m[u].astype(np.float64) for m in ms], axis=0)
    for slot, q0 in zip(layout.compressed, qs0):
        mats = [m[slot.offset:slot.offset + slot.size].reshape(slot.rows, slot.cols)
                .astype(np.float64) for m in ms]
        q = q0.astype(np.float64)
        orthogonalize(q)
        p = np.sum([mat @ q for mat in mats], axis=0)
        orthogonalize(p)
        qm = np.sum([mat.T @ p for mat in mats], axis=0) / world
        out[slot.offset:slot.offset + slot.size] = (p @ qm.T).reshape(-1)
    return out


def test_n_ranks_get_the_same_bits_and_float64_agrees_within_tolerance():
    shapes = [(30, 20), (20,), (6, 2, 3, 3), (6,)]
    ranks = 3
    options = PowerSGD(rank=2, start_iter=0, seed=5)
    states = [options.state(shapes) for _ in range(ranks)]
    rng = np.random.default_rng(8)
    size = states[0].layout.size
    for _ in range(4):
        grads = [rng.standard_normal(size).astype(np.float32) for _ in range(ranks)]
        q_before = [q.copy() for q in states[0].qs] if states[0].qs is not None else None
        ms, outs = simulate_powersgd(states, grads)
        for other in outs[1:]:
            np.testing.assert_array_equal(other, outs[0])
        if q_before is not None:
            ref = float64_powersgd(ms, q_before, states[0].layout, ranks)
            np.testing.assert_allclose(outs[0], ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        for s, m in zip(states, ms):  # error feedback: E = M - result, bit for bit
            np.testing.assert_array_equal(s.error, m - outs[0])
    assert states[0].step == 4
    assert all(np.array_equal(a, b) for a, b in zip(states[0].qs, states[1].qs))


def test_powersgd_conserves_the_signal_through_error_feedback():
    """sum over steps and ranks of N * result, plus every rank's final error, equals the
    sum of the gradients up to float32 rounding of M = G + E and of E = M - result."""
    shapes = [(16, 12), (12,)]
    ranks, steps = 2, 6
    options = PowerSGD(rank=1, start_iter=0)
    states = [options.state(shapes) for _ in range(ranks)]
    rng = np.random.default_rng(9)
    sent = np.zeros(states[0].layout.size)
    fed = np.zeros_like(sent)
    slack = np.zeros_like(sent)
    for _ in range(steps):
        grads = [rng.standard_normal(sent.size).astype(np.float32) for _ in range(ranks)]
        ms, outs = simulate_powersgd(states, grads)
        sent += ranks * outs[0].astype(np.float64)
        fed += np.sum(grads, axis=0, dtype=np.float64)
        slack += 2 * F32_EPS * np.sum([np.abs(m) for m in ms], axis=0)
    residual = np.sum([s.error.astype(np.float64) for s in states], axis=0)
    assert np.all(np.abs(sent + residual - fed) <= slack)


def test_start_iter_warm_start_and_wire_bytes():
    shapes = [(32, 16), (16,)]
    options = PowerSGD(rank=2, start_iter=2, warm_start=False, seed=3)
    state = options.state(shapes)
    grad = np.ones(state.layout.size, dtype=np.float32)
    assert state.wire_bytes(grad.size) == 4 * grad.size
    with pytest.raises(ValueError, match="powersgd call 0 is plain"):
        state.prepare(grad)
    state.finish_plain()
    state.finish_plain()
    assert state.compressing and not state.error.any()
    compressed = 4 * (32 * 2 + 16 * 2 + 16)
    assert state.wire_bytes(grad.size) == compressed == options.wire_bytes(grad.size, shapes)
    m = state.prepare(grad)
    p = state.p_buffer(m)
    q = state.q_buffer(m, p)
    u = state.uncompressed_buffer(m)
    assert 4 * (p.size + q.size + u.size) == compressed
    first_rng = state.rng.get_state()[2]
    state.finish(m, q, u, 1)
    assert state.qs is None  # no warm start: a fresh Q (new seed) next call
    state.p_buffer(state.prepare(grad))
    assert state.rng.get_state()[2] != first_rng
    warm = PowerSGD(rank=2, start_iter=0).state(shapes)
    m = warm.prepare(grad)
    p = warm.p_buffer(m)
    warm.finish(m, warm.q_buffer(m, p), warm.uncompressed_buffer(m), 1)
    assert [q.shape for q in warm.qs] == [(16, 2)]


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_restored_state_continues_bit_for_bit(warm_start):
    """Snapshot after 3 calls (1 plain, 2 compressed), restore into a fresh state: the
    next calls give the same bits as the state that never stopped."""
    shapes = [(24, 12), (12,), (8, 2, 3, 3)]
    options = PowerSGD(rank=2, start_iter=1, warm_start=warm_start, seed=7)
    rng = np.random.default_rng(14)
    grads = [rng.standard_normal(24 * 12 + 12 + 144).astype(np.float32) for _ in range(6)]
    straight = options.state(shapes)
    resumed = options.state(shapes)

    def call(state, grad):
        if not state.compressing:
            state.finish_plain()
            return grad
        return simulate_powersgd([state], [grad])[1][0]

    for grad in grads[:3]:
        call(straight, grad)
    saved = {k: v.copy() for k, v in straight.snapshot().items()}
    resumed.restore(saved)
    for grad in grads[3:]:
        np.testing.assert_array_equal(call(resumed, grad), call(straight, grad))
    np.testing.assert_array_equal(resumed.error, straight.error)
    with pytest.raises(ValueError, match="saved Q of 3 elements, expected 60"):
        resumed.restore({**saved, "q": np.zeros(3, dtype=np.float32)})


def test_tensor_shapes_checks_the_layer_offsets():
    layers = [[(4, 3), (3,)], [], [(3, 2), (2,)]]
    assert tensor_shapes(layers, [0, 15, 15]) == [(4, 3), (3,), (3, 2), (2,)]
    with pytest.raises(ValueError, match="layer 2 starts at 14, its shapes put it at 15"):
        tensor_shapes(layers, [0, 15, 14])


# ----------------------------------------------------------------------------- sparse


def test_k_is_the_ceiling_of_the_written_density():
    assert kept(0.07, 100) == 7  # 0.07 * 100 is 7.000000000000001 in binary
    assert kept(0.01, 1_000_000) == 10_000
    assert kept(0.015, 10) == 1 and kept(1e-9, 10) == 1 and kept(1.0, 9) == 9
    assert kept(0.5, 0) == 0


def test_topk_keeps_the_largest_magnitudes_sorted():
    rng = np.random.default_rng(10)
    x = rng.standard_normal(1000).astype(np.float32)
    codec = TopK(0.05)
    code = codec.encode(x)
    expect = np.sort(np.argsort(-np.abs(x))[:50])
    np.testing.assert_array_equal(code.indices, expect)
    assert code.indices.dtype == np.int32 and code.values.dtype == np.float32
    dense = code.decode()
    np.testing.assert_array_equal(dense[expect], x[expect])
    assert np.count_nonzero(dense) == 50
    assert codec.wire_bytes(x.size) == code.indices.nbytes + code.values.nbytes == 400


def test_randomk_draws_the_same_indices_on_every_rank_and_new_ones_each_step():
    a, b = RandomK(0.01, seed=4), RandomK(0.01, seed=4)
    first = a.indices(10_000, 0)
    np.testing.assert_array_equal(first, b.indices(10_000, 0))
    assert first.size == 100 and np.all(np.diff(first) > 0) and first.dtype == np.int32
    assert not np.array_equal(first, a.indices(10_000, 1))
    assert not np.array_equal(first, RandomK(0.01, seed=5).indices(10_000, 0))
    assert a.wire_bytes(10_000) == 400


@pytest.mark.parametrize("make", [lambda: TopK(0.03), lambda: RandomK(0.03, seed=2)],
                         ids=["topk", "randomk"])
def test_float64_memory_conserves_the_signal_exactly(make):
    """sum of sent values + final residual == sum of gradients, per element, compared
    as exact sums (math.fsum) of the float64 values."""
    codec = make()
    n, steps = 500, 25
    memory = ErrorFeedback(n, np.float64)
    rng = np.random.default_rng(11)
    grads, sent = [], []
    for step in range(steps):
        g = rng.standard_normal(n).astype(np.float32)
        acc = memory.compensate(g)
        code = codec.encode(acc) if isinstance(codec, TopK) else codec.encode(acc, step)
        memory.keep_unsent(acc, code.indices, code.values)
        grads.append(g.astype(np.float64))
        sent.append(code.decode().astype(np.float64))
    for i in range(n):
        lhs = math.fsum([s[i] for s in sent] + [memory.residual[i]])
        rhs = math.fsum(g[i] for g in grads)
        assert lhs == rhs


def test_float32_memory_splits_exactly_each_step_and_conserves_to_rounding():
    codec = TopK(0.1)
    n = 300
    memory = ErrorFeedback(n)
    rng = np.random.default_rng(12)
    fed = np.zeros(n)
    sent = np.zeros(n)
    slack = np.zeros(n)
    for _ in range(20):
        g = rng.standard_normal(n).astype(np.float32)
        acc = memory.compensate(g)
        code = codec.encode(acc)
        memory.keep_unsent(acc.copy(), code.indices, code.values)
        np.testing.assert_array_equal(code.decode() + memory.residual, acc)
        fed += g
        sent += code.decode()
        slack += F32_EPS * np.abs(acc)
    assert np.all(np.abs(sent + memory.residual - fed) <= slack)
    assert memory.norm() == pytest.approx(np.linalg.norm(memory.residual.astype(np.float64)))


def test_n_ranks_topk_mean_matches_float64_sum_of_sent_values():
    ranks, n = 4, 2000
    codec = TopK(0.02)
    rng = np.random.default_rng(13)
    codes = [codec.encode(rng.standard_normal(n).astype(np.float32)) for _ in range(ranks)]
    total = np.zeros(n, dtype=np.float32)
    for c in codes:  # the order an Allgatherv delivers them in
        c.add_to(total)
    exact = np.sum([c.decode().astype(np.float64) for c in codes], axis=0)
    scale = np.sum([np.abs(c.decode()) for c in codes], axis=0)
    assert np.all(np.abs(total - exact) <= (ranks - 1) * F32_EPS * scale)


# ----------------------------------------------------------------------------- specs


@pytest.mark.parametrize("spec, kind, attrs", [
    ("fp16", Float16Codec, {}),
    ("bf16", BFloat16Codec, {}),
    ("int8", MinMaxUInt8Codec, {"chunk": 4096}),
    ("int8:512", MinMaxUInt8Codec, {"chunk": 512, "spec": "int8:512"}),
    ("powersgd", PowerSGD, {"rank": 1, "start_iter": 1000, "min_compression_rate": 2.0}),
    ("powersgd:2", PowerSGD, {"rank": 2, "spec": "powersgd:2"}),
    ("topk:0.01", TopK, {"density": 0.01, "spec": "topk:0.01"}),
    ("randomk:0.01", RandomK, {"density": 0.01}),
    ("randk:1", RandomK, {"density": 1.0, "spec": "randomk:1.0"}),
])
def test_specs_parse_to_codecs(spec, kind, attrs):
    codec = parse_codec(spec)
    assert isinstance(codec, kind)
    for key, value in attrs.items():
        assert getattr(codec, key) == value


@pytest.mark.parametrize("spec, message", [
    ("zstd", "unknown codec 'zstd' in 'zstd': choose one of bf16, fp16, int4, int8, powersgd, "
             "randk, randomk, topk"),
    ("powersgd:0", "powersgd rank 0 is below 1: give a rank >= 1 (e.g. powersgd:2)"),
    ("powersgd:-3", "powersgd rank -3 is below 1: give a rank >= 1 (e.g. powersgd:2)"),
    ("powersgd:two", "powersgd rank 'two' is not an integer: give a rank >= 1 (e.g. powersgd:2)"),
    ("topk:0", "topk density 0.0 is outside (0, 1]: give a fraction 0 < D <= 1 (e.g. topk:0.01)"),
    ("topk:1.5", "topk density 1.5 is outside (0, 1]: give a fraction 0 < D <= 1 "
                 "(e.g. topk:0.01)"),
    ("randomk:-0.1", "randomk density -0.1 is outside (0, 1]: give a fraction 0 < D <= 1 "
                     "(e.g. randomk:0.01)"),
    ("randomk:nan", "randomk density nan is outside (0, 1]: give a fraction 0 < D <= 1 "
                    "(e.g. randomk:0.01)"),
    ("topk:lots", "topk density 'lots' is not a number: give a fraction 0 < D <= 1 "
                  "(e.g. topk:0.01)"),
    ("topk", "topk needs a density: give topk:D with 0 < D <= 1 (e.g. topk:0.01)"),
    ("topk:", "codec 'topk:' has an empty argument after ':'"),
    ("fp16:3", "fp16 takes no argument, got 'fp16:3'"),
    ("int8:0", "int8 chunk 0 is below 1: give a chunk length >= 1 element (e.g. int8:4096)"),
    ("int8:1k", "int8 chunk '1k' is not an integer: give a chunk length >= 1 element "
                "(e.g. int8:4096)"),
])
def test_bad_specs_give_one_line_naming_the_value(spec, message):
    with pytest.raises(ValueError) as err:
        parse_codec(spec)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_constructors_validate_like_the_parser():
    with pytest.raises(ValueError, match=r"topk density 2 is outside \(0, 1\]"):
        TopK(2)
    with pytest.raises(ValueError, match="powersgd rank 0 is below 1"):
        PowerSGD(rank=0)
    with pytest.raises(ValueError, match="powersgd start_iter -1 is not an integer >= 0"):
        PowerSGD(start_iter=-1)
    with pytest.raises(ValueError, match="powersgd epsilon -1.0 is not a finite number >= 0"):
        PowerSGD(epsilon=-1.0)
    with pytest.raises(ValueError, match="int8 chunk 2.5 is not an integer"):
        MinMaxUInt8Codec(2.5)


def test_every_codec_declares_wire_bytes_and_none_loads_mpi():
    n = 10_000
    assert {name: parse_codec(f"{name}:0.5" if name in ("topk", "randomk", "randk") else name)
            .wire_bytes(n) for name in CODECS if name != "powersgd"} == {
        "fp16": 2 * n, "bf16": 2 * n, "int8": n + 8 * 3, "int4": n // 2 + 8 * 3,
        "topk": 8 * n // 2,
        "randomk": 4 * n // 2, "randk": 4 * n // 2}
    assert parse_codec("powersgd").wire_bytes(n, [(100, 100)]) == 4 * 200
    for source in Path(codecs.__file__).parent.glob("*.py"):
        assert "mpi4py" not in source.read_text(), source.name
