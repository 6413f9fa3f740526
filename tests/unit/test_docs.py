"""The documentation site's generated reference names everything the code defines.

``docs/_ext/reference_text.py`` writes the reference pages from the code (``make docs``
builds them with Sphinx); these tests read its text without Sphinx: every command and
every action of a command is a section with its ``--help`` as the parser prints it,
every name of the run-file schema, every scenario key and shipped scenario, every
report column is listed, and generating the commands' help does not load
``mpi4py.MPI``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import pytest

DOCS_EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext" / "reference_text.py"


@pytest.fixture(scope="module")
def ref():
    spec = importlib.util.spec_from_file_location("reference_text", DOCS_EXT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def literals(text: str) -> set[str]:
    """The ``inline literals`` of reStructuredText."""
    return set(re.findall(r"``([^`]+)``", text))


def test_every_command_and_action_is_a_section_with_its_help(ref):
    from syncbench.bench import cli

    mpi_before = "mpi4py.MPI" in sys.modules
    helps = ref.command_helps()
    text = ref.commands_rst()
    if not mpi_before:  # building every command's parser must not start MPI
        assert "mpi4py.MPI" not in sys.modules
    progs = [prog for prog, _, _ in helps]
    assert progs[0] == "syncbench"
    assert [p for p in progs if p.count(" ") == 1] == [f"syncbench {n}" for n in cli.COMMANDS]
    with cli.mpi_not_started():
        cluster = cli.build_parser("cluster")
    sub = next(a for a in cluster._actions if isinstance(a, argparse._SubParsersAction))
    actions = next(a for a in sub.choices["cluster"]._actions
                   if isinstance(a, argparse._SubParsersAction))
    assert {f"syncbench cluster {a}" for a in actions.choices} <= set(progs)
    for prog, _, help_text in helps[1:]:
        assert f"\n{prog}\n{'-' if prog.count(' ') == 1 else '~'}" in text, prog
        block = "\n".join(("   " + line).rstrip() for line in help_text.rstrip().splitlines())
        assert block in text, f"{prog}: its --help is not in the reference as printed"


def test_every_schema_name_is_in_the_runfile_reference(ref):
    from syncbench.analysis import schema as s

    text = ref.runfile_rst()
    shown = literals(text)
    # a row of a table each (the first cell of a list-table row)
    rows = set(re.findall(r"^   \* - ``([^`]+)``$", text, flags=re.MULTILINE))
    in_tables = {*s.ROOT_ATTRS, *s.RANK_COLUMNS, *s.RANK_ATTR_DTYPES, *s.RANK_INDEX_INFO,
                 *s.EVENT_COLUMNS, *s.EVENT_PACKED_INFO, *s.EVAL_COLUMNS}
    assert not in_tables - rows, f"no row in the run-file reference: {sorted(in_tables - rows)}"
    listed = {*s.EVENT_KINDS, *s.EVENT_ATTRS, *s.SUMMARY_ATTRS, *s.SUMMARY_FLAGS,
              s.COMPLETE_ATTR, s.STOPPED_BY_ATTR, *s.REPORT_KEYS}
    assert not listed - shown, f"missing from the run-file reference: {sorted(listed - shown)}"
    units = {units for info in s.DATASET_INFO.values() for units, _ in info.values()}
    assert units <= shown


def test_root_attribute_notes_are_read_from_the_schema_source(ref):
    from syncbench.analysis import schema as s

    notes = ref._inline_comments(s.__file__, "ROOT_ATTRS")
    assert notes["cupy_package"].startswith("the CuPy distribution")
    assert set(notes) <= set(s.ROOT_ATTRS)
    docs = ref.attribute_docs(s.__file__)
    assert docs["RANKS_GROUP"].startswith("Group of every rank's rows")


def test_every_scenario_key_and_shipped_scenario_is_in_the_reference(ref):
    from syncbench.bench.experiment import scenario as sc

    text = ref.scenario_rst()
    shown = literals(text)
    # (table, key) of every row of the keys' table
    rows = set(re.findall(r"^   \* - (.+)\n     - ``([^`]+)``$", text, flags=re.MULTILINE))
    keys = {(ref.escape(table), key) for table, keys in (
        ("top level", sc._TOP_KEYS), ("[[run]]", sc._RUN_KEYS), ("cluster", sc._CLUSTER_KEYS),
        ("[[parity]]", sc._PARITY_KEYS)) for key in keys}
    assert not keys - rows, f"missing scenario keys: {sorted(keys - rows)}"
    assert set(sc.RESERVED_FLAGS) <= shown
    for name, path in sc.shipped_scenarios().items():
        assert f"\n{name}\n~" in text
        first = path.read_text(encoding="utf-8").strip().splitlines()[0]
        assert "   " + first in text
    # a default shown is the field's own
    assert "``5``" in text and "``'time_to_target'``" in text
    # every comment of Scenario's example file is its key's note
    import inspect

    notes = ref.listing_notes(inspect.getdoc(sc.Scenario).splitlines())
    assert ("top level", "np") in notes and ("[[run]]", "label") in notes
    for note in notes.values():
        assert ref.escape(note) in text


def test_every_report_column_is_in_the_reference(ref):
    from syncbench.analysis import columns

    text = ref.columns_rst()
    rows = set(re.findall(r"^   \* - ``([^`]+)``$", text, flags=re.MULTILINE))
    keys = {c.key for c in columns.columns()}
    assert not keys - rows, f"missing columns: {sorted(keys - rows)}"
    assert set(columns.TABLE_ORDER) <= rows


@pytest.mark.parametrize("text, escaped", [("a_b", "a\\_b"), ("x*y", "x\\*y"),
                                           ("`q`", "\\`q\\`"), ("p|q", "p\\|q")])
def test_escape_leaves_no_markup(ref, text, escaped):
    assert ref.escape(text) == escaped
