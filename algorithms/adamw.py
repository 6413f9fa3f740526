"""AdamW, the adaptive local optimizer: Adam with decoupled weight decay over one flat buffer.

Loshchilov and Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019), Alg. 2, as
PyTorch's ``torch.optim.AdamW`` computes it (``torch/optim/adam.py``,
``_single_tensor_adam`` with ``decoupled_weight_decay``, no ``amsgrad``), operation for
operation, so that the float64 results agree to rounding:

    w   <- w * (1 - lr * wd)                      (decoupled decay, before the moments)
    m   <- m + (1 - beta1) * (g - m)              (``exp_avg.lerp_``)
    v   <- beta2 * v + (1 - beta2) * g * g        (``exp_avg_sq``)
    t   <- t + 1
    w   <- w - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

The decay follows ``--wd-exempt`` as :class:`~syncbench.algorithms.optimizer.MomentumSGD`'s
does (``decay_mask``: an exempt element decays by 0, as a PyTorch parameter group with
``weight_decay=0``). DiLoCo's inner optimizer (Douillard et al. 2023, arXiv 2311.08105).

On the GPU backend the step is one fused CUDA kernel (:func:`syncbench.kernels.ops.adamw_`
dispatches CuPy arrays to it, as :func:`~syncbench.kernels.ops.sgd_momentum_` does for
momentum SGD).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.lr_schedule import LRClock, LRSchedule
from syncbench.algorithms.optimizer import FLUSH_SUBNORMALS_EVERY
from syncbench.kernels import cpu_native
from syncbench.kernels.ops import adamw_, flush_subnormals_


def check_adamw(beta1: float, beta2: float, eps: float) -> None:
    """``ValueError`` (one line) for AdamW hyper-parameters PyTorch would refuse, and eps 0."""
    checks = [
        (0 <= beta1 < 1, f"--beta1 must be in [0, 1), got {beta1}"),
        (0 <= beta2 < 1, f"--beta2 must be in [0, 1), got {beta2}"),
        (eps > 0, f"--eps must be > 0, got {eps}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


class AdamW:
    """AdamW over a flat buffer; owns the two moments, the step count and two scratches.

    :attr:`moments` are what ``--momentum-sync`` keeps, zeroes or averages at an
    averaging (both: :func:`~syncbench.algorithms.averagers.sync_momentum`).
    """

    def __init__(self, like: Any, lr: float, weight_decay: float, betas: tuple[float, float],
                 eps: float, decay_mask: Any = None, schedule: LRSchedule | None = None) -> None:
        beta1, beta2 = float(betas[0]), float(betas[1])
        check_adamw(beta1, beta2, float(eps))
        self.weight_decay, self.eps = weight_decay, float(eps)
        #: ``--lr`` under ``--lr-schedule`` (its own count: ``steps`` restarts at a reset).
        self.clock = LRClock(lr, schedule)
        self.beta1, self.beta2 = beta1, beta2
        self.exp_avg = like * 0
        self.exp_avg_sq = like * 0
        #: Steps taken (PyTorch's ``state["step"]``): the bias corrections' exponent.
        self.steps = 0
        self._num = like * 0
        self._den = like * 0
        #: What multiplies lr in the decay factor: a number, or one per element.
        self.decay: Any = weight_decay
        if decay_mask is not None and weight_decay:
            self.decay = decay_mask * weight_decay

    @property
    def lr(self) -> float:
        """``--lr``, the rate the schedule scales (:attr:`clock`)."""
        return self.clock.lr

    @property
    def velocity(self) -> Any:
        """The first moment."""
        return self.exp_avg

    @property
    def moments(self) -> tuple[Any, ...]:
        """The buffers ``--momentum-sync average`` averages: both moments."""
        return (self.exp_avg, self.exp_avg_sq)

    def reset_moments(self) -> None:
        """``--momentum-sync zero``: a fresh AdamW (both moments 0, bias corrections
        restarted)."""
        self.exp_avg[...] = 0
        self.exp_avg_sq[...] = 0
        self.steps = 0

    def step(self, params: Any, grads: Any, lr: float | None = None) -> None:
        """One AdamW step of ``params`` from ``grads``, in place: one compiled pass on the
        CPU (``kernels/cpu/adamw.c``, equal to :meth:`reference_step` to the bit) where
        the library is built; on the GPU one CUDA kernel (``kernels/cuda/optim.cu``'s
        ``adamw``, through :func:`~syncbench.kernels.ops.adamw_`, equal to it too); else
        the NumPy reference."""
        lr = self.clock.next_lr() if lr is None else lr
        self.steps += 1
        beta1, beta2 = self.beta1, self.beta2
        step_size = lr / (1 - beta1 ** self.steps)
        correction2_sqrt = (1 - beta2 ** self.steps) ** 0.5
        scalars = (1 - beta1, beta2, 1 - beta2, correction2_sqrt, self.eps, -step_size)
        if not cpu_native.adamw_(params, grads, self.exp_avg, self.exp_avg_sq, self.decay,
                                 lr, scalars):  # a GPU array: the CUDA kernel, else NumPy
            adamw_(params, grads, self.exp_avg, self.exp_avg_sq, self.decay, lr, scalars,
                   self._num, self._den)
        if self.steps % FLUSH_SUBNORMALS_EVERY == 0 and isinstance(params, np.ndarray):
            flush_subnormals_(self.exp_avg, self._num)  # as MomentumSGD's SubnormalFlush
            flush_subnormals_(self.exp_avg_sq, self._num)

    def reference_step(self, params: Any, grads: Any, lr: float,
                       scalars: tuple[float, ...]) -> None:
        """The NumPy reference of one step (the step count already advanced; the body is
        :func:`syncbench.kernels.ops.adamw_`'s); ``scalars`` as
        :func:`~syncbench.kernels.cpu_native.adamw_` takes them."""
        adamw_.reference(params, grads, self.exp_avg, self.exp_avg_sq, self.decay, lr,
                         scalars, self._num, self._den)

    def state(self) -> dict[str, Any]:
        """Resumable state: both moments and the step count (``velocity`` is the first)."""
        return {"velocity": self.exp_avg, "exp_avg_sq": self.exp_avg_sq,
                "adamw_steps": self.steps, **self.clock.state()}

    def load_state(self, state: dict[str, Any], asarray: Any) -> None:
        """Restore what :meth:`state` saved (``asarray``: host array -> this backend's)."""
        self.exp_avg[...] = asarray(state["velocity"])
        self.exp_avg_sq[...] = asarray(state["exp_avg_sq"])
        self.steps = int(state["adamw_steps"])
        self.clock.load_state(state)

