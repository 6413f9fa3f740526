"""DiLoCo's ``--quantize CODEC``: each fragment's pseudo-gradient reduced through a codec.

Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512, section 2.3 "Quantized
communication") sends the outer gradients in lower precision (4-bit in the paper) and
accumulates in float32; torchft's ``_StreamingDiLoCoFragment`` does the same with
``should_quantize`` (``allreduce_quantized``: a reduce-scatter of quantized codes,
dequantize and sum in float32, quantize the sum, an allgather of the codes). That is
what the compressing SSGD reducers of ``--compress`` already do for a gradient bucket,
so a fragment here is one bucket of such a reducer
(:class:`~syncbench.algorithms.reducers.halfprec.HalfPrecisionReduce` for ``fp16`` and
``bf16``, :class:`~syncbench.algorithms.reducers.bytegrad.ByteGradReduce` for
``int8[:CHUNK]`` and ``int4[:CHUNK]``, min-max codes of 8 and 4 bits, the latter the
paper's): its per-bucket reduction generator is driven
here, a collective at a time, instead of from backward's hooks. What it returns is the
float32 mean of the ranks' pseudo-gradients (the same bits on every rank), which the
outer optimizer takes as a sum over one rank.

The sparse and low-rank codecs (``topk``, ``randk``, ``powersgd``) are refused: they
need error feedback across rounds and a layout of whole matrices, which a fragment's
pseudo-gradient, applied once per round, does not have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.registry import parse_codec
from syncbench.algorithms.reducers.compress import REDUCERS
from syncbench.algorithms.reducers.compressed import CompressedReducer

#: ``--quantize``'s value for float32 pseudo-gradients (one ``Allreduce``).
NONE = "none"
#: Codecs a pseudo-gradient may travel in.
QUANTIZE_CODECS = ("fp16", "bf16", "int8", "int4")


def check_quantize(spec: str) -> None:
    """A one-line ValueError if ``spec`` is neither ``none`` nor a codec of
    :data:`QUANTIZE_CODECS` (``int8`` and ``int4`` take ``:CHUNK``)."""
    if spec == NONE:
        return
    try:
        codec = parse_codec(spec)
    except ValueError as exc:
        raise ValueError(f"--quantize: {exc}") from None
    if codec.name not in QUANTIZE_CODECS:
        raise ValueError(f"--quantize {spec}: a pseudo-gradient travels in "
                         f"{', '.join(QUANTIZE_CODECS)} (int8 and int4 take :CHUNK) or none")


class QuantizedReduction:
    """The quantized mean of one fragment ``[lo, hi)`` of a vector at a time.

    ``bounds``: the fragments (buckets of the codec's reducer). :meth:`post` starts a
    fragment's reduction, :meth:`poll` advances a fragment whose collective completed
    (its next phase is posted then), :meth:`wait` finishes it and returns the mean.
    """

    def __init__(self, core: Any, spec: str, bounds: list[tuple[int, int]]) -> None:
        check_quantize(spec)
        codec = parse_codec(spec)
        #: The codec's reducer over the fragments (never driven by backward's hooks).
        self.reducer: CompressedReducer = REDUCERS[codec.name](core, codec, list(bounds))
        self.spec = spec
        #: Fragment in flight -> [its generator, the request it waits on, its phase].
        self._flight: dict[int, list[Any]] = {}

    def wire_bytes(self, p: int) -> int:
        """Bytes of fragment ``p``'s codes this rank hands to MPI per sync."""
        return int(self.reducer.bucket_wire_bytes(p))

    def post(self, p: int, values: Any) -> None:
        """Start fragment ``p``'s reduction of this rank's ``values`` (taken as float32)."""
        reducer = self.reducer
        with reducer.phase():
            host = np.array(reducer.core.model.backend.to_numpy(values), dtype=np.float32)
        gen = reducer.reduction(p, host)
        self._flight[p] = [gen, next(gen), 0]

    def _advance(self, p: int) -> np.ndarray | None:
        """Fragment ``p``'s next collective; its mean when it has none left."""
        entry = self._flight[p]
        try:
            entry[1] = next(entry[0])
            entry[2] += 1
        except StopIteration as done:
            del self._flight[p]
            return done.value
        return None

    def poll(self) -> None:
        """Advance every fragment whose collective completed (its next one is posted)."""
        for p in sorted(self._flight):
            _, request, phase = self._flight[p]
            if phase + 1 < self.reducer.phases and self.reducer.comms[phase].Test(request):
                self._advance(p)

    def wait(self, p: int) -> np.ndarray:
        """Finish fragment ``p``'s reduction: the float32 mean over the ranks."""
        while True:
            _, request, phase = self._flight[p]
            self.reducer.comms[phase].Wait(request)
            mean = self._advance(p)
            if mean is not None:
                return mean

    def close(self) -> None:
        """Forget what is in flight (a run stopped between a post and its wait)."""
        self._flight = {}
