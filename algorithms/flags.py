"""Typed options of a strategy, and the command-line flags generated from them.

Each strategy declares a frozen ``Options`` dataclass (as PyTorch's averagers
take typed constructor arguments): one field per option, its help text and
argparse details in the field's metadata (:func:`option`), and validation in
``__post_init__`` (``ValueError`` with one line, as ``PeriodicModelAverager``
checks its period). ``syncbench train`` generates one argument group per
strategy from it (:func:`add_option_flags`); a benchmark builds the dataclass
directly, e.g. ``SSGD.Options(comm="blocking")``.

A flag names one option of one strategy. Two strategies share a flag only
explicitly: by inheriting the field (Oscars' ``Options`` extends Local SGD's,
so ``--period`` is Local SGD's period and Oscars' base period); any other
repeated name is an error when the parser is built.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


class StrategyOptions:
    """Base of every strategy's ``Options`` dataclass: :meth:`check_run`, the checks of
    the options that need the rest of the run's configuration (the number of ranks, the
    model). The default checks nothing."""

    def check_run(self, config: Any, world_size: int) -> None:
        """Raise ``ValueError`` with one line where the options cannot run with ``config``
        on ``world_size`` ranks (every rank agrees)."""


def validate_options(options: type, config: Any, world_size: int) -> Any:
    """``options`` built from ``config`` (the dataclass validates itself), then checked
    against the run (:meth:`StrategyOptions.check_run`); ``ValueError``: one line."""
    built = options_from(options, config)
    if isinstance(built, StrategyOptions):
        built.check_run(config, world_size)
    return built


def option(default: Any, help: str, *, choices: Sequence[Any] | None = None,
           type: Callable[[str], Any] | None = None,
           metavar: str | None = None, flag: bool = False) -> Any:
    """A field of an ``Options`` dataclass with its flag's help and argparse details.

    ``flag=True``: a boolean switch (``store_true``). The flag's name is the
    field's, with dashes (``bucket_mb`` -> ``--bucket-mb``).
    """
    meta = {"help": help, "choices": choices, "type": type, "metavar": metavar, "flag": flag}
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def add_option_flags(group: argparse._ActionsContainer, options: type,
                     seen: dict[str, dataclasses.Field]) -> None:
    """Add one flag per field of ``options`` to ``group``.

    ``seen`` maps the flags added so far (over every strategy) to their field;
    a field inherited from another strategy's ``Options`` is shared and added
    once, a different field with a taken name raises ``ValueError``.
    """
    for field in dataclasses.fields(options):
        name = flag_name(field)
        if name in seen:
            if seen[name] is field:  # inherited: explicitly shared
                continue
            raise ValueError(f"{name} of {options.__qualname__} is already another "
                             "strategy's option (share it by inheriting the field)")
        seen[name] = field
        meta = field.metadata
        kwargs: dict[str, Any] = {"help": _help(field), "default": field.default}
        if meta.get("flag"):
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = meta.get("type") or _scalar_type(field.default)
            for key in ("choices", "metavar"):
                if meta.get(key) is not None:
                    kwargs[key] = meta[key]
        group.add_argument(name, **kwargs)


def options_from(options: type, source: Any) -> Any:
    """``options`` (a strategy's ``Options`` class) of a run.

    ``source`` is a run's ``TrainConfig``, whose ``strategy_options`` is returned
    when it is an ``options``, or the parsed flags (an ``argparse.Namespace``, as
    ``TrainConfig.from_args`` builds them from): ``options`` is then built from the
    attributes named as its fields, those ``source`` lacks keeping their
    defaults, and the dataclass validates.
    """
    own = getattr(source, "strategy_options", None)
    if type(own) is options:
        return own
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(options)
              if hasattr(source, f.name)}
    return options(**values)


def _help(field: dataclasses.Field) -> str:
    text = field.metadata.get("help", "")
    if field.default is None or field.metadata.get("flag") or "default" in text:
        return text
    return f"{text} (default {field.default})"


def _scalar_type(default: Any) -> Callable[[str], Any] | None:
    if isinstance(default, bool) or default is None or isinstance(default, str):
        return None
    return type(default)
