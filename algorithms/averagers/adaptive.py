"""Oscars' averager: rounds of per-rank local steps from a global view of rank speeds.

In round r rank k takes tau_k local steps from the common anchor W_start, then ONE
packed ``Iallreduce`` of ``[w_k * delta_k | onehot_k * c_k | tau_k]`` (delta_k = W_k -
W_start; w_k = tau_k, or 1 with ``--averaging uniform``) gives every rank the same
vector, from which the outer optimizer moves the anchor by ``sum_k w_k delta_k /
sum_k w_k`` and every rank computes the next schedule
(:mod:`~syncbench.algorithms.averagers.schedule`), so the global view needs no
coordinator (Oscars, arXiv 2102.08550; ALGORITHMS.md, "Oscars").

c_k is rank k's seconds per local step (data, compute, injected delay and update: an
emulated straggler is slow, time blocked in communication is left out), averaged over
the round and smoothed across rounds (``--speed-ema``). With ``overlap`` the rank takes
the first step of the next round while the reduction is in flight, then sets
W_k = W_start_new + (W_k - W_k_at_sync). The sample budget is exact: a round that would
leave fewer than N steps, or overshoot, is the last and is fitted to the steps left.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.averagers import ModelAverager, average_over_ranks, sync_momentum
from syncbench.algorithms.averagers.schedule import (
    next_schedule,
    plan_round,
    tau_max_of,
    uniform_schedule,
)
from syncbench.algorithms.outer import OuterOptimizer


class AdaptiveAverager(ModelAverager):
    """One packed reduction per round; the round's schedule from the last one's speeds.

    ``options`` are Oscars' (``period``, ``max_period``, ``averaging``, ``adaptive``,
    ``overlap``, ``period_growth``, ``speed_ema``, ``momentum_sync``); ``outer`` moves
    the anchor.
    """

    def __init__(self, core: Any, options: Any, outer: OuterOptimizer) -> None:
        super().__init__(core)
        self.options, self.outer = options, outer
        model, size = core.model, core.comm.size
        self.tau_max = tau_max_of(options)
        self.total_steps = core.budget.total_samples // core.budget.batch_size
        #: The anchor W_start every replica starts a round from.
        self.w_start = model.params.copy()
        self.w_sync = model.params.copy() if options.overlap else None
        self.packed = model.backend.xp.zeros(model.size + size + 1, dtype=model.dtype)
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
        self._plan_round(uniform_schedule(size, float(options.period), self.tau_max))

    # -- schedule ------------------------------------------------------------
    def _plan_round(self, taus: list[int]) -> None:
        """Fix the current round's schedule (fitted to the budget) on this rank."""
        self.taus = plan_round(taus, self.total_steps, self.scheduled)
        self.scheduled += sum(self.taus)
        self.tau = self.taus[self.core.comm.rank]
        self.history.append(self.taus)

    def measured_step_seconds(self) -> float:
        """Seconds of this step's local work so far: data + compute + delay + update."""
        t = self.core.timer.totals
        return t["data"] + t["compute"] + t["delay"] + t["update"]

    def observe_speed(self) -> None:
        """Add this step's local seconds to the round's window."""
        self._window[0] += self.measured_step_seconds()
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

    # -- a round ---------------------------------------------------------------
    def count_step(self) -> None:
        """Count one local step; after the overlapped first step of a round, complete the
        previous round's reduction."""
        self.round_steps += 1
        self.at_boundary = False
        if self.pending is not None:
            self.complete()

    def end_round_if_due(self) -> None:
        """At the round's end start its reduction (completed at once unless overlapped,
        or the last round)."""
        if self.round_steps >= self.tau:
            self.start()
            if not self.options.overlap or self.scheduled >= self.total_steps:
                self.complete()

    def start(self) -> None:
        """Pack [w_k * delta_k | onehot_k * c_k | tau_k] and start its Iallreduce."""
        core = self.core
        size, n = core.model.size, core.comm.size
        self._update_speed()
        with core.timer.phase("update"):
            delta = self.packed[:size]
            delta[...] = core.model.params
            delta -= self.w_start
            if self.options.averaging == "weighted":
                delta *= self.tau
            self.packed[size:] = 0
            self.packed[size + core.comm.rank] = self.step_seconds
            self.packed[size + n] = self.tau
            if self.w_sync is not None:
                self.w_sync[...] = core.model.params
        self.pending = core.comm.Iallreduce(self.packed)
        self.at_boundary = True

    def complete(self) -> None:
        """Wait for the round's reduction, move the anchor, and plan the next round."""
        core = self.core
        core.comm.Wait(self.pending)
        self.pending = None
        model, n = core.model, core.comm.size
        size = model.size
        tail = model.backend.to_numpy(self.packed[size:])
        sum_tau = round(float(tail[n]))
        if sum_tau != sum(self.taus):
            raise RuntimeError(f"Oscars round {self.round}: reduced sum of tau {sum_tau} != "
                               f"planned {sum(self.taus)} (ranks disagree on the schedule)")
        self.speeds = [float(c) for c in tail[:n]]
        denom = sum_tau if self.options.averaging == "weighted" else n
        with core.timer.phase("update"):
            self.outer.step(self.w_start, self.packed[:size], denom)
            if self.w_sync is not None and self.round_steps > self.tau:
                model.params -= self.w_sync  # local progress made meanwhile
                model.params += self.w_start
            else:
                model.params[...] = self.w_start
        if model.buffers.size:  # BatchNorm's running statistics: their uniform mean
            average_over_ranks(core, model.buffers)
        sync_momentum(core, self.options.momentum_sync)
        self.consumed += sum_tau
        self.round_steps -= self.tau
        self.round += 1
        if self.consumed >= self.total_steps:
            self.finished = True
            return
        self._plan_round(next_schedule(self.options, self.speeds, self.round))

    def average(self) -> None:
        """Complete the round in flight, if any (collective)."""
        if self.pending is not None:
            self.complete()

    # -- checkpoints -----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The anchor, this rank's speed, every rank's, the round and every schedule."""
        return {
            "w_start": self.core.model.backend.to_numpy(self.w_start).copy(),
            "step_seconds": self.step_seconds,
            "speeds": list(self.speeds),
            "round": self.round,
            "consumed": self.consumed,
            "scheduled": self.scheduled,
            "history": [list(t) for t in self.history],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.w_start[...] = self.core.model.backend.asarray(state["w_start"])
        self.step_seconds = float(state["step_seconds"])
        self.speeds = [float(c) for c in state["speeds"]]
        self.round, self.round_steps = int(state["round"]), 0
        self.consumed, self.scheduled = int(state["consumed"]), int(state["scheduled"])
        self.history = [[int(t) for t in taus] for taus in state["history"]]
        self.taus = self.history[-1]
        self.tau = self.taus[self.core.comm.rank]
        self.pending, self.at_boundary = None, True
        self.finished = self.consumed >= self.total_steps
