"""The optimizer every strategy updates with: momentum SGD over one flat buffer.

Apart from the strategies (which import MPI through the communicator), so that
single-process code such as ``syncbench speed`` can step a model without MPI.
The update is PyTorch's ``torch.optim.SGD`` with momentum and weight decay
(``v = mu v + g + wd w``, ``w -= lr v``), one fused pass in
:func:`syncbench.kernels.ops.sgd_momentum_`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.kernels.ops import sgd_momentum_


class MomentumSGD:
    """Momentum SGD with weight decay over a flat buffer (owns velocity and scratch).

    ``decay_mask`` (flat, 1 where an element decays, 0 where it is exempt;
    :meth:`~syncbench.kernels.model.Model.decay_mask`) makes :attr:`decay` a
    per-element array, ``weight_decay * mask``: ``--wd-exempt``.
    """

    def __init__(self, like: Any, lr: float, momentum: float, weight_decay: float,
                 decay_mask: Any = None) -> None:
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.velocity = like * 0
        self.scratch = like * 0
        #: What multiplies the weights in the decay term: a number, or one per element.
        self.decay: Any = weight_decay
        if decay_mask is not None and weight_decay:
            self.decay = decay_mask * weight_decay

    def decay_of(self, weights: Any, out: Any) -> Any:
        """``decay * weights`` into ``out`` (the decay term of a step from ``weights``)."""
        return np.multiply(weights, self.decay, out=out)

    def step(self, params: Any, grads: Any, lr: float | None = None) -> None:
        """``params -= lr * (mu * v + g + wd * params)``, in place."""
        sgd_momentum_(
            params,
            grads,
            self.velocity,
            self.lr if lr is None else lr,
            self.momentum,
            self.decay,
            self.scratch,
        )
