"""Outer SGD with momentum, plain (SlowMo) or Nesterov (DiLoCo), on the pseudo-gradient.

The pseudo-gradient is the issue of a round, written as DiLoCo writes it (Douillard et
al. 2023, arXiv 2311.08105, Alg. 1): ``Delta = theta_global - mean_i theta_i``, the
anchor minus the replicas' average, a descent direction like a gradient. It is formed
from the averager's ``delta_sum = sum_i (theta_i - theta_global)`` (Oscars' convention,
:class:`~syncbench.algorithms.outer.global_step.GlobalStep`'s) as
``Delta = delta_sum * (-1 / count)``; negation is exact, so both conventions give the
same bits. Then ``torch.optim.SGD``'s step with ``dampening`` 0, operation for
operation (``torch/optim/sgd.py``, ``_single_tensor_sgd``):

    b <- Delta                      (first step: the buffer is a copy)
    b <- mu * b + Delta             (later steps)
    d <- Delta + mu * b  (Nesterov)  or  d <- b
    theta_global <- theta_global - lr * d

- SlowMo (Wang et al., ICLR 2020, arXiv 1910.00643, Alg. 1): slow learning rate
  ``alpha`` = ``lr``, slow momentum ``beta`` = ``mu``, plain momentum. The paper scales
  the buffer's input by 1/gamma (the base learning rate) and its output by gamma; with
  a constant gamma the two cancel, and this is fairscale's ``SlowMoDistributedDataParallel``
  form (an ``SGD`` on the pseudo-gradient). ``alpha`` 1, ``beta`` 0 is Local SGD.
- DiLoCo: Nesterov with lr 0.7 and momentum 0.9, OpenDiLoCo's defaults
  (``PrimeIntellect-ai/OpenDiloco``, ``outer_lr``, ``SGD(nesterov=True)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.outer import OuterOptimizer


class OuterSGD(OuterOptimizer):
    """SGD with (Nesterov) momentum on the averaged pseudo-gradient; owns the buffer."""

    def __init__(self, lr: float, momentum: float, nesterov: bool, like: Any) -> None:
        if not lr > 0:
            raise ValueError(f"outer learning rate must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        self.lr, self.momentum, self.nesterov = float(lr), float(momentum), bool(nesterov)
        #: The momentum buffer b (meaningful once :attr:`steps` > 0).
        self.buffer = like * 0
        self.steps = 0
        self._delta = like * 0
        self._scratch = like * 0

    def step(self, anchor: Any, delta_sum: Any, count: float) -> None:
        """``anchor -= lr * d`` from ``Delta = -delta_sum / count`` (module docstring)."""
        delta = np.multiply(delta_sum, -1.0 / count, out=self._delta)
        direction = delta
        if self.momentum:
            if self.steps == 0:
                self.buffer[...] = delta
            else:
                self.buffer *= self.momentum
                self.buffer += delta
            if self.nesterov:
                direction = np.multiply(self.buffer, self.momentum, out=self._scratch)
                direction += delta
            else:
                direction = self.buffer
        self.steps += 1
        scaled = np.multiply(direction, -self.lr, out=self._scratch)
        anchor += scaled

    def state(self) -> dict[str, Any]:
        """The momentum buffer and the step count."""
        return {"outer_buffer": self.buffer, "outer_steps": self.steps}

    def load_state(self, state: dict[str, Any]) -> None:
        self.buffer[...] = state["outer_buffer"]
        self.steps = int(state["outer_steps"])
