"""16-bit codecs: IEEE half (``fp16``) and bfloat16 (``bf16``).

The gradient travels as 16-bit codes and is summed in float32, so the sum keeps
float32's range (ALGORITHMS.md, "Gradient compression"). The rounding of each
value is PyTorch's: ``fp16_compress_hook`` and ``bf16_compress_hook`` in
``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py`` cast the
bucket with ``Tensor.to(torch.float16)`` / ``Tensor.to(torch.bfloat16)``, both
round to nearest, ties to even; Horovod's ``Compression.fp16``
(``horovod/torch/compression.py``) casts the same way.

Where the arithmetic differs from those hooks: they divide by the world size
in 16 bits *before* the allreduce and let the collective sum 16-bit values;
here codes are decoded and summed in float32 (:func:`sum_decoded`) and the
division by the world size is the reducer's, in float32. Both give the same
codes on the wire; our sum loses less (no 16-bit partial sums, no fp16
overflow of a partial sum above 65504).

bfloat16 is computed from the float32 bits, as c10's ``round_to_nearest_even``:
``(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16``. Infinities stay infinite,
overflow past bfloat16's largest finite value rounds to infinity, subnormals
round like any other value. Every NaN becomes the code ``0xFFFF`` (a NaN), the
code PyTorch's vectorised CPU conversion writes for NaN lanes (ATen's
``cvtfp32_bf16``; c10's scalar constructor writes ``0x7FC0``, also a NaN), so
``tensor.to(torch.bfloat16)`` and :meth:`BFloat16Codec.encode` agree bit for bit.

Both directions of both codecs run as one compiled pass (``kernels/cpu/codecs.c``,
:mod:`syncbench.kernels.cpu_native`) where the library is built, equal to the NumPy
references here (``*_reference``) to the bit; NumPy's float16 cast is a software
conversion that costs tens of nanoseconds an element (docs/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from syncbench.kernels import cpu_native

#: The bfloat16 code every NaN encodes to (as PyTorch's vectorised CPU cast).
BF16_NAN = np.uint16(0xFFFF)


def _float32(x: np.ndarray, who: str) -> np.ndarray:
    """``x`` as a float32 array; a clear ValueError for any other dtype."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"{who} encodes float32 values, got {x.dtype}")
    return x


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """bfloat16 codes (uint16) of float32 ``x``: round to nearest, ties to even (compiled
    where built, else :func:`bf16_encode_reference`)."""
    codes = cpu_native.half_encode(_float32(x, "bf16"), "bf16")
    return bf16_encode_reference(x) if codes is None else codes


def bf16_encode_reference(x: np.ndarray) -> np.ndarray:
    """:func:`bf16_encode` in NumPy (the reference)."""
    bits = _float32(x, "bf16").view(np.uint32)
    # bits + 0x7FFF + lsb, in place in one temporary. No uint32 wrap-around for
    # non-NaN inputs: the largest such pattern, 0xFF800000 (-inf), plus 0x8000
    # stays below 2**32; NaNs are replaced below.
    work = bits >> np.uint32(16)
    work &= np.uint32(1)
    work += np.uint32(0x7FFF)
    work += bits
    work >>= np.uint32(16)
    codes = work.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        codes[nan] = BF16_NAN
    return codes


def bf16_decode(codes: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 ``codes`` (exact: bfloat16 is a float32 prefix)."""
    values = cpu_native.half_decode(np.asarray(codes), "bf16")
    return bf16_decode_reference(codes) if values is None else values


def bf16_decode_reference(codes: np.ndarray) -> np.ndarray:
    """:func:`bf16_decode` in NumPy (the reference)."""
    return (np.asarray(codes, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(
        np.float32)


class Decoder(Protocol):
    """What :func:`sum_decoded` needs of a codec: the 16-bit ones, and ``int8``."""

    def decode(self, codes: Any) -> np.ndarray: ...


class Float16Codec:
    """``fp16``: IEEE 754 binary16 codes (NumPy's float16 cast: nearest, ties to even).

    Values above 65504 in magnitude become infinite and values below 2**-24
    become zero, as with ``Tensor.to(torch.float16)``.
    """

    name = "fp16"
    #: Bytes each element occupies on the wire.
    bytes_per_element = 2

    def __init__(self) -> None:
        self.spec = self.name

    def encode(self, x: np.ndarray) -> np.ndarray:
        """The float16 codes of float32 ``x``, as uint16 (the bytes handed to MPI)."""
        codes = cpu_native.half_encode(_float32(x, self.name), self.name)
        return self.encode_reference(x) if codes is None else codes

    def encode_reference(self, x: np.ndarray) -> np.ndarray:
        """:meth:`encode` by NumPy's float16 cast (the reference)."""
        with np.errstate(over="ignore"):  # beyond 65504: infinity, as intended
            return _float32(x, self.name).astype(np.float16).view(np.uint16)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float32 values of float16 ``codes`` (exact)."""
        values = cpu_native.half_decode(np.asarray(codes), self.name)
        return self.decode_reference(codes) if values is None else values

    def decode_reference(self, codes: np.ndarray) -> np.ndarray:
        """:meth:`decode` by NumPy's float32 cast (the reference)."""
        return np.asarray(codes, dtype=np.uint16).view(np.float16).astype(np.float32)

    def wire_bytes(self, count: int) -> int:
        """Bytes one rank hands to MPI to send ``count`` elements."""
        return self.bytes_per_element * count


class BFloat16Codec:
    """``bf16``: bfloat16 codes, float32 rounded to nearest even on its upper 16 bits."""

    name = "bf16"
    bytes_per_element = 2

    def __init__(self) -> None:
        self.spec = self.name

    def encode(self, x: np.ndarray) -> np.ndarray:
        """The bfloat16 codes of float32 ``x`` (uint16; see :func:`bf16_encode`)."""
        return bf16_encode(x)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float32 values of bfloat16 ``codes`` (exact)."""
        return bf16_decode(codes)

    def wire_bytes(self, count: int) -> int:
        """Bytes one rank hands to MPI to send ``count`` elements."""
        return self.bytes_per_element * count


def sum_decoded(codec: Decoder, chunks: Iterable[Any],
                out: np.ndarray | None = None) -> np.ndarray:
    """Sum of the decoded ``chunks`` (one per rank, in order), accumulated in float32.

    The reduce step of a compressed reduce-scatter (16-bit codes, or int8's
    :class:`~.minmax.MinMaxCode` before it is encoded again): every rank's codes
    for one segment are decoded and added one after another in the order given,
    so every rank that sums the same codes in the same order gets the same bits.
    ``out`` (float32) receives the sum when given.
    """
    total: np.ndarray | None = None
    add_decoded = getattr(codec, "add_decoded", None)
    for codes in chunks:
        if (total is not None and add_decoded is not None
                and add_decoded(codes, total)):  # int8: decode and add in one pass
            continue
        values = codec.decode(codes)
        if total is None:
            if out is None:
                total = values.copy()
            else:
                out[...] = values
                total = out
        elif total.shape != values.shape:
            raise ValueError(f"chunks differ in shape: {total.shape} and {values.shape}")
        else:
            total += values
    if total is None:
        raise ValueError("sum_decoded needs at least one chunk")
    return total
