"""The start of a micro-benchmark between exactly two ranks (``polls``, ``rma_behind``,
``after_idle``), and the spin that stands for their compute.

Bad flags are one line and exit status 2 on every rank, before MPI starts; a world of
another size is one line from rank 0 and status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any


def flag_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m syncbench.bench.micro.NAME``, its description the first
    paragraph of the module's docstring ``doc``."""
    return argparse.ArgumentParser(prog=f"python -m syncbench.bench.micro.{name}",
                                   description=doc.split("\n\n", 1)[0])


def known_flags(parser: argparse.ArgumentParser, name: str,
                argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s flags of ``argv``; ``ValueError`` (one line) naming any it does not know."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(f"{name}: unknown arguments: {' '.join(unknown)}")
    return args


def start_pair(name: str, parse: Callable[[list[str] | None], argparse.Namespace],
               argv: list[str] | None) -> tuple[argparse.Namespace, Any] | int:
    """``(args, MPI.COMM_WORLD)``, or the exit status after the line saying what is wrong."""
    try:
        args = parse(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        if comm.Get_rank() == 0:
            print(f"{name}: needs exactly 2 ranks", file=sys.stderr)
        return 2
    return args, comm


def spin(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` without a system call or an MPI call: a rank's
    compute, during which MPI progresses nothing."""
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        pass
