"""The CPU convolution: batch-innermost planes, im2col as one strided copy, GEMMs by chunks.

Layout. Activations between the CPU layers are kept *batch-innermost* in
memory, (C, H, W, N) (the "CHWN" layout of cuda-convnet, Krizhevsky 2012),
and handed on as the NCHW-indexed view ``stored.transpose(3, 0, 1, 2)``
(:func:`nchw`): values and indexing are NCHW as every layer's contract says,
only the strides differ. In that layout the k x k window (ki, kj) of one
output row ``oy`` of every output column and every sample is ONE contiguous
run of ``OW * N`` elements of the padded input (stride 1; ``N`` elements at
a larger stride), so im2col copies runs of kilobytes rather than rows of a
few elements, no column is computed and thrown away, and the GEMM's output
(C_out, OH * OW * N) *is* the next layer's input. Pooling, BatchNorm and the
element-wise layers work on the same layout (each channel is one run), and
flattening for a dense layer is a free transpose: (C*H*W, N) is ``x^T``.

Forward. The input is copied once into zero-padded planes of shape
(C, Hp, Wp, N). The column matrix (C*k*k, OH*OW*N) is built and multiplied
by chunks of output rows (:func:`chunk_budget`): each chunk is one
``np.copyto`` from an ``as_strided`` view of the planes, and its GEMM writes
straight into the output's rows for those output rows, where the bias (and
a fused ReLU) is applied while they are still in cache.

Backward. Training keeps the forward pass's column matrix when it is small
(:data:`KEEP_COLUMNS_BYTES`), so the weight gradient is one GEMM of the
output gradient by that matrix; a larger one is built again chunk by chunk
and the chunks' GEMMs summed. The input gradient is ``W^T @ dy`` by chunks
of output rows, folded back (col2im) with k*k in-place additions per chunk,
each over runs of ``OW * N`` elements; a stride-1 convolution whose gradient
columns are no larger (a ResNet's 3 x 3) instead convolves the padded output
gradient with the flipped kernel (:func:`convolve`, ``Conv2d``).

The arithmetic is the textbook im2col convolution's (Chellapilla et al.
2006, "High performance convolutional neural networks for document
processing"); only the order in which BLAS sums a long dot product differs
from one big GEMM, so float32 results can differ in the last bits.
Measured in docs/RESULTS.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

#: Bytes of one chunk's column matrix where the chunks land in a column matrix training
#: keeps whole: with runs of OW*N elements a GEMM over more columns gains more than an
#: L2-sized chunk (512 KiB) saves (docs/RESULTS.md).
CHUNK_BYTES = 4 * 1024 * 1024
#: Bytes of one chunk where one chunk-sized buffer is filled and multiplied again and
#: again (a column matrix too large to keep, built in the forward pass and again for
#: the weight gradient; the convolution-shaped input gradient's): a chunk that stays in
#: the core's L2 cache between its copy and its GEMM. 1 MiB made a ResNet-8 step 0.87x
#: as long as 4 MiB on a core with 2 MiB of L2 (docs/RESULTS.md).
STREAMED_CHUNK_BYTES = 1024 * 1024
#: Training keeps a convolution's column matrix up to this size for the weight
#: gradient; a larger one (a ResNet's first stage: 29 MB) is built again by chunks.
KEEP_COLUMNS_BYTES = 8 * 1024 * 1024
#: OpenBLAS multiplies without packing ("small matrix" kernels) when M*N*K is at most
#: 100^3 (kernel/x86_64/sgemm_small_kernel_permit_skylakex.c, used on AVX-512 cores):
#: for a first layer's GEMMs (6 x 25 by 1,792 columns per output row in LeNet) that
#: ran 2.5x the packed rate, so such a convolution multiplies by chunks of at most
#: this many multiply-adds (docs/RESULTS.md).
SMALL_GEMM_MNK = 1_000_000
#: Bytes of one chunk of col2im's column gradient (``W^T @ dy`` by chunks, each folded
#: back with k*k additions): LeNet's step lost 5 % with 1 MiB (docs/RESULTS.md).
BACKWARD_CHUNK_BYTES = 4 * 1024 * 1024


def stored(x: np.ndarray) -> np.ndarray:
    """The (C, H, W, N) view of NCHW-indexed ``x``: contiguous when ``x`` came from a CPU
    layer of this package (see the module docstring), strided otherwise."""
    return x.transpose(1, 2, 3, 0)


def nchw(planes: np.ndarray) -> np.ndarray:
    """The NCHW-indexed view of (C, H, W, N) ``planes`` (the inverse of :func:`stored`)."""
    return planes.transpose(3, 0, 1, 2)


@dataclass(frozen=True)
class ConvGeometry:
    """Sizes of one convolution of an (n, c, h, w) input: padded planes and columns."""

    n: int
    c: int
    h: int
    w: int
    k: int
    pad: int
    stride: int

    @property
    def hp(self) -> int:
        return self.h + 2 * self.pad

    @property
    def wp(self) -> int:
        return self.w + 2 * self.pad

    @property
    def oh(self) -> int:
        return (self.hp - self.k) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.wp - self.k) // self.stride + 1

    @property
    def per_row(self) -> int:
        """Columns of the column matrix per output row (``OW * N``)."""
        return self.ow * self.n

    @property
    def rows(self) -> int:
        """Rows of the column matrix (C * k * k)."""
        return self.c * self.k * self.k

    @property
    def planes_shape(self) -> tuple[int, int, int, int]:
        """The zero-padded input, (C, Hp, Wp, N)."""
        return (self.c, self.hp, self.wp, self.n)

    def chunk(self, itemsize: int, budget: int | None = None) -> int:
        """Output rows per chunk whose column matrix fits ``budget`` bytes (default
        :data:`CHUNK_BYTES`; at least 1)."""
        budget = CHUNK_BYTES if budget is None else budget
        return max(1, min(self.oh, budget // (self.rows * self.per_row * itemsize)))


def small_gemm_rows(g: ConvGeometry, outputs: int) -> int:
    """The most output rows whose GEMM of ``outputs`` rows by the column matrix stays within
    :data:`SMALL_GEMM_MNK`, when one output row does; else every output row (no limit)."""
    small = SMALL_GEMM_MNK // (outputs * g.rows * g.per_row)
    return min(g.oh, small) if small >= 1 else g.oh


def gemm_chunk(g: ConvGeometry, outputs: int, itemsize: int, budget: int) -> int:
    """Output rows per chunk of a GEMM of ``outputs`` rows by the column matrix: those
    ``budget`` bytes of columns hold, and no more than :func:`small_gemm_rows`."""
    return min(g.chunk(itemsize, budget), small_gemm_rows(g, outputs))


def chunk_budget(kept: bool) -> int:
    """Bytes of one chunk of columns: :data:`CHUNK_BYTES` for chunks written into a kept
    column matrix, :data:`STREAMED_CHUNK_BYTES` for one buffer reused per chunk."""
    return CHUNK_BYTES if kept else STREAMED_CHUNK_BYTES


def chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    """(first, count) of each chunk of ``size`` out of ``total`` (output rows)."""
    for first in range(0, total, size):
        yield first, min(size, total - first)


def fill_planes(planes: np.ndarray, x: np.ndarray, g: ConvGeometry) -> None:
    """Copy NCHW-indexed ``x`` (any strides) into the interior of zero-bordered ``planes``."""
    p = g.pad
    np.copyto(planes[:, p : p + g.h, p : p + g.w], stored(x))


def _windows(planes: np.ndarray, g: ConvGeometry, first: int, count: int) -> np.ndarray:
    """The im2col view of output rows ``first .. first+count-1``: (c, k, k, count, ow, n).

    Element [ch, i, j, oy, ox, b] is planes[ch, (first+oy)*s + i, ox*s + j, b].
    """
    it, s = planes.itemsize, g.stride
    row, col = g.wp * g.n * it, g.n * it
    return as_strided(planes[:, first * s :], shape=(g.c, g.k, g.k, count, g.ow, g.n),
                      strides=(planes.strides[0], row, col, s * row, s * col, it),
                      writeable=False)


def _window(planes: np.ndarray, g: ConvGeometry, first: int, count: int, ki: int,
            kj: int) -> np.ndarray:
    """Window offset (ki, kj)'s writeable (c, count, ow, n) view of ``planes`` for output rows
    ``first .. first+count-1``, by slicing (bounds-checked by NumPy)."""
    s = g.stride
    top = first * s + ki
    return planes[:, top : top + (count - 1) * s + 1 : s, kj : kj + (g.ow - 1) * s + 1 : s]


def columns(cols: np.ndarray, planes: np.ndarray, g: ConvGeometry, first: int,
            count: int) -> np.ndarray:
    """im2col of ``count`` output rows into ``cols`` (rows x at least count*per_row): one copy.

    Returns the (rows, count * per_row) matrix (a view of ``cols``).
    """
    out = cols[:, : count * g.per_row]
    np.copyto(out.reshape(g.c, g.k, g.k, count, g.ow, g.n), _windows(planes, g, first, count))
    return out


def convolve(weight: np.ndarray, planes: np.ndarray, g: ConvGeometry, cols: np.ndarray,
             out: np.ndarray, size: int, keep: bool = False) -> Iterator[tuple[slice, np.ndarray]]:
    """``out = weight @ im2col(planes)`` by chunks of ``size`` output rows (the caller's
    :func:`gemm_chunk`, which sized ``cols``), yielding each chunk's columns of ``out`` (a
    (rows, OH*OW*N) matrix) and that block right after its GEMM, so the caller can finish
    it (bias, ReLU) while it is in cache. ``cols`` holds one chunk's columns, or every
    chunk's (``keep``: at their place, for the weight gradient)."""
    for first, count in chunks(g.oh, size):
        span = slice(first * g.per_row, (first + count) * g.per_row)
        where = cols[:, span.start :] if keep else cols
        yield span, np.matmul(weight, columns(where, planes, g, first, count), out=out[:, span])


def fold(dplanes: np.ndarray, dcols: np.ndarray, g: ConvGeometry, first: int,
         count: int) -> None:
    """col2im: add a (rows, count*per_row) column gradient onto ``dplanes``, in (ki, kj)
    order; each window offset is one in-place addition over every channel and sample."""
    parts = dcols.reshape(g.c, g.k, g.k, count, g.ow, g.n)
    for i in range(g.k):
        for j in range(g.k):
            dst = _window(dplanes, g, first, count, i, j)
            np.add(dst, parts[:, i, j], out=dst)


def interior(planes: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """The NCHW-indexed view of the unpadded images in ``planes``."""
    p = g.pad
    return nchw(planes[:, p : p + g.h, p : p + g.w])
