"""``--compress powersgd[:R]``: rank-R PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019,
arXiv 1905.13727), step for step as PyTorch's ``powerSGD_hook``.

The math is :class:`~syncbench.algorithms.codecs.powersgd.PowerSGDState`'s; this
reducer adds the collectives between its steps. A compressed step is two
sequential Allreduces (posted and waited at once): the packed ``P`` of every compressed
tensor together with the packed values of the uncompressed ones (vectors, and matrices
whose compression rate is below ``min_compression_rate``; PyTorch allreduces those in
their own concurrent call), then the packed ``Q``. The first ``start_iter`` steps
(PyTorch's ``start_powerSGD_iter``, default 1000) are one plain Allreduce of the
gradient. The error and the warm-started ``Q`` (and the generator of the first ``Q``)
are this reducer's :meth:`state`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.powersgd import ITEMSIZE, tensor_shapes
from syncbench.algorithms.reducers.compressed import (
    CompressedReducer,
    Reduction,
    mean_scale,
)

#: Prefix of the state's keys in a checkpoint.
KEY = "powersgd_"


class PowerSGDReduce(CompressedReducer):
    """P (with the uncompressed tensors) Allreduce, orthogonalize, Q Allreduce; the whole
    gradient at once (its layout is the model's tensors), after backward."""

    bucketed = False
    phases = 2

    def __init__(self, core: Any, codec: Any, plan: Any = None) -> None:
        if plan is not None:
            raise ValueError("powersgd reduces the whole gradient after backward only: "
                             "add --comm blocking")
        super().__init__(core, codec)
        model = core.model
        self.shapes = tensor_shapes([layer.param_shapes() for layer in model.layers],
                                    model.layer_offsets)
        self.psgd = codec.state(self.shapes)

    def wire_bytes(self) -> int:
        """Bytes of a compressed step (``P``, ``Q``, uncompressed); the first ``start_iter``
        steps hand the plain gradient's 4 bytes per element."""
        return self.codec.wire_bytes(self.count, self.shapes)

    def bucket_wire_bytes(self, index: int) -> int:
        return self.wire_bytes()

    def run_wire_bytes(self, steps: int) -> int:
        """The mean over ``steps`` steps: the first ``start_iter`` allreduce the plain
        gradient (4 bytes an element), the rest are compressed. Declaring the compressed
        figure alone would have put a run shorter than ``start_iter`` (PyTorch's default
        1000; about 234 steps for mlp's epoch on 4 ranks) at a fraction of the bytes it
        sent."""
        if steps <= 0:
            return self.wire_bytes()
        plain = min(steps, self.codec.start_iter)
        total = plain * ITEMSIZE * self.count + (steps - plain) * self.wire_bytes()
        return int(round(total / steps))

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        comm, psgd = self.core.comm, self.psgd
        if not psgd.compressing:  # a plain Allreduce: its 1/N is update's, as SSGD's
            yield self.iallreduce(values)
            with self.core.timer.phase("update"):
                values *= mean_scale(comm.size)
            psgd.finish_plain()
            return values
        with self.phase():
            m = psgd.prepare(values)
            p_size = psgd.layout.p_size
            first = np.concatenate([psgd.p_buffer(m), psgd.uncompressed_buffer(m)])
        yield self.iallreduce(first)
        with self.phase():
            q = psgd.q_buffer(m, first[:p_size])
        yield self.iallreduce(q)
        with self.phase():
            return psgd.finish(m, q, first[p_size:], comm.size)

    def state(self) -> dict[str, Any]:
        saved = super().state()
        saved.update({KEY + key: value for key, value in self.psgd.snapshot().items()})
        return saved

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.psgd.restore({key[len(KEY):]: np.asarray(value) for key, value in state.items()
                           if key.startswith(KEY)})
