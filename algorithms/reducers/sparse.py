"""``--compress topk:D`` / ``randomk:D``: sparsified gradients with error feedback
(Stich, Cordonnier, Jaggi, NeurIPS 2018; Lin et al., DGC, arXiv 1712.01887).

Every rank adds its residual to its gradient (``acc = g + e``; bucket by bucket under
overlap), sends ``k = ceil(D n)`` entries of ``acc`` and keeps the rest as its residual
(:class:`~syncbench.algorithms.codecs.feedback.ErrorFeedback`). The mean gradient is the
mean of the ranks' sparse vectors.

- top-k (:class:`TopKReduce`): each rank's ``k`` entries of largest magnitude; supports
  differ between ranks, so the indices travel with the values. ``k`` is the same on
  every rank, so an ``Iallgather`` of ``k`` int32 indices and ``k`` float32 values per
  rank (``8 k`` bytes) does what an Allgatherv would; every rank adds the N sparse
  vectors in rank order.
- random-k (:class:`RandomKReduce`): the ``k`` indices are drawn from a generator seeded
  by ``(seed, step)`` (:class:`~syncbench.algorithms.codecs.sparse.RandomK`), the same
  on every rank, so only the values travel, summed by an ``Iallreduce`` (``4 k`` bytes).

DGC's momentum correction and warm-up are not implemented. The residual (float32) and
the step are this reducer's :meth:`state`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.feedback import ErrorFeedback
from syncbench.algorithms.codecs.sparse import INDEX_DTYPE, VALUE_DTYPE, RandomK
from syncbench.algorithms.reducers.compressed import (
    CompressedReducer,
    Reduction,
    mean_scale,
)


class SparseReduce(CompressedReducer):
    """The error feedback of both sparsifiers (one residual per bucket), and its state."""

    def __init__(self, core: Any, codec: Any, plan: list[tuple[int, int]] | None = None) -> None:
        super().__init__(core, codec, plan)
        self.feedback = [ErrorFeedback(end - start) for start, end in self.plan]

    def bucket_wire_bytes(self, index: int) -> int:
        start, end = self.plan[index]
        return self.codec.wire_bytes(end - start)

    def residual(self) -> np.ndarray:
        """This rank's residual over the whole gradient (flat-buffer order)."""
        flat = np.empty(self.count, dtype=np.float32)
        for fb, (start, end) in zip(self.feedback, self.plan):
            flat[start:end] = fb.residual
        return flat

    def state(self) -> dict[str, Any]:
        return {**super().state(), "compress_residual": self.residual()}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        residual = np.asarray(state["compress_residual"], dtype=np.float32)
        if residual.shape != (self.count,):
            raise ValueError(f"--resume: saved residual of {residual.size} elements, "
                             f"the gradient has {self.count}")
        for fb, (start, end) in zip(self.feedback, self.plan):
            fb.residual = residual[start:end].copy()


class TopKReduce(SparseReduce):
    """Top-k of ``g + e`` on each rank; ``Iallgather`` of indices and values."""

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        comm, feedback = self.core.comm, self.feedback[index]
        with self.phase():
            acc = feedback.compensate(values)
            code = self.codec.encode(acc)
            feedback.keep_unsent(acc, code.indices, code.values)
            k = code.indices.size
            send = np.concatenate([code.indices.view(np.uint8), code.values.view(np.uint8)])
        gathered = np.empty((comm.size, send.size), dtype=np.uint8)
        yield comm.Iallgather(send, gathered)
        with self.phase():
            total = np.zeros(values.size, dtype=np.float32)
            for row in gathered:
                total[row[:4 * k].view(INDEX_DTYPE)] += row[4 * k:].view(VALUE_DTYPE)
            total *= mean_scale(comm.size)
            return total


class RandomKReduce(SparseReduce):
    """The step's shared random indices of ``g + e``; ``Iallreduce`` of the values. Bucket
    j draws from seed ``seed + j`` (one bucket: the codec's own draw)."""

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        comm, feedback = self.core.comm, self.feedback[index]
        with self.phase():
            draw = RandomK(self.codec.density, self.codec.seed + index)
            indices = draw.indices(values.size, self.calls)
            acc = feedback.compensate(values)
            sent = acc[indices].astype(VALUE_DTYPE)
            feedback.keep_unsent(acc, indices, sent)
        yield self.iallreduce(sent)
        with self.phase():
            total = np.zeros(values.size, dtype=np.float32)
            total[indices] = sent * mean_scale(comm.size)
            return total
