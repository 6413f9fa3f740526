"""The one-line failure every command shares, before and after ``MPI_Init``.

A bad command line or an agreed setup error ends a job with one line on stderr
from the rank the launcher numbered 0 and exit status 2 on every rank, with no
rank left waiting (the launcher's variables name the rank before MPI starts).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import IO, NoReturn

#: Variables through which launchers tell a process its rank before MPI starts, most
#: specific first: MPICH's Hydra and ``srun --mpi=pmi2`` (PMI_RANK), Open MPI
#: (OMPI_COMM_WORLD_RANK), PMIx launchers such as ``srun --mpi=pmix`` (PMIX_RANK), then
#: any Slurm step (SLURM_PROCID; under Hydra inside an allocation it numbers proxies,
#: not ranks, hence last).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank as its launcher announced it; 0 when not started as a rank."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


#: Where each launcher of :data:`RANK_VARIABLES` tells the number of ranks (PMIx: none).
SIZE_VARIABLES = {"PMI_RANK": ("PMI_SIZE",), "OMPI_COMM_WORLD_RANK": ("OMPI_COMM_WORLD_SIZE",),
                  "PMIX_RANK": (), "SLURM_PROCID": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")}


def launcher_size(environ: Mapping[str, str] = os.environ) -> int | None:
    """The job's ranks as the launcher that numbered this process announced them: 1 when
    not started as a rank, None when that launcher does not say."""
    for name in RANK_VARIABLES:
        if environ.get(name, "").strip().isdigit():
            for size in SIZE_VARIABLES[name]:
                value = environ.get(size, "").strip()
                if value.isdigit() and int(value) > 0:
                    return int(value)
            return None
    return 1


#: Seconds a rank that does not print an error waits before it exits 2: Open MPI's
#: launcher ends the job at the first non-zero exit and would kill rank 0 before it
#: printed the one error line.
ERROR_EXIT_GRACE_S = 1.0


def _exit_2_on_sigterm(signum: int, frame: object) -> None:
    os._exit(2)


def exit_after_grace() -> NoReturn:
    """Exit 2 after :data:`ERROR_EXIT_GRACE_S` (a rank that does not print the error).

    A launcher that ends the job at the first non-zero exit (``srun``, Open MPI's)
    may terminate this rank during its grace: SIGTERM then exits 2 at once, so every
    rank's status, and the job's, stays 2 (not 143).
    """
    signal.signal(signal.SIGTERM, _exit_2_on_sigterm)
    time.sleep(ERROR_EXIT_GRACE_S)
    raise SystemExit(2)


def folded(text: str) -> str:
    """``text`` on one line: every run of whitespace, newlines included, one space."""
    return " ".join(text.split())


def error_line(prog: str, message: str) -> str:
    """``PROG: error: MESSAGE (see 'PROG --help')``, the message folded onto one line."""
    return f"{prog}: error: {folded(message)} (see '{prog} --help')"


def fail(prog: str, message: str, rank: int | None = None) -> NoReturn:
    """End a bad command line: one line on stderr, from rank 0 only; status 2 on every rank.

    The command line is parsed before MPI starts (:func:`main`), so the printing rank
    comes from the launcher's variables, not from MPI. No collective is needed: every
    rank parses the same argv, so every rank reaches the same error and exits. The
    other ranks exit ``ERROR_EXIT_GRACE_S`` later, so that rank 0 has printed before a
    launcher that kills the job at the first non-zero exit (Open MPI's) ends it.
    ``rank`` overrides the launcher's rank (an agreed setup error passes MPI's).
    """
    if (launcher_rank() if rank is None else rank) != 0:
        exit_after_grace()
    print(error_line(prog, message), file=sys.stderr, flush=True)
    raise SystemExit(2)


class CommandParser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are :func:`fail`'s one line, not usage plus error,
    and whose ``--help`` comes from rank 0 only.

    ``add_subparsers`` builds the sub-commands' parsers with this class too.
    """

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)

    def print_help(self, file: IO[str] | None = None) -> None:
        if launcher_rank() == 0:
            super().print_help(file)
