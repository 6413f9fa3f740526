"""Every H local steps, an outer optimizer step on the replicas' averaged pseudo-gradient.

SlowMo (Wang et al., ICLR 2020, arXiv 1910.00643, Alg. 1) and DiLoCo (Douillard et al.
2023, arXiv 2311.08105, Alg. 1) end a round of H local steps as Local SGD does, with one
blocking ``Allreduce``, but of each replica's move from the round's anchor
``theta_i - theta_global``, and then hand the sum to an outer optimizer
(:mod:`~syncbench.algorithms.outer`) that moves the anchor; every replica restarts
from the new anchor. With the plain outer step at lr 1 this is Local SGD's average
(:class:`~syncbench.algorithms.averagers.periodic.PeriodicAverager`, up to rounding).

Rounds are budget-aware as Local SGD's (the last one shorter, still synchronized), and a
strategy may run synchronous steps first (DiLoCo's warm-up): :meth:`begin` sets the
anchor when rounds start. BatchNorm's running statistics are averaged at each round's
end, as Local SGD's; ``--momentum-sync`` acts on the local optimizer's first moment.
At a round boundary every replica equals the anchor, so a checkpoint there needs the
outer optimizer's state only (:meth:`state`). With a ``quantized`` reduction (DiLoCo's
``--quantize``, :mod:`~syncbench.algorithms.averagers.quantized`) the deltas travel as
codes and the outer step takes their float32 mean instead of the ``Allreduce`` sum.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.averagers import average_over_ranks, sync_momentum
from syncbench.algorithms.averagers.periodic import PeriodicAverager
from syncbench.algorithms.averagers.quantized import QuantizedReduction
from syncbench.algorithms.outer import OuterOptimizer


class PseudoGradientAverager(PeriodicAverager):
    """Rounds of ``period`` local steps; at each end one ``Allreduce`` of the deltas and
    ``outer.step`` on the anchor, which every replica then takes."""

    def __init__(self, core: Any, period: int, momentum_sync: str,
                 outer: OuterOptimizer, quantized: QuantizedReduction | None = None) -> None:
        super().__init__(core, period, momentum_sync)
        self.outer = outer
        #: The codec the deltas travel in (one fragment: the whole vector), else None.
        self.quantized = quantized
        #: theta_global, the anchor every replica started the round from.
        self.anchor = core.model.params.copy()
        self._delta = core.model.params * 0

    def begin(self) -> None:
        """Rounds start now, from the current (common) parameters."""
        self.anchor[...] = self.core.model.params
        self.restart(self.round)

    def average(self) -> None:
        """``Allreduce`` of ``theta_i - anchor``, the outer step, every replica <- anchor;
        BatchNorm's statistics averaged, then ``--momentum-sync``."""
        core = self.core
        model = core.model
        with core.timer.phase("update"):
            delta = self._delta
            delta[...] = model.params
            delta -= self.anchor
        if self.quantized is None:
            core.comm.Allreduce(delta)
            summed, count = delta, core.comm.size
        else:  # the mean of the ranks' deltas, as one rank's sum
            self.quantized.post(0, delta)
            mean = self.quantized.wait(0)
            with core.timer.phase("codec"):
                summed, count = model.backend.asarray(mean), 1
        with core.timer.phase("update"):
            self.outer.step(self.anchor, summed, count)
            model.params[...] = self.anchor
        if model.buffers.size:
            average_over_ranks(core, model.buffers)
        sync_momentum(core, self.momentum_sync)

    def state(self) -> dict[str, Any]:
        """The outer optimizer's state (host arrays) and the round index."""
        to_numpy = self.core.model.backend.to_numpy
        return {"round": self.round,
                **{key: (to_numpy(value).copy() if hasattr(value, "shape") else value)
                   for key, value in self.outer.state().items()}}

    def load_state(self, state: dict[str, Any], rounds_started: bool) -> None:
        """Restore :meth:`state` at a round boundary (the replicas are the anchor)."""
        asarray = self.core.model.backend.asarray
        self.outer.load_state({key: (asarray(value) if hasattr(value, "shape") else value)
                               for key, value in state.items()})
        self.round = int(state["round"])
        if rounds_started:
            self.begin()
