"""The data a run read, from its run file: the report's "Data read" lines.

A run file records where its data came from and a SHA-256 of it
(``schema.DATA_ATTRS``, written by ``syncbench train``); runs of one table
that read different data (another copy of the files, a synthetic set of
another seed) are told apart there. Files written before these attributes,
and simulations, have none: their data is "not recorded".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import schema


def _json(value: Any, default: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str) or not value.strip():
        return default
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return default


def data_record(attrs: Mapping[str, Any] | Any) -> dict[str, Any]:
    """``dataset``, ``source``, ``sha256``, ``files`` (list of {name, bytes, sha256})
    and ``generator`` (dict) of a run (its root attributes, or a ``Run``); ``source``
    and ``sha256`` are None where the file does not record them."""
    attrs = getattr(attrs, "attrs", attrs)
    source, sha = attrs.get(schema.DATA_SOURCE_ATTR), attrs.get(schema.DATA_SHA256_ATTR)
    return {"dataset": str(attrs.get("dataset", "")) or None,
            "source": str(source) if source else None,
            "sha256": str(sha) if sha else None,
            "files": _json(attrs.get(schema.DATA_FILES_ATTR), []),
            "generator": _json(attrs.get(schema.DATA_GENERATOR_ATTR), {})}


def describe(record: Mapping[str, Any]) -> str:
    """One run's data in words: ``fashion-mnist from /usr/share/datasets/fashion-mnist
    (4 files), sha256 362b...`` or ``synthetic, generated (train 8192, test 2048,
    seed 0), sha256 ...``; ``not recorded`` where the file does not say."""
    name = record.get("dataset") or "dataset unknown"
    if not record.get("sha256"):
        return f"{name}: not recorded (run file written before data provenance)"
    generator = record.get("generator") or {}
    if generator:
        args = ", ".join(f"{k} {generator[k]}" for k in ("train", "test", "seed")
                         if k in generator)
        where = f"generated ({args})" if args else "generated"
    else:
        count = len(record.get("files") or ())
        where = f"from {record.get('source')}" + (f" ({count} files)" if count else "")
    return f"{name} {where}, sha256 {record['sha256']}"


def data_lines(runs: Sequence[Any]) -> list[str]:
    """One line per distinct data of ``runs`` (run files or root attribute mappings), in
    first-seen order, with the runs that read it counted."""
    counts: dict[str, int] = {}
    for run in runs:
        text = describe(data_record(run))
        counts[text] = counts.get(text, 0) + 1
    return [f"{text} ({n} run{'s' if n != 1 else ''})" for text, n in counts.items()]


def format_data_md(runs: Sequence[Any]) -> str:
    """The report's Markdown section of the data its runs read ("" without runs)."""
    lines = data_lines(runs)
    if not lines:
        return ""
    return "\n".join(["## Data read", "", *(f"- {line}" for line in lines)])
