"""One blocking ``Allreduce`` of the flat gradient after backward (SSGD ``--comm blocking``,
OD-SGD's warm-up): the reference every other reducer is measured against."""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.reducers import GradientReducer, mean_in_place


class BlockingAllreduce(GradientReducer):
    """The emulated slowdown, then ``Allreduce(SUM)`` in place, then the 1/N scaling."""

    def complete(self) -> Any:
        core = self.core
        core.straggle()
        core.comm.Allreduce(core.model.grads)
        return mean_in_place(core, core.model.grads)
