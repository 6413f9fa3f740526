"""Gradient codecs: pure NumPy encode/decode math for the compressing reducers.

One module per family: :mod:`.half` (``fp16``, ``bf16``), :mod:`.minmax`
(``int8``, Bagua's MinMaxUInt8), :mod:`.powersgd` (``powersgd:R``),
:mod:`.sparse` (``topk:D``, ``randomk:D``) with :mod:`.feedback` (error
feedback), and :mod:`.registry` (names and ``NAME[:ARG]`` specs). Nothing
here loads MPI: reducers, DiLoCo's quantized pseudo-gradients and gossip call
these between their collectives. Every codec declares ``wire_bytes(count)``,
the bytes one rank hands to MPI for ``count`` elements (PowerSGD needs the
tensor shapes as well).
"""

from syncbench.algorithms.codecs.feedback import ErrorFeedback
from syncbench.algorithms.codecs.half import (
    BFloat16Codec,
    Float16Codec,
    bf16_decode,
    bf16_encode,
    sum_decoded,
)
from syncbench.algorithms.codecs.minmax import MinMaxCode, MinMaxUInt8Codec
from syncbench.algorithms.codecs.powersgd import (
    Layout,
    PowerSGD,
    PowerSGDState,
    compute_p,
    compute_q,
    decompress,
    orthogonalize,
    tensor_shapes,
)
from syncbench.algorithms.codecs.registry import CODECS, parse_codec
from syncbench.algorithms.codecs.sparse import RandomK, SparseCode, TopK

__all__ = [
    "CODECS", "BFloat16Codec", "ErrorFeedback", "Float16Codec", "Layout", "MinMaxCode",
    "MinMaxUInt8Codec", "PowerSGD", "PowerSGDState", "RandomK", "SparseCode", "TopK",
    "bf16_decode", "bf16_encode", "compute_p", "compute_q", "decompress", "orthogonalize",
    "parse_codec", "sum_decoded", "tensor_shapes",
]
