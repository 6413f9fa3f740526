"""A reduction across steps: step t's gradient ``Iallreduce`` completes at step t+1
(OD-SGD, Xu et al. 2020, arXiv 2005.06728).

Step t's gradient is copied into one of two receive buffers and reduced in place by an
``Iallreduce``, which the next step's forward and backward poll between layers
(``Testall``, charged to ``comm``); the blocking part of the ``Wait`` is ``wait``.
:meth:`DelayedAllreduce.complete` posts this step's and returns the previous step's
mean, so the update applies a gradient one step stale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.reducers import GradientReducer, mean_in_place


class DelayedAllreduce(GradientReducer):
    """Posts this step's gradient; completes and returns the previous step's mean."""

    def __init__(self, core: Any) -> None:
        super().__init__(core)
        params = core.model.params
        self._recv = [params * 0, params * 0]  # two receive buffers: t and t-1 in flight
        #: The reduction in flight: (request, its receive buffer), or None. A request of
        #: None is a reduction restored complete from a checkpoint.
        self.pending: tuple[Any, Any] | None = None

    def hooks(self) -> dict[str, Any]:
        poll = self.core.comm.poll
        return {"on_grads_ready": lambda _offset: poll(), "poll": poll}

    def complete(self) -> Any:
        """The emulated slowdown, this step's post, then the previous step's mean (None
        at the first delayed step)."""
        core = self.core
        core.straggle()
        recv = self._recv[core.steps_taken % 2]
        with core.timer.phase("update"):
            recv[...] = core.model.grads
        request = core.comm.Iallreduce(recv)
        previous = self.drain()
        self.pending = (request, recv)
        return previous

    def drain(self) -> Any:
        """Wait for the reduction in flight (if any); its mean, else None."""
        if self.pending is None:
            return None
        request, summed = self.pending
        self.pending = None
        if request is not None:
            self.core.comm.Wait(request)
        return mean_in_place(self.core, summed)

    def state(self) -> dict[str, Any]:
        """The sum in flight, completed (every rank calls this at the same point) and not
        yet applied: the next step applies it as usual."""
        core = self.core
        if self.pending is not None and self.pending[0] is not None:
            core.comm.Wait(self.pending[0])
            self.pending = (None, self.pending[1])
        empty = np.zeros(0, dtype=core.model.params.dtype)
        held = empty if self.pending is None else core.model.backend.to_numpy(self.pending[1])
        return {"gsum_pending": held.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.pending = None
        if np.size(state["gsum_pending"]):
            buf = self._recv[(self.core.steps_taken - 1) % 2]
            buf[...] = self.core.model.backend.asarray(state["gsum_pending"])
            self.pending = (None, buf)

    def close(self) -> None:
        if self.pending is not None and self.pending[0] is not None:
            request = self.pending[0]
            comm = self.core.comm
            comm.outstanding = [r for r in comm.outstanding if r is not request]
        self.pending = None
