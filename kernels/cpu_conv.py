"""The CPU convolution: channel-major planes, im2col as one strided copy, GEMMs by chunks.

Layout. Activations between the CPU layers are kept *channel-major* in
memory, (C, N, H, W), and handed on as the NCHW-indexed view
``planes.transpose(1, 0, 2, 3)``: values and indexing are NCHW as every
layer's contract says, only the strides differ. In that layout each
channel's images are one run of memory, so the convolution needs no
transposes: its GEMM output (C_out, N*H*W) *is* the next layer's input.

Forward. The input is copied once into zero-padded planes of shape
(C, N * Hp * Wp + tail). Stride 1 uses *wide rows*: output columns are
computed for the full padded width ``Wp`` (``k - 1`` of them per row are
discarded), so the k x k window (ki, kj) of every output of a sample is the
contiguous run of its plane starting at ``ki * Wp + kj`` and im2col is ONE
``np.copyto`` from an ``as_strided`` view of the planes, with rows of
``OH * Wp`` elements, instead of k*k strided copies of short rows. A stride
above 1 has compact columns (the view then has strided rows). The column
matrix is built and multiplied by chunks of samples sized to stay in the
core's L2 cache (:data:`CHUNK_BYTES`), so the copy writes and the GEMM reads
cache rather than memory; the bias is added while the valid columns are
copied out.

Backward. Training keeps the forward pass's column matrix when it is small
(:data:`KEEP_COLUMNS_BYTES`; the chunks are written into one array, each
still in cache when its GEMM reads it), so the weight gradient is one GEMM
of the output gradient, laid out like those columns with zeros in the
discarded ones, by that matrix; a larger one is built again chunk by chunk
and the chunks' GEMMs summed. The input
gradient is ``W^T @ dy`` over wide rows whenever the stride is 1 (even where
the forward pass used compact columns), folded back (col2im) by chunks: k*k
in-place additions per chunk, each of one contiguous run per (channel,
sample). The discarded columns contribute exact zeros.

The arithmetic is the textbook im2col convolution's (Chellapilla et al.
2006, "High performance convolutional neural networks for document
processing"); only the order in which BLAS sums a long dot product differs
from one big GEMM, so float32 results can differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from numpy.lib.stride_tricks import as_strided

#: Bytes of one chunk's column matrix (about half of this machine's 1 MiB L2 per core).
CHUNK_BYTES = 512 * 1024
#: Training keeps a convolution's column matrix up to this size for the weight
#: gradient; a larger one (a ResNet's first stage: 31 MB) is built again by chunks.
KEEP_COLUMNS_BYTES = 8 * 1024 * 1024
#: Narrower outputs than this fraction of the padded width get compact columns: the
#: discarded columns of wide rows would cost more GEMM work than the strided copy saves.
WIDE_MIN = 0.75
#: Bytes of one chunk of the backward pass's column matrices: the weight gradient's
#: GEMM and the col2im additions run per chunk, and both lose more to short calls
#: than they gain from the cache below a few MiB.
BACKWARD_CHUNK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ConvGeometry:
    """Sizes of one convolution of an (n, c, h, w) input: padded planes and column pitch."""

    n: int
    c: int
    h: int
    w: int
    k: int
    pad: int
    stride: int
    #: Wide rows or compact columns; None: the rule of :attr:`wide`.
    wide_rows: bool | None = None

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
    def wide(self) -> bool:
        """Wide rows: stride 1 and few discarded columns (``OW / Wp`` at least :data:`WIDE_MIN`)."""
        if self.wide_rows is not None:
            return self.wide_rows and self.stride == 1
        return self.stride == 1 and self.ow >= WIDE_MIN * self.wp

    def folding(self) -> ConvGeometry:
        """The geometry of the input gradient's fold: wide rows whenever the stride is 1
        (each window offset one contiguous run, whatever the forward pass used)."""
        return replace(self, wide_rows=self.stride == 1)

    @property
    def pitch(self) -> int:
        """Columns per output row in the column matrix: ``Wp`` (wide rows) or ``OW``."""
        return self.wp if self.wide else self.ow

    @property
    def plane(self) -> int:
        """Elements of one padded image of one channel."""
        return self.hp * self.wp

    @property
    def per_sample(self) -> int:
        """Columns of the column matrix per sample."""
        return self.oh * self.pitch

    @property
    def rows(self) -> int:
        """Rows of the column matrix (C * k * k)."""
        return self.c * self.k * self.k

    @property
    def planes_shape(self) -> tuple[int, int]:
        """Padded planes with one zero plane as a tail: wide rows reach up to ``k - 2``
        elements past a sample's plane, and a window offset's view (:func:`fold`) is a
        slice of whole planes starting up to ``(k - 1) * (Wp + 1)`` elements in."""
        return (self.c, (self.n + 1) * self.plane)

    def chunk(self, itemsize: int, budget: int | None = None) -> int:
        """Samples per chunk whose column matrix fits ``budget`` bytes (default
        :data:`CHUNK_BYTES`; at least 1)."""
        budget = CHUNK_BYTES if budget is None else budget
        return max(1, min(self.n, budget // (self.rows * self.per_sample * itemsize)))


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    """(first sample, sample count) of each chunk of ``size`` samples out of ``n``."""
    for first in range(0, n, size):
        yield first, min(size, n - first)


def fill_planes(planes: np.ndarray, x: np.ndarray, g: ConvGeometry) -> None:
    """Copy NCHW-indexed ``x`` (any strides) into the interior of zero-bordered ``planes``."""
    interior = planes[:, : g.n * g.plane].reshape(g.c, g.n, g.hp, g.wp)
    p = g.pad
    np.copyto(interior[:, :, p : p + g.h, p : p + g.w], x.transpose(1, 0, 2, 3))


def _windows(planes: np.ndarray, g: ConvGeometry, first: int, count: int) -> np.ndarray:
    """The im2col view of samples ``first .. first+count-1``: (c, k, k, count, oh, pitch).

    Element [ch, i, j, b, oy, ox] is planes[ch, (first+b)*plane + (oy*s+i)*Wp + ox*s + j];
    it never reaches past the planes' zero tail (:attr:`ConvGeometry.planes_shape`).
    """
    it, s = planes.itemsize, g.stride
    return as_strided(planes[:, first * g.plane :],
                      shape=(g.c, g.k, g.k, count, g.oh, g.pitch),
                      strides=(planes.strides[0], g.wp * it, it, g.plane * it, s * g.wp * it,
                               s * it), writeable=False)


def _window(planes: np.ndarray, g: ConvGeometry, first: int, count: int, ki: int,
            kj: int) -> np.ndarray:
    """Window offset (ki, kj)'s writeable (c, count, oh, pitch) view of ``planes``, by
    slicing (cheaper than ``as_strided``, and bounds-checked by NumPy)."""
    if g.wide:  # one run of oh * Wp elements per (channel, sample)
        start = first * g.plane + ki * g.wp + kj
        runs = planes[:, start : start + count * g.plane].reshape(g.c, count, g.plane)
        return runs[:, :, : g.per_sample].reshape(g.c, count, g.oh, g.pitch)
    s = g.stride
    images = planes[:, first * g.plane : (first + count) * g.plane]
    images = images.reshape(g.c, count, g.hp, g.wp)
    return images[:, :, ki : ki + (g.oh - 1) * s + 1 : s, kj : kj + (g.ow - 1) * s + 1 : s]


def columns(cols: np.ndarray, planes: np.ndarray, g: ConvGeometry, first: int,
            count: int) -> np.ndarray:
    """im2col of ``count`` samples into ``cols`` (rows x at least count*per_sample): one copy.

    Returns the (rows, count * per_sample) matrix (a view of ``cols``).
    """
    out = cols[:, : count * g.per_sample]
    np.copyto(out.reshape(g.c, g.k, g.k, count, g.oh, g.pitch), _windows(planes, g, first, count))
    return out


def fold(dplanes: np.ndarray, dcols: np.ndarray, g: ConvGeometry, first: int,
         count: int) -> None:
    """col2im: add a (rows, count*per_sample) column gradient onto ``dplanes``, in (ki, kj)
    order; each window offset is one in-place addition over every channel and sample."""
    parts = dcols.reshape(g.c, g.k, g.k, count, g.oh, g.pitch)
    for i in range(g.k):
        for j in range(g.k):
            dst = _window(dplanes, g, first, count, i, j)
            np.add(dst, parts[:, i, j], out=dst)


def interior(planes: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """The NCHW-indexed view of the unpadded images in ``planes`` (channel-major memory)."""
    p = g.pad
    full = planes[:, : g.n * g.plane].reshape(g.c, g.n, g.hp, g.wp)
    return full[:, :, p : p + g.h, p : p + g.w].transpose(1, 0, 2, 3)


def channel_major(x: np.ndarray) -> np.ndarray:
    """``x`` (NCHW-indexed) as its (C, N, H, W) view: contiguous when ``x`` came from a CPU
    layer of this package (see the module docstring)."""
    return x.transpose(1, 0, 2, 3)
