"""The codecs' compiled passes (kernels/cpu/codecs.c) against their NumPy references, bit
for bit: fp16 and bf16 both ways (every 16-bit code, rounding ties, overflow, subnormals,
NaN payloads), int8 (constant chunks, chunk remainders, -0, infinities, NaN), its
decode-and-add, and top-k's selection (ties, NaN, zeros), with the fall-back to the
reference where the kernels do not run.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.codecs import (
    BFloat16Codec,
    Float16Codec,
    MinMaxUInt8Codec,
    TopK,
    sum_decoded,
)
from syncbench.algorithms.codecs.half import bf16_decode_reference, bf16_encode_reference
from syncbench.kernels import cpu_native

native = pytest.mark.skipif(cpu_native.library() is None,
                            reason=f"no compiled kernels: {cpu_native.status()}")

#: Lengths around the eight-wide vectors and their remainders.
LENGTHS = [0, 1, 7, 8, 9, 31, 1001]


def edge_bits() -> np.ndarray:
    """float32 bit patterns at every 16-bit rounding edge: each float16 and bfloat16 value
    as float32, the halfway points to the next code, and one ulp either side of both;
    signed zeros, subnormals, infinities, quiet and signalling NaNs of both signs."""
    every = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(all="ignore"):
        halves = every.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    finite = halves[(halves & 0x7F800000) != 0x7F800000]
    bf = every << 16
    steps = [np.uint32(0x1000), np.uint32(0x8000)]  # half a float16 / bfloat16 code
    parts = [finite, bf]
    for base in (finite & 0x7FFFFFFF, bf & 0x7FFFFFFF):
        for step in steps:
            for delta in (-1, 0, 1):
                mid = (base.astype(np.int64) + int(step) + delta).clip(0, 0x7FFFFFFF)
                parts += [mid.astype(np.uint32), mid.astype(np.uint32) | 0x80000000]
    specials = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                         0xFFC00000, 0x7F800001, 0xFF800001, 0x7F802000, 0x7FBFFFFF,
                         0x7FFFFFFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001,
                         0x32FFFFFF, 0x387FF000, 0x38800000, 0x7F7FFFFF, 0x7F7F8000],
                        dtype=np.uint32)
    return np.concatenate(parts + [specials, specials | 0x80000000])


def random_bits(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 32, count, dtype=np.uint32)


@native
@pytest.mark.parametrize("codec", [Float16Codec(), BFloat16Codec()], ids=["fp16", "bf16"])
def test_half_codes_equal_the_reference_at_every_edge(codec):
    bits = np.concatenate([edge_bits(), random_bits(1 << 20, 1)])
    x = bits.view(np.float32)
    ref = (codec.encode_reference(x) if codec.name == "fp16" else bf16_encode_reference(x))
    got = cpu_native.half_encode(x, codec.name)
    assert got is not None and got.dtype == np.uint16
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(codec.encode(x), ref)
    # every value beside a NaN: each group of eight goes through the integer rule
    mixed = np.full(2 * bits.size, 0x7FC00000, dtype=np.uint32)
    mixed[1::2] = bits
    mixed = mixed.view(np.float32)
    ref_mixed = (codec.encode_reference(mixed) if codec.name == "fp16"
                 else bf16_encode_reference(mixed))
    np.testing.assert_array_equal(codec.encode(mixed), ref_mixed)
    for n in LENGTHS:  # the vector loop's remainders, a NaN in and out of a full vector
        part = x[-n - 3:-3] if n else x[:0]
        np.testing.assert_array_equal(codec.encode(part), ref[-n - 3:-3] if n else ref[:0])


@native
@pytest.mark.parametrize("codec", [Float16Codec(), BFloat16Codec()], ids=["fp16", "bf16"])
def test_every_16_bit_code_decodes_as_the_reference(codec):
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    beside_nan = np.full(2 * codes.size, 0x7E00, dtype=np.uint16)
    beside_nan[1::2] = codes  # each group of eight holds a NaN: the integer rule
    codes = np.concatenate([codes, codes[::-1], beside_nan, codes[5:12]])
    ref = (codec.decode_reference(codes) if codec.name == "fp16"
           else bf16_decode_reference(codes))
    got = cpu_native.half_decode(codes, codec.name)
    assert got is not None
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(codec.decode(codes).view(np.uint32), ref.view(np.uint32))


def int8_inputs() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    normal = rng.standard_normal(10_007).astype(np.float32)
    signed_zeros = np.where(rng.random(999) < 0.5, -0.0, 0.0).astype(np.float32)
    mixed = normal[:3000].copy()
    mixed[::7] = 0.0
    mixed[1::7] = -0.0
    mixed[500:1500] = 3.25  # constant chunks
    wide = (rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000)).astype(np.float32)
    special = normal[:1200].copy()
    special[[3, 600]] = np.inf
    special[[700]] = -np.inf
    special[[1000, 1100]] = np.nan
    tiny = (rng.standard_normal(777) * 1e-42).astype(np.float32)  # subnormal ranges
    ties = (rng.integers(-300, 300, 4099) / 2).astype(np.float32)  # x * scale near .5
    nonnegative = np.abs(normal[:6000])  # min -0 or +0, NumPy's choice
    nonnegative[::5] = 0.0
    nonnegative[2::5] = -0.0
    # ranges of about 1 far from zero: upper = rint(max * scale) near 2**24, where the
    # compiled pass leaves its integer path (levels no longer exact floats) for the float one
    offset = (np.repeat([10.0, 6.5e4, 6.6e4, -6.58e4, 3e5], 1000)
              + rng.random(5000)).astype(np.float32)
    return [("normal", normal), ("signed zeros", signed_zeros), ("mixed", mixed),
            ("offset", offset),
            ("wide", wide), ("special", special), ("tiny", tiny), ("ties", ties),
            ("nonnegative", nonnegative), ("nonpositive", -nonnegative),
            ("constant", np.full(4097, -1.5, np.float32)), ("empty", normal[:0])]


@native
@pytest.mark.parametrize("chunk", [1, 3, 64, 1000, 4096])
@pytest.mark.parametrize("name,x", int8_inputs(), ids=[n for n, _ in int8_inputs()])
def test_int8_codes_and_values_equal_the_reference(name, x, chunk):
    codec = MinMaxUInt8Codec(chunk)
    with np.errstate(all="ignore"):  # NaN and infinity: the reference's casts warn
        ref = codec.encode_reference(x)
        got = codec.encode(x)
        ref_values = codec.decode_reference(ref)
        values = codec.decode(got)
    np.testing.assert_array_equal(got.pack(), ref.pack())
    np.testing.assert_array_equal(values.view(np.uint32), ref_values.view(np.uint32))
    codes = np.empty(x.size, np.uint8)
    assert cpu_native.minmax_encode(x, chunk, got.minmax, codes)  # the kernel did run
    np.testing.assert_array_equal(codes, ref.codes)


@native
def test_int8_takes_headers_in_the_compiled_pass_but_where_zero_or_nan_is_an_extreme():
    x = np.random.default_rng(2).standard_normal(10 * 64 + 3).astype(np.float32)
    x[64:128] = np.abs(x[64:128])
    x[100] = -0.0  # chunk 1: min is a zero
    x[200] = np.nan  # chunk 3
    x[-2:] = 0.0  # the short last chunk: max and min zero
    minmax = np.empty((11, 2), np.float32)
    codes = np.empty(x.size, np.uint8)
    ask = cpu_native.minmax_encode_fused(x, 64, minmax, codes)
    np.testing.assert_array_equal(ask, [1, 3, 10])
    with np.errstate(invalid="ignore"):
        ref = MinMaxUInt8Codec(64).encode_reference(x)
    np.testing.assert_array_equal(MinMaxUInt8Codec(64).encode(x).pack(), ref.pack())
    whole = x[:-3].copy()  # ten whole chunks, none with a zero or NaN extreme
    whole[100] = whole[200] = 0.5
    none_left = cpu_native.minmax_encode_fused(whole, 64, minmax[:-1], codes[:-3])
    assert isinstance(none_left, tuple) and not none_left


@native
@pytest.mark.parametrize("chunk", [5, 4096])
def test_int8_decode_and_add_equals_decode_then_add(chunk):
    rng = np.random.default_rng(3)
    codec = MinMaxUInt8Codec(chunk)
    codes = [codec.encode(rng.standard_normal(9001).astype(np.float32)) for _ in range(4)]
    total = sum_decoded(codec, codes)
    expect = codec.decode_reference(codes[0])
    for code in codes[1:]:
        expect += codec.decode_reference(code)
    np.testing.assert_array_equal(total.view(np.uint32), expect.view(np.uint32))
    with pytest.raises(ValueError, match="chunk headers"):
        sum_decoded(codec, [codes[0], type(codes[0])(codes[1].minmax[:-1], codes[1].codes)])


@native
@pytest.mark.parametrize("chunk", [7, 600, 4096])
def test_int8_equals_the_reference_from_every_start_within_a_cache_line(chunk):
    """The compiled loops take a chunk's first elements, up to the next 64-byte line, by a
    masked load (and the decoding its first stores): every float offset of the input
    and of the output within a line, with lengths that leave every remainder."""
    rng = np.random.default_rng(5)
    codec = MinMaxUInt8Codec(chunk)
    base = rng.standard_normal(3 * 4096 + 64).astype(np.float32)
    out_base = np.empty(base.size + 16, np.float32)
    for offset in range(16):
        for count in (3, 17, 530, 2 * chunk + 33):
            x = base[offset:offset + count]
            got = codec.encode(x)
            ref = codec.encode_reference(x)
            np.testing.assert_array_equal(got.pack(), ref.pack())
            out = out_base[15 - offset:15 - offset + count]
            expect = codec.decode_reference(ref)
            np.testing.assert_array_equal(codec.decode(got, out).view(np.uint32),
                                          expect.view(np.uint32))
            out[:] = x
            assert codec.add_decoded(got, out)
            np.testing.assert_array_equal(out.view(np.uint32), (x + expect).view(np.uint32))


def topk_inputs() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    normal = rng.standard_normal(23_517).astype(np.float32)
    special = normal.copy()
    special[[10, 20]] = np.nan
    special[[30]] = -np.inf
    special[[40]] = np.inf
    sparse = np.zeros(5000, np.float32)
    sparse[rng.choice(5000, 30, replace=False)] = rng.standard_normal(30)
    signed = normal.copy()
    signed[::2] *= -1
    coarse = rng.integers(-1000, 1000, 20_000).astype(np.float32)  # ties, some straddle
    return [("normal", normal), ("special", special), ("sparse", sparse),
            ("signed", signed), ("coarse", coarse), ("short", normal[:9])]


@native
@pytest.mark.parametrize("density", [1e-4, 0.01, 0.1, 0.5, 0.999])
@pytest.mark.parametrize("name,x", topk_inputs(), ids=[n for n, _ in topk_inputs()])
def test_topk_selection_equals_the_reference(name, x, density):
    codec = TopK(density)
    ref = codec.select_reference(x)
    np.testing.assert_array_equal(codec.select(x), ref)
    got = cpu_native.topk_indices(x, codec.k(x.size))
    if got is not None:  # a unique set: the kernel's own answer is the reference's
        np.testing.assert_array_equal(got, ref)


@native
def test_topk_kernel_declines_where_ties_straddle_the_kth_place():
    x = np.array([5, -1, 1, 3, -1, 2, 1], dtype=np.float32)
    assert cpu_native.topk_indices(x, 4) is None  # |x| = 1 four times for one place
    assert cpu_native.topk_indices(x, 6) is None
    np.testing.assert_array_equal(cpu_native.topk_indices(x, 3), [0, 3, 5])
    np.testing.assert_array_equal(cpu_native.topk_indices(x, 7), np.arange(7))
    nan = np.array([np.nan, 1, np.nan, 2], dtype=np.float32)
    assert cpu_native.topk_indices(nan, 1) is None  # two NaNs, both largest
    np.testing.assert_array_equal(cpu_native.topk_indices(nan, 2), [0, 2])


def test_the_references_run_where_the_kernels_do_not(monkeypatch):
    monkeypatch.setattr(cpu_native, "numpy_only", True)
    x = np.random.default_rng(5).standard_normal(1003).astype(np.float32)
    assert cpu_native.half_encode(x, "fp16") is None
    assert not cpu_native.minmax_encode(x, 64, np.zeros((16, 2), np.float32),
                                        np.empty(1003, np.uint8))
    assert cpu_native.topk_indices(x, 10) is None
    codec = MinMaxUInt8Codec(64)
    np.testing.assert_array_equal(codec.encode(x).pack(), codec.encode_reference(x).pack())
    np.testing.assert_array_equal(Float16Codec().encode(x), Float16Codec().encode_reference(x))
    np.testing.assert_array_equal(TopK(0.01).select(x), TopK(0.01).select_reference(x))
    # float64 and strided vectors take the references with the library built, too
    monkeypatch.setattr(cpu_native, "numpy_only", False)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(TopK(0.01).select(x64), TopK(0.01).select_reference(x64))
    np.testing.assert_array_equal(Float16Codec().encode(x[::2]),
                                  Float16Codec().encode_reference(x[::2]))
