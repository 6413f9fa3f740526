"""Oscars: adaptive semi-synchronous local SGD with a global view of rank speeds.

Training runs in rounds of local SGD (Haddadpour et al. 2019, arXiv 1910.13598,
Alg. 1; Oscars, arXiv 2102.08550; ALGORITHMS.md, "Oscars"): in round r rank k takes
tau_k local momentum-SGD steps from the common W_start, then one packed reduction
gives every rank every delta, speed and step count, from which the anchor moves by
``global_lr`` times the (weighted) mean delta and every rank computes the next
schedule: the slowest rank takes tau_0 steps, faster ones proportionally more, at most
tau_max.

A composition of three parts: the local optimizer (momentum SGD,
:func:`~syncbench.algorithms.localsgd.local_step`), the averager
(:class:`~syncbench.algorithms.averagers.adaptive.AdaptiveAverager`: the packed
``Iallreduce``, the speeds, the schedule) and the outer optimizer
(:class:`~syncbench.algorithms.outer.global_step.GlobalStep`, ``--global-lr``).
``--no-adaptive`` is Local SGD with period tau_0; ``--period-growth ALPHA`` makes
tau_0(r) = tau_0 * (1 + ALPHA*r); ``--momentum-sync`` is Local SGD's; ``--overlap``
takes the next round's first step while the reduction is in flight. Every step
records the c_k its schedule came from (rank dataset ``speed``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers import round_wire_bytes
from syncbench.algorithms.averagers.adaptive import AdaptiveAverager
from syncbench.algorithms.averagers.schedule import (  # noqa: F401 (Oscars' schedule)
    fit_budget,
    next_schedule,
    schedule,
    uniform_schedule,
)
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import option
from syncbench.algorithms.localsgd import LocalSGD, local_step
from syncbench.algorithms.outer.global_step import GlobalStep
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, StrategyTraits


class Oscars(Strategy):
    name = "oscars"
    summary = ("Oscars: adaptive local steps per rank from a global view of speeds, "
               "one packed Iallreduce per round (--period from localsgd)")
    #: Local steps per round follow the measured speeds c_k (wall time), and ranks take
    #: different numbers of local steps per round (no ``--sync-bn``). A stop vote
    #: completes at the next point with blocking rounds (``stop_vote_lag`` 1), at the
    #: one after with ``--overlap``.
    traits = StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="oscars",
                            deterministic=False, lock_step=False, stop_vote_lag=1)

    @dataclass(frozen=True)
    class Options(LocalSGD.Options):
        """Oscars' options: Local SGD's (``--period`` is tau_0, ``--momentum-sync``) and more."""

        max_period: int | None = option(
            None, "Oscars tau_max: most local steps per round (default 8*--period)", type=int)
        averaging: str = option(
            "weighted", "Oscars averaging of the deltas: by local steps (default) or plain mean",
            choices=("weighted", "uniform"))
        adaptive: str = option(
            "on", "Oscars: per-rank local steps from measured speeds (on, default) or --period "
            "for all (= Local SGD)", choices=("on", "off"))
        overlap: bool = option(
            False, "Oscars: take exactly one step, the next round's first, while the round's "
            "Iallreduce is in flight", flag=True)
        period_growth: float = option(
            0.0, "Oscars: tau_0 grows as tau_0*(1 + ALPHA*round)")
        global_lr: float = option(1.0, "Oscars: step size applied to the averaged delta")
        speed_ema: float = option(
            0.5, "Oscars: weight of the old value in the per-round EMA of seconds per local step")

        def __post_init__(self) -> None:
            super().__post_init__()
            checks = [
                (self.max_period is None or self.max_period >= 1,
                 f"--max-period must be >= 1, got {self.max_period}"),
                (self.period_growth >= 0,
                 f"--period-growth must be >= 0, got {self.period_growth}"),
                (self.global_lr > 0, f"--global-lr must be > 0, got {self.global_lr}"),
                (0 <= self.speed_ema < 1, f"--speed-ema must be in [0, 1), got {self.speed_ema}"),
            ]
            for ok, message in checks:
                if not ok:
                    raise ValueError(message)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.options.overlap:  # a round's average completes in the next round's first step
            self.traits = dataclasses.replace(Oscars.traits, stop_vote_lag=2)
        self.averager = AdaptiveAverager(
            self, self.options, GlobalStep(self.options.global_lr, self.model.params))

    def step(self, x: Any, y: Any) -> StepStats:
        averager = self.averager
        in_flight = averager.pending is not None
        loss = local_step(self, x, y, poll=self.comm.poll if in_flight else None)
        averager.observe_speed()
        self.steps_taken += 1
        averager.count_step()
        stats = StepStats(loss=loss, samples=int(x.shape[0]), local_steps=averager.tau,
                          round=averager.round, speed=averager.speeds[self.comm.rank])
        averager.end_round_if_due()
        return stats

    def done(self) -> bool:
        """True once the round that consumes the last of the global budget is averaged."""
        return self.averager.finished

    def evaluation_point(self) -> int | None:
        """Global samples at a round boundary (every rank there, same count), else None."""
        averager = self.averager
        if not averager.at_boundary:
            return None
        steps = averager.consumed + (sum(averager.taus) if averager.pending is not None else 0)
        return steps * self.budget.batch_size

    def consensus_params(self) -> Any:
        """The averaged W_start (completes an in-flight round first: collective)."""
        self.averager.average()
        return self.averager.w_start

    def finish(self) -> None:
        averager = self.averager
        averager.average()
        # one round's bytes (the packed Iallreduce, BatchNorm's statistics and averaged
        # moments), and the local steps a rank took per round on the mean: its rounds
        # differ in length, per rank and per round; the same on every rank
        self.run_attributes["wire_bytes_per_outer_step"] = round_wire_bytes(
            self, self.options.momentum_sync, int(averager.packed.nbytes))
        if averager.round:
            self.run_attributes["outer_period_steps"] = (
                averager.consumed / (self.comm.size * averager.round))

    def state(self) -> dict[str, Any]:
        """Resumable state at a round boundary (completes an in-flight round: collective)."""
        self.finish()
        return {**super().state(), **self.averager.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.load_state(state)

    def close(self) -> None:
        self.averager.pending = None
