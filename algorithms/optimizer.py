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

from syncbench.algorithms.lr_schedule import LRClock, LRSchedule
from syncbench.kernels.ops import flush_subnormals_, sgd_momentum_

#: Steps between two flushes of a velocity's subnormal elements (:class:`SubnormalFlush`).
FLUSH_SUBNORMALS_EVERY = 64


class SubnormalFlush:
    """Every :data:`FLUSH_SUBNORMALS_EVERY` calls, zero a CPU velocity's subnormal elements
    (:func:`~syncbench.kernels.ops.flush_subnormals_`: decayed momentum otherwise sticks
    there and slows every later update). Three passes every 64 steps instead of every
    step; a GPU array is left alone (its float32 units take subnormals at full speed).
    The count is not checkpointed: after a resume the flushes fall on other steps, which
    can change only values below ``finfo.tiny``."""

    def __init__(self, every: int = FLUSH_SUBNORMALS_EVERY) -> None:
        self.every, self.calls = every, 0

    def __call__(self, velocity: Any, scratch: Any) -> None:
        self.calls += 1
        if self.calls % self.every == 0 and isinstance(velocity, np.ndarray):
            flush_subnormals_(velocity, scratch)


class MomentumSGD:
    """Momentum SGD with weight decay over a flat buffer (owns velocity and scratch).

    ``decay_mask`` (flat, 1 where an element decays, 0 where it is exempt;
    :meth:`~syncbench.kernels.model.Model.decay_mask`) makes :attr:`decay` a
    per-element array, ``weight_decay * mask``: ``--wd-exempt``. ``schedule``
    (:mod:`~syncbench.algorithms.lr_schedule`) scales ``lr`` step by step.
    """

    def __init__(self, like: Any, lr: float, momentum: float, weight_decay: float,
                 decay_mask: Any = None, schedule: LRSchedule | None = None) -> None:
        self.momentum, self.weight_decay = momentum, weight_decay
        #: ``--lr`` under ``--lr-schedule``.
        self.clock = LRClock(lr, schedule)
        self.velocity = like * 0
        self.scratch = like * 0
        #: Zeroes the velocity's subnormal elements every few steps (its ``every``).
        self.subnormal_flush = SubnormalFlush()
        #: What multiplies the weights in the decay term: a number, or one per element.
        self.decay: Any = weight_decay
        if decay_mask is not None and weight_decay:
            self.decay = decay_mask * weight_decay

    @property
    def lr(self) -> float:
        """``--lr``, the rate the schedule scales (:attr:`clock`)."""
        return self.clock.lr

    def decay_of(self, weights: Any, out: Any) -> Any:
        """``decay * weights`` into ``out`` (the decay term of a step from ``weights``)."""
        return np.multiply(weights, self.decay, out=out)

    def step(self, params: Any, grads: Any, lr: float | None = None) -> None:
        """``params -= lr * (mu * v + g + wd * params)``, in place (and every 64 steps the
        velocity's subnormal elements zeroed: :class:`SubnormalFlush`); ``lr`` left out:
        ``--lr`` under the schedule."""
        sgd_momentum_(
            params,
            grads,
            self.velocity,
            self.clock.next_lr() if lr is None else lr,
            self.momentum,
            self.decay,
            self.scratch,
        )
        self.subnormal_flush(self.velocity, self.scratch)

    @property
    def moments(self) -> tuple[Any, ...]:
        """The buffers ``--momentum-sync average`` averages: the velocity."""
        return (self.velocity,)

    def reset_moments(self) -> None:
        """``--momentum-sync zero``: the velocity restarts at 0."""
        self.velocity[...] = 0

    def state(self) -> dict[str, Any]:
        """Resumable state: the velocity and the schedule's step count."""
        return {"velocity": self.velocity, **self.clock.state()}

    def load_state(self, state: dict[str, Any], asarray: Any) -> None:
        """Restore what :meth:`state` saved (``asarray``: host array -> this backend's)."""
        self.velocity[...] = asarray(state["velocity"])
        self.clock.load_state(state)
