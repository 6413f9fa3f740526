"""BatchNorm's passes on the CPU, over one contiguous row per channel, (C, H*W*N), in place.

The NumPy references of :mod:`syncbench.kernels.ops` (``bn_sums``,
``bn_normalize``, ``bn_grad_sums``, ``bn_backward``) take NCHW arrays and
allocate every intermediate; they are the oracle of the CUDA kernels. The
CPU layer runs these instead: the same quantities on each channel's
contiguous row (the layout the CPU convolution hands on,
:mod:`syncbench.kernels.cpu_conv`), writing into work arrays the layer keeps.

Memory, not arithmetic, bounds these passes: a ResNet's first-stage
activation is 3.2 MB (16 x 28 x 28 x 64 float32), more than a core's L2, so
a pass of its own over each array reads it from L3 or DRAM again. Each
function therefore runs all its passes over one block of columns
(:data:`BLOCK_BYTES` of each row set) before the next, so an array is
fetched from memory once per function and the other passes hit L2.

Training keeps one array from the forward pass, ``work = x - shift`` (the
rows about the running mean, which the statistics need anyway) instead of
``xhat``: with ``centred = mean - shift``, ``xhat = (work - centred) *
invstd`` is never stored. The forward pass is ``work`` and its two sums
(the sum of squares an ``einsum`` without a squared temporary), then the
affine ``y = work * a + (beta - centred * a)`` with ``a = gamma * invstd``
and the fused ReLU. PyTorch's CPU kernel applies the same folded affine
(``batch_norm_cpu_transform_input``: ``alpha = invstd * weight``, ``beta =
bias - mean * alpha``); here it is about the running mean, so the two terms
of ``y`` stay of the data's spread. The backward pass masks ``dy`` by the
ReLU, gets ``sum(dy * xhat) = invstd * (sum(dy * work) - centred *
sum(dy))`` and ``dx = a * dy + k1 * work + k0`` (the reference's ``a * (dy -
mean_dy - xhat * mean_dy_xhat)`` expanded). Partial sums per block are added
in block order. Results equal the references' to rounding. Measured in
docs/RESULTS.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from syncbench.kernels import cpu_native
from syncbench.kernels.ops import relu_in_place

#: Bytes of one block of columns of one (C, width) array: several such blocks (input,
#: work, output, mask, scratch) stay in a core's L2 cache together.
BLOCK_BYTES = 512 * 1024


def block_width(rows: np.ndarray) -> int:
    """Columns of one block of (C, width) ``rows``: :data:`BLOCK_BYTES` of them, or all."""
    return max(1, min(rows.shape[1], BLOCK_BYTES // (rows.shape[0] * rows.itemsize)))


def blocks(rows: np.ndarray) -> Iterator[slice]:
    """Column ranges of (C, width) ``rows`` of :func:`block_width` columns (the last fewer)."""
    width, step = rows.shape[1], block_width(rows)
    for first in range(0, width, step):
        yield slice(first, min(width, first + step))


def _masked(dy: np.ndarray, mask: np.ndarray | None, tmp: np.ndarray) -> np.ndarray:
    """``dy * mask`` into ``tmp`` (``dy`` itself without a mask)."""
    if mask is None:
        return dy
    return np.multiply(dy, mask, out=tmp)


def sums_about(x: np.ndarray, shift: np.ndarray, work: np.ndarray) -> np.ndarray:
    """(2, C): per row ``sum(x - shift)`` and ``sum((x - shift)**2)``, leaving ``x - shift``
    in ``work`` (x's shape) for :func:`normalize_centred` and the backward pass."""
    if cpu_native.rows_usable(x, work):
        return cpu_native.bn_sums_about(x, shift, work)
    sums = np.zeros((2, x.shape[0]), dtype=x.dtype)
    shift = shift[:, None]
    for b in blocks(x):
        w = np.subtract(x[:, b], shift, out=work[:, b])
        sums[0] += w.sum(axis=1)
        sums[1] += np.einsum("ij,ij->i", w, w)
    return sums


def affine(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, y: np.ndarray,
           mask: np.ndarray | None = None) -> None:
    """``y = x * scale + offset`` per row, then the fused ReLU keeping its ``mask`` if one is
    given (:func:`~syncbench.kernels.ops.relu_in_place`)."""
    if cpu_native.rows_usable(x, y, mask):
        cpu_native.bn_affine(x, scale, offset, y, mask)
        return
    scale, offset = scale[:, None], offset[:, None]
    for b in blocks(x):
        yb = np.multiply(x[:, b], scale, out=y[:, b])
        yb += offset
        if mask is not None:
            relu_in_place(yb, mask[:, b])


def normalize_centred(work: np.ndarray, centred: np.ndarray, invstd: np.ndarray,
                      gamma: np.ndarray, beta: np.ndarray, y: np.ndarray,
                      mask: np.ndarray | None = None) -> np.ndarray:
    """``y = gamma * (work - centred) * invstd + beta`` per row, as one affine of ``work``
    (then the fused ReLU with ``mask``); returns the scale ``gamma * invstd``."""
    scale = gamma * invstd
    affine(work, scale, beta - centred * scale, y, mask)
    return scale


def grad_sums(dy: np.ndarray, work: np.ndarray, centred: np.ndarray, invstd: np.ndarray,
              mask: np.ndarray | None, tmp: np.ndarray) -> np.ndarray:
    """(2, C): per row ``sum(g)`` and ``sum(g * xhat)`` of ``g = dy * mask`` (``dy`` without
    a mask), with ``xhat = (work - centred) * invstd`` (``xhat`` is not formed; ``tmp``:
    scratch of one block or more)."""
    if cpu_native.rows_usable(dy, work, mask):
        sums = cpu_native.bn_grad_sums(dy, work, mask)
        sums[1] = invstd * (sums[1] - centred * sums[0])
        return sums
    sums = np.zeros((2, dy.shape[0]), dtype=dy.dtype)
    for b in blocks(dy):
        g = _masked(dy[:, b], None if mask is None else mask[:, b], tmp[:, : b.stop - b.start])
        sums[0] += g.sum(axis=1)
        sums[1] += np.einsum("ij,ij->i", g, work[:, b])
    sums[1] = invstd * (sums[1] - centred * sums[0])
    return sums


def input_grad(dy: np.ndarray, work: np.ndarray, centred: np.ndarray, invstd: np.ndarray,
               scale: np.ndarray, mean_dy: np.ndarray, mean_dy_xhat: np.ndarray,
               out: np.ndarray, tmp: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """``out = scale * (g - mean_dy - xhat * mean_dy_xhat)`` per row of ``g = dy * mask``,
    with ``xhat = (work - centred) * invstd``, as ``scale * g + k1 * work + k0`` (``tmp``:
    scratch of one block or more)."""
    k1 = -scale * invstd * mean_dy_xhat
    k0 = (-scale * mean_dy - k1 * centred)[:, None]
    if cpu_native.rows_usable(dy, work, out, mask):
        cpu_native.bn_input_grad(dy, work, mask, scale, k1, k0[:, 0], out)
        return out
    k1, scale = k1[:, None], scale[:, None]
    for b in blocks(dy):
        t = tmp[:, : b.stop - b.start]
        g = _masked(dy[:, b], None if mask is None else mask[:, b], t)
        ob = np.multiply(g, scale, out=out[:, b])
        np.multiply(work[:, b], k1, out=t)
        t += k0
        ob += t
    return out
