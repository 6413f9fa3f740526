"""``--compress topk:D`` / ``randomk:D``: sparsified gradients with error feedback
(Stich, Cordonnier, Jaggi, NeurIPS 2018; Lin et al., DGC, arXiv 1712.01887).

Every rank adds its residual to its gradient (``acc = g + e``), sends ``k = ceil(D n)``
entries of ``acc`` and keeps the rest as its residual
(:class:`~syncbench.algorithms.codecs.feedback.ErrorFeedback`). The mean gradient is the
mean of the ranks' sparse vectors.

- top-k (:class:`TopKReduce`): each rank's ``k`` entries of largest magnitude; supports
  differ between ranks, so the indices travel with the values. ``k`` is the same on
  every rank, so an ``Allgather`` of ``k`` int32 indices and ``k`` float32 values per
  rank (``8 k`` bytes) does what an Allgatherv would; every rank adds the N sparse
  vectors in rank order.
- random-k (:class:`RandomKReduce`): the ``k`` indices are drawn from a generator seeded
  by ``(seed, step)`` (:class:`~syncbench.algorithms.codecs.sparse.RandomK`), the same
  on every rank, so only the values travel, summed by one ``Allreduce`` (``4 k`` bytes).

DGC's momentum correction and warm-up are not implemented. The residual (float32) and
the step are this reducer's :meth:`state`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.feedback import ErrorFeedback
from syncbench.algorithms.codecs.sparse import INDEX_DTYPE, VALUE_DTYPE
from syncbench.algorithms.reducers.compressed import CompressedReducer, mean_scale


class SparseReduce(CompressedReducer):
    """The error feedback of both sparsifiers, and its state."""

    def __init__(self, core: Any, codec: Any) -> None:
        super().__init__(core, codec)
        self.feedback = ErrorFeedback(self.count)
        self.k = codec.k(self.count)

    def wire_bytes(self) -> int:
        return self.codec.wire_bytes(self.count)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "compress_residual": self.feedback.residual.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        residual = np.asarray(state["compress_residual"], dtype=np.float32)
        if residual.shape != self.feedback.residual.shape:
            raise ValueError(f"--resume: saved residual of {residual.size} elements, "
                             f"the gradient has {self.count}")
        self.feedback.residual = residual.copy()


class TopKReduce(SparseReduce):
    """Top-k of ``g + e`` on each rank; ``Allgather`` of indices and values."""

    def reduce(self, local: np.ndarray) -> np.ndarray:
        comm, k = self.core.comm, self.k
        with self.phase():
            acc = self.feedback.compensate(local)
            code = self.codec.encode(acc)
            self.feedback.keep_unsent(acc, code.indices, code.values)
            send = np.concatenate([code.indices.view(np.uint8), code.values.view(np.uint8)])
        gathered = np.empty(comm.size * send.size, dtype=np.uint8).reshape(comm.size, -1)
        comm.Allgather(send, gathered)
        with self.phase():
            total = np.zeros(self.count, dtype=np.float32)
            for row in gathered:
                indices = row[:4 * k].view(INDEX_DTYPE)
                total[indices] += row[4 * k:].view(VALUE_DTYPE)
            total *= mean_scale(comm.size)
            return total


class RandomKReduce(SparseReduce):
    """The step's shared random indices of ``g + e``; ``Allreduce`` of the values."""

    def reduce(self, local: np.ndarray) -> np.ndarray:
        comm = self.core.comm
        with self.phase():
            indices = self.codec.indices(self.count, self.calls)
            acc = self.feedback.compensate(local)
            values = acc[indices].astype(VALUE_DTYPE)
            self.feedback.keep_unsent(acc, indices, values)
        comm.Allreduce(values)
        with self.phase():
            total = np.zeros(self.count, dtype=np.float32)
            total[indices] = values * mean_scale(comm.size)
            return total
