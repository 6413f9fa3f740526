"""``--compress NAME[:ARG]``: the compressing reducer of a codec spec.

========================  ====================================================  =========
spec                      reducer                                               bytes/elem
========================  ====================================================  =========
``fp16``, ``bf16``        :class:`~.halfprec.HalfPrecisionReduce`               2
``int8[:CHUNK]``          :class:`~.bytegrad.ByteGradReduce`                    1 (+8/chunk)
``int4[:CHUNK]``          :class:`~.bytegrad.ByteGradReduce`                    1/2 (+8/chunk)
``powersgd[:R]``          :class:`~.powersgd.PowerSGDReduce`                    (m+n)R/(mn)
``topk:D``                :class:`~.sparse.TopKReduce`                          8 D
``randomk:D``/``randk:D`` :class:`~.sparse.RandomKReduce`                       4 D
========================  ====================================================  =========

``topk:D`` and ``randomk:D`` take DGC's momentum correction and warm-up after the
density, ``topk:0.01,momentum=0.9,warmup=400`` (:mod:`~.sparse`).

Each runs after backward (``--comm blocking``) or, but PowerSGD, bucket by bucket as
backward finishes each (``--comm overlap``, :mod:`~.compressed`); SSGD refuses
``powersgd`` with ``--comm overlap``. Specs are parsed by
:func:`~syncbench.algorithms.codecs.registry.parse_codec`, whose errors are one line each.
"""

from __future__ import annotations

from typing import Any

from syncbench.algorithms.codecs.powersgd import DEFAULT_START_ITER, PowerSGD
from syncbench.algorithms.codecs.registry import parse_codec
from syncbench.algorithms.reducers.bytegrad import ByteGradReduce
from syncbench.algorithms.reducers.compressed import CompressedReducer
from syncbench.algorithms.reducers.halfprec import HalfPrecisionReduce
from syncbench.algorithms.reducers.powersgd import PowerSGDReduce
from syncbench.algorithms.reducers.sparse import RandomKReduce, TopKReduce

#: ``--compress``'s value for no compression.
NONE = "none"

#: Codec name (``codec.name``) -> its reducer.
REDUCERS: dict[str, type[CompressedReducer]] = {
    "fp16": HalfPrecisionReduce,
    "bf16": HalfPrecisionReduce,
    "int8": ByteGradReduce,
    "int4": ByteGradReduce,
    "powersgd": PowerSGDReduce,
    "topk": TopKReduce,
    "randomk": RandomKReduce,
}


def check_compress(spec: str, overlap: bool) -> None:
    """A one-line ValueError if ``spec`` is neither ``none`` nor a valid codec spec, or is
    a codec that reduces after backward only and ``overlap`` asks for buckets."""
    if spec == NONE:
        return
    codec = parse_codec(spec)
    if overlap and not REDUCERS[codec.name].bucketed:
        raise ValueError(f"--compress {spec} reduces the whole gradient after backward "
                         "only: add --comm blocking")


def compress_momentum(spec: str) -> float:
    """The momentum a valid ``spec``'s reducer applies itself (DGC's ``momentum=M`` of
    top-k and random-k); 0 for every other codec and ``none``."""
    if spec == NONE:
        return 0.0
    options = getattr(parse_codec(spec), "options", None)
    return options.momentum if options is not None else 0.0


def compressed_reducer(core: Any, spec: str, plan: list[tuple[int, int]] | None = None,
                       powersgd_start: int = DEFAULT_START_ITER) -> CompressedReducer:
    """The reducer of codec ``spec`` over ``core``: after backward (``plan`` None) or on
    the buckets of ``plan`` as backward finishes them. PowerSGD compresses from step
    ``powersgd_start`` on (its other options are PyTorch's defaults)."""
    codec = parse_codec(spec)
    if isinstance(codec, PowerSGD):
        codec = PowerSGD(rank=codec.rank, start_iter=powersgd_start)
    return REDUCERS[codec.name](core, codec, plan)
