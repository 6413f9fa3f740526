"""``int8``: Bagua ByteGrad's MinMaxUInt8 quantization, chunk by chunk.

Bagua's ByteGrad (``bagua/torch_api/algorithms/bytegrad.py``) reduces a bucket
with ``compression="MinMaxUInt8"``: every chunk of the bucket carries its
float32 minimum and maximum and one 8-bit code per element. The arithmetic
below is that of Bagua's CUDA kernels (``compress_float_to_uint8`` and
``decompress_uint8_to_float`` in ``bagua-core-internal/kernels/bagua_kernels.cu``),
all in float32, with ``eps = 1e-7``::

    scale = 255 / (max - min + eps)
    upper = rint(max * scale)           # round half to even (rintf)
    lower = upper - 255
    code  = min(rint(x * scale), upper) - lower
    x'    = (code + lower) / scale

``rint`` is round-half-to-even, as ``rintf`` in the default rounding mode.
The decoded value lies within ``(max - min + eps) / 510`` of ``x`` (half a
step of ``1 / scale``) up to float32 rounding of the products.

Where this differs from Bagua:

- Bagua converts ``level - lower`` (a float) to ``uint8_t`` with no lower
  clamp; a level below ``lower`` (possible only through float rounding at a
  chunk's minimum) has no defined result in C. Codes are clamped to
  ``[0, 255]`` here.
- Bagua's chunks are the bucket's per-rank segments and each chunk's header
  takes 32 bytes (min and max, padded for alignment); here the chunk length
  is a parameter (``int8:CHUNK``, default :data:`DEFAULT_CHUNK` elements) and
  the header is the 8 bytes of min and max, so a chunk of ``c`` elements
  costs ``c + 8`` bytes on the wire.
- Non-finite inputs, or a chunk whose ``max - min`` overflows float32, give
  non-finite or meaningless codes, as in Bagua; gradients are expected finite.

``int4[:CHUNK]`` (:class:`MinMaxUInt4Codec`) is the same arithmetic with 15 levels
instead of 255 (``scale = 15 / (max - min + eps)``), two codes to a byte on the wire
(the element at an even index in the low nibble; an odd count leaves the last high
nibble 0): the 4-bit min-max quantization of the Streaming DiLoCo paper (Douillard et
al. 2025, arXiv 2501.18512, section 2.3), chunk by chunk with the chunk's own min and
max. A chunk of ``c`` elements costs ``ceil(c / 2) + 8`` bytes.

Where the library is built, an ``int8`` chunk's min, max and codes come from one compiled pass
(``kernels/cpu/codecs.c``, :mod:`syncbench.kernels.cpu_native`), and so do the
decoding and the decode-and-add (:meth:`MinMaxUInt8Codec.add_decoded`): the same
float32 operations in the same order, so the codes and values equal the NumPy
reference (:meth:`MinMaxUInt8Codec.encode_reference`, ``decode_reference``) to the
bit. A chunk whose min or max is zero or NaN takes its header from NumPy's reductions,
as the reference does: which of -0 and +0 (or of several NaNs) they return is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from syncbench.kernels import cpu_native

#: Elements per chunk when ``int8`` is given no chunk length.
DEFAULT_CHUNK = 4096
#: Bagua's ``eps``, added to the chunk's range so a constant chunk has a finite scale.
EPS = np.float32(1e-7)
LEVELS = np.float32(255.0)
#: Bytes of a chunk's header on the wire: float32 min and max.
HEADER_BYTES = 8


@dataclass
class MinMaxCode:
    """One encoded vector: per chunk ``[min, max]`` (float32, shape (chunks, 2)), codes (uint8)."""

    minmax: np.ndarray
    codes: np.ndarray

    def pack(self) -> np.ndarray:
        """One uint8 buffer: every chunk's min and max, then every code (what MPI sends)."""
        return np.concatenate([self.minmax.reshape(-1).view(np.uint8), self.codes])

    @classmethod
    def unpack(cls, buffer: np.ndarray, count: int, chunk: int) -> MinMaxCode:
        """The inverse of :meth:`pack` for ``count`` elements in chunks of ``chunk``."""
        chunks = -(-count // chunk)
        head = chunks * HEADER_BYTES
        if buffer.size != head + count:
            raise ValueError(f"int8 buffer holds {buffer.size} bytes, expected {head + count}")
        minmax = np.ascontiguousarray(buffer[:head]).view(np.float32).reshape(chunks, 2)
        return cls(minmax, buffer[head:])


def _scales(minmax: np.ndarray,
            levels: np.float32 = LEVELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk ``scale``, ``upper`` and ``lower`` from ``[min, max]``, in float32."""
    lo, hi = minmax[:, 0], minmax[:, 1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scale = levels / ((hi - lo) + EPS)
        upper = np.rint(hi * scale)
    return scale, upper, upper - levels


class MinMaxUInt8Codec:
    """``int8``: per chunk min and max, one 8-bit code per element (Bagua MinMaxUInt8)."""

    name = "int8"
    #: The largest code: codes are 0 .. levels.
    levels = LEVELS

    def __init__(self, chunk: int = DEFAULT_CHUNK) -> None:
        name = self.name
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)):
            raise ValueError(f"{name} chunk {chunk!r} is not an integer: "
                             f"give a chunk length >= 1 element (e.g. {name}:4096)")
        if chunk < 1:
            raise ValueError(f"{name} chunk {chunk} is below 1: "
                             f"give a chunk length >= 1 element (e.g. {name}:4096)")
        self.chunk = int(chunk)
        self.spec = self.name if self.chunk == DEFAULT_CHUNK else f"{self.name}:{self.chunk}"

    def chunks(self, count: int) -> int:
        """Chunks a vector of ``count`` elements is cut into (the last one may be shorter)."""
        return -(-count // self.chunk)

    def code_bytes(self, count: int) -> int:
        """Bytes of ``count`` codes on the wire (one each)."""
        return count

    def wire_bytes(self, count: int) -> int:
        """Bytes one rank hands to MPI for ``count`` elements: codes plus 8 per chunk."""
        return self.code_bytes(count) + HEADER_BYTES * self.chunks(count)

    def pack(self, code: MinMaxCode) -> np.ndarray:
        """One uint8 buffer of ``code`` (:meth:`MinMaxCode.pack`), what MPI sends."""
        return code.pack()

    def unpack(self, buffer: np.ndarray, count: int) -> MinMaxCode:
        """The inverse of :meth:`pack` for ``count`` elements."""
        return MinMaxCode.unpack(buffer, count, self.chunk)

    def _blocks(self, x: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(first chunk index, 2-D view)``: the whole chunks, then the short tail."""
        whole = x.size // self.chunk * self.chunk
        blocks = []
        if whole:
            blocks.append((0, x[:whole].reshape(-1, self.chunk)))
        if whole < x.size:
            blocks.append((whole // self.chunk, x[whole:].reshape(1, -1)))
        return blocks

    def _minmax(self, x: np.ndarray) -> np.ndarray:
        """Every chunk's ``[min, max]`` (float32, (chunks, 2)) of 1-D float32 ``x``."""
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim != 1:
            raise ValueError(f"int8 encodes a 1-D float32 vector, got {x.dtype} {x.shape}")
        minmax = np.empty((self.chunks(x.size), 2), dtype=np.float32)
        for first, block in self._blocks(x):
            rows = slice(first, first + block.shape[0])
            minmax[rows, 0] = block.min(axis=1)
            minmax[rows, 1] = block.max(axis=1)
        return minmax

    def encode(self, x: np.ndarray) -> MinMaxCode:
        """Codes of float32 vector ``x``, chunk by chunk (compiled where built, else
        :meth:`encode_reference`): a chunk's min, max and codes in one compiled pass, but
        for a chunk whose min or max is zero or NaN (NumPy's choice of -0 or +0, or of a
        NaN, is its own): its header by NumPy's reductions, as the reference takes it."""
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim != 1:
            raise ValueError(f"{self.name} encodes a 1-D float32 vector, got {x.dtype} {x.shape}")
        if self.levels != LEVELS:  # the compiled pass makes 8-bit codes only
            return self.encode_reference(x)
        minmax = np.empty((self.chunks(x.size), 2), dtype=np.float32)
        codes = np.empty(x.size, dtype=np.uint8)
        ask = cpu_native.minmax_encode_fused(x, self.chunk, minmax, codes)
        if ask is None:
            return self.encode_reference(x)
        for c in ask:
            start = int(c) * self.chunk
            part = x[start:start + self.chunk]
            block = part.reshape(1, -1)  # the reference's row of its 2-D view
            minmax[c, 0] = block.min(axis=1)[0]
            minmax[c, 1] = block.max(axis=1)[0]
            cpu_native.minmax_encode(part, self.chunk, minmax[c:c + 1],
                                     codes[start:start + part.size])
        return MinMaxCode(minmax, codes)

    def encode_reference(self, x: np.ndarray) -> MinMaxCode:
        """:meth:`encode` in NumPy (the reference)."""
        minmax = self._minmax(x)
        x = np.asarray(x)
        codes = np.empty(x.size, dtype=np.uint8)
        for first, block in self._blocks(x):
            rows = slice(first, first + block.shape[0])
            scale, upper, lower = _scales(minmax[rows], self.levels)
            with np.errstate(over="ignore", invalid="ignore"):
                level = block * scale[:, None]
                np.rint(level, out=level)
                np.minimum(level, upper[:, None], out=level)
                level -= lower[:, None]
                np.clip(level, 0.0, self.levels, out=level)
            start = first * self.chunk
            codes[start:start + block.size] = level.reshape(-1)
        return MinMaxCode(minmax, codes)

    def _check(self, code: MinMaxCode) -> None:
        count = code.codes.size
        if code.minmax.shape != (self.chunks(count), 2):
            raise ValueError(f"{self.name} code has {code.minmax.shape[0]} chunk headers for "
                             f"{count} elements in chunks of {self.chunk}")

    def decode(self, code: MinMaxCode, out: np.ndarray | None = None) -> np.ndarray:
        """float32 values of ``code``: ``(code + lower) / scale`` per chunk (compiled
        where built, else :meth:`decode_reference`)."""
        self._check(code)
        if out is None:
            out = np.empty(code.codes.size, dtype=np.float32)
        if self.levels == LEVELS and cpu_native.minmax_decode(code.codes, self.chunk,
                                                              code.minmax, out):
            return out
        return self.decode_reference(code, out)

    def add_decoded(self, code: MinMaxCode, total: np.ndarray) -> bool:
        """``total += decode(code)`` in one compiled pass (what
        :func:`~.half.sum_decoded` adds), equal to decoding then adding; returns whether
        it ran (False: the caller decodes and adds)."""
        if code.codes.size != total.size or self.levels != LEVELS:
            return False
        self._check(code)
        return cpu_native.minmax_decode(code.codes, self.chunk, code.minmax, total,
                                        accumulate=True)

    def decode_reference(self, code: MinMaxCode, out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`decode` in NumPy (the reference)."""
        self._check(code)
        count = code.codes.size
        if out is None:
            out = np.empty(count, dtype=np.float32)
        for first, block in self._blocks(code.codes):
            scale, _, lower = _scales(code.minmax[first:first + block.shape[0]], self.levels)
            start = first * self.chunk
            view = out[start:start + block.size].reshape(block.shape)
            np.add(block, lower[:, None], out=view, dtype=np.float32)
            view /= scale[:, None]
        return out


class MinMaxUInt4Codec(MinMaxUInt8Codec):
    """``int4``: per chunk min and max, one 4-bit code per element, two to a byte."""

    name = "int4"
    levels = np.float32(15.0)

    def code_bytes(self, count: int) -> int:
        """Bytes of ``count`` 4-bit codes on the wire (two to a byte)."""
        return (count + 1) // 2

    def pack(self, code: MinMaxCode) -> np.ndarray:
        """Every chunk's min and max, then the codes two to a byte (even index low)."""
        codes = code.codes
        pairs = np.zeros(self.code_bytes(codes.size) * 2, dtype=np.uint8)
        pairs[:codes.size] = codes
        nibbles = pairs[0::2] | (pairs[1::2] << 4)
        return np.concatenate([code.minmax.reshape(-1).view(np.uint8), nibbles])

    def unpack(self, buffer: np.ndarray, count: int) -> MinMaxCode:
        """The inverse of :meth:`pack` for ``count`` elements."""
        chunks = self.chunks(count)
        head = chunks * HEADER_BYTES
        if buffer.size != head + self.code_bytes(count):
            raise ValueError(f"int4 buffer holds {buffer.size} bytes, expected "
                             f"{head + self.code_bytes(count)}")
        minmax = np.ascontiguousarray(buffer[:head]).view(np.float32).reshape(chunks, 2)
        nibbles = buffer[head:]
        codes = np.empty(2 * nibbles.size, dtype=np.uint8)
        codes[0::2] = nibbles & 0x0F
        codes[1::2] = nibbles >> 4
        return MinMaxCode(minmax, codes[:count])
