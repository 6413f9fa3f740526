"""``--lr-schedule`` and ``--lr-warmup``: what the local optimizer's learning rate is
multiplied by at each of its steps.

- ``constant`` (the default): 1 after the warm-up, the suite's behaviour before there
  was a schedule (the factor is exactly 1.0, so runs are bit-identical to it).
- ``cosine``: half a cosine from 1 down to :data:`COSINE_FLOOR` at the end of the run's
  budget (SGDR without restarts: Loshchilov and Hutter, ICLR 2017,
  arXiv 1608.03983), the floor at a tenth as nanoGPT's ``get_lr`` (``min_lr =
  learning_rate / 10``); the DiLoCo paper's inner optimizer steps under a cosine
  schedule with a linear warm-up (Douillard et al. 2023, arXiv 2311.08105, section 3).
- ``--lr-warmup W``: the first W steps ramp linearly, ``step / W`` (Goyal et al. 2017,
  arXiv 1706.02677, section 2.2), for either kind.

The step count is the optimizer's own (:class:`LRClock`), not reset by ``--momentum-sync
zero``, and saved for ``--resume``. A caller that hands the optimizer an explicit
learning rate (a strategy's own correction step) is not scheduled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

#: ``--lr-schedule`` choices.
SCHEDULES = ("constant", "cosine")

#: Where ``cosine`` ends, as a fraction of ``--lr``.
COSINE_FLOOR = 0.1


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """The schedule of one run: its kind, warm-up steps and total steps (per rank)."""

    kind: str = "constant"
    warmup: int = 0
    total: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"--lr-schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.kind!r}")
        if self.warmup < 0:
            raise ValueError(f"--lr-warmup must be >= 0, got {self.warmup}")

    def factor(self, step: int) -> float:
        """The learning rate's multiplier at ``step`` (1 for the first step)."""
        if step <= self.warmup:
            return step / self.warmup  # torch's LinearLR(start_factor=1/W, total_iters=W-1)
        if self.kind == "constant" or self.total <= self.warmup:
            return 1.0
        # the first step after the warm-up at the peak, as torch.optim.lr_scheduler's
        # CosineAnnealingLR after a LinearLR warm-up and nanoGPT's get_lr (0-based counts)
        progress = min(1.0, (step - 1 - self.warmup) / (self.total - self.warmup))
        return COSINE_FLOOR + (1.0 - COSINE_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LRClock:
    """An optimizer's scheduled learning rate: ``lr * schedule.factor(step)`` for the
    steps it counts (:meth:`next_lr`), with its count in the checkpoint."""

    def __init__(self, lr: float, schedule: LRSchedule | None = None) -> None:
        self.lr, self.schedule, self.steps = lr, schedule or LRSchedule(), 0

    def next_lr(self) -> float:
        """The learning rate of the next step (and count it)."""
        rate = self.peek_lr()
        self.steps += 1
        return rate

    def peek_lr(self) -> float:
        """The learning rate the next step will take, not counted (OD-SGD's look-ahead
        applies the part of the next global step it already knows)."""
        return self.lr * self.schedule.factor(self.steps + 1)

    def state(self) -> dict[str, Any]:
        return {"lr_schedule_steps": self.steps}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore the count (a checkpoint from before the schedule: 0, constant only)."""
        self.steps = int(state.get("lr_schedule_steps", 0))


def schedule_of(config: Any, total_steps: int) -> LRSchedule:
    """The :class:`LRSchedule` of ``config`` (``--lr-schedule``, ``--lr-warmup``; absent:
    constant) over ``total_steps`` steps per rank."""
    return LRSchedule(getattr(config, "lr_schedule", "constant") or "constant",
                      int(getattr(config, "lr_warmup", 0) or 0), int(total_steps))
