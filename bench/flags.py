"""One vocabulary of flags across the commands: old spellings kept as hidden aliases.

docs/FLAGS.md lists one flag per idea (``--out FILE``, ``--out-dir DIR``,
``--dry-run``, ``--model``, ``--np``, ``--seed`` / ``--order-seed``, switches
``--flag/--no-flag``). A flag that was spelled otherwise keeps its old spelling
as an alias that ``--help`` does not show: it still works, and the first use in
a process prints one line on stderr (from the launcher's rank 0 only) naming
the spelling to use. Renaming a flag is one line::

    renamed(parser, ("--output",), "-o", "--out", default=None, help=...)

:class:`Switch` is an on/off flag as ``--events`` / ``--no-events``; its old
values (``--events on``, ``--cuda-aware yes``) are accepted the same way. The
parsed value is what the command's body always read (``"on"``/``"off"``,
``"yes"``/``"no"``/``"auto"``, ``True``/``False``), so only the spelling changed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from syncbench.bench.mpi.errors import launcher_rank

#: Old spellings already announced in this process (one line each, once).
_announced: set[str] = set()


def positive_int(text: str) -> int:
    """argparse ``type`` of a count: an integer >= 1, else one line naming the value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


#: The most ranks any command takes: the simulator's (``simulate --np``, and a scenario's
#: ``np``, since ``sweep --simulate`` to 16,384 ranks is a scaling scenario too).
MAX_RANKS = 16_384


def parse_rank_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: the rank counts of ``--np`` (run, compare, sweep,
    peers), positive and distinct, in the order typed; a single count is a list of one.
    ``ValueError`` with one line that names the value otherwise."""
    try:
        counts = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"expected positive integers like 4 or 1,2,4, got {text!r}")
    if len(set(counts)) != len(counts):
        raise ValueError(f"rank counts repeat in {text!r}")
    return counts


def rank_counts(text: str) -> list[int]:
    """argparse ``type`` of ``--np N,...``: :func:`parse_rank_counts`."""
    try:
        return parse_rank_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def deprecation(prog: str, old: str, new: str) -> None:
    """One line on stderr, once per process and old spelling, from the launcher's rank 0:
    ``PROG: 'OLD' is an old spelling; use 'NEW' (docs/FLAGS.md)``."""
    if old in _announced:
        return
    _announced.add(old)
    if launcher_rank() == 0:
        print(f"{prog}: '{old}' is an old spelling; use '{new}' (docs/FLAGS.md)",
              file=sys.stderr, flush=True)


class _Alias(argparse.Action):
    """A hidden old spelling of ``target``: same value, one deprecation line."""

    def __init__(self, option_strings: Sequence[str], dest: str,
                 target: argparse.Action | None = None, implies: dict | None = None,
                 **kwargs: Any) -> None:
        assert target is not None
        self.target, self.implies = target, dict(implies or {})
        super().__init__(option_strings, dest, nargs=target.nargs, const=target.const,
                         default=argparse.SUPPRESS, type=target.type, choices=target.choices,
                         metavar=target.metavar, help=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        new = next((s for s in self.target.option_strings if s.startswith("--")),
                   self.target.option_strings[0])
        deprecation(parser.prog, option_string or self.option_strings[0], new)
        self.target(parser, namespace, values, new)
        for dest, value in self.implies.items():
            setattr(namespace, dest, value)


def alias(container: argparse._ActionsContainer, target: argparse.Action, *old: str,
          implies: dict | None = None) -> None:
    """Add ``old`` spellings of ``target`` (an action already added) to ``container``;
    ``implies``: what else the old spelling meant (``--json PATH``: the format too)."""
    if old:
        container.add_argument(*old, dest=target.dest, action=_Alias, target=target,
                               implies=implies)


def renamed(container: argparse._ActionsContainer, old: Sequence[str], *names: str,
            implies: dict | None = None, **kwargs: Any) -> argparse.Action:
    """``container.add_argument(*names, **kwargs)`` with ``old`` spellings as hidden aliases."""
    action = container.add_argument(*names, **kwargs)
    alias(container, action, *old, implies=implies)
    return action


def add_json_out(container: argparse._ActionsContainer, what: str) -> None:
    """``--out FILE`` (was ``--json PATH``) and ``--format json`` of a command whose one
    file output is JSON (speed, ssgd-comm); the body reads ``args.json``."""
    renamed(container, ("--json",), "--out", dest="json", default=None, metavar="FILE",
            implies={"format": "json"},
            help=f"also write {what} to FILE, as JSON (FILE.json, or --format json)")
    container.add_argument("--format", choices=("json",), default=None,
                           help="the format of --out (default: from its suffix)")


def check_json_out(args: argparse.Namespace) -> None:
    """``--out FILE`` whose format is known: a ``.json`` name or ``--format json``
    (``ValueError``, one line, otherwise)."""
    path = getattr(args, "json", None)
    if path and getattr(args, "format", None) is None and not str(path).lower().endswith(
            ".json"):
        raise ValueError(f"--out {path}: the format comes from the name's suffix; name it "
                         "*.json or add --format json")


#: Old values of an on/off flag and what they meant.
_ON = ("on", "yes", "true", "1")
_OFF = ("off", "no", "false", "0")


class Switch(argparse.Action):
    """``--flag`` / ``--no-flag``; ``auto=True`` adds a third state (neither given, or the
    old ``--flag auto``). ``stored`` is what the body reads for (on, off, auto).

    The old value forms (``--flag on|off|yes|no|auto``, ``--flag=on``) are accepted with
    one deprecation line; any other value is refused in one line naming the flag.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, default: Any = None,
                 stored: tuple[Any, Any, Any] = (True, False, None), auto: bool = False,
                 help: str | None = None, **kwargs: Any) -> None:
        strings = []
        for s in option_strings:
            strings += [s] + ([f"--no-{s[2:]}"] if s.startswith("--") else [])
        self.stored, self.auto = stored, auto
        super().__init__(strings, dest, nargs="?", default=default, help=help,
                         metavar=argparse.SUPPRESS)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)

    def shown_default(self) -> str:
        """The default in words: the spelling that gives it, or auto."""
        positive = self.option_strings[0]
        if self.default == self.stored[0]:
            return positive
        if self.default == self.stored[1]:
            return f"--no-{positive[2:]}"
        return "auto"

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        option = option_string or self.option_strings[0]
        negative = option.startswith("--no-")
        positive = "--" + option[5:] if negative else option
        if values is None:
            state = 1 if negative else 0
        else:
            word = str(values).strip().lower()
            if negative:
                parser.error(f"{option} takes no value, got {values!r}")
            if word in _ON:
                state, new = 0, positive
            elif word in _OFF:
                state, new = 1, f"--no-{positive[2:]}"
            elif word == "auto" and self.auto:
                state, new = 2, f"(neither {positive} nor --no-{positive[2:]})"
            else:
                kinds = "on/off" + (" or auto" if self.auto else "")
                parser.error(f"{positive} takes no value (the old form took {kinds}), "
                             f"got {values!r}: use {positive} or --no-{positive[2:]}")
            deprecation(parser.prog, f"{positive} {values}", new)
        setattr(namespace, self.dest, self.stored[state])


def switch(container: argparse._ActionsContainer, name: str, *, on: Any = True,
           off: Any = False, auto: Any = None, default: Any = None, has_auto: bool = False,
           help: str) -> argparse.Action:
    """Add the switch ``name`` / ``--no-NAME``; the body reads ``on``, ``off`` or ``auto``."""
    return container.add_argument(name, action=Switch, default=default,
                                  stored=(on, off, auto), auto=has_auto, help=help)


class OnOffAsSwitches:
    """A stand-in for an argument group: a flag added with ``choices`` of exactly on and
    off (a strategy's option, ``--adaptive {on,off}``) becomes a :class:`Switch` whose
    body still reads ``"on"``/``"off"``; any other flag is added unchanged."""

    def __init__(self, container: argparse._ActionsContainer) -> None:
        self._container = container

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        choices = kwargs.get("choices")
        if choices is not None and sorted(choices) == ["off", "on"]:
            return switch(self._container, *names, on="on", off="off",
                          default=kwargs.get("default"), help=kwargs.get("help") or "")
        return self._container.add_argument(*names, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)
