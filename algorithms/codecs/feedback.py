"""Error feedback: the part of a gradient a codec did not send is kept and added next step.

Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018), and
Lin et al., "Deep Gradient Compression" (ICLR 2018, arXiv 1712.01887): each
rank keeps a residual ``e``; at every step it compresses ``acc = g + e`` and
keeps ``e = acc - sent``. BytePS does the same around any compressor
(``byteps/common/compressor/impl/vanilla_error_feedback.cc``, there also
rescaled by the learning-rate ratio, which is not done here).

Conservation: ``sent`` is a subset of ``acc``'s entries copied exactly, so
``sent + e == acc`` bit for bit at every step, and over steps
``sum(sent) + e_final == sum(g)`` up to the rounding of the additions
``g + e`` in the memory's dtype. With a float64 memory and float32 gradients
those additions are exact unless a residual entry gathers more than 53
significant bits, so the balance holds exactly in float64 for ordinary
gradients; with the default float32 memory (the footprint of BytePS and of
PyTorch's PowerSGD error) it holds to float32 rounding of each addition.
"""

from __future__ import annotations

import numpy as np


class ErrorFeedback:
    """The residual memory of one rank for a vector of ``size`` elements."""

    def __init__(self, size: int, dtype: np.dtype | type = np.float32) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"error feedback size {size!r} is not a count >= 0")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"error feedback memory is float32 or float64, got {self.dtype}")
        #: The residual: what was left unsent so far.
        self.residual = np.zeros(int(size), dtype=self.dtype)

    def compensate(self, grad: np.ndarray) -> np.ndarray:
        """``grad + residual`` in the memory's dtype (a new array; ``grad`` is left alone)."""
        if grad.shape != self.residual.shape:
            raise ValueError(f"gradient of shape {grad.shape}, memory of {self.residual.shape}")
        return np.add(grad, self.residual, dtype=self.dtype)

    def keep_unsent(self, acc: np.ndarray, indices: np.ndarray, sent: np.ndarray) -> None:
        """Residual := ``acc`` less the values ``sent`` at ``indices``.

        ``sent`` are the values as they travel (float32); where the memory is
        float64 the difference ``acc - sent`` at a sent index is the part
        float32 could not carry (exact: the two are within a factor of 2).
        """
        self.residual = acc if acc.dtype == self.dtype else acc.astype(self.dtype)
        self.residual[indices] -= sent.astype(self.dtype)

    def keep(self, acc: np.ndarray, approx: np.ndarray) -> None:
        """Residual := ``acc - approx`` (dense codecs, e.g. PowerSGD's ``M - P Q^T``)."""
        self.residual = np.subtract(acc, approx, dtype=self.dtype)

    def norm(self) -> float:
        """L2 norm of the residual (recorded at evaluations), in float64."""
        return float(np.linalg.norm(self.residual.astype(np.float64)))
