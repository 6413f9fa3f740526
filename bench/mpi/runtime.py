"""Ending MPI jobs cleanly: agreed setup errors, and abort on any other exception.

Two kinds of failure, two endings:

* Setup errors (bad flags, missing or corrupt data, unwritable output) are
  found before any training communication. Every rank reports whether it
  failed; the ranks agree with one ``allgather``, rank 0 prints ONE line (the
  first failing rank's message) and every rank exits with status 2. No rank
  is left waiting in a collective.
* Any exception after that (inside a step, a nonblocking wait or an RMA
  epoch) prints ``syncbench: rank R: <error>`` to stderr, flushes, and calls
  ``MPI_Abort`` so the whole job ends instead of hanging (as
  ``python -m mpi4py`` does).

A bad command line ends earlier still: ``syncbench`` parses it before MPI starts
(``errors.fail``: one line from rank 0, status 2 everywhere); :func:`start_mpi` then
starts MPI for the MPI commands.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

import mpi4py
from mpi4py import MPI

from syncbench.bench.mpi.errors import fail, folded

T = TypeVar("T")

#: Seconds between printing the error and ``MPI_Abort``: the launcher forwards a
#: rank's output asynchronously and drops what is in flight when it kills the job.
ABORT_GRACE_S = 0.5


class SetupError(Exception):
    """A user error found before training starts; its message is one line."""


def agree_on_setup(comm: MPI.Comm, setup: Callable[[], T], command: str) -> T:
    """Run ``setup`` on every rank; if it fails on any rank, all ranks exit(2).

    ``setup`` should raise :class:`SetupError` (or ``ValueError``/``OSError``)
    with a one-line message for user errors. Rank 0 prints ``syncbench COMMAND:
    error: ... (see 'syncbench COMMAND --help')``, the line of a bad command line
    (``errors.fail`` with MPI's rank); the other ranks exit ``errors.ERROR_EXIT_GRACE_S``
    later, so a launcher that kills the job at the first non-zero exit cannot swallow it.
    """
    result: T | None = None
    error = ""
    try:
        result = setup()
    except (SetupError, ValueError, OSError) as exc:
        error = one_line(exc)
    except Exception as exc:  # a bug during setup: still agree, with the type
        error = f"{type(exc).__name__}: {one_line(exc)}"
        traceback.print_exc()
    errors = comm.allgather(error)
    failed = [(rank, msg) for rank, msg in enumerate(errors) if msg]
    if failed:
        sys.stdout.flush()
        rank, msg = failed[0]
        where = "" if len(failed) == comm.Get_size() else f"rank {rank}: "
        fail(f"syncbench {command}", where + msg, rank=comm.Get_rank())
    return result  # type: ignore[return-value]


def one_line(exc: BaseException) -> str:
    """The exception's message folded onto one line."""
    return folded(str(exc) or type(exc).__name__)


def abort_on_exception(comm: MPI.Comm, body: Callable[[], T]) -> T:
    """Run ``body``; on an unhandled exception print it and ``MPI_Abort`` the job."""
    try:
        return body()
    except SystemExit:
        raise
    except BaseException as exc:
        rank = comm.Get_rank()
        if not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()
        print(
            f"syncbench: rank {rank}: {type(exc).__name__}: {one_line(exc)}; aborting the job",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        time.sleep(ABORT_GRACE_S)  # let the launcher forward the message before the kill
        comm.Abort(1)
        raise  # unreachable when Abort works


#: mpi4py's ``rc.thread_level`` names, as ``MPI_Init_thread`` levels.
THREAD_LEVELS = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
                 "serialized": MPI.THREAD_SERIALIZED, "multiple": MPI.THREAD_MULTIPLE}


def start_mpi() -> MPI.Comm:
    """``MPI.COMM_WORLD``, initializing MPI first if importing mpi4py did not.

    ``syncbench`` parses its command line with MPI not yet started (``cli.main``),
    so MPI commands start it here, as mpi4py would have at import (``mpi4py.rc``'s
    thread level). Steps that must precede ``MPI_Init`` go before this call.
    """
    if not MPI.Is_initialized():
        if mpi4py.rc.threads:
            MPI.Init_thread(THREAD_LEVELS.get(mpi4py.rc.thread_level, MPI.THREAD_MULTIPLE))
        else:
            MPI.Init()
    return MPI.COMM_WORLD


def run_on_world(body: Callable[[MPI.Comm], object]) -> int:
    """Exit status of ``body(MPI.COMM_WORLD)`` for an MPI command's ``main``.

    Starts MPI (:func:`start_mpi`). 0 when ``body`` returns; the agreed status (2)
    when :func:`agree_on_setup` ended it; any other exception aborts the job
    (:func:`abort_on_exception`).
    """
    comm = start_mpi()
    try:
        abort_on_exception(comm, lambda: body(comm))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def wait_politely(request: MPI.Request, interval: float = 0.002) -> None:
    """Complete ``request`` while sleeping between tests instead of spinning.

    MPI libraries busy-poll inside ``Wait``. Ranks that only wait for rank 0
    (to evaluate, or to write the run file) would steal its core when ranks
    outnumber cores; sleeping between ``Test`` calls leaves the core to it.
    """
    while not request.Test():
        time.sleep(interval)


def library_version() -> str:
    """The first line of ``MPI_Get_library_version`` (which MPI, which release)."""
    return MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
