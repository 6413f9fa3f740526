"""The reference pages' text, generated from the code: reStructuredText, no Sphinx.

Each function returns the reStructuredText of one generated part of the site, read
from the definitions the suite itself uses, so the reference cannot drift from them:

- :func:`commands_rst`: every command's ``--help`` (``syncbench COMMAND --help``, and
  each action of a command with actions, ``syncbench cluster up --help``), from the
  parsers of :mod:`syncbench.bench.cli`, built with MPI not started;
- :func:`runfile_rst`: the ``syncbench/1`` run-file schema, from the names, dtypes,
  units and descriptions of :mod:`syncbench.analysis.schema`;
- :func:`scenario_rst`: the scenario keys, from :mod:`syncbench.bench.experiment.scenario`
  (the key sets its checks use, the defaults of :class:`Scenario`'s fields, its
  docstring) and the shipped scenario files;
- :func:`columns_rst`: the report columns, from the registry of
  :mod:`syncbench.analysis.columns`.

``docs/_ext/syncbench_docs.py`` puts them in the pages; ``tests/test_docs.py`` checks
that they name every command, schema name and scenario key, without building the site.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import re
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

#: The width of the command reference's help text (argparse reads ``COLUMNS``): fixed,
#: so the pages do not depend on the terminal that built them.
HELP_WIDTH = 92

# ---------------------------------------------------------------- reStructuredText


def escape(text: str) -> str:
    """``text`` as plain reStructuredText: markup characters are escaped."""
    return re.sub(r"([\\`*_|])", r"\\\1", str(text))


def literal(text: str) -> str:
    """``text`` as an inline literal."""
    return f"``{text}``" if text else ""


def heading(title: str, char: str) -> list[str]:
    """A section title underlined with ``char``, and a blank line."""
    return [title, char * max(len(title), 4), ""]


def table(header: Sequence[str], rows: Iterable[Sequence[str]],
          widths: Sequence[int] | None = None) -> list[str]:
    """A ``list-table`` of cells that are already reStructuredText."""
    lines = [".. list-table::", "   :header-rows: 1"]
    if widths:
        lines.append("   :widths: " + " ".join(str(w) for w in widths))
    lines.append("")
    for row in [header, *rows]:
        for i, cell in enumerate(row):
            lines.append(("   * - " if i == 0 else "     - ") + (cell or ""))
    return [*lines, ""]


def block(text: str, language: str = "text") -> list[str]:
    """``text`` as a code block."""
    body = [("   " + line).rstrip() for line in text.rstrip("\n").splitlines()]
    return [f".. code-block:: {language}", "", *body, ""]


def docstring(obj: object) -> list[str]:
    """An object's docstring as reStructuredText lines (its indent removed)."""
    import inspect

    return [*(inspect.getdoc(obj) or "").splitlines(), ""]


# ---------------------------------------------------------------- commands


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_helps(width: int = HELP_WIDTH) -> list[tuple[str, str, str]]:
    """``(prog, one-line help, --help text)`` of every command and every action of a
    command with actions, in the order of ``syncbench --help``; the first entry is
    ``syncbench`` itself. Each command's parser is built as ``syncbench COMMAND`` builds
    it (only that command's module imported, MPI not started)."""
    from syncbench.bench import cli

    out = []
    with _columns(width):
        with cli.mpi_not_started():
            top = cli.build_parser()
        out.append((top.prog, "", top.format_help()))
        for name, command in cli.COMMANDS.items():
            with cli.mpi_not_started():
                parser = _subparsers(cli.build_parser(name))[name]
            line = command.help
            out.append((parser.prog, line, parser.format_help()))
            for action in _subparsers(parser).values():
                out.append((action.prog, "", action.format_help()))
    return out


def commands_rst() -> str:
    """The command reference: a section per command, its ``--help`` as printed."""
    lines: list[str] = []
    for prog, line, text in command_helps():
        words = prog.split()
        char = "-" if len(words) <= 2 else "~"
        if len(words) == 1:
            lines += ["The command list (``syncbench --help``):", "", *block(text)]
            continue
        lines += [f".. _cmd-{'-'.join(words[1:])}:", ""]
        lines += heading(prog, char)
        if line:
            lines += [escape(line[:1].upper() + line[1:]) + ".", ""]
        lines += block(text)
    return "\n".join(lines)


# ---------------------------------------------------------------- run-file schema


def attribute_docs(path: str, indent: int = 0) -> dict[str, str]:
    """The ``#:`` comment lines right above each assignment at ``indent`` in the source
    file ``path`` (a module's constants at 0, a class's fields at 4), joined: what
    autodoc shows as their documentation, read here without Sphinx."""
    out: dict[str, str] = {}
    pending: list[str] = []
    prefix = " " * indent
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        body = line[indent:] if line.startswith(prefix) else None
        if body is not None and body.startswith("#:"):
            pending.append(body[2:].strip())
            continue
        match = re.match(r"([A-Za-z_]\w*)\s*(?::[^=]*)?=", body or "")
        if match and pending and not (body or "")[:1].isspace():
            out[match.group(1)] = " ".join(pending).strip()
        pending = []
    return out


def _constant_docs(module: object) -> dict[str, str]:
    """The ``#:`` comments above a module's constants."""
    return attribute_docs(module.__file__)


def _inline_comments(path: str, constant: str) -> dict[str, str]:
    """The ``#`` comment lines written right above each string of the tuple assigned
    to ``constant`` in the source file ``path`` (``ROOT_ATTRS``' notes)."""
    source = Path(path).read_text(encoding="utf-8")
    out: dict[str, str] = {}
    named, inside, depth, pending = False, False, 0, []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if not inside:  # the constant's name at the line's start, then its "="
            if tok.type == tokenize.NAME and tok.start[1] == 0:
                named = tok.string == constant
            inside = named and tok.type == tokenize.OP and tok.string == "="
            continue
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
            if depth == 0:
                break
        elif tok.type == tokenize.COMMENT and depth == 1:
            pending.append(tok.string.lstrip("#").strip())
        elif tok.type == tokenize.STRING and depth == 1:
            if pending:
                out[tok.string.strip("\"'")] = " ".join(pending)
            pending = []
    return out


def _info_table(columns: dict[str, str] | None, info: dict[str, tuple[str, str]],
                defaults: dict[str, object] | None = None) -> list[str]:
    """A table of datasets: name, dtype (where ``columns`` gives them), units, what."""
    header = ["name", *(["dtype"] if columns else []), "units", "description"]
    rows = []
    for name in (columns or info):
        units, what = info.get(name, ("", ""))
        if defaults and name in defaults:
            what += f" (files written before it: read as {defaults[name]!r})"
        rows.append([literal(name), *([literal(columns[name])] if columns else []),
                     literal(units), escape(what)])
    return table(header, rows, [20, 8, 6, 66] if columns else [24, 6, 70])


def runfile_rst() -> str:
    """The run-file schema: every group, dataset and attribute, from its definitions."""
    from syncbench.analysis import schema as s

    docs = _constant_docs(s)
    notes = _inline_comments(s.__file__, "ROOT_ATTRS")

    def doc(name: str) -> list[str]:
        return [docs[name], ""] if docs.get(name) else []

    # the constants that document a group of root attributes, or one of them
    groups = {name: value for name, value in vars(s).items()
              if name.isupper() and name not in ("ROOT_ATTRS", "OPTIONAL_ROOT_ATTRS", "FLOAT_ATTRS")
              and (name.endswith("_ATTRS") or name.endswith("_ATTR"))}
    topics: dict[str, list[str]] = {}
    for name, value in groups.items():
        for attr in (value,) if isinstance(value, str) else value:
            if isinstance(attr, str) and attr in s.ROOT_ATTRS:
                topics.setdefault(attr, []).append(name)

    layout = "\n".join(f"{path:<22} {what}" for path, what in (
        ("/", "root attributes (ROOT_ATTRS)"),
        (f"/{s.RANKS_GROUP}/", "packed layout: one dataset per column, every rank's rows"),
        (f"/{s.RANKS_GROUP}/{s.EVENTS_GROUP}/", "--events on: one row per collective call"),
        (f"/{s.rank_group(3)}/", "groups layout (older files): one group per rank"),
        (f"/{s.rank_group(3)}/{s.EVENTS_GROUP}/", "--events on, groups layout"),
        (f"/{s.EVAL_GROUP}/", "evaluations of the consensus model"),
        (f"/{s.EVAL_LOCAL_GROUP}/", "--eval-model both: every rank's own model"),
        (f"/{s.SUMMARY_GROUP}/", "attributes that summarise the run"),
    ))
    lines = [*docstring(s), f"Schema name: {literal(s.SCHEMA)} (root attribute "
             f"{literal('schema')}).", "", *heading("Layout", "-"), *block(layout)]

    lines += heading("Root attributes", "-")
    rows = []
    for attr in s.ROOT_ATTRS:
        kind = ("optional" if attr in s.OPTIONAL_ROOT_ATTRS else "always") + (
            ", float (unknown: NaN)" if attr in s.FLOAT_ATTRS else "")
        see = ", ".join(f":py:data:`~syncbench.analysis.schema.{t}`"
                        for t in topics.get(attr, ()))
        rows.append([literal(attr), kind, escape(notes.get(attr, "")), see])
    lines += table(["name", "written", "note in the schema", "defined with"], rows,
                   [22, 14, 44, 20])
    for name in groups:
        if name in docs and not name.startswith(("RANK_", "EVENT", "EVAL")):
            lines += [f"{literal(name)}: " + docs[name], ""]

    lines += heading("Rank rows", "-")
    lines += [f"One row per step of a rank: {literal('/' + s.RANKS_GROUP)} (packed) or "
              f"{literal('/' + s.rank_group(0))} (groups). "
              + docs.get("RANK_COLUMN_DEFAULTS", ""), ""]
    lines += _info_table(s.RANK_COLUMNS, s.RANK_COLUMN_INFO, s.RANK_COLUMN_DEFAULTS)
    lines += heading("Rank attributes", "-")
    lines += doc("RANK_ATTR_DTYPES")
    lines += _info_table(s.RANK_ATTR_DTYPES, s.RANK_ATTR_INFO)
    lines += doc("CLOCK_ATTRS")
    lines += heading("Rank layout", "-")
    lines += doc("RANK_LAYOUT_ATTR")
    lines += _info_table(None, s.RANK_INDEX_INFO)

    lines += heading("Events", "-")
    lines += doc("EVENTS_GROUP") + doc("EVENT_KINDS")
    lines += ["Kinds, in the order of the ``kind`` column: "
              + ", ".join(literal(k) for k in s.EVENT_KINDS) + ".", ""]
    lines += _info_table(s.EVENT_COLUMNS, s.EVENT_COLUMN_INFO)
    lines += doc("EVENT_COUNT_ATTRS")
    lines += ["Attributes of an events group: "
              + ", ".join(literal(k) for k in s.EVENT_ATTRS) + ".", ""]
    lines += doc("EVENT_PACKED_INFO")
    lines += _info_table(None, s.EVENT_PACKED_INFO)

    lines += heading("Evaluations", "-")
    lines += doc("EVAL_GROUP")
    lines += _info_table(s.EVAL_COLUMNS, s.EVAL_COLUMN_INFO)
    lines += doc("EVAL_LOCAL_GROUP")
    local = {k: v for k, v in s.DATASET_INFO[s.EVAL_LOCAL_GROUP].items()
             if v != s.EVAL_COLUMN_INFO.get(k)}
    lines += _info_table(None, local)

    lines += heading("Summary", "-")
    lines += doc("SUMMARY_GROUP")
    lines += [f"Attributes of {literal('/' + s.SUMMARY_GROUP)}: "
              + ", ".join(literal(k) for k in (*s.SUMMARY_ATTRS, *s.SUMMARY_FLAGS,
                                               s.COMPLETE_ATTR, s.STOPPED_BY_ATTR,
                                               s.FINAL_LOCAL_ACCURACY)) + ".", ""]
    for name in ("SUMMARY_FLAGS", "COMPLETE_ATTR", "STOPPED_BY_ATTR"):
        lines += [f"{literal(name)}: " + docs[name], ""] if name in docs else []

    lines += heading("Report rows", "-")
    lines += doc("REPORT_KEYS")
    lines += [", ".join(literal(k) for k in s.REPORT_KEYS) + ".", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- scenarios


def _field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments above the fields of a class of its module (at one indent);
    where two classes share a field name, the later one's."""
    import inspect

    lines, start = inspect.getsourcelines(cls)
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        body = line.strip()
        if body.startswith("#:") and line.startswith("    ") and not line[4].isspace():
            pending.append(body[2:].strip())
            continue
        match = re.match(r"    ([A-Za-z_]\w*)\s*:", line)
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        pending = []
    return docs


def listing_notes(listing: Sequence[str]) -> dict[tuple[str, str], str]:
    """The comment beside each key of :class:`Scenario`'s example file (and the
    comment lines under it), by (table, key): ``("top level", "np")`` -> ``ranks per
    run (--np overrides)``; the tables are ``top level``, ``[[run]]``, ``[[parity]]``."""
    notes: dict[tuple[str, str], str] = {}
    table_name, last = "top level", None
    for line in listing:
        text = line.strip()
        section = re.match(r"\[\[(\w+)\]\]\s*(?:#\s*(.*))?$", text)
        if section:  # [[parity]]  # a note: the top level's key "parity"
            table_name, last = f"[[{section.group(1)}]]", None
            if section.group(2):
                last = ("top level", section.group(1))
                notes[last] = section.group(2)
            continue
        entry = re.match(r"(\w+) = .*?#\s*(.*)$", text)
        if entry:
            last = (table_name, entry.group(1))
            notes[last] = entry.group(2)
        elif text.startswith("#") and last and len(line) - len(line.lstrip()) > 8:
            notes[last] += " " + text.lstrip("#").strip()  # a note's next line
        else:
            last = None
    return notes


def scenario_keys() -> dict[str, tuple[str, ...]]:
    """Every key a scenario file may hold, by table: the sets the checks use."""
    from syncbench.bench.experiment import scenario as sc

    return {"top level": tuple(sorted(sc._TOP_KEYS)), "[[run]]": tuple(sorted(sc._RUN_KEYS)),
            "cluster": tuple(sorted(sc._CLUSTER_KEYS)),
            "[[parity]]": tuple(sorted(sc._PARITY_KEYS))}


def scenario_rst() -> str:
    """The scenario format: the module's rules, every key, the runner's flags, the
    shipped files."""
    from syncbench.bench.experiment import scenario as sc

    # the defaults a file's key takes (a number or a string; a list or a table is empty)
    defaults = {f.name: f.default for f in dataclasses.fields(sc.Scenario)
                if isinstance(f.default, int | float | str) and not isinstance(f.default, bool)}
    fields = _field_docs(sc.Scenario)
    # Scenario's docstring past its summary line: the listing of every key
    listing = docstring(sc.Scenario)
    listing = listing[listing.index("") + 1:] if "" in listing else listing
    notes = listing_notes(listing)
    lines = [*docstring(sc), *heading("Keys", "-"), *listing]
    rows = []
    for table_name, keys in scenario_keys().items():
        for key in keys:
            required = (key in ("np", "run") and table_name == "top level") or (
                table_name == "[[run]]" and key == "algorithm") or table_name == "[[parity]]"
            default = defaults.get(key) if table_name == "top level" else None
            shown = ("required" if required
                     else literal(repr(default)) if default not in (None, "") else "")
            note = escape(notes.get((table_name, key), ""))
            if table_name == "top level" and fields.get(key):
                note = f"{note}. {fields[key]}" if note else fields[key]
            rows.append([escape(table_name), literal(key), shown, note])
    lines += table(["table", "key", "default", "note"], rows, [12, 18, 16, 54])
    lines += ["Values checked against fixed sets: ``headline`` is one of "
              + ", ".join(literal(h) for h in sc.HEADLINES) + "; ``slowdown_modes`` of "
              + ", ".join(literal(m) for m in sc.SLOWDOWN_MODES) + "; ``scaling`` of "
              + ", ".join(literal(m) for m in sc.SCALING_MODES) + "; a run's ``algorithm`` "
              "is a registered strategy (``syncbench train --help`` lists them).", ""]
    lines += heading("Flags the runner sets", "-")
    lines += ["A flag table may not set these ``syncbench train`` flags; the key named "
              "instead sets them.", ""]
    lines += table(["flag", "set by"], [[literal(k), escape(v)]
                                        for k, v in sc.RESERVED_FLAGS.items()], [30, 70])
    lines += table(["flag of a scaling scenario", "set by"],
                   [[literal(k), escape(v)] for k, v in sc.SCALING_FLAGS.items()], [30, 70])
    lines += table(["flag naming a file", "what each run writes"],
                   [[literal(k), escape(v)] for k, v in sc.OUT_DIR_FILES.items()], [30, 70])
    lines += heading("Shipped scenarios", "-")
    lines += ["``syncbench run NAME`` runs one of these; ``syncbench run PATH`` any other "
              "file.", ""]
    for name, path in sc.shipped_scenarios().items():
        lines += heading(name, "~")
        lines += [escape(sc.load_scenario(str(path)).description), ""]
        lines += block(path.read_text(encoding="utf-8"), "toml")
    return "\n".join(lines)


# ---------------------------------------------------------------- report columns


def columns_rst() -> str:
    """The column registry: every column, its format and the tables that show it."""
    from syncbench.analysis import columns as c

    rows = []
    for col in c.columns():
        headers = {t: h.header if isinstance(h, c.Shown) else h for t, h in col.tables.items()}
        shown = ", ".join(literal(t) + (f" ({escape(h)})" if h else "")
                          for t, h in headers.items())
        how = [w for w, on in (("spread", col.spread), ("report row", col.report),
                               ("diverged left out", col.diverged_excluded),
                               ("ratio to a baseline", col.baseline_ratio)) if on]
        rows.append([literal(col.key), literal(col.fmt or ""), escape(", ".join(how)), shown])
    lines = [*docstring(c), *table(["key", "format", "kind", "tables (header)"], rows,
                                   [24, 10, 20, 46])]
    lines += ["Table order (``TABLE_ORDER``):", ""]
    lines += table(["table", "columns"], [[literal(t), ", ".join(literal(k) for k in keys)]
                                          for t, keys in c.TABLE_ORDER.items()], [14, 86])
    return "\n".join(lines)


#: Each generated part by the name the ``syncbench-reference`` directive takes.
PARTS = {"commands": commands_rst, "runfile": runfile_rst, "scenario": scenario_rst,
         "columns": columns_rst}
