"""What the training driver does around each step, as hooks (ChainerMN's extensions).

The loop of :meth:`syncbench.bench.train.driver.Training.train` only gets data, calls
``algorithm.step`` and records the row; everything else is a :class:`Hook`
called at the start of training, before and after every step, when the steps
end, and at the end, and each hook owns its logic:

- :class:`Heartbeat` feeds the hang guard (``--timeout``);
- :class:`RowFlusher` appends this rank's new rows for ``syncbench recover``;
- :class:`~syncbench.bench.train.evaluation.SnapshotKeeper` keeps ASGD-style
  parameter copies at evaluation strides;
- :class:`ProgressLine` drives rank 0's progress line;
- :class:`~syncbench.bench.train.evaluation.Evaluator` evaluates every
  ``--eval-every`` and stops at ``--target-accuracy`` with ``--stop-at-target``;
- :class:`Checkpointer` saves resumable state every ``--checkpoint-every`` steps
  (and joins a strategy's checkpoint pauses, :meth:`NotLockStep.pause_point`),
  writes the stop checkpoint and restores state for ``--resume``;
- :class:`StrategyReport` prints a strategy's own measurements after training;
- :class:`StopOnSignal` ends training at an agreed step boundary after SIGTERM,
  SIGINT or SIGUSR1 (:mod:`syncbench.bench.train.stopping`).

The rule for hooks that make collective calls (Evaluator, Checkpointer): they
act only on values every rank agrees on, the step's
:meth:`~syncbench.algorithms.base.Strategy.evaluation_point` (``StepContext.seen``)
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from syncbench.algorithms.base import StepStats
from syncbench.bench.train.checkpoint import (
    WriteError,
    abort_on_write_error,
    commit_checkpoint,
    load_state,
    save_state,
)
from syncbench.bench.train.progress import Progress
from syncbench.bench.train.stopping import SignalCatcher, StopVote, signal_name

if TYPE_CHECKING:
    from syncbench.bench.mpi.watchdog import Watchdog
    from syncbench.bench.train.driver import LoopState, Training


@dataclass
class StepContext:
    """What hooks see: the rank's training, the loop's position, and the step just taken."""

    training: Training
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
    #: Seconds of training at ``train_end``: the run's clock less the off-clock blocks
    #: before it (the end-of-training evaluation's time, and the run's ``wall_s``).
    train_seconds: float = math.nan

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

    def before_finish(self, ctx: StepContext) -> None:
        """After the last step, before the strategy drains its communication."""

    def on_end(self, ctx: StepContext) -> None:
        """After the strategy drained its communication (``Strategy.finish``)."""


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
                ctx.training.flush()
            self.last = time.monotonic()
        return False


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


class Checkpointer(Hook):
    """Saves every rank's resumable state (collective) and restores it (``--resume``).

    Every checkpoint stride: lock-step strategies checkpoint at an evaluation
    point past the stride; a strategy without evaluation points (ASGD)
    announces a pause that every rank joins
    (:meth:`~syncbench.algorithms.not_lock_step.NotLockStep.pause_point`, checked before
    each step). Checkpoints are tagged by global samples over the batch size,
    the same on every rank even where step counts differ. A run with a parts
    folder has one, which also writes the stop checkpoint
    (:class:`StopOnSignal`); it is a hook only with ``--checkpoint-every``.
    """

    def __init__(self, folder: Path, identity: dict[str, Any],
                 resume_step: int | None = None) -> None:
        #: The run's parts folder, and what its checkpoints record (``--resume`` checks it).
        self.folder, self.identity = folder, identity
        #: ``--resume``: the tag of the checkpoint to continue from.
        self.resume_step = resume_step
        #: The tag of the last checkpoint saved, and the samples of the stop checkpoint.
        self.last_tag: int | None = None
        self.stop_samples: int | None = None

    def before_step(self, ctx: StepContext) -> bool:
        pause = ctx.training.protocol.pause_point()
        if pause is None:
            return False
        if pause < 0:  # dropped (the run ended early): the loop checks done() again
            return True
        ctx.loop.next_ckpt = pause + ctx.loop.ckpt_stride
        self._save_off_clock(ctx, pause)
        return True

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is not None and ctx.seen >= ctx.loop.next_ckpt:
            ctx.loop.next_ckpt += ctx.loop.ckpt_stride
            self._save_off_clock(ctx, ctx.seen)
        return False

    def _save_off_clock(self, ctx: StepContext, seen: int) -> None:
        with ctx.off_clock() as t:
            self.save(ctx.training, ctx.loop, t, tag=seen // ctx.training.budget.batch_size)

    def save_at_stop(self, ctx: StepContext, samples: int, at_end: bool = False) -> None:
        """The stop checkpoint at global ``samples`` (collective; off the clock): an
        evaluation point every rank is at, or (``at_end``) the point a strategy that
        ended itself early agreed on right after ``Strategy.finish``, when the run's
        clock stands at the end of training. A tag saved at this point already is not
        saved again."""
        tag = samples // ctx.training.budget.batch_size
        if tag != self.last_tag:
            with ctx.off_clock() as now:
                self.save(ctx.training, ctx.loop, ctx.train_end if at_end else now, tag=tag)
        self.stop_samples = samples

    def save(self, training: Training, loop: LoopState, elapsed: float, tag: int) -> None:
        """Save every rank's resumable state at this evaluation point (collective).

        ``tag`` names the checkpoint and must be the same on every rank. After every
        rank saved and flushed its rows (a barrier), rank 0 commits it.
        """
        loop.elapsed = elapsed
        state = {
            "algorithm": training.algorithm.state(),
            "loop": loop.as_dict(),
            "stream_position": training.stream.position,
            "rows": training.recorder.columns(),
        }
        if training.rank == 0:
            state["evals"] = training.evaluator.rows.columns()
            state["evals_local"] = training.evaluator.local_rows.columns()
        self.last_tag = tag
        try:
            save_state(self.folder, training.rank, tag, state)
        except WriteError as exc:
            abort_on_write_error(training.world, exc)
        training.flush()
        training.world.Barrier()
        if training.rank == 0:
            try:  # with the run's identity, checked by --resume
                commit_checkpoint(self.folder, tag, training.size, self.identity)
            except WriteError as exc:
                abort_on_write_error(training.world, exc)

    def restore(self, training: Training, loop: LoopState) -> None:
        """Continue from the newest complete checkpoint (``--resume``)."""
        state = load_state(self.folder, training.rank, self.resume_step)
        training.algorithm.load_state(state["algorithm"])
        loop.load(state["loop"])
        training.stream.seek(int(state["stream_position"]))
        training.recorder.extend(state["rows"])
        if training.rank == 0 and "evals" in state:
            training.evaluator.rows.extend(state["evals"])
        if training.rank == 0 and "evals_local" in state:
            training.evaluator.local_rows.extend(state["evals_local"])


class StrategyReport(Hook):
    """Rank 0 prints the strategy's own measurements (collective, after the clock)."""

    def on_end(self, ctx: StepContext) -> None:
        line: Any = ctx.training.protocol.report_line()
        if line:
            print(line, flush=True)


class StopOnSignal(Hook):
    """Ends training at a step boundary every rank agrees on once a signal arrived.

    See :mod:`syncbench.bench.train.stopping`. It is the first hook: at an evaluation
    point the rank votes (off the clock); when the vote of
    ``StrategyTraits.stop_vote_lag`` points ago carries a signal and the budget is
    not used up, every rank is at this same point: the stop checkpoint is
    written there (``checkpointer``, collective; None without ``--out``: nowhere
    to keep one) and training ends before the other hooks act on the point (the
    final evaluation follows in ``Evaluator.on_end``). A strategy without
    evaluation points is asked to end early instead
    (:meth:`~syncbench.algorithms.not_lock_step.NotLockStep.end_early`, also where it
    waits: :meth:`~syncbench.algorithms.not_lock_step.NotLockStep.stop_requested`); at the
    end the ranks agree on its stop point, which is checkpointed before
    anything else runs. Every rank learns the signal that stopped the run
    (``training.stopped_by``), or "" when the budget was consumed all the same.
    """

    def __init__(self, catcher: SignalCatcher, vote: StopVote,
                 checkpointer: Checkpointer | None = None) -> None:
        self.catcher, self.vote, self.checkpointer = catcher, vote, checkpointer
        self.stopped = 0

    def on_start(self, ctx: StepContext) -> None:
        ctx.training.protocol.stop_requested = lambda: bool(self.catcher.signum)

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is None:
            if self.catcher.signum:
                ctx.training.protocol.end_early()  # once: later calls return False
            return False
        with ctx.off_clock():
            agreed = self.vote.post(self.catcher.signum)
        if not agreed or ctx.training.algorithm.done():  # done: the same on every rank
            return False
        self.stopped = agreed
        if self.checkpointer is not None:
            self.checkpointer.save_at_stop(ctx, ctx.seen)
        return True

    def on_end(self, ctx: StepContext) -> None:
        self.vote.free()  # completes the votes in flight: every rank posted as many
        training = ctx.training
        if self.stopped:
            training.stopped_by = signal_name(self.stopped)
            return
        point = training.protocol.early_end_point()  # collective where it is not None
        if point is None:
            training.stopped_by = ""
            return
        training.stopped_by = signal_name(
            int(training.world.allreduce(self.catcher.signum, op=MPI.MAX)))
        if self.checkpointer is not None:
            self.checkpointer.save_at_stop(ctx, point, at_end=True)
