"""Gradient reducers: this step's local gradients -> the global mean gradient.

A reducer is the part of a strategy that communicates gradients, as a DDP
communication hook is in PyTorch (``torch/distributed/algorithms/ddp_comm_hooks``: a
function of a bucket plus a small state): it hooks backward to post reductions as
layers finish (:meth:`GradientReducer.hooks`), posts, polls and completes its own
requests, owns its state (error feedback, warm starts) and declares what it hands to
MPI per step. Each variant is one small module:

================================ ============================================== =========
reducer                          what travels                                   used by
================================ ============================================== =========
``allreduce.BlockingAllreduce``  one ``Allreduce`` of the flat gradient         SSGD
                                 after backward                                 blocking,
                                                                                OD-SGD
                                                                                warm-up
``bucketed.BucketedIallreduce``  an ``Iallreduce`` per bucket of whole layers   SSGD
                                 as soon as backward finishes it                overlap
``delayed.DelayedAllreduce``     step t's ``Iallreduce`` completes at step t+1  OD-SGD
================================ ============================================== =========

The core (:class:`~syncbench.algorithms.base.Strategy`) a reducer is made with gives
it ``model``, ``comm``, ``timer`` and ``straggle`` (the emulated slowdown, which a
reducer that posts during backward spends right before its last post). No module here
imports ``mpi4py.MPI``: requests come from the communicator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class GradientReducer(ABC):
    """Turns this rank's gradient (``core.model.grads``) into every rank's mean.

    A step is :meth:`start`, backward with :meth:`hooks`, then :meth:`complete`, which
    returns the mean gradient the step's update applies.
    """

    #: Reductions handed to MPI per step (the run file's root attribute ``buckets``).
    posts_per_step: int = 1
    #: Whether the mean it returns already carries the momentum (DGC's momentum
    #: correction, :mod:`~syncbench.algorithms.reducers.sparse`): the update after it
    #: must then apply none.
    applies_momentum: bool = False

    def __init__(self, core: Any) -> None:
        self.core = core

    def hooks(self) -> dict[str, Any]:
        """What backward calls between layers (``Model.loss_and_grad``'s
        ``on_grads_ready`` and ``poll``); default nothing."""
        return {}

    def start(self) -> None:
        """Before backward: reset this step's bookkeeping; default nothing."""

    @abstractmethod
    def complete(self) -> Any:
        """After backward: the global mean gradient this step's update applies (None:
        none yet, a delayed reducer's first step). Runs the emulated slowdown if no
        post has run it."""

    def wire_bytes(self) -> int:
        """Bytes this rank hands to MPI per step (the gradient's, uncompressed)."""
        return int(self.core.model.grads.nbytes)

    def run_wire_bytes(self, steps: int) -> int:
        """Bytes this rank hands to MPI per step over a run of ``steps`` steps, the mean
        (the run file's ``wire_bytes_per_step``): :meth:`wire_bytes`, for a reducer whose
        bytes are the same every step."""
        return self.wire_bytes()

    def state(self) -> dict[str, Any]:
        """Resumable state (error feedback, a reduction completed but not applied)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved."""

    def drain(self) -> Any:
        """Complete what is in flight at the end of training; the mean gradient it
        leaves to apply, else None."""
        return None

    def close(self) -> None:
        """Drop requests still in flight (error paths: the job is being aborted)."""


def mean_in_place(core: Any, summed: Any) -> Any:
    """``summed`` (a sum over ranks) divided by the number of ranks, in place, charged
    to ``update``; returns it."""
    with core.timer.phase("update"):
        summed *= 1.0 / core.comm.size
    return summed
