"""``int4[:CHUNK]``: min-max codes of 4 bits (15 levels), two to a byte on the wire.

The same arithmetic as ``int8`` with 15 levels, re-computed element by element in
float32 here; the packing round-trips and the wire bytes are ``ceil(c / 2) + 8`` per
chunk of ``c`` elements.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_codecs import bagua_scalar

from syncbench.algorithms.codecs.minmax import MinMaxUInt4Codec
from syncbench.algorithms.codecs.registry import parse_codec
from syncbench.algorithms.reducers.bytegrad import ByteGradReduce
from syncbench.algorithms.reducers.compress import REDUCERS


def scalar_int4(x: np.ndarray, lo: np.float32, hi: np.float32) -> tuple[list[int], list[float]]:
    """Element-by-element float32 re-computation with 15 levels."""
    return bagua_scalar(x, lo, hi, levels=15.0)


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_int4_equals_the_scalar_recomputation_within_half_a_step(chunk):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(1001) * 2 - 0.5).astype(np.float32)
    codec = MinMaxUInt4Codec(chunk)
    code = codec.encode(x)
    decoded = codec.decode(code)
    assert code.codes.max() <= 15
    for c in range(codec.chunks(x.size)):
        part = x[c * chunk:(c + 1) * chunk]
        lo, hi = part.min(), part.max()
        codes, values = scalar_int4(part, lo, hi)
        np.testing.assert_array_equal(code.codes[c * chunk:c * chunk + part.size], codes)
        got = decoded[c * chunk:c * chunk + part.size]
        np.testing.assert_array_equal(got, np.array(values, dtype=np.float32))
        step = (float(hi) - float(lo) + 1e-7) / 15.0
        slack = 4 * np.spacing(np.float32(max(abs(lo), abs(hi))))
        assert np.all(np.abs(got.astype(np.float64) - part) <= step / 2 + slack)


@pytest.mark.parametrize("count", [1, 2, 9, 10, 257])
def test_int4_packs_two_codes_a_byte_and_round_trips(count):
    codec = MinMaxUInt4Codec(chunk=4)
    x = np.random.default_rng(count).standard_normal(count).astype(np.float32)
    code = codec.encode(x)
    packed = codec.pack(code)
    chunks = -(-count // 4)
    assert packed.dtype == np.uint8
    assert packed.size == codec.wire_bytes(count) == (count + 1) // 2 + 8 * chunks
    again = codec.unpack(packed, count)
    np.testing.assert_array_equal(again.codes, code.codes)
    np.testing.assert_array_equal(again.minmax, code.minmax)
    low = packed[8 * chunks] & 0x0F  # the first element's code sits in the low nibble
    assert low == code.codes[0]
    with pytest.raises(ValueError, match="int4 buffer holds"):
        codec.unpack(packed[:-1], count)


def test_int4_is_a_codec_spec_reduced_as_bytegrad():
    codec = parse_codec("int4:512")
    assert isinstance(codec, MinMaxUInt4Codec) and codec.chunk == 512
    assert codec.spec == "int4:512" and parse_codec("int4").spec == "int4"
    assert REDUCERS["int4"] is ByteGradReduce
    with pytest.raises(ValueError, match="int4 chunk 0 is below 1"):
        parse_codec("int4:0")
    with pytest.raises(ValueError, match="int4 chunk 'x' is not an integer"):
        parse_codec("int4:x")
