"""Oscars: adaptive semi-synchronous local SGD with a global view of rank speeds.

Training runs in rounds of local SGD (Haddadpour et al. 2019, arXiv 1910.13598,
Alg. 1; Oscars, arXiv 2102.08550; ALGORITHMS.md, "Oscars"). In round r rank k
takes tau_k local momentum-SGD steps from the common W_start, then ONE packed
``Iallreduce`` of ``[w_k * delta_k | onehot_k * c_k | tau_k]`` (delta_k = W_k -
W_start; w_k = tau_k, or 1 with ``--averaging uniform``) gives every rank the
same vector, from which it updates ``W_start += global_lr * sum_k w_k delta_k /
sum_k w_k`` and computes the next schedule (ALGORITHMS.md)::

    T     = tau_0(r) * max_k c_k           # the slowest rank takes tau_0 steps
    tau_k = clamp(floor(T / c_k), 1, tau_max)

with c_k rank k's seconds per local step (data, compute, injected delay and
update: an emulated straggler is slow, time blocked in communication is left
out), averaged over the round and smoothed across rounds (``--speed-ema``). So
the global view needs no coordinator. ``--adaptive off`` is Local SGD with
period tau_0; ``--period-growth ALPHA`` makes tau_0(r) = tau_0 * (1 + ALPHA*r)
(the adaptive period of 1910.13598); ``--momentum-sync`` is Local SGD's. Every
step records the c_k its schedule came from (rank dataset ``speed``).

``--overlap``: the rank takes the FIRST step of the next round while the
Iallreduce is in flight (every tau is >= 1, so that step is in the next round
whatever its schedule), then sets W_k = W_start_new + (W_k - W_k_at_sync).
The sample budget is exact: a round that would leave fewer than N steps, or
overshoot, is the last and is fitted to the steps left (:func:`fit_budget`), so
every rank stops after the same round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.base import Algorithm, StepStats
from syncbench.algorithms.flags import option
from syncbench.algorithms.localsgd import LocalSGD, average_over_ranks, local_step, sync_momentum
from syncbench.kernels.ops import axpy_

#: Slack for floor(T / c_k): T / c_max must give tau_0, not tau_0 - 1, after rounding.
_FLOOR_SLACK = 1e-9


def schedule(step_seconds: Sequence[float], tau0: float, tau_max: int) -> list[int]:
    """tau_k = clamp(floor(tau0 * max(c) / c_k), 1, tau_max) for every rank k.

    ``step_seconds`` are the ranks' seconds per local step (larger = slower);
    the slowest rank gets ``floor(tau0)``. Without a measurement for every rank
    (a value <= 0) every rank gets ``floor(tau0)``.
    """
    if not step_seconds or min(step_seconds) <= 0:
        return uniform_schedule(len(step_seconds), tau0, tau_max)
    horizon = tau0 * max(step_seconds)
    return [
        min(tau_max, max(1, math.floor(horizon / c + _FLOOR_SLACK))) for c in step_seconds
    ]


def uniform_schedule(world_size: int, tau0: float, tau_max: int) -> list[int]:
    """Every rank takes clamp(floor(tau0), 1, tau_max) steps (``--adaptive off``)."""
    return [min(tau_max, max(1, math.floor(tau0 + _FLOOR_SLACK)))] * world_size


def fit_budget(taus: Sequence[int], remaining: int) -> list[int]:
    """The round's schedule, fitted to the steps left when it is the last round.

    If the round leaves at least N = len(taus) steps (or exactly none) it is
    returned unchanged. Otherwise it becomes the last round with exactly
    ``remaining`` (>= N) steps: one per rank, plus ``remaining - N`` shared in
    proportion to ``tau_k - 1`` (equally if all are 1) by largest remainder,
    ties to the lower rank. Pure integer arithmetic: identical on every rank.
    """
    n, total = len(taus), sum(taus)
    if remaining == total or remaining - total >= n:
        return list(taus)
    if remaining < n:
        raise ValueError(f"cannot fit {remaining} steps on {n} ranks (each needs >= 1)")
    weights = [t - 1 for t in taus]
    if sum(weights) == 0:
        weights = [1] * n
    wsum, target = sum(weights), remaining - n
    shares = [w * target // wsum for w in weights]
    order = sorted(range(n), key=lambda k: (-(weights[k] * target % wsum), k))
    for k in order[: target - sum(shares)]:
        shares[k] += 1
    return [1 + s for s in shares]


def tau_max_of(options: Any) -> int:
    """tau_max: ``--max-period``, default 8 * ``--period``."""
    return int(options.max_period or 8 * options.period)


def base_period(options: Any, round_index: int) -> float:
    """tau_0 of round ``round_index``: ``--period`` * (1 + ``--period-growth`` * round)."""
    return float(options.period) * (1.0 + options.period_growth * round_index)


def plan_round(taus: Sequence[int], total_steps: int, scheduled: int) -> list[int]:
    """A round's schedule fitted to the global steps left after the ``scheduled`` ones."""
    return fit_budget(taus, total_steps - scheduled)


def next_schedule(options: Any, speeds: Sequence[float], round_index: int) -> list[int]:
    """Round ``round_index``'s schedule from every rank's c_k (``--adaptive off``: uniform).

    Pure: every rank (and the simulator) computes the same list from the same
    reduced speeds.
    """
    tau0, tau_max = base_period(options, round_index), tau_max_of(options)
    if options.adaptive == "off":
        return uniform_schedule(len(speeds), tau0, tau_max)
    return schedule(speeds, tau0, tau_max)


class Oscars(Algorithm):
    name = "oscars"
    summary = ("Oscars: adaptive local steps per rank from a global view of speeds, "
               "one packed Iallreduce per round (--period from localsgd)")
    #: Each local step updates before a round's reduction communicates.
    step_order = ("data", "compute", "delay", "update", "comm", "wait")
    simulation = "oscars"
    #: Local steps per round follow the measured speeds c_k (wall time).
    deterministic = False
    #: Ranks take different numbers of local steps per round (no ``--sync-bn``).
    lock_step = False

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
        cfg, size, xp = self.options, self.comm.size, self.model.backend.xp
        self.tau0 = float(cfg.period)
        self.tau_max = tau_max_of(cfg)
        self.total_steps = self.budget.total_samples // self.budget.batch_size
        self.w_start = self.model.params.copy()
        self.w_sync = self.model.params.copy() if cfg.overlap else None
        self.packed = xp.zeros(self.model.size + size + 1, dtype=self.model.dtype)
        self.scratch = self.model.params * 0
        self.step_seconds = 0.0  # c_k, this rank's EMA
        self._window = [0.0, 0]  # seconds and local steps since the last reduction
        self.speeds = [0.0] * size  # every rank's c, from the last reduction
        self.round = 0
        self.round_steps = 0
        self.consumed = 0  # global local steps of the rounds averaged so far
        self.scheduled = 0  # global local steps of the rounds planned so far
        self.history: list[list[int]] = []  # every round's schedule (identical on all ranks)
        self.pending: Any = None  # the in-flight round's request (overlap)
        self.at_boundary = True
        self.finished = False
        self._plan_round(uniform_schedule(size, self.tau0, self.tau_max))

    # -- schedule ------------------------------------------------------------
    def _plan_round(self, taus: list[int]) -> None:
        """Fix the current round's schedule (fitted to the budget) on this rank."""
        self.taus = plan_round(taus, self.total_steps, self.scheduled)
        self.scheduled += sum(self.taus)
        self.tau = self.taus[self.comm.rank]
        self.history.append(self.taus)

    def _next_schedule(self) -> list[int]:
        return next_schedule(self.options, self.speeds, self.round)

    def _measured_step_seconds(self) -> float:
        """Seconds of this step's local work so far: data + compute + delay + update."""
        t = self.timer.totals
        return t["data"] + t["compute"] + t["delay"] + t["update"]

    def _observe_speed(self) -> None:
        """Add this step's local seconds to the round's window."""
        self._window[0] += self._measured_step_seconds()
        self._window[1] += 1

    def _update_speed(self) -> None:
        """c_k <- EMA over rounds of the window's mean seconds per local step.

        Averaging within the round first keeps one preempted step on an
        oversubscribed host from swinging the schedule, and a speed change still
        shows within a few rounds (``--speed-ema``: the weight of the old value).
        """
        seconds, steps = self._window
        if steps == 0:
            return
        sample, beta = seconds / steps, self.options.speed_ema
        first = self.step_seconds == 0.0
        self.step_seconds = sample if first else beta * self.step_seconds + (1 - beta) * sample
        self._window = [0.0, 0]

    # -- one step ------------------------------------------------------------
    def _local_step(self, x: Any, y: Any) -> float:
        """One local momentum-SGD step (polling an in-flight round); returns the loss."""
        loss = local_step(self, x, y, poll=self.comm.poll if self.pending is not None else None)
        self._observe_speed()
        return loss

    def step(self, x: Any, y: Any) -> StepStats:
        loss = self._local_step(x, y)
        self.steps_taken += 1
        self.round_steps += 1
        self.at_boundary = False
        if self.pending is not None:  # the overlapped first step of this round
            self._complete()
        stats = StepStats(loss=loss, samples=int(x.shape[0]), local_steps=self.tau,
                          round=self.round, speed=self.speeds[self.comm.rank])
        if self.round_steps >= self.tau:
            self._start_reduction()
            if not self.options.overlap or self.scheduled >= self.total_steps:
                self._complete()
        return stats

    # -- one round's reduction -------------------------------------------------
    def _start_reduction(self) -> None:
        """Pack [w_k * delta_k | onehot_k * c_k | tau_k] and start its Iallreduce."""
        size, n = self.model.size, self.comm.size
        self._update_speed()
        with self.timer.phase("update"):
            delta = self.packed[:size]
            delta[...] = self.model.params
            delta -= self.w_start
            if self.options.averaging == "weighted":
                delta *= self.tau
            self.packed[size:] = 0
            self.packed[size + self.comm.rank] = self.step_seconds
            self.packed[size + n] = self.tau
            if self.w_sync is not None:
                self.w_sync[...] = self.model.params
        self.pending = self.comm.Iallreduce(self.packed)
        self.at_boundary = True

    def _complete(self) -> None:
        """Wait for the round's reduction, average, and plan the next round."""
        self.comm.Wait(self.pending)
        self.pending = None
        size, n = self.model.size, self.comm.size
        tail = self.model.backend.to_numpy(self.packed[size:])
        sum_tau = round(float(tail[n]))
        if sum_tau != sum(self.taus):
            raise RuntimeError(f"Oscars round {self.round}: reduced sum of tau {sum_tau} != "
                               f"planned {sum(self.taus)} (ranks disagree on the schedule)")
        self.speeds = [float(c) for c in tail[:n]]
        denom = sum_tau if self.options.averaging == "weighted" else n
        with self.timer.phase("update"):
            axpy_(self.w_start, self.options.global_lr / denom, self.packed[:size], self.scratch)
            if self.w_sync is not None and self.round_steps > self.tau:
                self.model.params -= self.w_sync  # local progress made meanwhile
                self.model.params += self.w_start
            else:
                self.model.params[...] = self.w_start
        if self.model.buffers.size:  # BatchNorm's running statistics: their uniform mean
            average_over_ranks(self, self.model.buffers)
        sync_momentum(self, self.options.momentum_sync)
        self.consumed += sum_tau
        self.round_steps -= self.tau
        self.round += 1
        if self.consumed >= self.total_steps:
            self.finished = True
            return
        self._plan_round(self._next_schedule())

    # -- driver interface --------------------------------------------------------
    def done(self) -> bool:
        """True once the round that consumes the last of the global budget is averaged."""
        return self.finished

    @property
    def stop_vote_lag(self) -> int:
        """1 with blocking rounds; 2 with ``--overlap`` (a round's average completes in
        the next round's first step)."""
        return 2 if self.options.overlap else 1

    def evaluation_point(self) -> int | None:
        """Global samples at a round boundary (every rank there, same count), else None."""
        if not self.at_boundary:
            return None
        steps = self.consumed + (sum(self.taus) if self.pending is not None else 0)
        return steps * self.budget.batch_size

    def consensus_params(self) -> Any:
        """The averaged W_start (completes an in-flight round first: collective)."""
        if self.pending is not None:
            self._complete()
        return self.w_start

    def finish(self) -> None:
        if self.pending is not None:
            self._complete()

    def state(self) -> dict[str, Any]:
        """Resumable state at a round boundary (completes an in-flight round: collective)."""
        self.finish()
        to_numpy = self.model.backend.to_numpy
        return {
            **super().state(),
            "w_start": to_numpy(self.w_start).copy(),
            "step_seconds": self.step_seconds,
            "speeds": list(self.speeds),
            "round": self.round,
            "consumed": self.consumed,
            "scheduled": self.scheduled,
            "history": [list(t) for t in self.history],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.w_start[...] = self.model.backend.asarray(state["w_start"])
        self.step_seconds = float(state["step_seconds"])
        self.speeds = [float(c) for c in state["speeds"]]
        self.round, self.round_steps = int(state["round"]), 0
        self.consumed, self.scheduled = int(state["consumed"]), int(state["scheduled"])
        self.history = [[int(t) for t in taus] for taus in state["history"]]
        self.taus = self.history[-1]
        self.tau = self.taus[self.comm.rank]
        self.pending, self.at_boundary = None, True
        self.finished = self.consumed >= self.total_steps

    def close(self) -> None:
        self.pending = None
