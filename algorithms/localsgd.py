"""Local SGD: periodic model averaging with a fixed period (the Oscars baseline).

Every rank takes ``tau`` (``--period``) local momentum-SGD steps on its own replica,
then all ranks replace their parameters by the uniform average ``W = (1/N) sum_k W_k``
with one blocking ``Allreduce`` of the flat parameter buffer (Stich 2018, Alg. 1; Lin
et al. 2020, eq. (2); ALGORITHMS.md, "Local SGD"). By default momentum buffers are NOT
averaged: each rank keeps its own velocity across rounds (only parameters travel), as
in Lin et al.'s local SGD; ``--momentum-sync`` makes that a choice: ``keep``
(default), ``zero`` (restart every velocity at each averaging) or ``average`` (one more
blocking ``Allreduce`` of the velocity per round).

A composition of two parts, as PyTorch's ``PostLocalSGDOptimizer``: the local optimizer
(momentum SGD, :func:`local_step`) and
:class:`~syncbench.algorithms.averagers.periodic.PeriodicAverager`. All ranks take the
same number of steps; when it is not a multiple of ``tau`` the last round is shorter
and still ends with an averaging. Evaluation points are round boundaries, where every
replica equals the average.

``--period`` and ``--momentum-sync`` are shared with Oscars (``--period`` is its base
period tau_0) and are defined here only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers import MOMENTUM_SYNCS, round_wire_bytes
from syncbench.algorithms.averagers.periodic import PeriodicAverager
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, StrategyTraits


def local_step(core: Strategy, x: Any, y: Any, poll: Callable[[], None] | None = None) -> float:
    """The local optimizer step of Local SGD and Oscars; returns the loss.

    Compute the gradient of this rank's batch (calling ``poll`` between layers while a
    reduction is in flight), spend the emulated slowdown, and apply momentum SGD to the
    replica.
    """
    hooks = {"on_grads_ready": lambda _offset: poll(), "poll": poll} if poll else None
    loss = core.compute_gradient(x, y, hooks)
    core.straggle()
    with core.timer.phase("update"):
        core.optimizer.step(core.model.params, core.model.grads)
    return loss


class RoundsOfLocalSteps(Strategy):
    """A strategy of local steps in rounds that its ``averager`` ends (Local SGD, SlowMo):
    each step is a local step, then the averager counts it; evaluation points are round
    boundaries, where every replica equals the average."""

    averager: Any

    def step(self, x: Any, y: Any) -> StepStats:
        loss = local_step(self, x, y)
        self.steps_taken += 1
        stats = StepStats(loss=loss, samples=int(x.shape[0]),
                          local_steps=self.averager.round_len, round=self.averager.round)
        self.averager.after_step()
        return stats

    def evaluation_point(self) -> int | None:
        """Global samples at a round boundary (replicas equal), else None."""
        return None if self.averager.round_steps else super().evaluation_point()


def declare_round_bytes(core: Any, period: int, momentum_sync: str) -> None:
    """Run attributes ``wire_bytes_per_outer_step`` (one averaging's bytes,
    :func:`~syncbench.algorithms.averagers.round_wire_bytes`) and ``outer_period_steps``
    (the local steps between two), from which the tables take bytes per sample."""
    core.run_attributes["wire_bytes_per_outer_step"] = round_wire_bytes(
        core, momentum_sync, int(core.model.params.nbytes))
    core.run_attributes["outer_period_steps"] = int(period)


class LocalSGD(RoundsOfLocalSteps):
    name = "localsgd"
    summary = "local SGD: --period local steps, then a blocking Allreduce average of the weights"
    #: Each local step updates before a round's averaging communicates; every round ends
    #: with a blocking average of every rank.
    traits = StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="localsgd",
                            stop_vote_lag=1)

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """Local SGD's options (Oscars' extend them: ``--period`` is its tau_0)."""

        period: int = option(
            4, "Local SGD period tau, and Oscars' base period tau_0: local steps per "
            "round between model averagings")
        momentum_sync: str = option(
            "keep", "Local SGD and Oscars: momentum buffers at each averaging: keep them local "
            "(default), zero them, or average them (one more Allreduce per round)",
            choices=MOMENTUM_SYNCS)

        def __post_init__(self) -> None:
            if self.period < 1:
                raise ValueError(f"--period must be >= 1, got {self.period}")
            if self.momentum_sync not in MOMENTUM_SYNCS:
                raise ValueError(f"--momentum-sync must be one of {', '.join(MOMENTUM_SYNCS)}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.averager = PeriodicAverager(self, self.options.period, self.options.momentum_sync)
        declare_round_bytes(self, self.options.period, self.options.momentum_sync)

    def state(self) -> dict[str, Any]:
        """Resumable state (taken at a round boundary, where replicas are equal)."""
        return {**super().state(), "round": self.averager.round}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.restart(int(state["round"]))
