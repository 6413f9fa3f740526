"""``syncbench report``: one row per run file, as Markdown, CSV or JSON.

Values come from each file's ``/summary`` attributes and its root attributes
(``algorithm``, ``world_size``); nothing is recomputed here.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from .runfile import read_run
from .schema import REPORT_KEYS

#: Extra key of every row: the run file it came from (a column of JSON only).
PATH_KEY = "path"

# Markdown number formats by key; a key not listed is shown as is.
_MD_FORMATS: dict[str, str] = {
    "world_size": "{:d}",
    "samples_per_s": "{:.1f}",
    "wall_s": "{:.2f}",
    "final_accuracy": "{:.4f}",
    "time_to_target_s": "{:.2f}",
    "comm_fraction": "{:.3f}",
    "wait_fraction": "{:.3f}",
}
if not _MD_FORMATS.keys() <= set(REPORT_KEYS):  # pragma: no cover - guards a schema edit
    raise ImportError("syncbench.analysis.report is out of step with schema.REPORT_KEYS")


def report_rows(paths: Sequence[str]) -> list[dict[str, Any]]:
    """One dict per run file: the keys of ``schema.REPORT_KEYS`` plus ``"path"``.

    Raises :class:`~syncbench.analysis.runfile.RunFileError` for a file that
    cannot be read.
    """
    rows = []
    for path in paths:
        run = read_run(path)
        root = {"algorithm": run.algorithm, "world_size": run.world_size}
        row: dict[str, Any] = {}
        for key in REPORT_KEYS:
            if key in root:
                row[key] = root[key]
            elif key in run.summary:
                row[key] = run.summary[key]
            else:  # pragma: no cover - guards a schema edit
                row[key] = run.attrs.get(key)
        row[PATH_KEY] = run.path
        rows.append(row)
    return rows


def _missing(value: Any) -> bool:
    """None, NaN and infinities are shown as missing."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _plain(value: Any) -> Any:
    """A value as plain JSON-able Python: NumPy scalars unwrapped, NaN -> None."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    return None if _missing(value) else value


def _md_cell(key: str, value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "-"
    spec = _MD_FORMATS.get(key)
    if spec is not None and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return spec.format(value)
        except ValueError:  # e.g. a float where "{:d}" was expected
            return f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _csv_cell(value: Any) -> Any:
    value = _plain(value)
    return "" if value is None else value


def _format_md(rows: list[dict[str, Any]]) -> str:
    keys = list(REPORT_KEYS)
    cells = [[_md_cell(k, row.get(k)) for k in keys] for row in rows]
    # Text columns are left-aligned, numeric columns right-aligned.
    numeric = [
        k in _MD_FORMATS
        and all(isinstance(_plain(row.get(k)), int | float | None) for row in rows)
        for k in keys
    ]
    widths = [max([len(k), 3, *(len(c[i]) for c in cells)]) for i, k in enumerate(keys)]

    def line(parts: list[str]) -> str:
        return "| " + " | ".join(parts) + " |"

    def pad(text: str, i: int) -> str:
        return text.rjust(widths[i]) if numeric[i] else text.ljust(widths[i])

    header = line([pad(k, i) for i, k in enumerate(keys)])
    rule = line([("-" * (w - 1) + ":") if numeric[i] else "-" * w for i, w in enumerate(widths)])
    body = [line([pad(c, i) for i, c in enumerate(cs)]) for cs in cells]
    return "\n".join([header, rule, *body])


def _format_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(REPORT_KEYS)
    for row in rows:
        writer.writerow([_csv_cell(row.get(k)) for k in REPORT_KEYS])
    return out.getvalue().rstrip("\n")


def _format_json(rows: list[dict[str, Any]]) -> str:
    keys = (*REPORT_KEYS, PATH_KEY)
    objects = [{k: _plain(row.get(k)) for k in keys} for row in rows]
    return json.dumps(objects, indent=2, allow_nan=False)


_FORMATTERS: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "md": _format_md,
    "csv": _format_csv,
    "json": _format_json,
}

#: Output formats of :func:`format_report`.
FORMATS: tuple[str, ...] = tuple(_FORMATTERS)


def format_report(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows of :func:`report_rows` as text, without a trailing newline.

    - ``md``: a GitHub table, fixed-width, columns ``schema.REPORT_KEYS``;
      samples/s with 1 decimal, seconds 2, fractions 3, accuracy 4; missing
      or NaN values as ``-``.
    - ``csv``: header ``schema.REPORT_KEYS``, full precision, NaN as empty.
    - ``json``: a list of objects with the keys ``schema.REPORT_KEYS`` plus
      ``path``; NaN as ``null`` (strict JSON).
    """
    try:
        formatter = _FORMATTERS[fmt]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown report format {fmt!r}; valid formats: {', '.join(FORMATS)}"
        ) from None
    return formatter(rows)
