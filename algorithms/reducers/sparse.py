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

DGC's momentum correction and warm-up are options of the spec
(``topk:D,momentum=M,warmup=STEPS``; :mod:`~syncbench.algorithms.codecs.dgc`, Lin et al.
section 3 and Algorithm 1). With ``momentum=M`` every rank keeps a velocity beside its
residual (``u = M u + g``, ``v = v + u``), sends entries of ``v`` and zeroes ``u`` and
``v`` where it sent; the reducer then applies the momentum (:attr:`applies_momentum`) and
SSGD's update applies none. With ``warmup=S`` the density of the first ``S`` steps falls
from ``D ** (1/5)`` to ``D`` in four stages; ``wire_bytes_per_step`` is the target
density's. The residual (float32), the velocity (with ``momentum``) and the step are this
reducer's :meth:`state`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.dgc import MomentumCorrection
from syncbench.algorithms.codecs.feedback import ErrorFeedback
from syncbench.algorithms.codecs.sparse import INDEX_DTYPE, VALUE_DTYPE, RandomK, TopK
from syncbench.algorithms.reducers.compressed import (
    CompressedReducer,
    Reduction,
    mean_scale,
)


class SparseReduce(CompressedReducer):
    """The memory of both sparsifiers, one per bucket, and its state: error feedback, or
    DGC's momentum correction (the codec's ``options.momentum`` > 0)."""

    def __init__(self, core: Any, codec: Any, plan: list[tuple[int, int]] | None = None) -> None:
        super().__init__(core, codec, plan)
        momentum = codec.options.momentum
        #: The reduction applies the momentum (DGC's correction): the update must not.
        self.applies_momentum = codec.options.corrects_momentum
        self.feedback: list[ErrorFeedback] | list[MomentumCorrection] = (
            [MomentumCorrection(end - start, momentum) for start, end in self.plan]
            if self.applies_momentum else [ErrorFeedback(end - start) for start, end in self.plan])

    def bucket_wire_bytes(self, index: int) -> int:
        start, end = self.plan[index]
        return self.codec.wire_bytes(end - start)

    def density(self) -> float:
        """This step's density (the warm-up's, then the codec's)."""
        return self.codec.density_at(self.calls)

    def compensate(self, index: int, values: np.ndarray) -> np.ndarray:
        """Bucket ``index``'s vector to sparsify: ``g + e``, or DGC's ``v + (M u + g)``."""
        memory = self.feedback[index]
        if self.applies_momentum:
            return memory.accumulate(values)
        return memory.compensate(values)

    def keep_unsent(self, index: int, acc: np.ndarray, indices: np.ndarray,
                    sent: np.ndarray) -> None:
        """Bucket ``index``'s memory after sending ``sent`` at ``indices`` of ``acc``."""
        memory = self.feedback[index]
        if self.applies_momentum:
            memory.mask(indices)
        else:
            memory.keep_unsent(acc, indices, sent)

    def _flat(self, name: str) -> np.ndarray:
        flat = np.empty(self.count, dtype=np.float32)
        for memory, (start, end) in zip(self.feedback, self.plan):
            flat[start:end] = getattr(memory, name)
        return flat

    def residual(self) -> np.ndarray:
        """This rank's residual over the whole gradient (flat-buffer order)."""
        return self._flat("residual")

    def velocity(self) -> np.ndarray:
        """This rank's DGC velocity over the whole gradient (flat-buffer order)."""
        return self._flat("velocity")

    def state(self) -> dict[str, Any]:
        state = {**super().state(), "compress_residual": self.residual()}
        if self.applies_momentum:
            state["compress_velocity"] = self.velocity()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        names = ["residual", "velocity"] if self.applies_momentum else ["residual"]
        for name in names:
            flat = np.asarray(state[f"compress_{name}"], dtype=np.float32)
            if flat.shape != (self.count,):
                raise ValueError(f"--resume: saved {name} of {flat.size} elements, "
                                 f"the gradient has {self.count}")
            for memory, (start, end) in zip(self.feedback, self.plan):
                setattr(memory, name, flat[start:end].copy())


class TopKReduce(SparseReduce):
    """Top-k of ``g + e`` (or DGC's ``v``) on each rank; ``Iallgather`` of indices and
    values."""

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        comm = self.core.comm
        with self.phase():
            density = self.density()
            codec = self.codec if density == self.codec.density else TopK(density)
            acc = self.compensate(index, values)
            code = codec.encode(acc)
            self.keep_unsent(index, acc, code.indices, code.values)
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
    """The step's shared random indices of ``g + e`` (or DGC's ``v``); ``Iallreduce`` of
    the values. Bucket j draws from seed ``seed + j`` (one bucket: the codec's own draw)."""

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        comm = self.core.comm
        with self.phase():
            draw = RandomK(self.density(), self.codec.seed + index)
            indices = draw.indices(values.size, self.calls)
            acc = self.compensate(index, values)
            sent = acc[indices].astype(VALUE_DTYPE)
            self.keep_unsent(index, acc, indices, sent)
        yield self.iallreduce(sent)
        with self.phase():
            total = np.zeros(values.size, dtype=np.float32)
            total[indices] = sent * mean_scale(comm.size)
            return total
