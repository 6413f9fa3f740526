"""The evaluation hooks: test loss and accuracy of what a run trains, and their rows.

:class:`Evaluator` scores what ``--eval-model`` names at every ``--eval-every``
stride and once more at the end of training: the consensus model
(:meth:`~syncbench.algorithms.base.Strategy.consensus_params` with its running
statistics) on rank 0 over the whole test split (the ``/eval`` rows), every
rank's own weights on its contiguous shard of the test split with the loss and
accuracy over all shards, as the OD-SGD paper's workers score themselves
(``base_module.py``, gluon ``data.py``; ``/eval_local`` with ``both``), or both.
Before each stride's evaluation it completes the communication in flight on the
clock (:meth:`Evaluator.settle`), so an overlapped reduction is charged to the
last step instead of vanishing into the evaluation.

:class:`SnapshotKeeper` does it for strategies without evaluation points (ASGD):
rank 0 keeps the parameter copies that crossed a stride
(:meth:`~syncbench.algorithms.not_lock_step.NotLockStep.snapshot_point`) and scores them
after training.

Evaluations are collective, made only at points every rank agrees on (the rule
of :mod:`syncbench.bench.train.hooks`), and off the training clock.

A language model (``gpt`` on a text corpus) is scored on the corpus's fixed
held-out windows: its rows' ``loss`` is the validation loss in nats per token
and its ``accuracy`` is NaN (absent: next-token accuracy is not what an LM is
judged by); :attr:`Evaluator.lm_metrics` adds bits per character and
perplexity of the last evaluation, and :func:`quality` puts them in the
result line.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from syncbench.analysis.targets import Target
from syncbench.bench.data.catalog import Dataset
from syncbench.bench.mpi.runtime import wait_politely
from syncbench.bench.train.hooks import Hook, StepContext
from syncbench.bench.train.recorder import EvalRecorder
from syncbench.kernels.backend import Backend
from syncbench.kernels.gpt import lm_metrics
from syncbench.kernels.zoo import build_model

if TYPE_CHECKING:
    from syncbench.bench.train.config import TrainConfig
    from syncbench.bench.train.driver import LoopState, Training


class Evaluator(Hook):
    """Evaluates what ``--eval-model`` names at every evaluation stride (collective).

    ``--target-accuracy`` (or ``--target-loss``) with ``--stop-at-target``: training
    ends at the first evaluation whose accuracy (loss) reaches it (both are
    broadcast, so every rank stops). At the end, the final model is evaluated unless the last
    evaluation was at the same samples. Owns the evaluation rows.
    """

    def __init__(self, config: TrainConfig, data: Dataset, backend: Backend,
                 dtype: np.dtype, rank: int) -> None:
        self.target: Target | None = config.target()
        self.stop: bool = config.stop_at_target
        self.data = data
        #: Rank 0's copy of the consensus model (also what ``--save-model`` writes).
        self.consensus_model = build_model(
            config.model, data.input_shape, data.num_classes, backend, dtype
        ) if rank == 0 else None
        #: What is evaluated (``--eval-model``): the consensus model, every rank's own, or both.
        self.mode: str = config.eval_model
        #: Every rank's own model and test shard, for ``--eval-model local|both``.
        self.local_model = build_model(
            config.model, data.input_shape, data.num_classes, backend, dtype
        ) if self.mode != "global" else None
        #: Rank 0's ``/eval`` rows (the local evaluations with ``--eval-model local``).
        self.rows = EvalRecorder()
        #: ``--eval-model both``: the local evaluations (``/eval_local``).
        self.local_rows = EvalRecorder()
        #: This rank's own weights when training ended (before ``finish`` drains into them).
        self.final_local_params: Any = None
        #: A language model's measures at its last ``/eval`` row (:func:`lm_metrics`),
        #: else None.
        self.lm_metrics: dict[str, float] | None = None
        #: Every rank's copy for scoring its own model on the whole test split, where a
        #: strategy's replicas differ (:meth:`score_own`; built at its first use).
        self.replica_model: Any = None
        self._build_model = lambda: build_model(
            config.model, data.input_shape, data.num_classes, backend, dtype)

    def after_step(self, ctx: StepContext) -> bool:
        loop, seen = ctx.loop, ctx.seen
        if seen is None or seen < loop.next_eval:
            return False
        self.settle(ctx.training)
        with ctx.off_clock() as t:
            loss, accuracy = self.evaluate(ctx.training, t - loop.eval_seconds, loop.step, seen)
        loop.last_eval_seen = seen
        loop.next_eval += loop.eval_stride
        if not self.stop or self.target is None:
            return False
        return bool(self.target.reached(loss if self.target.metric == "loss" else accuracy))

    def before_finish(self, ctx: StepContext) -> None:
        if self.mode != "global":
            self.final_local_params = ctx.training.algorithm.model.params.copy()

    def on_end(self, ctx: StepContext) -> None:
        if ctx.seen != ctx.loop.last_eval_seen:  # the same on every rank
            self.evaluate(ctx.training, ctx.train_seconds, ctx.loop.step,
                          ctx.seen)

    @staticmethod
    def settle(training: Training) -> None:
        """Complete communication in flight before an evaluation, on the clock.

        An overlapped reduction (Oscars ``--overlap``) would otherwise be waited
        for inside the evaluation and vanish from ``wall_s``; here its wait and
        update are charged to the last step's row instead.
        """
        timer = training.timer
        timer.reset()
        with timer.phase("wait"):
            training.algorithm.consensus_params()
        with training.rows_lock:
            training.recorder.add_to_last(timer.totals)

    def evaluate(self, training: Training, t: float, step: int,
                 samples_seen: int) -> tuple[float, float]:
        """Evaluate what ``--eval-model`` names (collective); returns the loss and accuracy
        that the run's ``/eval`` rows hold (the consensus model's, or the local one with
        ``local``) on all ranks."""
        result = np.zeros(2)
        if self.mode != "local":
            params = training.algorithm.consensus_params()
            buffers = training.algorithm.model.buffers
            if training.rank == 0:
                result[:] = self.record(params, buffers, t, step, samples_seen)
        if self.mode != "global":
            local = self.evaluate_local(training)
            if training.rank == 0:
                rows = self.rows if self.mode == "local" else self.local_rows
                rows.append(t, step, samples_seen, *local)
            if self.mode == "local":
                result[:] = local
        # a decentralized strategy's ranks' own models: mean and worst (root attributes)
        training.algorithm.score_replicas(
            lambda params: self.score_own(params, training.algorithm.model.buffers))
        wait_politely(training.world.Ibcast(result, root=0))
        return float(result[0]), float(result[1])

    def record(self, params: Any, buffers: Any, t: float, step: int,
               samples_seen: int) -> tuple[float, float]:
        """Rank 0: test loss and accuracy of ``params`` with the running statistics
        ``buffers``, appended as an eval row."""
        model = self.consensus_model
        model.params[...] = params
        model.buffers[...] = buffers
        loss, accuracy = model.evaluate(self.data.test_x, self.data.test_y)
        self.rows.append(t, step, samples_seen, float(loss), float(accuracy))
        if math.isnan(accuracy):  # a language model: nats per token, bits per char, perplexity
            self.lm_metrics = lm_metrics(float(loss))
        return float(loss), float(accuracy)

    def score_own(self, params: Any, buffers: Any) -> float:
        """This rank's accuracy of ``params`` with running statistics ``buffers`` on the
        whole test split (a rank's own model; no communication)."""
        if self.replica_model is None:
            self.replica_model = self._build_model()
        model = self.replica_model
        model.params[...] = params
        model.buffers[...] = buffers
        return float(model.evaluate(self.data.test_x, self.data.test_y)[1])

    def evaluate_local(self, training: Training) -> tuple[float, float]:
        """Every rank's own weights (the model's parameters; when training has
        ended, those it ended with) and running statistics on its contiguous shard of the
        test split; the loss and accuracy over all shards (collective)."""
        model = self.local_model
        own = self.final_local_params
        model.params[...] = training.algorithm.model.params if own is None else own
        model.buffers[...] = training.model.buffers
        rank, size = training.rank, training.size
        count = len(self.data.test_y)
        lo, hi = rank * count // size, (rank + 1) * count // size
        loss, accuracy = model.evaluate(self.data.test_x[lo:hi], self.data.test_y[lo:hi])
        totals = np.array([loss * (hi - lo), accuracy * (hi - lo), hi - lo], dtype=np.float64)
        wait_politely(training.world.Iallreduce(MPI.IN_PLACE, totals, op=MPI.SUM))
        return float(totals[0] / totals[2]), float(totals[1] / totals[2])


class SnapshotKeeper(Hook):
    """Rank 0 keeps parameters that crossed an evaluation stride; evaluated at the end.

    For strategies without evaluation points (ASGD): see
    :meth:`~syncbench.algorithms.not_lock_step.NotLockStep.snapshot_point`. The copies are
    scored by ``evaluator`` into its rows after training (off the clock).
    """

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        #: (time, step, global samples, parameters, running statistics) of each copy.
        self.snapshots: list[tuple[float, int, int, Any, Any]] = []

    def after_step(self, ctx: StepContext) -> bool:
        if ctx.seen is None:
            self.keep_if_due(ctx.training, ctx.loop, ctx.t_start - ctx.loop.eval_seconds)
        return False

    def on_end(self, ctx: StepContext) -> None:
        for t, step, seen, params, buffers in self.snapshots:
            self.evaluator.record(params, buffers, t, step, seen)
        self.snapshots = []

    def keep_if_due(self, training: Training, loop: LoopState, t: float) -> None:
        """Rank 0 keeps a copy of parameters that crossed the next evaluation stride,
        with time ``t`` (the start of the step whose parameters it is)."""
        if training.rank != 0 or loop.next_eval == math.inf:
            return
        seen = training.protocol.snapshot_point()
        if seen is None or seen < loop.next_eval:
            return
        model = training.model
        self.snapshots.append((t, loop.step, seen, model.params.copy(), model.buffers.copy()))
        while loop.next_eval <= seen:
            loop.next_eval += loop.eval_stride


def quality(summary: dict[str, float]) -> str:
    """The result line's clause on what the run learned: ``accuracy A  loss L`` for a
    classifier; for a language model (no accuracy) the validation loss in nats per token
    with bits per character and perplexity."""
    accuracy, loss = summary["final_accuracy"], summary["final_loss"]
    if math.isnan(accuracy) and math.isfinite(loss):
        m = lm_metrics(loss)
        return (f"val loss {loss:.4f} nats/token  {m['bits_per_char']:.4f} bits/char  "
                f"perplexity {m['perplexity']:.2f}")
    return f"accuracy {accuracy:.4f}  loss {loss:.4f}"
