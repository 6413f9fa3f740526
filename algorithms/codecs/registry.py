"""The codecs by name, and the ``NAME[:ARG]`` spec of ``--compress``.

``fp16``, ``bf16`` (no argument); ``int8[:CHUNK]`` and ``int4[:CHUNK]`` (chunk
length in elements, default 4096); ``powersgd[:R]`` (rank, default 1); ``topk:D``,
``randomk:D`` (``randk:D`` as well, the issue's spelling; density in (0, 1],
required), each optionally followed by DGC's ``,momentum=M`` and ``,warmup=STEPS``
(:mod:`~syncbench.algorithms.codecs.dgc`). Every bad spec is one ValueError line that
names the bad value and what is allowed, for the CLI to print as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from syncbench.algorithms.codecs.dgc import DGCOptions, parse_options
from syncbench.algorithms.codecs.half import BFloat16Codec, Float16Codec
from syncbench.algorithms.codecs.minmax import MinMaxUInt4Codec, MinMaxUInt8Codec
from syncbench.algorithms.codecs.powersgd import PowerSGD
from syncbench.algorithms.codecs.sparse import RandomK, TopK

#: Any codec a spec names.
Codec = (Float16Codec | BFloat16Codec | MinMaxUInt8Codec | MinMaxUInt4Codec | PowerSGD | TopK
         | RandomK)


def _no_argument(cls: type) -> Callable[[str | None], Any]:
    def make(arg: str | None) -> Any:
        if arg is not None:
            raise ValueError(f"{cls.name} takes no argument, got '{cls.name}:{arg}'")
        return cls()
    return make


def _integer(name: str, what: str, arg: str, example: str) -> int:
    try:
        return int(arg)
    except ValueError:
        raise ValueError(f"{name} {what} '{arg}' is not an integer: {example}") from None


def _int8(arg: str | None) -> MinMaxUInt8Codec:
    if arg is None:
        return MinMaxUInt8Codec()
    return MinMaxUInt8Codec(_integer(
        "int8", "chunk", arg, "give a chunk length >= 1 element (e.g. int8:4096)"))


def _int4(arg: str | None) -> MinMaxUInt4Codec:
    if arg is None:
        return MinMaxUInt4Codec()
    return MinMaxUInt4Codec(_integer(
        "int4", "chunk", arg, "give a chunk length >= 1 element (e.g. int4:4096)"))


def _powersgd(arg: str | None) -> PowerSGD:
    if arg is None:
        return PowerSGD()
    return PowerSGD(rank=_integer("powersgd", "rank", arg, "give a rank >= 1 (e.g. powersgd:2)"))


def _density(name: str, arg: str | None) -> tuple[float, DGCOptions]:
    """``D[,momentum=M][,warmup=STEPS]``: the density and DGC's options."""
    if arg is None:
        raise ValueError(f"{name} needs a density: give {name}:D with 0 < D <= 1 "
                         f"(e.g. {name}:0.01)")
    density, *items = arg.split(",")
    try:
        value = float(density)
    except ValueError:
        raise ValueError(f"{name} density '{density}' is not a number: "
                         f"give a fraction 0 < D <= 1 (e.g. {name}:0.01)") from None
    return value, parse_options(name, items)


def _topk(arg: str | None) -> TopK:
    density, options = _density("topk", arg)
    return TopK(density, options=options)


def _randomk(name: str) -> Callable[[str | None], RandomK]:
    def make(arg: str | None) -> RandomK:
        density, options = _density(name, arg)
        return RandomK(density, options=options)
    return make


#: Codec name -> factory taking the spec's argument (None when the spec has none).
CODECS: dict[str, Callable[[str | None], Codec]] = {
    "fp16": _no_argument(Float16Codec),
    "bf16": _no_argument(BFloat16Codec),
    "int8": _int8,
    "int4": _int4,
    "powersgd": _powersgd,
    "topk": _topk,
    "randomk": _randomk("randomk"),
    "randk": _randomk("randk"),
}


def parse_codec(spec: str) -> Codec:
    """The codec of ``spec`` (``NAME[:ARG]``); a one-line ValueError if it is not valid."""
    name, sep, arg = spec.strip().partition(":")
    if name not in CODECS:
        raise ValueError(f"unknown codec '{name}' in '{spec}': choose one of "
                         f"{', '.join(sorted(CODECS))}")
    if sep and not arg:
        raise ValueError(f"codec '{spec}' has an empty argument after ':'")
    return CODECS[name](arg if sep else None)
