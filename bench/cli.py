"""The ``syncbench`` command line (also ``python -m syncbench``).

Each sub-command is one module of :mod:`syncbench.bench.commands`, found by
listing that package (``ssgd_comm.py`` is ``syncbench ssgd-comm``), which provides
``add_arguments`` (its flags) and ``run`` (its body). Only the module of the
command being run is imported, so ``syncbench report`` works without MPI and
``--help`` is instant; the command list reads each module's ``HELP`` from its
source. Commands marked ``PASSTHROUGH`` hand flags they do not know to
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
import ast
import contextlib
import copy
import functools
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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


#: The package of the commands, one module each (:mod:`syncbench.bench.commands`).
PACKAGE = "syncbench.bench.commands"

#: Old command names, each a shipped scenario of ``syncbench run`` (its flags but
#: SCENARIO, its body): command name -> scenario.
ALIASES = {"overlap": "overlap", "hetero": "hetero", "asgd-bench": "asgd"}

#: The order of the command list (``syncbench --help``) and of the names an unknown
#: command's error offers; a command module not named here comes after them, by name.
ORDER = ("train", "run", "compare", "sweep", "report", "sample", "trace", "recover", "comm",
         "ssgd-comm", "speed", "overlap", "hetero", "asgd-bench", "peers", "simulate",
         "cluster", "data", "env")


@dataclass(frozen=True)
class Command:
    """A sub-command: the module of its flags and body, and where its help comes from."""

    module: str
    #: The shipped scenario an old command name stands for (``syncbench run NAME``).
    alias_of: str | None = None

    @functools.cached_property
    def help(self) -> str:
        """Its line in the command list: the module's ``HELP``, read from its source (the
        list imports no command; a command that runs never reads the others')."""
        if self.alias_of is not None:
            return f"alias of 'syncbench run {self.alias_of}'"
        return str(declared(self.module, "HELP") or "")


def declared(module: str, name: str) -> object:
    """The value of the constant ``name`` that ``module`` assigns at its top, before its
    first function (``HELP``), read from its source without importing it; None if it
    assigns none there."""
    spec = importlib.util.find_spec(module)
    source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    head = source.split("\ndef ", 1)[0]
    try:
        tree = ast.parse(head)
    except SyntaxError:  # the head cut a statement: the whole module
        tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def find_commands() -> dict[str, Command]:
    """Every module of :data:`PACKAGE` as a command (``ssgd_comm`` is ``ssgd-comm``), and
    the :data:`ALIASES`, in :data:`ORDER`."""
    package = importlib.import_module(PACKAGE)
    commands = {info.name.replace("_", "-"): Command(f"{PACKAGE}.{info.name}")
                for info in pkgutil.iter_modules(package.__path__)
                if not info.name.startswith("_")}
    commands |= {name: Command(f"{PACKAGE}.run", scenario)
                 for name, scenario in ALIASES.items()}
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(commands.items(), key=lambda c: (rank.get(c[0], len(ORDER)), c[0])))


COMMANDS: dict[str, Command] = find_commands()


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
        # An alias gets no help=: argparse then leaves it out of the command list, which
        # only a parser with no command selected prints (the others never read it).
        listed = {} if command.alias_of else {"help": command.help if selected is None else ""}
        described = (plain(doc, module) or command.help) if module is not None else None
        sp = sub.add_parser(name, description=described, **listed)
        if module is not None and command.alias_of:
            module.add_runner_arguments(sp)  # the runner's flags; the scenario is the alias's
            sp.set_defaults(scenario=command.alias_of)
        elif module is not None:
            module.add_arguments(sp)
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


#: Set to 1, ``syncbench train`` checks its flags and exits 0 without starting MPI: the
#: Slurm batch scripts check them once in the batch step before ``srun``, since under
#: ``srun --kill-on-bad-exit`` a task still loading its modules when rank 0 printed the
#: bad flag's line is killed by SIGTERM (job status 143, not 2).
CHECK_FLAGS_ENV = "SYNCBENCH_CHECK_FLAGS"


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
    module = import_command(args.command, COMMANDS[args.command].module)  # imported above
    passthrough = getattr(module, "PASSTHROUGH", False)
    if extra and not passthrough:
        fail(f"{parser.prog} {args.command}", f"unrecognized arguments: {' '.join(extra)}")
    if threads is not None:
        with mpi_not_started():
            check_train_flags(args, f"{parser.prog} {args.command}")
        if os.environ.get(CHECK_FLAGS_ENV) == "1":
            return 0
        announce(threads)
    result = module.run(args, extra) if passthrough else module.run(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
