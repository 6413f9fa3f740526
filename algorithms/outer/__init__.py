"""Outer optimizers: what an averaged pseudo-gradient does to the parameters.

A local-steps strategy keeps an anchor (the parameters every replica started the round
from); after its averager has reduced every rank's delta (replica minus anchor), the
outer optimizer moves the anchor (SlowMo, Wang et al. 2020, arXiv 1910.00643, calls
this the slow, outer update; DiLoCo, Douillard et al. 2023, arXiv 2311.08105, its outer
optimizer). One small module per variant:

=========================== =============================================== =========
outer optimizer             anchor update                                   used by
=========================== =============================================== =========
``global_step.GlobalStep``  ``anchor += lr * delta_sum / count``            Oscars
                            (``lr`` 1: the average replaces the replicas,   (``--global-lr``)
                            Local SGD's rule)
``sgd.OuterSGD``            SGD with momentum on the pseudo-gradient        SlowMo,
                            ``Delta = -delta_sum / count``, plain or        DiLoCo
                            Nesterov (``torch.optim.SGD``'s step)
=========================== =============================================== =========

Every ``step`` takes ``delta_sum = sum_i (theta_i - anchor)``, the replicas' moves from
the anchor (Oscars' convention); the pseudo-gradient of SlowMo and DiLoCo,
``theta_global - mean_i theta_i``, is its negated mean.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class OuterOptimizer(ABC):
    """Moves the anchor by the averaged delta ``delta_sum / count``."""

    @abstractmethod
    def step(self, anchor: Any, delta_sum: Any, count: float) -> None:
        """Update ``anchor`` in place from the reduced ``delta_sum`` of ``count`` parts."""

    def state(self) -> dict[str, Any]:
        """Resumable state (a momentum buffer); default none."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved."""
