"""Local SGD: periodic model averaging with a fixed period (the Oscars baseline).

Every rank takes ``tau`` (``--period``) local momentum-SGD steps on its own
replica, then all ranks replace their parameters by the uniform average
``W = (1/N) sum_k W_k`` with one blocking ``Allreduce`` of the flat parameter
buffer (Stich 2018, "Local SGD converges fast and communicates little",
Alg. 1; Lin et al. 2020, "Don't use large mini-batches, use local SGD",
eq. (2); ALGORITHMS.md, "Local SGD"). By default momentum buffers are NOT
averaged: each rank keeps its own velocity across rounds (only parameters
travel), as in Lin et al.'s local SGD. ``--momentum-sync`` (shared with
Oscars, defined here) makes that a choice: ``keep`` (default), ``zero``
(restart every velocity at each averaging) or ``average`` (replace every
velocity by the uniform mean, one more blocking ``Allreduce`` of the
velocity per round).

All ranks take the same number of steps (``Budget.steps_per_rank``); when
it is not a multiple of ``tau`` the last round is shorter and still ends
with an averaging, so the final model is the consensus. Evaluation points
are round boundaries, where every replica equals the average.

``--period`` and ``--momentum-sync`` are shared with Oscars (``--period``
is its base period tau_0) and are defined here only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.base import Algorithm, StepStats
from syncbench.algorithms.flags import option

#: ``--momentum-sync``: what becomes of the momentum buffers at an averaging.
MOMENTUM_SYNCS = ("keep", "zero", "average")


def average_over_ranks(algo: Algorithm, buf: Any) -> None:
    """``buf`` = its uniform mean over the ranks, in place: a blocking ``Allreduce``
    (charged by the communicator) then the 1/N scaling (charged to ``update``)."""
    algo.comm.Allreduce(buf)
    with algo.timer.phase("update"):
        buf *= 1.0 / algo.comm.size


def sync_momentum(algo: Algorithm, mode: str) -> None:
    """Apply ``--momentum-sync`` to ``algo``'s velocity at an averaging (every rank)."""
    velocity = algo.optimizer.velocity
    if mode == "zero":
        velocity[...] = 0
    elif mode == "average":
        average_over_ranks(algo, velocity)


def local_step(algo: Algorithm, x: Any, y: Any, poll: Callable[[], None] | None = None) -> float:
    """The local optimizer step of Local SGD and Oscars; returns the loss.

    Compute the gradient of this rank's batch (calling ``poll`` between
    layers while a reduction is in flight), spend the emulated slowdown,
    and apply momentum SGD to the replica. The averager (what a round does
    with the replicas) is the strategy's own, as PyTorch splits
    ``PostLocalSGDOptimizer`` (the local step) from its model averager.
    """
    with algo.timer.phase("compute"):
        loss = algo.model.loss_and_grad(
            x, y, on_grads_ready=(lambda _offset: poll()) if poll else None, poll=poll)
    algo.straggle()
    with algo.timer.phase("update"):
        algo.optimizer.step(algo.model.params, algo.model.grads)
    return loss


class LocalSGD(Algorithm):
    #: Every round ends with a blocking average of every rank.
    stop_vote_lag = 1
    name = "localsgd"
    summary = "local SGD: --period local steps, then a blocking Allreduce average of the weights"
    #: Each local step updates before a round's averaging communicates.
    step_order = ("data", "compute", "delay", "update", "comm", "wait")
    simulation = "localsgd"

    @dataclass(frozen=True)
    class Options:
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
        self.period = int(self.options.period)
        self.round = 0
        self.round_steps = 0  # local steps taken in the current round
        self.round_len = self._next_round_len()

    def _next_round_len(self) -> int:
        """Steps of the round that starts now: tau, or what is left of the budget."""
        return min(self.period, self.budget.steps_per_rank - self.steps_taken)

    def local_step(self, x: Any, y: Any) -> float:
        """One local momentum-SGD step on this rank's replica; returns the loss."""
        return local_step(self, x, y)

    def average(self) -> None:
        """Replace every replica by the uniform average (blocking Allreduce)."""
        average_over_ranks(self, self.model.params)
        if self.model.buffers.size:  # BatchNorm's running statistics, with the weights
            average_over_ranks(self, self.model.buffers)
        sync_momentum(self, self.options.momentum_sync)

    def step(self, x: Any, y: Any) -> StepStats:
        loss = self.local_step(x, y)
        self.steps_taken += 1
        self.round_steps += 1
        stats = StepStats(
            loss=loss, samples=int(x.shape[0]), local_steps=self.round_len, round=self.round
        )
        if self.round_steps >= self.round_len:
            self.average()
            self.round += 1
            self.round_steps = 0
            self.round_len = self._next_round_len()
        return stats

    def state(self) -> dict[str, Any]:
        """Resumable state (taken at a round boundary, where replicas are equal)."""
        return {**super().state(), "round": self.round}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.round, self.round_steps = int(state["round"]), 0
        self.round_len = self._next_round_len()

    def evaluation_point(self) -> int | None:
        """Global samples at a round boundary (replicas equal), else None."""
        if self.round_steps != 0:
            return None
        return super().evaluation_point()
