"""SSGD: synchronous data-parallel SGD with an allreduce of the gradients.

Each step every rank computes the mean gradient of its mini-batch, the ranks
average the gradients, and every rank applies the same momentum-SGD update,
so replicas stay bit-identical. With per-rank batch b on N ranks this equals
single-process SGD with batch N*b (up to the summation order).

A composition of two parts: a gradient reducer chosen by ``--comm`` and the local
optimizer (momentum SGD):

* ``blocking``: :class:`~syncbench.algorithms.reducers.allreduce.BlockingAllreduce`,
  one ``Allreduce`` of the whole flat gradient after backward.
* ``overlap`` (default):
  :class:`~syncbench.algorithms.reducers.bucketed.BucketedIallreduce`, an
  ``Iallreduce`` per bucket of at most ``--bucket-mb`` MB of whole layers
  (:mod:`~syncbench.algorithms.reducers.buckets`), posted as backward finishes it.
* ``hierarchical``:
  :class:`~syncbench.algorithms.reducers.hierarchical.HierarchicalAllreduce`, the
  gradient summed inside each node, then among one rank per node, then broadcast
  inside the node (Horovod's hierarchical allreduce).

``--compress NAME[:ARG]`` replaces the Allreduce (or, under overlap, each bucket's
Iallreduce) by a compressing reducer (:mod:`~syncbench.algorithms.reducers.compress`: 16-bit, int8,
PowerSGD, top-k, random-k). A reducer that applies the momentum itself (top-k and
random-k with DGC's ``momentum=M``: ``applies_momentum``) is followed by momentum SGD
with momentum 0, and ``--momentum`` must equal its ``M``.

The number of reductions posted per step is the run file's root attribute
``buckets``; the bytes of gradient this rank hands to MPI per step,
``wire_bytes_per_step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.codecs.powersgd import DEFAULT_START_ITER
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.local_optimizer import local_optimizer_name
from syncbench.algorithms.reducers import GradientReducer
from syncbench.algorithms.reducers.allreduce import BlockingAllreduce
from syncbench.algorithms.reducers.bucketed import BucketedIallreduce
from syncbench.algorithms.reducers.buckets import (
    AUTO_BUCKET_CAP_MB,
    bucket_mb_arg,
    model_bucket_plan,
)
from syncbench.algorithms.reducers.compress import (
    NONE,
    check_compress,
    compress_momentum,
    compressed_reducer,
)
from syncbench.algorithms.reducers.hierarchical import HierarchicalAllreduce
from syncbench.algorithms.traits import StrategyTraits

#: ``--comm``: how SSGD reduces the gradient.
COMM_MODES = ("overlap", "blocking", "hierarchical")


def gradient_reducer(core: Strategy, comm: str, bucket_mb: str | float,
                     compress: str = NONE,
                     powersgd_start: int = DEFAULT_START_ITER) -> GradientReducer:
    """SSGD's reducer for ``--comm``, ``--bucket-mb``, ``--compress`` and
    ``--powersgd-start``."""
    if comm == "hierarchical":
        return HierarchicalAllreduce(core)
    plan = None if comm == "blocking" else model_bucket_plan(core.model, bucket_mb)
    if compress != NONE:
        return compressed_reducer(core, compress, plan, powersgd_start)
    if plan is None:
        return BlockingAllreduce(core)
    return BucketedIallreduce(core, plan)


class SSGD(Strategy):
    name = "ssgd"
    summary = "synchronous allreduce SGD (blocking, or bucketed Iallreduce overlapping backward)"
    #: Every step ends with its reductions complete (Allreduce, or Waitall of the buckets).
    traits = StrategyTraits(hides_comm=True, simulation="ssgd", stop_vote_lag=1)

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """SSGD's options."""

        comm: str = option(
            "overlap", "SSGD gradient reduction: bucketed Iallreduce overlapped with backward "
            "(default), one blocking Allreduce after backward, or hierarchical (inside each "
            "node, across one rank per node, broadcast inside the node)", choices=COMM_MODES)
        bucket_mb: str | float = option(
            "auto", "SSGD overlap: most MB of gradient per Iallreduce bucket (whole layers; a "
            "larger layer gets its own). auto (default): a quarter of the model's gradient, "
            f"at most {AUTO_BUCKET_CAP_MB:g} MB", type=bucket_mb_arg)
        compress: str = option(
            NONE, "SSGD gradient compression, NAME[:ARG]: fp16, bf16, int8[:CHUNK], "
            "int4[:CHUNK], "
            "powersgd[:RANK], topk:DENSITY, randomk:DENSITY (error feedback; DGC's "
            "momentum correction and warm-up: topk:DENSITY,momentum=M,warmup=STEPS), or none "
            "(default); bucket by bucket with --comm overlap, but powersgd (--comm blocking)",
            metavar="NAME[:ARG]")
        powersgd_start: int = option(
            DEFAULT_START_ITER, "SSGD --compress powersgd: plain Allreduce steps before "
            "compressing (PyTorch's start_powerSGD_iter)", metavar="STEPS")

        def __post_init__(self) -> None:
            if self.comm not in COMM_MODES:
                raise ValueError(f"--comm must be one of {', '.join(COMM_MODES)}, got {self.comm}")
            if self.bucket_mb != "auto" and not float(self.bucket_mb) > 0:
                raise ValueError(f"--bucket-mb must be auto or > 0, got {self.bucket_mb}")
            if self.comm == "hierarchical" and self.compress != NONE:
                raise ValueError("--compress needs --comm blocking or overlap, not hierarchical")
            check_compress(self.compress, overlap=self.comm == "overlap")
            if self.powersgd_start < 0:
                raise ValueError(f"--powersgd-start must be >= 0, got {self.powersgd_start}")

        def check_run(self, config: Any, world_size: int) -> None:
            """DGC's momentum correction replaces momentum SGD's momentum: SGD only, and
            ``--momentum`` equal to the spec's ``M`` (one momentum in the run's record)."""
            momentum = compress_momentum(self.compress)
            if not momentum:
                return
            optimizer = local_optimizer_name(config, SSGD.traits)
            if optimizer != "sgd":
                raise ValueError(f"--compress {self.compress} applies momentum SGD's momentum "
                                 f"in the reducer: it needs --optimizer sgd, not {optimizer}")
            if config.momentum != momentum:
                raise ValueError(f"--compress {self.compress} corrects momentum {momentum:g} "
                                 f"but --momentum is {config.momentum:g}: give --momentum "
                                 f"{momentum:g} (the update then applies none)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options
        self.reducer = gradient_reducer(self, options.comm, options.bucket_mb, options.compress,
                                        options.powersgd_start)
        if self.reducer.applies_momentum:  # the reduced gradient carries the momentum
            self.optimizer.momentum = 0.0
        self.run_attributes["buckets"] = self.reducer.posts_per_step
        self.run_attributes["wire_bytes_per_step"] = self.reducer.run_wire_bytes(
            self.budget.steps_per_rank)

    def step(self, x: Any, y: Any) -> StepStats:
        self.reducer.start()
        loss = self.compute_gradient(x, y, self.reducer.hooks())
        grads = self.reducer.complete()
        with self.timer.phase("update"):
            self.optimizer.step(self.model.params, grads)
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]))

    def state(self) -> dict[str, Any]:
        """The core's state and the reducer's (a compressing reducer's error feedback)."""
        return {**super().state(), **self.reducer.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.reducer.load_state(state)
