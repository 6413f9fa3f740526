"""DiLoCo: H inner AdamW steps, then Nesterov momentum on the averaged pseudo-gradient.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models"
(2023, arXiv 2311.08105), Alg. 1: every rank takes H inner steps (``--inner-steps``,
500 as the paper) with the inner optimizer (AdamW, the local optimizer part, by
default here; ``--optimizer sgd`` for momentum SGD) from the anchor theta_global; one
blocking ``Allreduce`` averages the pseudo-gradient ``Delta = theta_global - mean_i
theta_i``, the outer optimizer (SGD with Nesterov momentum, ``--outer-lr`` 0.7 and
``--outer-momentum`` 0.9, OpenDiLoCo's defaults) moves the anchor, and every replica
restarts from it. The inner optimizer's state stays on its rank across rounds, as in
the paper and torchft's ``DiLoCo`` (``torchft/local_sgd.py``).

``--sync-warmup S`` takes S synchronous steps first (a blocking ``Allreduce`` of the
gradient, then the inner optimizer: SSGD), the paper's pretrained start done in the run
(recorded as the run file's ``warmup_steps``). With H 1, outer lr 1, no outer momentum
and a linear inner optimizer (momentum SGD) DiLoCo is SSGD up to rounding; with AdamW
each rank's moments see its own gradient only, so it is not.

A composition of the inner optimizer
(:func:`~syncbench.algorithms.localsgd.local_step`), the warm-up's reducer
(:class:`~syncbench.algorithms.reducers.allreduce.BlockingAllreduce`), the averager
(:class:`~syncbench.algorithms.averagers.pseudo_gradient.PseudoGradientAverager`) and
the outer optimizer (:class:`~syncbench.algorithms.outer.sgd.OuterSGD`, Nesterov).
Evaluation points and checkpoints are warm-up steps and round boundaries.

Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): ``--fragments P``
``--overlap-steps tau`` ``--mix alpha`` sync the model in P fragments of whole layers at
staggered steps, each fragment's ``Iallreduce`` overlapped with tau inner steps and
merged by alpha (:class:`~syncbench.algorithms.averagers.streaming.StreamingAverager`);
its evaluation points are the steps with no fragment in flight, where the global model
is evaluated. ``--quantize CODEC`` (``fp16``, ``bf16``, ``int8[:CHUNK]``,
``int4[:CHUNK]``, the latter the paper's 4-bit min-max codes; the paper's
section 2.3, torchft's ``should_quantize``) sends every fragment's pseudo-gradient (the
whole one without fragments) as codes through the compressing SSGD reducers'
reduce-scatter and allgather with float32 sums
(:mod:`~syncbench.algorithms.averagers.quantized`). The run file records the bytes one
rank hands to MPI per outer step (``wire_bytes_per_outer_step``: every fragment synced
once) and per fragment (``wire_bytes_per_fragment``), codes or float32 alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers import round_wire_bytes
from syncbench.algorithms.averagers.pseudo_gradient import PseudoGradientAverager
from syncbench.algorithms.averagers.quantized import NONE, QuantizedReduction, check_quantize
from syncbench.algorithms.averagers.streaming import StreamingAverager
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.localsgd import local_step
from syncbench.algorithms.outer.sgd import OuterSGD
from syncbench.algorithms.reducers.allreduce import BlockingAllreduce
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, StrategyTraits


class DiLoCo(Strategy):
    name = "diloco"
    summary = ("DiLoCo: --inner-steps local AdamW steps, then Nesterov momentum on the "
               "averaged pseudo-gradient (one blocking Allreduce per round)")
    #: Warm-up steps as blocking SSGD, then an outer Allreduce every --inner-steps (or
    #: Streaming DiLoCo's fragments).
    traits = StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="diloco", stop_vote_lag=1,
                            local_optimizers=("adamw", "sgd"))

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """DiLoCo's options."""

        inner_steps: int = option(500, "DiLoCo H: inner steps per round between outer steps")
        outer_lr: float = option(0.7, "DiLoCo outer (Nesterov) learning rate")
        outer_momentum: float = option(0.9, "DiLoCo outer Nesterov momentum")
        sync_warmup: int = option(
            0, "DiLoCo: synchronous steps (Allreduce of the gradient, as SSGD) before the "
            "first round")
        fragments: int = option(
            1, "Streaming DiLoCo P: fragments of whole layers, synced in turn every H/P steps")
        overlap_steps: int = option(
            0, "Streaming DiLoCo tau: inner steps a fragment's Iallreduce overlaps "
            "(< --inner-steps // --fragments)")
        mix: float = option(
            0.0, "Streaming DiLoCo alpha: a synced fragment becomes alpha * local + "
            "(1 - alpha) * global")
        quantize: str = option(
            NONE, "DiLoCo: the codec the pseudo-gradients travel in, fp16, bf16, "
            "int8[:CHUNK], int4[:CHUNK], or none (default: float32 Allreduce); reduce-scatter and "
            "allgather of codes with float32 sums, per fragment", metavar="CODEC")

        def __post_init__(self) -> None:
            checks = [
                (self.inner_steps >= 1, f"--inner-steps must be >= 1, got {self.inner_steps}"),
                (self.outer_lr > 0, f"--outer-lr must be > 0, got {self.outer_lr}"),
                (0 <= self.outer_momentum < 1,
                 f"--outer-momentum must be in [0, 1), got {self.outer_momentum}"),
                (self.sync_warmup >= 0, f"--sync-warmup must be >= 0, got {self.sync_warmup}"),
                (self.fragments >= 1, f"--fragments must be >= 1, got {self.fragments}"),
                (self.fragments <= self.inner_steps,
                 f"--fragments {self.fragments} must be <= --inner-steps {self.inner_steps}"),
                (0 <= self.overlap_steps < self.inner_steps // self.fragments,
                 f"--overlap-steps must be in [0, --inner-steps // --fragments = "
                 f"{self.inner_steps // self.fragments}), got {self.overlap_steps}"),
                (0 <= self.mix <= 1, f"--mix must be in [0, 1], got {self.mix}"),
            ]
            for ok, message in checks:
                if not ok:
                    raise ValueError(message)
            check_quantize(self.quantize)

        @property
        def streaming(self) -> bool:
            """Fragments, overlap or mixing: Streaming DiLoCo's averager."""
            return self.fragments > 1 or self.overlap_steps > 0 or self.mix > 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options

        def outer(like: Any) -> OuterSGD:
            return OuterSGD(options.outer_lr, options.outer_momentum, True, like)

        self.averager: PseudoGradientAverager | StreamingAverager
        if options.streaming:  # points between fragments' syncs: no reduction between them
            self.traits = dataclasses.replace(DiLoCo.traits, stop_vote_lag=2)
            self.averager = StreamingAverager(self, options.inner_steps, options.fragments,
                                              options.overlap_steps, options.mix, outer,
                                              options.quantize)
            per_fragment = self.averager.wire_bytes()
        else:
            whole = [(0, int(self.model.size))]
            quantized = (QuantizedReduction(self, options.quantize, whole)
                         if options.quantize != NONE else None)
            self.averager = PseudoGradientAverager(self, options.inner_steps, "keep",
                                                   outer(self.model.params), quantized)
            per_fragment = [quantized.wire_bytes(0) if quantized is not None
                            else int(self.model.params.nbytes)]
        self.warmup = BlockingAllreduce(self)
        self.run_attributes["warmup_steps"] = options.sync_warmup
        # a round's bytes: every fragment once; unstreamed, what round_wire_bytes adds
        # (BatchNorm's running statistics, which PseudoGradientAverager averages at each
        # outer step; its moments are kept); the streamed form averages the statistics
        # only when it finishes
        fragments = int(sum(per_fragment))
        self.run_attributes["wire_bytes_per_outer_step"] = (
            fragments if options.streaming else round_wire_bytes(self, "keep", fragments))
        self.run_attributes["wire_bytes_per_fragment"] = [int(b) for b in per_fragment]
        self.run_attributes["outer_period_steps"] = int(options.inner_steps)

    def in_warmup(self) -> bool:
        return self.steps_taken < self.options.sync_warmup

    def step(self, x: Any, y: Any) -> StepStats:
        if self.in_warmup():
            loss = self.compute_gradient(x, y)
            grads = self.warmup.complete()
            with self.timer.phase("update"):
                self.optimizer.step(self.model.params, grads)
            self.steps_taken += 1
            if not self.in_warmup():
                self.averager.begin()
            return StepStats(loss=loss, samples=int(x.shape[0]))
        averager = self.averager
        if isinstance(averager, StreamingAverager):
            if not averager.started:
                averager.begin()  # no warm-up
            loss = local_step(self, x, y, poll=averager.poll if averager.in_flight() else None)
            self.steps_taken += 1
            stats = StepStats(loss=loss, samples=int(x.shape[0]),
                              local_steps=averager.period, round=averager.round)
            averager.after_step(last=self.done())
            return stats
        loss = local_step(self, x, y)
        self.steps_taken += 1
        stats = StepStats(loss=loss, samples=int(x.shape[0]), local_steps=averager.round_len,
                          round=averager.round)
        averager.after_step()
        return stats

    def evaluation_point(self) -> int | None:
        """Global samples after a warm-up step or at a round boundary (streamed: at a step
        with no fragment in flight), else None."""
        averager = self.averager
        if isinstance(averager, StreamingAverager):
            return None if averager.in_flight() else super().evaluation_point()
        return None if averager.round_steps else super().evaluation_point()

    def consensus_params(self) -> Any:
        """The global model: the parameters (streamed: every fragment's anchor, once the
        rounds have begun)."""
        averager = self.averager
        if isinstance(averager, StreamingAverager) and averager.started:
            return averager.anchor
        return self.model.params

    def finish(self) -> None:
        if isinstance(self.averager, StreamingAverager):
            self.averager.average()

    def close(self) -> None:
        averager = self.averager
        if isinstance(averager, StreamingAverager):
            averager.pending = [None] * len(averager.pending)
        if averager.quantized is not None:
            averager.quantized.close()

    def state(self) -> dict[str, Any]:
        return {**super().state(), **self.averager.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.load_state(state, rounds_started=not self.in_warmup())
