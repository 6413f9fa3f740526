"""SlowMo: Local SGD rounds whose average drives a slow momentum (Wang et al., ICLR 2020,
arXiv 1910.00643, Alg. 1).

Every rank takes ``--period`` local steps with the local optimizer (momentum SGD, or
``--optimizer adamw``) from the round's anchor; one blocking ``Allreduce`` then averages
the replicas' pseudo-gradient ``Delta = theta_global - mean_i theta_i`` and the slow
update ``b <- beta b + Delta``, ``theta_global <- theta_global - alpha b`` moves the
anchor every replica restarts from. ``--slow-lr`` is alpha, ``--slow-momentum`` beta
(defaults 1.0 and 0.5, fairscale's ``SlowMoDistributedDataParallel``); alpha 1 and beta
0 is Local SGD. ``--period`` and ``--momentum-sync`` are Local SGD's (the paper's base
optimizer buffers: kept, zeroed or averaged at each round's end).

A composition of the local optimizer
(:func:`~syncbench.algorithms.localsgd.local_step`), the averager
(:class:`~syncbench.algorithms.averagers.pseudo_gradient.PseudoGradientAverager`) and
the outer optimizer (:class:`~syncbench.algorithms.outer.sgd.OuterSGD`, plain momentum).
Evaluation points and checkpoints are round boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers.pseudo_gradient import PseudoGradientAverager
from syncbench.algorithms.flags import option
from syncbench.algorithms.localsgd import LocalSGD, RoundsOfLocalSteps, declare_round_bytes
from syncbench.algorithms.outer.sgd import OuterSGD
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, StrategyTraits


class SlowMo(RoundsOfLocalSteps):
    name = "slowmo"
    summary = ("SlowMo: local SGD rounds of --period steps, then slow momentum on the "
               "averaged pseudo-gradient (one blocking Allreduce per round)")
    #: A blocking Allreduce of the pseudo-gradient every --period steps (the outer step
    #: is a few vector passes of update per round).
    traits = StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="slowmo",
                            stop_vote_lag=1)

    @dataclass(frozen=True)
    class Options(LocalSGD.Options):
        """SlowMo's options: Local SGD's (``--period``, ``--momentum-sync``) and the slow
        learning rate and momentum."""

        slow_lr: float = option(1.0, "SlowMo slow learning rate alpha")
        slow_momentum: float = option(0.5, "SlowMo slow momentum beta")

        def __post_init__(self) -> None:
            super().__post_init__()
            if not self.slow_lr > 0:
                raise ValueError(f"--slow-lr must be > 0, got {self.slow_lr}")
            if not 0 <= self.slow_momentum < 1:
                raise ValueError(f"--slow-momentum must be in [0, 1), got {self.slow_momentum}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        outer = OuterSGD(self.options.slow_lr, self.options.slow_momentum, False,
                         self.model.params)
        self.averager = PseudoGradientAverager(self, self.options.period,
                                               self.options.momentum_sync, outer)
        declare_round_bytes(self, self.options.period, self.options.momentum_sync)

    def state(self) -> dict[str, Any]:
        return {**super().state(), **self.averager.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.load_state(state, rounds_started=True)
