"""What the compressing reducers share (``--compress``): the blocking step, the rank
segments of a hand-written reduce-scatter, and the byte packing of codes.

A compressing reducer runs after backward (the emulated slowdown first, as
:class:`~syncbench.algorithms.reducers.allreduce.BlockingAllreduce`): it takes this
rank's gradient as float32 (the codecs of :mod:`syncbench.algorithms.codecs` encode
float32; a float64 model's gradient is rounded to float32 first, as it would travel),
runs its codec and collectives, and writes the float32 mean back into
``model.grads``, which the update applies. Encoding, decoding and summing codes are
charged to ``update`` (as the 1/N scaling of the plain reducers), so ``comm`` holds
only time inside MPI and ``compute`` stays comparable across strategies.

:meth:`CompressedReducer.wire_bytes` is the bytes of the encoded gradient this rank
hands to MPI per step: the same measure as the plain reducers' ``grads.nbytes`` (the
buffer of one Allreduce), so the ratio of the two is the compression ratio.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from syncbench.algorithms.reducers import GradientReducer


def segment_bounds(count: int, ranks: int) -> list[int]:
    """Bounds of the ``ranks`` contiguous segments of a vector of ``count`` elements (rank
    i reduces ``[b[i], b[i + 1])``; sizes differ by at most one, as ``numpy.array_split``)."""
    return [count * i // ranks for i in range(ranks + 1)]


def mean_scale(ranks: int) -> np.float32:
    """The float32 factor 1/N every compressing reducer scales its sum by."""
    return np.float32(1.0 / ranks)


class CompressedReducer(GradientReducer):
    """A blocking reducer that sends a codec's encoding of the gradient.

    Subclasses implement :meth:`reduce` (this rank's float32 gradient -> the float32 mean,
    the same bits on every rank) and :meth:`wire_bytes`; :meth:`state` holds the calls
    made so far (``calls``) and whatever the codec keeps (error feedback, warm start).
    """

    def __init__(self, core: Any, codec: Any) -> None:
        super().__init__(core)
        self.codec = codec
        self.count = int(core.model.grads.size)
        #: Reductions made so far (random-k's step; restored on resume).
        self.calls = 0

    def complete(self) -> Any:
        core = self.core
        core.straggle()
        grads, backend = core.model.grads, core.model.backend
        with core.timer.phase("update"):
            local = np.asarray(backend.to_numpy(grads), dtype=np.float32)
        mean = self.reduce(local)
        with core.timer.phase("update"):
            grads[...] = backend.asarray(mean)
        self.calls += 1
        return grads

    @abstractmethod
    def reduce(self, local: np.ndarray) -> np.ndarray:
        """The mean over ranks of ``local`` (float32) as the codec lets it travel."""

    @abstractmethod
    def wire_bytes(self) -> int:
        """Bytes of the encoded gradient this rank hands to MPI per step."""

    def state(self) -> dict[str, Any]:
        return {"compress_calls": self.calls}

    def load_state(self, state: dict[str, Any]) -> None:
        self.calls = int(state["compress_calls"])

    def phase(self) -> Any:
        """The phase encode and decode are charged to."""
        return self.core.timer.phase("update")
