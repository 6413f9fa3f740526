"""Fused element-wise operations over flat buffers (NumPy reference versions).

Every operation writes in place into preallocated buffers (an optional
``scratch`` of the same shape avoids temporaries), so the training hot loop
allocates nothing. These are the CPU implementations and the oracles that
the CUDA kernels are tested against.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sgd_momentum_(
    params: Any,
    grads: Any,
    velocity: Any,
    lr: float,
    momentum: float,
    weight_decay: float,
    scratch: Any = None,
) -> None:
    """Momentum SGD with L2 weight decay, in place (the PyTorch convention).

    ``v = mu * v + (g + wd * w)``; ``w = w - lr * v``. With ``momentum == 0``
    the velocity buffer just holds the decayed gradient. ``grads`` is left
    unchanged.
    """
    velocity *= momentum
    velocity += grads
    if weight_decay:
        velocity += np.multiply(params, weight_decay, out=scratch)
    params -= np.multiply(velocity, lr, out=scratch)


def axpy_(y: Any, alpha: float, x: Any, scratch: Any = None) -> None:
    """``y += alpha * x`` in place (model averaging, compensations)."""
    if alpha == 1.0:
        y += x
    else:
        y += np.multiply(x, alpha, out=scratch)
