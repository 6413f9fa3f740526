"""``--compress int8[:CHUNK]``: Bagua ByteGrad's reduction of MinMaxUInt8 codes.

Bagua's ByteGrad (``bagua/torch_api/algorithms/bytegrad.py``: a centralized,
``compression="MinMaxUInt8"`` reduction) compresses each rank's segment, exchanges the
codes in a reduce-scatter, decompresses, sums and compresses the reduced segment
again, then allgathers the codes. Here, for the gradient or each bucket of it: every
rank encodes each rank's segment
(:func:`~syncbench.algorithms.reducers.compressed.segment_bounds`) chunk by chunk
(:class:`~syncbench.algorithms.codecs.minmax.MinMaxUInt8Codec`, 8-bit codes plus a
float32 min and max per chunk); an ``Ialltoallv`` gives rank i every rank's codes of
segment i; rank i decodes and sums them in float32 in rank order, scales by 1/N and
encodes the mean; an ``Iallgatherv`` of the means' codes gives every rank the whole
mean, which it decodes. About a quarter of the float32 bytes travel (plus 8 bytes per
chunk), and the mean is quantized twice (once per rank's contribution, once the mean).
``int4[:CHUNK]`` is the same reduction of 4-bit codes, two to a byte (an eighth).
"""

from __future__ import annotations

import numpy as np

from syncbench.algorithms.codecs.half import sum_decoded
from syncbench.algorithms.reducers.compressed import (
    CompressedReducer,
    Reduction,
    mean_scale,
    segment_bounds,
)


class ByteGradReduce(CompressedReducer):
    """Reduce-scatter of int8 codes with decode-sum-encode, then allgather of the codes."""

    phases = 2

    def _segments(self, index: int) -> tuple[list[int], list[int]]:
        """Bucket ``index``'s rank segment bounds and the bytes of each segment's codes."""
        start, end = self.plan[index]
        b = segment_bounds(end - start, self.core.comm.size)
        return b, [self.codec.wire_bytes(b[i + 1] - b[i]) for i in range(len(b) - 1)]

    def bucket_wire_bytes(self, index: int) -> int:
        return sum(self._segments(index)[1])

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        (comm, second), codec = self.comms, self.codec
        ranks, rank = comm.size, comm.rank
        b, seg_bytes = self._segments(index)
        mine, mine_bytes = b[rank + 1] - b[rank], seg_bytes[rank]
        with self.phase():
            send = np.concatenate([codec.pack(codec.encode(values[b[i]:b[i + 1]]))
                                   for i in range(ranks)])
        received = np.empty(ranks * mine_bytes, dtype=np.uint8)
        yield comm.Ialltoallv(send, seg_bytes, received, [mine_bytes] * ranks)
        with self.phase():
            codes = [codec.unpack(received[i * mine_bytes:(i + 1) * mine_bytes], mine)
                     for i in range(ranks)]
            total = sum_decoded(codec, codes)
            total *= mean_scale(ranks)
            mean_code = codec.pack(codec.encode(total))
        gathered = np.empty(sum(seg_bytes), dtype=np.uint8)
        yield second.Iallgatherv(mean_code, gathered, seg_bytes)
        with self.phase():
            out = np.empty(values.size, dtype=np.float32)
            at = 0
            for i in range(ranks):
                code = codec.unpack(gathered[at:at + seg_bytes[i]], b[i + 1] - b[i])
                codec.decode(code, out=out[b[i]:b[i + 1]])
                at += seg_bytes[i]
            return out
