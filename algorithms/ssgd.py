"""SSGD: synchronous data-parallel SGD with an allreduce of the gradients.

Each step every rank computes the mean gradient of its mini-batch, the ranks
average the gradients, and every rank applies the same momentum-SGD update,
so replicas stay bit-identical. With per-rank batch b on N ranks this equals
single-process SGD with batch N*b (up to the summation order).

Communication modes (``--comm``):

* ``blocking``: one ``Allreduce`` of the whole flat gradient after backward.
* ``overlap`` (default): the flat gradient is cut into buckets of at most
  ``--bucket-mb`` MB of whole layers (:func:`plan_buckets`). Backward visits
  layers in reverse and the model reports after each layer the offset from
  which the gradient is final; as soon as a bucket's slice ``[start, end)``
  is final an in-place ``Iallreduce`` starts on it. A bucket is closed
  *before* adding a layer whose gradient would overflow it, as PyTorch DDP
  assigns parameters to buckets (``bucket_cap_mb``; Li et al., VLDB 2020,
  "PyTorch Distributed"), so a large first layer, whose gradient arrives
  last, gets a bucket of its own and the buckets before it overlap its
  backward. Outstanding requests are polled between layers (MPI progresses
  only inside MPI calls) and the update waits on all of them.
* ``--bucket-mb auto`` (the default) is a quarter of the model's gradient,
  at most 25 MB (DDP's default cap): every model with two or more layers of
  parameters then gets at least two buckets (``mlp``: 2, ``lenet``: 3).

The number of reductions posted per step is :attr:`SSGD.buckets` (the run
file's root attribute ``buckets``). An emulated straggler (``--slowdown``)
spends its delay right before posting its last bucket, where a slower
processor would post it (see :meth:`SSGD._on_grads_ready`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from syncbench.algorithms.base import Algorithm, StepStats
from syncbench.algorithms.flags import option

#: ``--bucket-mb auto``: this fraction of the model's gradient, capped at DDP's default.
AUTO_BUCKET_FRACTION = 0.25
AUTO_BUCKET_CAP_MB = 25.0
#: ``--comm``: how SSGD reduces the gradient.
COMM_MODES = ("overlap", "blocking")


def bucket_mb_arg(text: str) -> str | float:
    """``--bucket-mb``: ``auto`` or a number of MB."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number of MB, got {text!r}") from None


def bucket_bytes(bucket_mb: str | float, grad_nbytes: int) -> int:
    """The bucket size in bytes for ``--bucket-mb`` (``auto``: see the module docstring)."""
    if bucket_mb == "auto":
        return max(1, int(min(AUTO_BUCKET_FRACTION * grad_nbytes, AUTO_BUCKET_CAP_MB * 1e6)))
    return max(1, int(float(bucket_mb) * 1e6))


def plan_buckets(
    layer_offsets: Sequence[int], size: int, bucket_elems: int
) -> list[tuple[int, int]]:
    """Buckets ``[start, end)`` of a flat gradient, in the order backward completes them.

    Layer ``i`` owns ``[layer_offsets[i], layer_offsets[i + 1])`` (the last one
    up to ``size``). Walking layers in reverse, a bucket is closed before a
    layer whose elements would take it past ``bucket_elems`` (a layer larger
    than that gets a bucket of its own); layers without parameters are
    skipped. The buckets tile ``[0, size)`` exactly.
    """
    bounds = [*layer_offsets[1:], size]
    buckets: list[tuple[int, int]] = []
    start = end = size
    for lo, hi in zip(reversed(layer_offsets), reversed(bounds)):
        if hi <= lo:
            continue
        if start < end and (end - start) + (hi - lo) > bucket_elems:
            buckets.append((start, end))
            end = start
        start = lo
    if start < end:
        buckets.append((start, end))
    return buckets


class SSGD(Algorithm):
    #: Every step ends with its reductions complete (Allreduce, or Waitall of the buckets).
    stop_vote_lag = 1
    name = "ssgd"
    summary = "synchronous allreduce SGD (blocking, or bucketed Iallreduce overlapping backward)"
    hides_comm = True
    simulation = "ssgd"

    @dataclass(frozen=True)
    class Options:
        """SSGD's options."""

        comm: str = option(
            "overlap", "SSGD gradient reduction: bucketed Iallreduce overlapped with backward "
            "(default) or one blocking Allreduce after backward", choices=COMM_MODES)
        bucket_mb: str | float = option(
            "auto", "SSGD overlap: most MB of gradient per Iallreduce bucket (whole layers; a "
            "larger layer gets its own). auto (default): a quarter of the model's gradient, "
            f"at most {AUTO_BUCKET_CAP_MB:g} MB", type=bucket_mb_arg)

        def __post_init__(self) -> None:
            if self.comm not in COMM_MODES:
                raise ValueError(f"--comm must be one of {', '.join(COMM_MODES)}, got {self.comm}")
            if self.bucket_mb != "auto" and not float(self.bucket_mb) > 0:
                raise ValueError(f"--bucket-mb must be auto or > 0, got {self.bucket_mb}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        grads = self.model.grads
        self.bucket_elems = max(1, bucket_bytes(self.options.bucket_mb, grads.nbytes)
                                // grads.itemsize)
        #: Overlap buckets ``[start, end)``, in the order backward completes them.
        self.bucket_plan = plan_buckets(self.model.layer_offsets, self.model.size,
                                        self.bucket_elems)
        #: Reductions posted per step.
        self.buckets = len(self.bucket_plan) if self.options.comm == "overlap" else 1
        self._requests: list[MPI.Request] = []
        self._next_bucket = 0  # index in bucket_plan of the next bucket to post
        self._straggled = False  # this step's emulated slowdown has run

    def _on_grads_ready(self, offset: int) -> None:
        """Start an Iallreduce on every bucket whose gradient is now final, else poll.

        An emulated straggler spends its delay right before it posts its last
        bucket: a processor f times slower would post that bucket at f times
        its compute time, so the delay must not hide the reduction of the
        whole gradient (which it would, after the last post).
        """
        plan, posted = self.bucket_plan, False
        while self._next_bucket < len(plan) and plan[self._next_bucket][0] >= offset:
            start, end = plan[self._next_bucket]
            if self._next_bucket == len(plan) - 1 and not self._straggled:
                self._straggled = True
                self.straggle()
            self._requests.append(self.comm.Iallreduce(self.model.grads[start:end]))
            self._next_bucket += 1
            posted = True
        if not posted:
            self.comm.poll()

    def reduce_gradients(self, x: Any, y: Any) -> float:
        """Compute this rank's gradient and leave the SUM over ranks in ``model.grads``."""
        if self.options.comm == "blocking":
            with self.timer.phase("compute"):
                loss = self.model.loss_and_grad(x, y)
            self.straggle()
            self.comm.Allreduce(self.model.grads)
            return loss
        self._next_bucket, self._straggled = 0, False
        with self.timer.phase("compute"):
            loss = self.model.loss_and_grad(
                x, y, on_grads_ready=self._on_grads_ready, poll=self.comm.poll
            )
        if not self._straggled:  # (every bucket is posted from inside backward)
            self.straggle()
        self.comm.Waitall(self._requests)
        self._requests = []
        return loss

    def step(self, x: Any, y: Any) -> StepStats:
        loss = self.reduce_gradients(x, y)
        with self.timer.phase("update"):
            self.model.grads *= 1.0 / self.comm.size
            self.optimizer.step(self.model.params, self.model.grads)
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]))
