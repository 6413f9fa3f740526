"""The tables of run files behind ``syncbench report`` (its command line:
:mod:`syncbench.bench.commands.report`, whose description says what they show).

:func:`report_tables` computes the rows of runs read by :func:`load_runs`,
:func:`format_tables` writes them as Markdown, CSV or JSON, every column from the
column registry (:mod:`.columns`); :func:`runner_tables` reprints the runner's own
tables from a results file.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from . import columns
from .columns import PATH_KEY, RANK_TABLE, format_spec
from .completeness import incomplete_reason
from .labels import run_label
from .repeats import group_rows
from .runfile import Run, read_run
from .schema import REPORT_KEYS
from .tables import ROOT_GROUP_KEYS, table_rows
from .targets import Target


def report_rows(paths: Sequence[str]) -> list[dict[str, Any]]:
    """One dict per run file: the keys of ``schema.REPORT_KEYS`` plus ``"path"``.

    Raises :class:`~syncbench.analysis.runfile.RunFileError` for a file that
    cannot be read.
    """
    rows = []
    for path in paths:
        run = read_run(path)
        root = {"algorithm": run_label(run.attrs), "world_size": run.world_size,
                "stopped_by": run.stopped_by, "resumes": run.resumes}
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


def _summary_format(key: str) -> str | None:
    entry = columns.column(key)
    return entry.fmt if entry is not None else None


def _md_cell(key: str, value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "-"
    spec = _summary_format(key)
    if spec is not None and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return spec.format(value)
        except ValueError:  # e.g. a float where "{:d}" was expected
            return f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _csv_cell(value: Any) -> Any:
    value = _plain(value)
    return "" if value is None else value


def _csv_table_cell(value: Any) -> Any:
    """One cell of the CSV table: a list of names (a group's paths) joined with ``;``, a
    structured value (a run's data files, its data generator) as compact JSON, as the run
    file records it; else :func:`_csv_cell`."""
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ";".join(map(str, value))
    if isinstance(value, list | dict):
        return json.dumps(_plain_nested(value), separators=(",", ":"), allow_nan=False)
    return _csv_cell(value)


def _plain_nested(value: Any) -> Any:
    """``value`` JSON-safe at every depth (NaN as null)."""
    if isinstance(value, list):
        return [_plain_nested(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_nested(v) for k, v in value.items()}
    return _plain(value)


def _format_md(rows: list[dict[str, Any]]) -> str:
    keys = list(REPORT_KEYS)
    cells = [[_md_cell(k, row.get(k)) for k in keys] for row in rows]
    # Text columns are left-aligned, numeric columns right-aligned.
    numeric = [
        _summary_format(k) is not None
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


# ---------------------------------------------------------------- syncbench report


def by_keys(text: str | None) -> tuple[str, ...]:
    return tuple(k.strip() for k in (text or "").split(",") if k.strip())


def load_runs(paths: Sequence[str], warn: Callable[[str], None] | None = None) -> list[Run]:
    """Read every run file; an incomplete one (``complete=False``) is read with a warning.

    Raises :class:`~syncbench.analysis.runfile.RunFileError` for a file that
    cannot be read (another schema, missing groups, not HDF5).
    """
    runs = []
    for path in paths:
        run = read_run(path)
        if not run.complete and warn is not None:
            warn(partial_warning(run))
        runs.append(run)
    return runs


def partial_warning(run: Run) -> str:
    """The warning that ``run`` is incomplete (``complete=False``), reported all the same:
    stopped by a signal (``Run.stopped_by``), or rebuilt by ``syncbench recover``."""
    reason = incomplete_reason(run.complete, run.stopped_by) or "partial (recovered)"
    if run.stopped_by:
        why = f"stopped by {run.stopped_by} at a step boundary before its sample budget"
    else:
        why = (f"rebuilt by syncbench recover from the parts of {len(run.ranks)} of "
               f"{run.world_size} ranks of a job that died")
    resumed = f", resumed {run.resumes}x" if run.resumes else ""
    return (f"warning: {run.path} is incomplete (complete=False: {why}{resumed}); "
            f"it is reported, marked '{reason}', and gets no speedup")


def check_by_keys(runs: Sequence[Run], by: Sequence[str], flag: str = "--by") -> None:
    """``ValueError`` naming a ``flag`` key that is neither a column nor a config flag."""
    known = {*columns.row_keys(), *ROOT_GROUP_KEYS}
    for key in by:
        if key in known or any(key in run.config for run in runs):
            continue
        raise ValueError(
            f"{flag} key {key!r} is neither a report column ({', '.join(ROOT_GROUP_KEYS)}, ...) "
            "nor a flag in the runs' config"
        )


def report_tables(runs: Sequence[Run], by: Sequence[str] = (),
                  target_accuracy: float | None = None,
                  series: Sequence[str] = (),
                  target_loss: float | None = None) -> list[dict[str, Any]]:
    """The tidy rows of ``syncbench report``: one per run, or one per ``by`` group.

    Per-run rows hold every registered column (``columns.row_keys``) and ``ranks``
    (the per-rank table of :func:`~syncbench.analysis.run_metrics.rank_table`);
    group rows (:func:`~syncbench.analysis.repeats.group_rows`) hold the medians,
    ``<key>_min``/``<key>_max`` of the columns with a spread, ``path`` as a list of
    files, and the ``by`` keys. ``series`` adds keys that split scaling series.
    ``target_accuracy`` or ``target_loss`` recomputes every run's time to target.
    """
    rows = table_rows(runs, by, target_accuracy, series, target_loss)
    if by:
        return group_rows(rows, by)
    for row in rows:
        row["ranks"] = row["_ranks"]  # computed once, by run_metrics.run_metrics
    return rows


def _md_value(key: str, value: Any) -> str:
    if key == "run":  # the run file's name, for per-run tables
        return os.path.basename(str(value))
    value = _plain(value)
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    spec = format_spec(key)
    if spec is not None and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return spec.format(value)
        except ValueError:
            return f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _value_cell(row: dict[str, Any], key: str) -> str:
    return _md_value(key, row.get(PATH_KEY if key == "run" else key))


def md_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
             cell: Callable[[dict[str, Any], str], str] | None = None) -> str:
    """A fixed-width GitHub table; ``columns`` are (key, header) pairs.

    Cells come from ``cell(row, key)`` (default: the key's number format,
    ``-`` for missing/NaN); columns whose cells are all numbers are right-aligned
    (never a registered column that asks to be left-aligned).
    """
    cell = cell or _value_cell
    cells = [[cell(row, key) for key, _ in columns] for row in rows]
    numeric = [
        all(_plain(row.get(key)) is None or
            (isinstance(_plain(row.get(key)), int | float)
             and not isinstance(_plain(row.get(key)), bool)) for row in rows)
        and format_spec(key) is not None and not _left(key)
        for key, _ in columns
    ]
    widths = [max([len(h), 3, *(len(c[i]) for c in cells)]) for i, (_, h) in enumerate(columns)]

    def pad(text: str, i: int) -> str:
        return text.rjust(widths[i]) if numeric[i] else text.ljust(widths[i])

    def line(parts: list[str]) -> str:
        return "| " + " | ".join(parts) + " |"

    header = line([pad(h, i) for i, (_, h) in enumerate(columns)])
    rule = line([("-" * (w - 1) + ":") if numeric[i] else "-" * w for i, w in enumerate(widths)])
    return "\n".join([header, rule, *(line([pad(c, i) for i, c in enumerate(cs)])
                                        for cs in cells)])


def _left(key: str) -> bool:
    entry = columns.column(key)
    return entry is not None and entry.left


def _label_columns(by: Sequence[str]) -> list[tuple[str, str]]:
    keys = list(by) if by else ["run", "algorithm", "world_size"]
    for key in ("algorithm", "world_size"):
        if key not in keys:
            keys.append(key)
    return [(k, k) for k in keys]


def _all_flagged(row: dict[str, Any], key: str) -> bool:
    value = row.get(key)
    if isinstance(value, bool) or value is None:
        return bool(value)
    return value >= int(row.get("repeats", 1) or 1)


def _flagged_cell(row: dict[str, Any], entry: columns.Column | None) -> str | None:
    """"diverged" / "overlapped" instead of a ratio that must not be read; else None."""
    if entry is None:
        return None
    if entry.flag_diverged and _all_flagged(row, "diverged"):
        return "diverged"
    if entry.flag_overlapped and _all_flagged(row, "overlapped"):
        return "overlapped"
    return None


def _cell(row: dict[str, Any], key: str) -> str:
    """A registered column's cell (its own cell, a flag, or its formatted value);
    a label's value."""
    entry = columns.column(key)
    if entry is not None and entry.cell is not None:
        return entry.cell(row)
    flagged = _flagged_cell(row, entry)
    if flagged is not None:
        return flagged
    return _value_cell(row, key)


def _spread_cell(row: dict[str, Any], key: str) -> str:
    """``min - max`` of a column with a spread (``- never``: a time to target missed)."""
    entry = columns.column(key)
    if entry is None or not entry.spread:
        return _value_cell(row, key)
    flagged = _flagged_cell(row, entry)
    if flagged is not None:
        return flagged
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    if _plain(lo) is None and _plain(hi) is None:
        return "-"
    if entry.missing_is_slow and _plain(hi) is None:
        return f"{_md_value(key, lo)} - never"
    return f"{_md_value(key, lo)} - {_md_value(key, hi)}"


def _registered(name: str, by: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(key, header) of the registered columns of report table ``name``."""
    return [(c.key, shown.header) for c, shown in columns.table(name)
            if not (c.key == "repeats" and not by)]


def format_tables_md(rows: Sequence[dict[str, Any]], by: Sequence[str] = (),
                     per_rank: bool = False, context: str | None = None) -> str:
    """The Markdown report: summary, time per phase, stragglers (and per-rank tables).

    Every table leads with the sync share (comm + wait) and is preceded by the
    machine ``context`` line (:func:`~syncbench.analysis.context.context_line`);
    the columns, their headers and their order are the registry's
    (:mod:`syncbench.analysis.columns`), the footnotes too.
    """
    labels = _label_columns(by)
    extra_labels = [c for c in labels if c[0] not in REPORT_KEYS]
    lead = [*extra_labels, ("algorithm", "algorithm"), ("world_size", "world_size")]
    ctx = [context, ""] if context else []

    title = f"## Runs grouped by {', '.join(by)} (medians)" if by else "## Runs"
    parts = [title, "", *ctx, md_table(rows, [*lead, *_registered("runs", by)], _cell)]
    if by and any(r.get("repeats", 1) > 1 for r in rows):
        cols = [*labels, ("repeats", "repeats"), *_registered("spread", by)]
        parts += ["", "## Spread over repeats (min - max)", "", *ctx,
                  md_table(rows, cols, _spread_cell)]
    sections = (("phase", "## Time per phase (mean s/step, share of wall time)"),
                ("stragglers", "## Stragglers"), ("scaling", "## Scaling and communication"))
    for name, heading in sections:
        parts += ["", heading, "", *ctx,
                  md_table(rows, [*labels, *_registered(name, by)], _cell)]
    if per_rank:
        rank_cols = [(key, header) for key, header, _ in RANK_TABLE]
        for row in rows:
            if "ranks" in row:
                parts += ["", f"## Per rank: {row[PATH_KEY]} (phase shares of wall time)", "",
                          *ctx, md_table(row["ranks"], rank_cols)]
    parts += ["", *columns.footnotes(rows), "Definitions: pydoc syncbench.analysis.tables"]
    return "\n".join(parts)


def _table_keys(rows: Sequence[dict[str, Any]], nested: bool) -> list[str]:
    """Every key of the rows in first-seen order, REPORT_KEYS and path first."""
    keys = [*REPORT_KEYS, PATH_KEY]
    for row in rows:
        for key in row:
            if key not in keys and not key.startswith("_") and (nested or key != "ranks"):
                keys.append(key)
    return keys


def format_tables(rows: Sequence[dict[str, Any]], fmt: str, by: Sequence[str] = (),
                  per_rank: bool = False, context: str | None = None) -> str:
    """The rows of :func:`report_tables` as text, without a trailing newline.

    - ``md``: the sections of :func:`format_tables_md`.
    - ``csv``: one tidy table, a header of every column (``schema.REPORT_KEYS``
      and ``path`` first), full precision, NaN as empty; a group's paths are
      joined with ``;``; per-rank tables are left out.
    - ``json``: a list of objects, keys ``schema.REPORT_KEYS``, ``path``, then
      the added ones (per-run rows also have ``ranks``: a list of per-rank
      objects); NaN as ``null``.
    """
    if fmt == "md":
        return format_tables_md(rows, by, per_rank, context)
    if fmt == "csv":
        keys = _table_keys(rows, nested=False)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(keys)
        for row in rows:
            writer.writerow([_csv_table_cell(row.get(k)) for k in keys])
        return out.getvalue().rstrip("\n")
    if fmt == "json":
        keys = _table_keys(rows, nested=True)

        def plain(value: Any) -> Any:
            if isinstance(value, list):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items() if not k.startswith("_")}
            return _plain(value)

        return json.dumps([{k: plain(row.get(k)) for k in keys} for row in rows],
                          indent=2, allow_nan=False)
    raise ValueError(f"unknown report format {fmt!r}; valid formats: {', '.join(FORMATS)}")


def runner_tables(path: Any, data: dict[str, Any], runs: Sequence[Run] = ()) -> list[str]:
    """The runner's tables of a results file, reprinted from what it recorded (its cells,
    records and comparisons; :mod:`syncbench.bench.experiment.print_tables` prints them):
    per configuration the comparison against the baseline, and the heterogeneous table;
    then the parity table of a scenario with ``[[parity]]`` pairs
    (:mod:`~syncbench.bench.experiment.parity`). A scaling scenario's results (a sweep's
    manifest) give its scaling table, from its run files among ``runs`` (read).
    Empty for a results file with no tables (a runner stopped before tabulating).
    ``ValueError`` for one that is not whole."""
    from syncbench.bench.experiment.parity import recorded_parity
    from syncbench.bench.experiment.print_tables import comparison_table, hetero_table
    from syncbench.bench.experiment.scaling_table import recorded_scaling

    head = data.get("scenario") if isinstance(data.get("scenario"), dict) else {}
    cells = data.get("cells")
    records = [r for r in data["runs"] if isinstance(r, dict)]
    comparisons = {c.get("condition"): c for c in data.get("comparisons") or []
                   if isinstance(c, dict)}
    lines: list[str] = []
    try:
        if head.get("scaling") or data.get("schema") == "syncbench-sweep/1":
            return recorded_scaling(path, data, runs)
        cells = cells if isinstance(cells, list) else []
        for cond in dict.fromkeys(c["condition"] for c in cells):
            these = [c for c in cells if c["condition"] == cond]
            mine = [r for r in records if r.get("condition") == cond]
            contexts = [r["context"] for r in mine if isinstance(r.get("context"), dict)]
            title = next((r["condition_title"] for r in mine if r.get("condition_title")), cond)
            target = (Target("loss", float(head["target_loss"]))
                      if head.get("target_loss") is not None
                      else float(head["target_accuracy"]))
            lines += [""] + comparison_table(head["name"], title, these, head["baseline"],
                                             target,
                                             head.get("headline", "time_to_target"), contexts)
            comp = comparisons.get(cond)
            if comp is not None:
                lines += [""] + hetero_table(head["name"], title, these, comp["ceiling"],
                                             max(comp["factors"]),
                                             comp["realised_factor_spread"], contexts)
        if parity := recorded_parity(head, records):  # runs are recorded once tabulated
            lines += ["", *parity]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: a results file without whole tables "
                         f"({type(exc).__name__}: {exc})") from None
    return [f"# {path}: the runner's tables as it recorded them", *lines] if lines else []
