"""The ``syncbench`` command line (also ``python -m syncbench``).

Each sub-command lives in its own module, which provides ``add_arguments``
(its flags) and ``main`` (its body). Only the module of the command being
run is imported, so ``syncbench report`` works without MPI and ``--help``
is instant. Commands marked *passthrough* hand flags they do not know to
``syncbench train`` (one set of training flags for every launcher).

The command line is parsed before MPI starts (importing a command's flags
does not initialize MPI; MPI commands start it in their body), so a bad flag
under ``mpiexec`` is one line from the rank its launcher numbered 0 and exit
status 2 on every rank, with no rank left waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, NoReturn


@dataclass(frozen=True)
class Command:
    """A sub-command: where its flags and body live, and its help."""

    module: str
    add: str
    run: str
    help: str
    passthrough: bool = False
    #: Module of the body ``run`` when it is not ``module`` (train: flags in options).
    body_module: str | None = None


COMMANDS: dict[str, Command] = {
    "train": Command("syncbench.bench.options", "add_train_arguments", "main",
                     "one training run (launch under mpiexec -n N)",
                     body_module="syncbench.bench.train"),
    "run": Command("syncbench.bench.experiment.runner", "add_arguments", "main",
                   "a comparison scenario (demo, hetero, overlap, asgd, peers or a .toml): "
                   "repeated, randomised runs, then tables", passthrough=True),
    "compare": Command("syncbench.bench.compare", "add_arguments", "main",
                       "the same training flags under several algorithms, then a table "
                       "(syncbench run with a scenario made of --algorithms)",
                       passthrough=True),
    "sweep": Command("syncbench.bench.sweep", "add_arguments", "main",
                     "strong or weak scaling sweep over rank counts", passthrough=True),
    "report": Command("syncbench.analysis.report", "add_report_arguments", "report_main",
                      "tables (and --plots) from run files"),
    "trace": Command("syncbench.analysis.trace", "add_trace_arguments", "trace_main",
                     "Chrome/Perfetto trace of every rank's phases"),
    "recover": Command("syncbench.bench.checkpoint", "add_recover_arguments", "recover_main",
                       "rebuild a partial run file from the rows a crashed run flushed"),
    "comm": Command("syncbench.bench.commbench", "add_arguments", "main",
                    "OSU-style communication micro-benchmarks (under mpiexec)"),
    "ssgd-comm": Command("syncbench.bench.ssgd_comm", "add_arguments", "main",
                         "SSGD's time inside MPI per step vs a bare Allreduce (under mpiexec)"),
    "speed": Command("syncbench.bench.speed", "add_arguments", "main",
                     "single-process training-step throughput of the models"),
    "overlap": Command("syncbench.bench.overlap_bench", "add_arguments", "main",
                       "alias of 'syncbench run overlap'", passthrough=True),
    "hetero": Command("syncbench.bench.hetero_bench", "add_arguments", "main",
                      "alias of 'syncbench run hetero'", passthrough=True),
    "asgd-bench": Command("syncbench.bench.asgd_bench", "add_arguments", "main",
                          "alias of 'syncbench run asgd'", passthrough=True),
    "peers": Command("syncbench.bench.peers.command", "add_arguments", "main",
                     "ours vs PyTorch DDP / PeriodicModelAverager, and SSGD vs a bare Allreduce"),
    "simulate": Command("syncbench.bench.simulate.cli", "add_arguments", "main",
                        "predict a strategy at 8 to 16,384 ranks on a simulated cluster (SimGrid)"),
    "cluster": Command("syncbench.bench.cluster.command", "add_arguments", "main",
                       "an emulated cluster on this host (root): up, status, mpiexec, down"),
    "data": Command("syncbench.bench.data_cli", "add_arguments", "main",
                    "dataset files: info (what is found where) or fetch (download)"),
}


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


def error_line(prog: str, message: str) -> str:
    """``PROG: error: MESSAGE (see 'PROG --help')``, the message folded onto one line."""
    text = " ".join(message.split())
    return f"{prog}: error: {text} (see '{prog} --help')"


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


def package_version() -> str:
    """The installed distribution's version (what run files record), else ``unknown``."""
    try:
        return metadata.version("syncbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_sha() -> str:
    """The commit of the source tree this package runs from (what run files record), else ``""``."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``selected``'s module is imported to add its flags."""
    parser = CommandParser(
        prog="syncbench",
        description="Benchmark synchronization strategies of data-parallel training under "
        "MPI: train (under mpiexec), run (a comparison scenario), compare, sweep, report, "
        "trace.",
    )
    parser.add_argument("--version", action="version", version=f"syncbench {package_version()}")
    # Not required: with no command, main prints this help (the command list) instead.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module) if name == selected else None
        doc = (module.__doc__ or "").strip() if module else ""
        sp = sub.add_parser(name, help=command.help, description=doc or command.help,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if module is not None:
            getattr(module, command.add)(sp)
    return parser


@contextlib.contextmanager
def mpi_not_started() -> Iterator[None]:
    """Import flag modules without starting MPI (mpi4py would ``MPI_Init`` at import).

    A bad flag then ends every rank before ``MPI_Init`` (nothing to wait for), and
    whatever must precede ``MPI_Init`` (binding a GPU by local rank) can run after
    parsing. MPI commands start MPI in their body (``runtime.start_mpi``); mpi4py still
    finalizes at exit what they started. Later imports initialize at import as usual.
    """
    import mpi4py  # noqa: PLC0415 - the package only; mpi4py.MPI is what starts MPI

    saved = mpi4py.rc.initialize, mpi4py.rc.finalize
    mpi4py.rc.initialize, mpi4py.rc.finalize = False, True
    try:
        yield
    finally:
        mpi4py.rc.initialize, mpi4py.rc.finalize = saved


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = argv[0] if argv and argv[0] in COMMANDS else None
    with mpi_not_started():
        parser = build_parser(selected)
        args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:
            fail(parser.prog, f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help(sys.stderr)
        return 2
    command = COMMANDS[args.command]
    if extra and not command.passthrough:
        fail(f"{parser.prog} {args.command}", f"unrecognized arguments: {' '.join(extra)}")
    body = getattr(importlib.import_module(command.body_module or command.module), command.run)
    result = body(args, extra) if command.passthrough else body(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
