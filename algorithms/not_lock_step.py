"""The protocol of a strategy whose ranks do not step together (ASGD).

A lock-step strategy (:class:`~syncbench.algorithms.base.Strategy`) has evaluation
points where every rank stands at the same sample count, and stops, checkpoints and
evaluates there. A strategy without them also implements :class:`NotLockStep`: it
pauses for checkpoints at points it announces, ends early when a signal reaches one
rank, keeps copies of its parameters to evaluate after training, may leave a rank out
of training (a dedicated parameter host) and sets up MPI resources collectively
before the clock starts. The driver asks :func:`protocol_of` for a strategy's view of
this protocol; a lock-step strategy's is :class:`LockStepView`, whose answers are the
lock-step ones (no pauses, no early ends, no snapshots), so no lock-step strategy
declares any of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NotLockStep:
    """What a strategy without common evaluation points adds to the lock-step contract.

    The defaults are the lock-step answers; ASGD overrides each.
    """

    #: Replaced by the driver: True once a signal asked this rank to stop
    #: (``bench/train/hooks.py``, ``StopOnSignal``). A strategy checks it where it
    #: waits outside steps, and ends early.
    stop_requested: Callable[[], bool] = staticmethod(lambda: False)

    @classmethod
    def data_shard(cls, config: Any, rank: int, size: int) -> tuple[int, int]:
        """(shard index, shard count) of rank ``rank``'s training data: every rank trains."""
        return rank, size

    def prepare(self) -> None:
        """Collective set-up before the clock starts (e.g. RMA windows); default none."""

    def pause_point(self) -> int | None:
        """Global samples of a checkpoint pause this rank must join now, else None.

        When not None every rank gets the same value, the driver checkpoints
        (collective) off the training clock, and training continues. A negative value,
        the same on every rank: the pause was dropped (the run ended early), the driver
        checks ``done`` again without a step.
        """
        return None

    def end_early(self) -> bool:
        """End every rank's training at its next step boundary; True if this cut the run
        (the driver calls it on the rank a signal reached)."""
        return False

    def early_end_point(self) -> int | None:
        """After ``finish`` (collective): the global samples of a run that
        :meth:`end_early` cut, if its state there can be checkpointed; else None."""
        return None

    def snapshot_point(self) -> int | None:
        """Global samples in ``model.params`` when they are a faithful copy of the global
        model (ASGD's last pull), for evaluation after training; None: no such copy."""
        return None

    def drive_progress(self) -> None:
        """Let MPI progress this rank's outstanding requests (the emulated slowdown calls
        it during its delay, as a slower processor would poll between layers)."""

    def report_line(self) -> str | None:
        """A line of this strategy's own measurements for rank 0 to print, else None
        (called on every rank after ``finish``, off the clock; may be collective)."""
        return None


class LockStepView(NotLockStep):
    """A lock-step strategy seen through :class:`NotLockStep`: the lock-step answers;
    progress is its communicator's ``poll`` (one cheap ``Testall``)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def drive_progress(self) -> None:
        self.strategy.comm.poll()


def protocol_of(strategy: Any) -> NotLockStep:
    """``strategy`` itself where it implements :class:`NotLockStep`, else its lock-step view."""
    return strategy if isinstance(strategy, NotLockStep) else LockStepView(strategy)


def data_shard(cls: type, config: Any, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s (shard index, shard count) for strategy class ``cls``."""
    if issubclass(cls, NotLockStep):
        return cls.data_shard(config, rank, size)
    return rank, size
