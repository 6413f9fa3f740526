"""The plain outer step: ``anchor += lr * delta_sum / count`` (Oscars' ``--global-lr``;
with ``lr`` 1, the replicas' average)."""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.outer import OuterOptimizer
from syncbench.kernels.ops import axpy_


class GlobalStep(OuterOptimizer):
    """``anchor += (lr / count) * delta_sum`` in one fused pass (``axpy_``)."""

    def __init__(self, lr: float, like: Any) -> None:
        if not lr > 0:
            raise ValueError(f"--global-lr must be > 0, got {lr}")
        self.lr = float(lr)
        self._scratch = like * 0

    def step(self, anchor: Any, delta_sum: Any, count: float) -> None:
        axpy_(anchor, self.lr / count, delta_sum, self._scratch)
