"""An ``Iallreduce`` per bucket of whole layers, posted as soon as backward finishes it
(SSGD ``--comm overlap``).

Backward visits layers in reverse and the model reports after each layer the offset
from which the gradient is final; as soon as a bucket's slice ``[start, end)``
(:mod:`~syncbench.algorithms.reducers.buckets`) is final an in-place ``Iallreduce``
starts on it. Outstanding requests are polled between layers (MPI progresses only
inside MPI calls) and :meth:`BucketedIallreduce.complete` waits on all of them. An
emulated straggler spends its delay right before posting its last bucket, where a
slower processor would post it.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.reducers import GradientReducer, mean_in_place


class BucketedIallreduce(GradientReducer):
    """In-place ``Iallreduce`` of each bucket of ``plan`` as backward completes it."""

    def __init__(self, core: Any, plan: list[tuple[int, int]]) -> None:
        super().__init__(core)
        #: Buckets ``[start, end)``, in the order backward completes them.
        self.plan = plan
        self.posts_per_step = len(plan)
        self._requests: list[Any] = []
        self._next = 0  # index in plan of the next bucket to post
        self._straggled = False  # this step's emulated slowdown has run

    def hooks(self) -> dict[str, Any]:
        return {"on_grads_ready": self.on_grads_ready, "poll": self.core.comm.poll}

    def start(self) -> None:
        self._next, self._straggled = 0, False

    def on_grads_ready(self, offset: int) -> None:
        """Start an Iallreduce on every bucket whose gradient is now final, else poll.

        An emulated straggler spends its delay right before it posts its last
        bucket: a processor f times slower would post that bucket at f times
        its compute time, so the delay must not hide the reduction of the
        whole gradient (which it would, after the last post).
        """
        core, plan, posted = self.core, self.plan, False
        while self._next < len(plan) and plan[self._next][0] >= offset:
            start, end = plan[self._next]
            if self._next == len(plan) - 1 and not self._straggled:
                self._straggled = True
                core.straggle()
            self._requests.append(core.comm.Iallreduce(core.model.grads[start:end]))
            self._next += 1
            posted = True
        if not posted:
            core.comm.poll()

    def complete(self) -> Any:
        core = self.core
        if not self._straggled:  # (every bucket is posted from inside backward)
            core.straggle()
        core.comm.Waitall(self._requests)
        self._requests = []
        return mean_in_place(core, core.model.grads)
