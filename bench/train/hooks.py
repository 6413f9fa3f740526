"""What the training driver does around each step, as hooks (ChainerMN's extensions).

The loop of :meth:`syncbench.bench.train.driver.Run.train` only gets data, calls
``algorithm.step`` and records the row; everything else is a :class:`Hook`
called at the start of training, before and after every step, and at its end:

- :class:`Heartbeat` feeds the hang guard (``--timeout``);
- :class:`RowFlusher` appends this rank's new rows for ``syncbench recover``;
- :class:`SnapshotKeeper` keeps ASGD-style parameter copies at evaluation strides;
- :class:`ProgressLine` drives rank 0's progress line;
- :class:`Evaluator` evaluates the consensus model every ``--eval-every`` and stops
  at ``--target-accuracy`` with ``--stop-at-target``;
- :class:`Checkpointer` saves resumable state every ``--checkpoint-every`` steps
  (and joins a strategy's checkpoint pauses, :meth:`Algorithm.pause_point`);
- :class:`StrategyReport` prints a strategy's own measurements after training;
- :class:`StopOnSignal` ends training at an agreed step boundary after SIGTERM,
  SIGINT or SIGUSR1 (:mod:`syncbench.bench.train.stopping`).

The rule for hooks that make collective calls (Evaluator, Checkpointer): they
act only on values every rank agrees on, the step's
:meth:`~syncbench.algorithms.base.Algorithm.evaluation_point` (``StepContext.seen``)
or a pause point, never on wall time (which differs per rank and would hang
the job). Work done by hooks is taken off the training clock with
:meth:`StepContext.off_clock`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from syncbench.algorithms.base import StepStats
from syncbench.bench.train.progress import Progress
from syncbench.bench.train.stopping import SignalCatcher, StopVote, signal_name

if TYPE_CHECKING:
    from syncbench.bench.mpi.watchdog import Watchdog
    from syncbench.bench.train.driver import LoopState, Run


@dataclass
class StepContext:
    """What hooks see: the run, the loop's position, and the step just taken."""

    run: Run
    loop: LoopState
    #: This rank's ``time.monotonic()`` at time 0 of the run (rank 0's start, mapped).
    t0: float
    #: The last step's start on the run's clock (evaluation time included).
    t_start: float = 0.0
    stats: StepStats | None = None
    #: Global samples at an evaluation point (the same on every rank), else None.
    seen: int | None = None
    #: End of training on this rank's clock (set before ``on_end``).
    train_end: float = math.nan

    def now(self) -> float:
        """Seconds on the run's clock (``CLOCK_MONOTONIC`` from time 0)."""
        return time.monotonic() - self.t0

    @contextlib.contextmanager
    def off_clock(self) -> Iterator[float]:
        """Charge the block's time to ``loop.eval_seconds`` (not training time)."""
        started = time.monotonic()
        try:
            yield started - self.t0
        finally:
            self.loop.eval_seconds += time.monotonic() - started


class Hook:
    """Called by the driver; the defaults do nothing."""

    def on_start(self, ctx: StepContext) -> None:
        """After the start barrier, on the clock."""

    def before_step(self, ctx: StepContext) -> bool:
        """Before each step; True when it did a step's worth of work (loop re-checks)."""
        return False

    def after_step(self, ctx: StepContext) -> bool:
        """After each recorded step; True ends training."""
        return False

    def on_end(self, ctx: StepContext) -> None:
        """After the strategy drained its communication (``Algorithm.finish``)."""


class Heartbeat(Hook):
    """Beats the hang guard once per step (local; it needs no agreement)."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def on_start(self, ctx: StepContext) -> None:
        self.watchdog.start()

    def after_step(self, ctx: StepContext) -> bool:
        self.watchdog.beat(ctx.loop.step)
        return False

    def on_end(self, ctx: StepContext) -> None:
        self.watchdog.stop()


class RowFlusher(Hook):
    """Appends this rank's new rows to its rows file every ``every`` seconds (per-rank
    file: no agreement; off the clock). A failed write ends the job with one line."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.last = time.monotonic()

    def after_step(self, ctx: StepContext) -> bool:
        if time.monotonic() - self.last >= self.every:
            with ctx.off_clock():
                ctx.run.flush()
            self.last = time.monotonic()
        return False


class SnapshotKeeper(Hook):
    """Rank 0 keeps parameters that crossed an evaluation stride; evaluated at the end.

    For strategies without evaluation points (ASGD): see
    :meth:`~syncbench.algorithms.base.Algorithm.snapshot_point`.
    """

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is None:
            ctx.run.snapshot_if_due(ctx.loop, ctx.t_start - ctx.loop.eval_seconds)
        return False

    def on_end(self, ctx: StepContext) -> None:
        ctx.run.evaluate_snapshots()


class ProgressLine(Hook):
    """Rank 0's progress line, updated at evaluation points."""

    def __init__(self, total: int, mode: str) -> None:
        self.progress = Progress(total, mode)

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is not None and ctx.stats is not None:
            self.progress.update(ctx.seen, ctx.stats.loss)
        return False

    def on_end(self, ctx: StepContext) -> None:
        self.progress.update(ctx.seen or 0, float("nan"), force=True)
        self.progress.close()


class Evaluator(Hook):
    """Evaluates the consensus model at every evaluation stride (collective).

    ``target`` with ``stop``: training ends at the first evaluation whose
    accuracy reaches it (the accuracy is broadcast, so every rank stops).
    At the end, the final model is evaluated unless the last evaluation was
    at the same samples.
    """

    def __init__(self, target: float | None, stop: bool) -> None:
        self.target, self.stop = target, stop

    def after_step(self, ctx: StepContext) -> bool:
        loop, seen = ctx.loop, ctx.seen
        if seen is None or seen < loop.next_eval:
            return False
        ctx.run.settle()
        with ctx.off_clock() as t:
            accuracy = ctx.run.evaluate(t - loop.eval_seconds, loop.step, seen)
        loop.last_eval_seen = seen
        loop.next_eval += loop.eval_stride
        return self.stop and self.target is not None and accuracy >= self.target

    def on_end(self, ctx: StepContext) -> None:
        if ctx.seen != ctx.loop.last_eval_seen:  # the same on every rank
            ctx.run.evaluate(ctx.train_end - ctx.loop.eval_seconds, ctx.loop.step, ctx.seen)


class Checkpointer(Hook):
    """Saves every rank's resumable state every checkpoint stride (collective).

    Lock-step strategies checkpoint at an evaluation point past the stride;
    a strategy without evaluation points (ASGD) announces a pause that every
    rank joins (:meth:`~syncbench.algorithms.base.Algorithm.pause_point`,
    checked before each step). Checkpoints are tagged by global samples over
    the batch size, the same on every rank even where step counts differ.
    """

    def before_step(self, ctx: StepContext) -> bool:
        pause = ctx.run.algorithm.pause_point()
        if pause is None:
            return False
        if pause < 0:  # dropped (the run ended early): the loop checks done() again
            return True
        ctx.loop.next_ckpt = pause + ctx.loop.ckpt_stride
        self._save(ctx, pause)
        return True

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is not None and ctx.seen >= ctx.loop.next_ckpt:
            ctx.loop.next_ckpt += ctx.loop.ckpt_stride
            self._save(ctx, ctx.seen)
        return False

    @staticmethod
    def _save(ctx: StepContext, seen: int) -> None:
        with ctx.off_clock() as t:
            ctx.run.checkpoint(ctx.loop, t, tag=seen // ctx.run.budget.batch_size)


class StrategyReport(Hook):
    """Rank 0 prints the strategy's own measurements (collective, after the clock)."""

    def on_end(self, ctx: StepContext) -> None:
        line: Any = ctx.run.algorithm.report_line()
        if line:
            print(line, flush=True)


class StopOnSignal(Hook):
    """Ends training at a step boundary every rank agrees on once a signal arrived.

    See :mod:`syncbench.bench.train.stopping`. It is the first hook: at an evaluation
    point the rank votes (off the clock); when the vote of
    ``Algorithm.stop_vote_lag`` points ago carries a signal and the budget is
    not used up, every rank is at this same point: the stop checkpoint is
    written there (collective) and training ends before the other hooks act
    on the point (the final evaluation follows in ``Evaluator.on_end``). A
    strategy without evaluation points is asked to end early instead
    (:meth:`~syncbench.algorithms.base.Algorithm.end_early`, also where it
    waits: :meth:`~syncbench.algorithms.base.Algorithm.stop_requested`); at the
    end the ranks agree on its stop point, which is checkpointed before
    anything else runs. Every rank learns the signal that stopped the run
    (``run.stopped_by``), or "" when the budget was consumed all the same.
    """

    def __init__(self, catcher: SignalCatcher, vote: StopVote) -> None:
        self.catcher, self.vote = catcher, vote
        self.stopped = 0

    def on_start(self, ctx: StepContext) -> None:
        ctx.run.algorithm.stop_requested = lambda: bool(self.catcher.signum)

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is None:
            if self.catcher.signum:
                ctx.run.algorithm.end_early()  # once: later calls return False
            return False
        with ctx.off_clock():
            agreed = self.vote.post(self.catcher.signum)
        if not agreed or ctx.run.algorithm.done():  # done: the same on every rank
            return False
        self.stopped = agreed
        ctx.run.checkpoint_at_stop(ctx, ctx.seen)
        return True

    def on_end(self, ctx: StepContext) -> None:
        self.vote.free()  # completes the votes in flight: every rank posted as many
        run = ctx.run
        if self.stopped:
            run.stopped_by = signal_name(self.stopped)
            return
        point = run.algorithm.early_end_point()  # collective where it is not None
        if point is None:
            run.stopped_by = ""
            return
        run.stopped_by = signal_name(int(run.world.allreduce(self.catcher.signum, op=MPI.MAX)))
        run.checkpoint_at_stop(ctx, point, at_end=True)
