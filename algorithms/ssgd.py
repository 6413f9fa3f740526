"""SSGD: synchronous data-parallel SGD with an allreduce of the gradients.

Each step every rank computes the mean gradient of its mini-batch, the ranks
average the gradients, and every rank applies the same momentum-SGD update,
so replicas stay bit-identical. With per-rank batch b on N ranks this equals
single-process SGD with batch N*b (up to the summation order).

Communication modes (``--comm``):

* ``blocking``: one ``Allreduce`` of the whole flat gradient after backward.
* ``overlap`` (default): the flat gradient is cut into buckets of about
  ``--bucket-mb`` MB. Backward visits layers in reverse and the model reports
  after each layer the offset from which the gradient is final; as soon as a
  bucket's slice ``[start, end)`` is final an in-place ``Iallreduce`` starts
  on it. Outstanding requests are polled between layers (MPI progresses only
  inside MPI calls) and the update waits on all of them.
"""

from __future__ import annotations

import argparse
from typing import Any

from mpi4py import MPI

from syncbench.algorithms.base import Algorithm, StepStats


class SSGD(Algorithm):
    name = "ssgd"
    summary = "synchronous allreduce SGD (blocking, or bucketed Iallreduce overlapping backward)"

    @classmethod
    def add_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        parser.add_argument(
            "--comm",
            choices=("overlap", "blocking"),
            default="overlap",
            help="SSGD gradient reduction: bucketed Iallreduce overlapped with backward "
            "(default) or one blocking Allreduce after backward",
        )
        parser.add_argument(
            "--bucket-mb",
            type=float,
            default=0.25,
            help="SSGD overlap bucket size in MB of gradient (default 0.25)",
        )

    @classmethod
    def validate(cls, config: argparse.Namespace, world_size: int) -> None:
        if config.bucket_mb <= 0:
            raise ValueError(f"--bucket-mb must be > 0, got {config.bucket_mb}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        itemsize = self.model.grads.itemsize
        self.bucket_elems = max(1, int(self.config.bucket_mb * 1e6) // itemsize)
        self._requests: list[MPI.Request] = []
        self._pending_end = self.model.size  # gradient [x, end) not yet sent

    def _on_grads_ready(self, offset: int) -> None:
        """Start an Iallreduce on every full bucket that backward has finished."""
        if self._pending_end - offset >= self.bucket_elems or (
            offset == 0 and self._pending_end > 0
        ):
            bucket = self.model.grads[offset : self._pending_end]
            self._requests.append(self.comm.Iallreduce(bucket))
            self._pending_end = offset
        else:
            self.comm.poll()

    def reduce_gradients(self, x: Any, y: Any) -> float:
        """Compute this rank's gradient and leave the SUM over ranks in ``model.grads``."""
        if self.config.comm == "blocking":
            with self.timer.phase("compute"):
                loss = self.model.loss_and_grad(x, y)
            self.straggle()
            self.comm.Allreduce(self.model.grads)
            return loss
        self._pending_end = self.model.size
        with self.timer.phase("compute"):
            loss = self.model.loss_and_grad(
                x, y, on_grads_ready=self._on_grads_ready, poll=self.comm.poll
            )
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
