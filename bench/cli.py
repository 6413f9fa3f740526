"""The ``syncbench`` command line (also ``python -m syncbench``).

Each sub-command lives in its own module, which provides ``add_arguments``
(its flags) and ``main`` (its body). Only the module of the command being
run is imported, so ``syncbench report`` works without MPI and ``--help``
is instant. Commands marked *passthrough* hand flags they do not know to
``syncbench train`` (one set of training flags for every launcher).

A command's ``--help`` is its module's docstring, so that docstring is written
for the command's users; it is shown in plain words (:func:`plain`: no
reStructuredText markup), and every flag's help ends with its default
(:class:`HelpFormatter`). The old command names (aliases of ``syncbench run
SCENARIO``) are listed apart from the commands.

The command line is parsed before MPI starts (importing a command's flags
does not initialize MPI; MPI commands start it in their body), so a bad flag
under ``mpiexec`` is one line from the rank its launcher numbered 0 and exit
status 2 on every rank, with no rank left waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from syncbench.bench.flags import Switch
from syncbench.bench.mpi.errors import CommandParser, fail, folded, launcher_size
from syncbench.bench.mpi.provenance import package_version
from syncbench.bench.mpi.threads import announce, limit_threads

#: reStructuredText markup in module docstrings: a role (``:func:`x` ``, ``:mod:`~a.b` ``)
#: and inline literals (double or single backquotes); help shows the text alone.
_ROLE = re.compile(r":[a-z]+:`~?\.?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``|`([^`\n]+)`")
#: Help that already states its default (hand-written "(default 4)", "auto (default)").
_STATES_DEFAULT = re.compile(r"\bdefault|%\(default\)", re.IGNORECASE)


def plain(text: str, module: object = None) -> str:
    """Help text in plain words: reStructuredText roles and literals become their text,
    a literal block's ``::`` one colon; a ``:data:`` role naming a number or a string of
    ``module`` (``DEFAULT_MAX_RANKS``) becomes its value."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        found = getattr(module, name, None) if match.group(0).startswith(":data:") else None
        if isinstance(found, int | float | str) and not isinstance(found, bool):
            return f"{found:g}" if isinstance(found, float) else str(found)
        return name

    text = _ROLE.sub(value, text)
    text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (their line breaks kept); every flag's help in plain words
    ending with its default, unless it states one, has none (None, "", [], SUPPRESS) or is
    a switch (``store_true``). A :class:`~syncbench.bench.flags.Switch` shows as
    ``--flag | --no-flag`` with the spelling of its default; a description or group
    description written as one long line is wrapped to the terminal's width."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text.strip():  # one long line (a group's description): wrapped
            return argparse.HelpFormatter._fill_text(self, text, width, indent)
        return super()._fill_text(text, width, indent)

    def _format_actions_usage(self, actions: list, groups: object) -> str:
        shown = []
        for action in actions:
            if isinstance(action, Switch):  # usage: [--events | --no-events], no value
                action = copy.copy(action)
                action.nargs = 0
            shown.append(action)
        return super()._format_actions_usage(shown, groups)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not action.help or action.help == argparse.SUPPRESS:
            return action.help
        text = plain(action.help)
        default = action.shown_default() if isinstance(action, Switch) else action.default
        takes_value = action.nargs != 0 and (
            action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
        if (not takes_value or shown is None or shown == "" or shown is argparse.SUPPRESS
                or _STATES_DEFAULT.search(text)):
            return text
        return f"{text} (default: {str(shown).replace('%', '%%')})"


class HelpParser(CommandParser):
    """:class:`CommandParser` with :class:`HelpFormatter`; ``add_subparsers`` makes every
    sub-command's parser, nested ones (``cluster up``) too, of this class."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


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
    #: The shipped scenario an old command name stands for (``syncbench run NAME``).
    alias_of: str | None = None


def _alias(scenario: str) -> Command:
    """An old command kept as ``syncbench run SCENARIO`` (the runner's flags and body)."""
    return Command("syncbench.bench.experiment.runner", "add_runner_arguments", "alias",
                   f"alias of 'syncbench run {scenario}'", passthrough=True, alias_of=scenario)


COMMANDS: dict[str, Command] = {
    "train": Command("syncbench.bench.train.options", "add_train_arguments", "main",
                     "one training run (launch under mpiexec -n N)",
                     body_module="syncbench.bench.train.driver"),
    "run": Command("syncbench.bench.experiment.runner", "add_arguments", "main",
                   "a comparison scenario (demo, hetero, overlap, asgd, peers or a .toml): "
                   "repeated, randomised runs, then tables", passthrough=True),
    "compare": Command("syncbench.bench.experiment.commands", "add_compare_arguments",
                       "compare_main",
                       "the same training flags under several algorithms, then a table "
                       "(syncbench run with a scenario made of --algorithms)",
                       passthrough=True),
    "sweep": Command("syncbench.bench.experiment.commands", "add_sweep_arguments", "sweep_main",
                     "strong or weak scaling sweep over rank counts", passthrough=True),
    "report": Command("syncbench.analysis.report", "add_report_arguments", "report_main",
                      "tables (and --plots) from run files"),
    "trace": Command("syncbench.analysis.trace", "add_trace_arguments", "trace_main",
                     "Chrome/Perfetto trace of every rank's phases"),
    "recover": Command("syncbench.bench.train.checkpoint", "add_recover_arguments", "recover_main",
                       "rebuild a partial run file from the rows a crashed run flushed"),
    "comm": Command("syncbench.bench.micro.comm", "add_arguments", "main",
                    "OSU-style communication micro-benchmarks (under mpiexec)"),
    "ssgd-comm": Command("syncbench.bench.micro.ssgd_comm", "add_arguments", "main",
                         "SSGD's time inside MPI per step vs a bare Allreduce (under mpiexec)"),
    "speed": Command("syncbench.bench.micro.speed", "add_arguments", "main",
                     "single-process training-step throughput of the models"),
    "overlap": _alias("overlap"),
    "hetero": _alias("hetero"),
    "asgd-bench": _alias("asgd"),
    "peers": Command("syncbench.bench.experiment.peers.command", "add_arguments", "main",
                     "ours vs PyTorch DDP / PeriodicModelAverager, and SSGD vs a bare Allreduce"),
    "simulate": Command("syncbench.bench.simulate.cli", "add_arguments", "main",
                        "predict a strategy at 8 to 16,384 ranks on a simulated cluster (SimGrid)"),
    "cluster": Command("syncbench.bench.cluster.command", "add_arguments", "main",
                       "an emulated cluster on this host (root): up, status, mpiexec, down"),
    "data": Command("syncbench.bench.data.command", "add_arguments", "main",
                    "dataset files: info (what is found where) or fetch (download)"),
    "env": Command("syncbench.bench.mpi.environment", "add_arguments", "main",
                   "what this environment gives a run (MPI library, GPU, datasets, SimGrid, "
                   "Slurm, threads) and what train would miss"),
}


def _aliases_epilog() -> str:
    """The old command names, listed apart from the commands: what each one runs."""
    aliases = {name: c.alias_of for name, c in COMMANDS.items() if c.alias_of}
    width = max(map(len, aliases), default=0)
    return "aliases (old command names, each a scenario of syncbench run):\n" + "\n".join(
        f"  {name:<{width}}  syncbench run {scenario}" for name, scenario in aliases.items())


def import_command(name: str, module: str) -> object:
    """A command's module; what it cannot load (mpi4py finding no MPI library, a missing
    package) ends the command with one line instead of a traceback."""
    try:
        return importlib.import_module(module)
    except (ImportError, RuntimeError, OSError) as exc:
        fail(f"syncbench {name}", f"cannot load what it needs: {folded(str(exc))} "
             "('syncbench env' lists what is missing)")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``selected``'s module is imported to add its flags."""
    parser = HelpParser(
        prog="syncbench",
        description="Benchmark synchronization strategies of data-parallel training under "
        "MPI:\ntrain (under mpiexec), run (a comparison scenario), compare, sweep, report, "
        "trace.\n'syncbench COMMAND --help' tells what a command does and its flags.",
        epilog=_aliases_epilog(),
    )
    parser.add_argument("--version", action="version", version=f"syncbench {package_version()}")
    # Not required: with no command, main prints this help (the command list) instead.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, command in COMMANDS.items():
        module = import_command(name, command.module) if name == selected else None
        doc = (module.__doc__ or "").strip() if module and not command.alias_of else ""
        # An alias gets no help=: argparse then leaves it out of the command list.
        listed = {} if command.alias_of else {"help": command.help}
        sp = sub.add_parser(name, description=plain(doc, module) or command.help, **listed)
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
    import mpi4py

    saved = mpi4py.rc.initialize, mpi4py.rc.finalize
    mpi4py.rc.initialize, mpi4py.rc.finalize = False, True
    try:
        yield
    finally:
        mpi4py.rc.initialize, mpi4py.rc.finalize = saved


def check_train_flags(args: argparse.Namespace, prog: str) -> None:
    """Train's flag values, checked before the thread line (a bad value is the only line
    printed): the run's config is built for the ranks the launcher announced; every
    rank builds it again once MPI has started (``train``'s body). Where the launcher
    does not say how many ranks, nothing is checked here."""
    size = launcher_size()
    if size is None:
        return
    from syncbench.bench.train.config import build_train_config

    try:
        build_train_config(args, size)
    except ValueError as exc:
        fail(prog, str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = argv[0] if argv and argv[0] in COMMANDS else None
    # before NumPy loads (train's flags import it): the BLAS/OpenMP threads of each rank
    threads = limit_threads() if selected == "train" else None
    with mpi_not_started():
        parser = build_parser(selected)
        args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:
            fail(parser.prog, f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()  # asked for nothing: the command list, on stdout
        return 0
    command = COMMANDS[args.command]
    if extra and not command.passthrough:
        fail(f"{parser.prog} {args.command}", f"unrecognized arguments: {' '.join(extra)}")
    if threads is not None:
        with mpi_not_started():
            check_train_flags(args, f"{parser.prog} {args.command}")
        announce(threads)
    body = getattr(import_command(args.command, command.body_module or command.module),
                   command.run)
    if command.alias_of is not None:
        body = body(command.alias_of, f"{parser.prog} {args.command}")
    result = body(args, extra) if command.passthrough else body(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
