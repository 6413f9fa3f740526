"""BatchNorm's passes on the CPU, over one contiguous row per channel, (C, H*W*N), in place.

The NumPy references of :mod:`syncbench.kernels.ops` (``bn_sums``,
``bn_normalize``, ``bn_grad_sums``, ``bn_backward``) take NCHW arrays and
allocate every intermediate; they are the oracle of the CUDA kernels. The
CPU layer runs these instead: the same formulas on each channel's contiguous
row (the layout the CPU convolution hands on, :mod:`syncbench.kernels.cpu_conv`),
writing into work arrays the layer keeps, with the per-row sums of squares
and products as one ``einsum`` pass each (no squared temporary). Results
equal the references' to rounding (the sums run in another order).
"""

from __future__ import annotations

import numpy as np


def sums_about(x: np.ndarray, shift: np.ndarray, work: np.ndarray) -> np.ndarray:
    """(2, C): per row ``sum(x - shift)`` and ``sum((x - shift)**2)`` (``work``: x's shape)."""
    np.subtract(x, shift[:, None], out=work)
    return np.stack([work.sum(axis=1), np.einsum("ij,ij->i", work, work)])


def normalize(x: np.ndarray, mean: np.ndarray, invstd: np.ndarray, gamma: np.ndarray,
              beta: np.ndarray, xhat: np.ndarray, y: np.ndarray) -> None:
    """``xhat = (x - mean) * invstd`` and ``y = xhat * gamma + beta`` per row, into the
    given arrays (``xhat`` may be None in evaluation: ``y`` is then the work array)."""
    target = y if xhat is None else xhat
    np.subtract(x, mean[:, None], out=target)
    target *= invstd[:, None]
    np.multiply(target, gamma[:, None], out=y)
    y += beta[:, None]


def grad_sums(dy: np.ndarray, xhat: np.ndarray) -> np.ndarray:
    """(2, C): per row ``sum(dy)`` and ``sum(dy * xhat)``."""
    return np.stack([dy.sum(axis=1), np.einsum("ij,ij->i", dy, xhat)])


def input_grad(dy: np.ndarray, xhat: np.ndarray, scale: np.ndarray, mean_dy: np.ndarray,
               mean_dy_xhat: np.ndarray, out: np.ndarray, work: np.ndarray) -> np.ndarray:
    """``out = scale * (dy - mean_dy - xhat * mean_dy_xhat)`` per row (the reference's order)."""
    np.subtract(dy, mean_dy[:, None], out=out)
    np.multiply(xhat, mean_dy_xhat[:, None], out=work)
    out -= work
    out *= scale[:, None]
    return out
