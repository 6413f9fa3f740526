"""``--compress fp16`` / ``bf16``: a reduce-scatter and an allgather of 16-bit codes with
float32 accumulation.

MPI has no standard half-precision type (MPI 4.1 defines none; MPICH's ``MPIX_C_FLOAT16``
is an extension), so the reduction is written by hand, as Horovod and NCCL reduce
segment by segment: every rank encodes its gradient (or bucket) (round to nearest even, PyTorch's
``fp16_compress_hook`` / ``bf16_compress_hook`` rounding; :mod:`~syncbench.algorithms.codecs.half`),
an ``Ialltoallv`` hands rank i every rank's codes of segment i
(:func:`~syncbench.algorithms.reducers.compressed.segment_bounds`), rank i decodes and
sums them in float32 in rank order (:func:`~syncbench.algorithms.codecs.half.sum_decoded`),
scales by 1/N, encodes the mean, and an ``Iallgatherv`` of the 16-bit means gives every
rank the whole mean, decoded exactly. Each half moves (N-1)/N of the 2n code bytes, so the
link carries half of a float32 ring Allreduce's 2 (N-1)/N 4n bytes.

Where this differs from PyTorch's hooks: they divide by N in 16 bits and let the
collective sum 16-bit values; here partial sums are float32 (no 16-bit overflow of a
partial sum above 65504) and only the final mean is rounded to 16 bits.
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


class HalfPrecisionReduce(CompressedReducer):
    """Reduce-scatter of 16-bit codes (``Ialltoallv``), float32 sum, allgather of the mean."""

    phases = 2

    def bucket_wire_bytes(self, index: int) -> int:
        start, end = self.plan[index]
        return self.codec.wire_bytes(end - start)

    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        (comm, second), codec = self.comms, self.codec
        ranks, rank = comm.size, comm.rank
        b = segment_bounds(values.size, ranks)
        seg_bytes = [2 * (b[i + 1] - b[i]) for i in range(ranks)]
        mine = b[rank + 1] - b[rank]
        with self.phase():
            codes = codec.encode(values)
        received = np.empty(ranks * mine, dtype=np.uint16)
        yield comm.Ialltoallv(codes, seg_bytes, received, [2 * mine] * ranks)
        with self.phase():
            total = sum_decoded(codec, received.reshape(ranks, mine))
            total *= mean_scale(ranks)
            mean_codes = codec.encode(total)
        gathered = np.empty(values.size, dtype=np.uint16)
        yield second.Iallgatherv(mean_codes, gathered, seg_bytes)
        with self.phase():
            return codec.decode(gathered)
