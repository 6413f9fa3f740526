"""Every H local steps, the uniform average of every replica (Local SGD).

Stich 2018, "Local SGD converges fast and communicates little", Alg. 1; Lin et al.
2020, "Don't use large mini-batches, use local SGD", eq. (2); PyTorch's
``PeriodicModelAverager``. Rounds are budget-aware: when the steps left are fewer
than H, the last round is shorter and still ends with an averaging, so the final
model is the consensus.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.averagers import ModelAverager, average_over_ranks, sync_momentum


class PeriodicAverager(ModelAverager):
    """Counts local steps into rounds of ``period``; averages at each round's end."""

    def __init__(self, core: Any, period: int, momentum_sync: str) -> None:
        super().__init__(core)
        if period < 1:
            raise ValueError(f"--period must be >= 1, got {period}")
        self.period = int(period)
        self.momentum_sync = momentum_sync
        self.round = 0
        self.round_steps = 0  # local steps taken in the current round
        self.round_len = self.next_round_len()

    def next_round_len(self) -> int:
        """Steps of the round that starts now: the period, or what is left of the budget."""
        core = self.core
        return min(self.period, core.budget.steps_per_rank - core.steps_taken)

    def after_step(self) -> bool:
        """Count one local step; at the round's end average (collective). True if it did."""
        self.round_steps += 1
        if self.round_steps < self.round_len:
            return False
        self.average()
        self.round += 1
        self.round_steps = 0
        self.round_len = self.next_round_len()
        return True

    def average(self) -> None:
        """Replace every replica by the uniform average (blocking Allreduce), BatchNorm's
        running statistics with it, then ``--momentum-sync``."""
        model = self.core.model
        average_over_ranks(self.core, model.params)
        if model.buffers.size:
            average_over_ranks(self.core, model.buffers)
        sync_momentum(self.core, self.momentum_sync)

    def restart(self, round_index: int) -> None:
        """Resume at the start of round ``round_index`` (a checkpoint is at a boundary)."""
        self.round, self.round_steps = round_index, 0
        self.round_len = self.next_round_len()
