"""``--compress int8[:CHUNK]``: Bagua ByteGrad's reduction of MinMaxUInt8 codes.

Bagua's ByteGrad (``bagua/torch_api/algorithms/bytegrad.py``: a centralized,
``compression="MinMaxUInt8"`` reduction) compresses each rank's segment, exchanges the
codes in a reduce-scatter, decompresses, sums and compresses the reduced segment
again, then allgathers the codes. Here: every rank encodes each rank's segment
(:func:`~syncbench.algorithms.reducers.compressed.segment_bounds`) chunk by chunk
(:class:`~syncbench.algorithms.codecs.minmax.MinMaxUInt8Codec`, 8-bit codes plus a
float32 min and max per chunk); an ``Alltoallv`` gives rank i every rank's codes of
segment i; rank i decodes and sums them in float32 in rank order, scales by 1/N and
encodes the mean; an ``Allgatherv`` of the means' codes gives every rank the whole
mean, which it decodes. About a quarter of the float32 bytes travel (plus 8 bytes per
chunk), and the mean is quantized twice (once per rank's contribution, once the mean).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.codecs.half import sum_decoded
from syncbench.algorithms.codecs.minmax import MinMaxCode
from syncbench.algorithms.reducers.compressed import (
    CompressedReducer,
    mean_scale,
    segment_bounds,
)


class ByteGradReduce(CompressedReducer):
    """Reduce-scatter of int8 codes with decode-sum-encode, then allgather of the codes."""

    def __init__(self, core: Any, codec: Any) -> None:
        super().__init__(core, codec)
        b = self.bounds = segment_bounds(self.count, core.comm.size)
        #: Bytes of each segment's codes (codes plus chunk headers).
        self.seg_bytes = [codec.wire_bytes(b[i + 1] - b[i]) for i in range(core.comm.size)]

    def wire_bytes(self) -> int:
        return sum(self.seg_bytes)

    def reduce(self, local: np.ndarray) -> np.ndarray:
        comm, codec, b = self.core.comm, self.codec, self.bounds
        ranks, rank = comm.size, comm.rank
        mine, mine_bytes = b[rank + 1] - b[rank], self.seg_bytes[rank]
        with self.phase():
            send = np.concatenate([codec.encode(local[b[i]:b[i + 1]]).pack()
                                   for i in range(ranks)])
        received = np.empty(ranks * mine_bytes, dtype=np.uint8)
        comm.Alltoallv(send, self.seg_bytes, received, [mine_bytes] * ranks)
        with self.phase():
            codes = [MinMaxCode.unpack(received[i * mine_bytes:(i + 1) * mine_bytes],
                                       mine, codec.chunk) for i in range(ranks)]
            total = sum_decoded(codec, codes)
            total *= mean_scale(ranks)
            mean_code = codec.encode(total).pack()
        gathered = np.empty(sum(self.seg_bytes), dtype=np.uint8)
        comm.Allgatherv(mean_code, gathered, self.seg_bytes)
        with self.phase():
            out = np.empty(self.count, dtype=np.float32)
            at = 0
            for i in range(ranks):
                code = MinMaxCode.unpack(gathered[at:at + self.seg_bytes[i]],
                                         b[i + 1] - b[i], codec.chunk)
                codec.decode(code, out=out[b[i]:b[i + 1]])
                at += self.seg_bytes[i]
            return out
