"""``syncbench report``: tables of run files, as Markdown, CSV or JSON, and plots.

:func:`report_rows` / :func:`format_report` give the summary table, one row per
run file: values come from each file's ``/summary`` attributes and its root
attributes (``algorithm``, ``world_size``); nothing is recomputed there.

:func:`report_main` (the ``syncbench report`` command) adds the tidy columns of
:mod:`syncbench.analysis.tables` (time per phase, hidden communication,
stragglers, accuracy, speedup and efficiency, all defined there), optional
aggregation over repeats (``--by``) and plots (``--plots``, see
:mod:`syncbench.analysis.plots`). Every Markdown table is headed by the machine
context (:mod:`syncbench.analysis.context`) and leads with the sync share
(comm + wait); the summary shows time to target beside the evaluation interval
that bounds its resolution, and "diverged" / "overlapped" instead of ratios
that must not be read. Its JSON rows keep the keys of ``schema.REPORT_KEYS``
plus ``path`` first and only add keys after them (``machine``: the context
line of the row's runs).

An incomplete run (``complete`` False: it did not consume its sample budget)
is read with a warning on stderr and noted with its reason, "stopped by
SIGTERM" (``stopped_by``: a signal stopped it at a step boundary) or "partial
(recovered)" (rebuilt by ``syncbench recover``); it gets no speedup,
efficiency or hidden communication ("-"), is no baseline, and a ``--by``
group with one gets none either (see :mod:`syncbench.analysis.tables`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .context import LOADED_SHARE, format_contexts, loaded_text, machine_context
from .labels import run_label
from .runfile import Run, RunFileError, read_run
from .schema import PHASES, REPORT_KEYS
from .tables import (
    NEW_KEYS,
    ROOT_GROUP_KEYS,
    SPREAD_KEYS,
    aggregate,
    incomplete_reason,
    table_rows,
)
from .trace import parse_steps

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
    "resumes": "{:d}",
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


# ---------------------------------------------------------------- syncbench report


def _by_keys(text: str | None) -> tuple[str, ...]:
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
    columns = {*REPORT_KEYS, *NEW_KEYS, *ROOT_GROUP_KEYS}
    for key in by:
        if key in columns or any(key in run.config for run in runs):
            continue
        raise ValueError(
            f"{flag} key {key!r} is neither a report column ({', '.join(ROOT_GROUP_KEYS)}, ...) "
            "nor a flag in the runs' config"
        )


def report_tables(runs: Sequence[Run], by: Sequence[str] = (),
                  target_accuracy: float | None = None,
                  series: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The tidy rows of ``syncbench report``: one per run, or one per ``by`` group.

    Per-run rows hold ``schema.REPORT_KEYS``, ``path``, ``tables.NEW_KEYS`` and
    ``ranks`` (the per-rank table of :func:`~syncbench.analysis.tables.rank_table`);
    group rows hold the medians, ``<key>_min``/``<key>_max`` of
    ``tables.SPREAD_KEYS``, ``path`` as a list of files, and the ``by`` keys.
    ``series`` adds keys that split scaling series (see ``tables.add_scaling``).
    """
    rows = table_rows(runs, by, target_accuracy, series)
    if by:
        return aggregate(rows, by)
    for row in rows:
        row["ranks"] = row["_ranks"]  # computed once, by tables.run_metrics
    return rows


# Markdown formats of the columns beyond REPORT_KEYS (by key, or by suffix).
_MD_EXTRA: dict[str, str] = {
    "repeats": "{:d}", "speedup": "{:.2f}", "efficiency": "{:.2f}",
    "speedup_wall": "{:.2f}", "efficiency_wall": "{:.2f}",
    "hidden_comm_fraction": "{:.3f}", "step_max_over_median": "{:.2f}",
    "busy_max_over_median": "{:.2f}", "slowest_rank": "{:d}", "rank": "{:d}",
    "steps": "{:d}", "samples": "{:d}", "baseline_world_size": "{:d}",
    "best_accuracy": "{:.4f}", "final_loss": "{:.4f}", "slowdown": "{:g}",
    "exposed_comm_s_per_round": "{:.5f}", "rounds": "{:.1f}",
    "steady_step_s": "{:.5f}", "eval_interval_s": "{:.2f}", "ranks_per_core": "{:.1f}",
    "warmup_steps": "{:d}", "cores": "{:d}", "slowdown_realised": "{:.2f}",
}
_MD_SUFFIX: tuple[tuple[str, str], ...] = (
    ("_fraction", "{:.3f}"), ("_share", "{:.3f}"), ("_share_max", "{:.3f}"),
    ("_s_per_step", "{:.5f}"), ("_s_median", "{:.5f}"), ("_s_max", "{:.5f}"),
    ("_s_mean", "{:.5f}"), ("_s", "{:.3f}"), ("_per_s", "{:.1f}"),
)


def _md_spec(key: str) -> str | None:
    base = key[:-4] if key.endswith(("_min", "_max")) and key[:-4] in SPREAD_KEYS else key
    if base in _MD_FORMATS:
        return _MD_FORMATS[base]
    if base in _MD_EXTRA:
        return _MD_EXTRA[base]
    for suffix, spec in _MD_SUFFIX:
        if base.endswith(suffix):
            return spec
    return None


def _md_value(key: str, value: Any) -> str:
    if key == "run":  # the run file's name, for per-run tables
        return os.path.basename(str(value))
    value = _plain(value)
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    spec = _md_spec(key)
    if spec is not None and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return spec.format(value)
        except ValueError:
            return f"{value:g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
             cell: Callable[[dict[str, Any], str], str] | None = None) -> str:
    """A fixed-width GitHub table; ``columns`` are (key, header) pairs.

    Cells come from ``cell(row, key)`` (default: the key's number format,
    ``-`` for missing/NaN); columns whose cells are all numbers are right-aligned.
    """
    def default(row: dict[str, Any], key: str) -> str:
        return _md_value(key, row.get(PATH_KEY if key == "run" else key))

    cell = cell or default
    cells = [[cell(row, key) for key, _ in columns] for row in rows]
    numeric = [
        all(_plain(row.get(key)) is None or
            (isinstance(_plain(row.get(key)), int | float)
             and not isinstance(_plain(row.get(key)), bool)) for row in rows)
        and _md_spec(key) is not None
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


_PHASE_COL = "phase:"  # column keys of the phase table (a --by key may be named "comm")


def _phase_cell(row: dict[str, Any], key: str) -> str:
    """``0.01234 (45.6%)``: seconds per step and share of wall time of one phase."""
    if not key.startswith(_PHASE_COL) and key != "untracked_fraction":
        return _md_value(key, row.get(PATH_KEY if key == "run" else key))
    key = key.removeprefix(_PHASE_COL)
    if key == "untracked_fraction":
        value = _plain(row.get(key))
        return "-" if value is None else f"{100 * value:.1f}%"
    seconds = _plain(row.get(f"{key}_s_per_step"))
    share = _plain(row.get(f"{key}_fraction"))
    if seconds is None:
        return "-"
    return f"{seconds:.5f}" + ("" if share is None else f" ({100 * share:.1f}%)")


def _label_columns(by: Sequence[str]) -> list[tuple[str, str]]:
    keys = list(by) if by else ["run", "algorithm", "world_size"]
    for key in ("algorithm", "world_size"):
        if key not in keys:
            keys.append(key)
    return [(k, k) for k in keys]


def _count_note(row: dict[str, Any], key: str, word: str) -> str:
    """``word`` for a run (or every run of a group) flagged ``key``, ``k/n word`` for some."""
    value = row.get(key)
    if isinstance(value, bool) or value is None:
        return word if value else ""
    repeats = int(row.get("repeats", 1) or 1)
    return "" if not value else word if value >= repeats else f"{value}/{repeats} {word}"


def _incomplete_note(row: dict[str, Any]) -> str:
    """Why a run is incomplete ("stopped by SIGTERM", "partial (recovered)"); for a
    group, each reason with its count when not every run has it ("1/3 stopped by ...")."""
    if "_incomplete" not in row:  # a per-run row
        return incomplete_reason(row.get("complete", True), row.get("stopped_by"))
    reasons = list(row["_incomplete"])
    repeats = int(row.get("repeats", 1) or 1)
    parts = []
    for reason in dict.fromkeys(reasons):
        k = reasons.count(reason)
        parts.append(reason if k >= repeats else f"{k}/{repeats} {reason}")
    return ", ".join(parts)


def _note(row: dict[str, Any]) -> str:
    notes = [_incomplete_note(row),
             _count_note(row, "diverged", "diverged"),
             _count_note(row, "overlapped", "overlapped"),
             _count_note(row, "loaded", "loaded")]
    resumes = _plain(row.get("resumes"))
    if isinstance(resumes, int) and not isinstance(resumes, bool) and resumes > 0:
        notes.append(f"resumed {resumes}x")
    if row.get("oversubscribed") is True:
        notes.append("oversubscribed")
    if row.get("simulated") is True:
        notes.append("simulated")
    return ", ".join(n for n in notes if n)


def _all_flagged(row: dict[str, Any], key: str) -> bool:
    value = row.get(key)
    if isinstance(value, bool) or value is None:
        return bool(value)
    return value >= int(row.get("repeats", 1) or 1)


#: Columns a diverged run shows "diverged" in, and an overlapped one "overlapped".
_RATIO_KEYS = frozenset({"speedup", "efficiency", "speedup_wall", "efficiency_wall"})


def _flagged_cell(row: dict[str, Any], key: str) -> str | None:
    """"diverged" / "overlapped" instead of a ratio that must not be read; else None."""
    if _all_flagged(row, "diverged") and key in (*_RATIO_KEYS, "time_to_target_s",
                                                  "hidden_comm_fraction", "samples_per_s"):
        return "diverged"
    if _all_flagged(row, "overlapped") and key in _RATIO_KEYS:
        return "overlapped"
    return None


def _cell(row: dict[str, Any], key: str) -> str:
    if key == "note":
        return _note(row)
    flagged = _flagged_cell(row, key)
    if flagged is not None:
        return flagged
    return _md_value(key, row.get(PATH_KEY if key == "run" else key))


#: The leading metric columns of every table: the sync share (comm + wait).
_SYNC = ("sync_fraction", "sync")


def format_tables_md(rows: Sequence[dict[str, Any]], by: Sequence[str] = (),
                     per_rank: bool = False, context: str | None = None) -> str:
    """The Markdown report: summary, time per phase, stragglers (and per-rank tables).

    Every table leads with the sync share (comm + wait, see
    :mod:`syncbench.analysis.tables`) and is preceded by the machine
    ``context`` line (:func:`~syncbench.analysis.context.context_line`); the
    summary then shows time to target and the evaluation interval that bounds
    its resolution.
    """
    labels = _label_columns(by)
    extra_labels = [c for c in labels if c[0] not in REPORT_KEYS]
    lead = [*extra_labels, ("algorithm", "algorithm"), ("world_size", "world_size")]
    main = [*lead, _SYNC, ("time_to_target_s", "time_to_target_s"),
            ("eval_interval_s", "eval every s"),
            *((k, k) for k in REPORT_KEYS if k not in ("algorithm", "world_size",
                                                       "time_to_target_s", "stopped_by",
                                                       "resumes"))]
    if by:
        main.append(("repeats", "repeats"))
    main += [("speedup", "speedup"), ("efficiency", "efficiency"),
             ("hidden_comm_fraction", "hidden_comm"), ("note", "note")]
    ctx = [context, ""] if context else []

    title = f"## Runs grouped by {', '.join(by)} (medians)" if by else "## Runs"
    parts = [title, "", *ctx, md_table(rows, main, _cell)]
    if by and any(r.get("repeats", 1) > 1 for r in rows):
        spread_keys = ("sync_fraction", "time_to_target_s", "samples_per_s", "wall_s",
                       "final_accuracy", "speedup", "efficiency")

        def spread_cell(row: dict[str, Any], key: str) -> str:
            if key not in spread_keys:
                return _md_value(key, row.get(PATH_KEY if key == "run" else key))
            flagged = _flagged_cell(row, key)
            if flagged is not None:
                return flagged
            lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
            if _plain(lo) is None and _plain(hi) is None:
                return "-"
            if key == "time_to_target_s" and _plain(hi) is None:
                return f"{_md_value(key, lo)} - never"
            return f"{_md_value(key, lo)} - {_md_value(key, hi)}"

        cols = [*labels, ("repeats", "repeats"), *((k, f"{k} min - max") for k in spread_keys)]
        parts += ["", "## Spread over repeats (min - max)", "", *ctx,
                  md_table(rows, cols, spread_cell)]
    phase_cols = [*labels, _SYNC, ("step_s_mean", "step s"),
                  *((_PHASE_COL + p, p) for p in PHASES), ("untracked_fraction", "untracked")]
    parts += ["", "## Time per phase (mean s/step, share of wall time)", "", *ctx,
              md_table(rows, phase_cols, _phase_cell)]
    strag = [*labels, _SYNC, ("step_s_median", "step s median"), ("step_s_max", "step s max"),
             ("step_max_over_median", "max/median"),
             ("busy_max_over_median", "busy max/median of others"),
             ("slowest_rank", "slowest rank"),
             ("wait_share_max", "wait share max"), ("idle_share_max", "idle share max")]
    parts += ["", "## Stragglers", "", *ctx, md_table(rows, strag)]
    scal = [*labels, _SYNC, ("series", "series"), ("scaling", "scaling"),
            ("baseline_world_size", "N0"),
            ("speedup", "speedup"), ("efficiency", "efficiency"),
            ("speedup_wall", "speedup (wall)"), ("efficiency_wall", "efficiency (wall)"),
            ("steady_step_s", "step s (steady)"), ("sync_s_per_step", "sync s/step"),
            ("hidden_comm_fraction", "hidden comm"), ("best_accuracy", "best accuracy"),
            ("note", "note")]
    parts += ["", "## Scaling and communication", "", *ctx, md_table(rows, scal, _cell)]
    if per_rank:
        rank_cols = [("rank", "rank"), ("hostname", "host"), ("slowdown", "slowdown"),
                     ("slowdown_mode", "mode"), ("slowdown_realised", "realised (median)"),
                     ("steps", "steps"), ("busy_s_per_step", "busy s/step"),
                     *((f"{p}_fraction", p) for p in PHASES),
                     ("wait_share", "wait share"), ("idle_share", "idle share"),
                     ("step_s_median", "step s median"), ("step_s_max", "step s max")]
        for row in rows:
            if "ranks" in row:
                parts += ["", f"## Per rank: {row[PATH_KEY]} (phase shares of wall time)", "",
                          *ctx, md_table(row["ranks"], rank_cols)]
    parts += ["", *_footnotes(rows)]
    return "\n".join(parts)


def _footnotes(rows: Sequence[dict[str, Any]]) -> list[str]:
    notes = []
    incomplete = [r for r in rows if not r.get("complete", True)]
    if any(r.get("stopped_by") for r in incomplete):
        signals = sorted({s for r in incomplete for s in str(r.get("stopped_by") or "").split(",")
                          if s})
        notes.append(f"stopped by {'/'.join(signals)}: the run was stopped by that signal at "
                     "a step boundary before it consumed its sample budget (complete=False).")
    if any(_incomplete_note(r) and "partial (recovered)" in _incomplete_note(r)
           for r in incomplete):
        notes.append("partial (recovered): rebuilt by syncbench recover from the per-rank "
                     "parts of a job that died (complete=False).")
    if incomplete:
        notes.append("incomplete runs get no speedup: a run with complete=False did not "
                     "consume its sample budget, so its accuracy, time to target and samples/s "
                     "are not comparable with complete runs; it gets no speedup, efficiency or "
                     "hidden communication ('-'), is no baseline or reference, and a group "
                     "with an incomplete run gets none either.")
    if any(r.get("diverged") for r in rows):
        notes.append("diverged: non-finite training loss or final accuracy at most 1.5x "
                     "chance; no time to target, speedup, efficiency or hidden communication "
                     "is shown for it, and its samples/s are left out of group medians.")
    shares = [float(r.get("foreign_cpu_share", math.nan)) for r in rows if r.get("loaded")]
    if shares:
        worst = max((s for s in shares if math.isfinite(s)), default=math.nan)
        used = (f"{loaded_text(worst)}" if math.isfinite(worst)
                else "other processes used the cores during the run")
        notes.append(f"loaded: {used}{' (the most of any loaded run)' if len(shares) > 1 else ''}"
                     f", above {100 * LOADED_SHARE:.0f}%; something outside the run competed "
                     "for the CPUs, timings contaminated.")
    overlapped = [r for r in rows if r.get("overlapped")]
    if overlapped:
        pairs = sorted({f"{os.path.basename(str(p))}" for r in overlapped
                        for p in (r.get("overlaps_with") or [])})
        notes.append("overlapped: ran at the same time as another run on the same host ("
                     + ", ".join(pairs) + "); timings not comparable, no speedup or "
                     "efficiency computed from them.")
    if any(r.get("oversubscribed") for r in rows):
        notes.append("oversubscribed: more ranks than physical cores on a node; timings "
                     "include time-sharing of cores.")
    notes.append("sync = comm + wait (shares of all ranks' wall time). The split depends on "
                 "the MPI call: time blocked inside a blocking collective counts as comm, "
                 "time in Wait/Waitall as wait.")
    notes.append("time_to_target_s can only take evaluation times: its resolution is the "
                 "evaluation interval ('eval every s').")
    notes.append("Definitions: pydoc syncbench.analysis.tables")
    return notes


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
            writer.writerow([";".join(map(str, v)) if isinstance(v, list) else _csv_cell(v)
                             for v in (row.get(k) for k in keys)])
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


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench report`` (for ``bench/cli.py``)."""
    parser.add_argument("runs", nargs="+", metavar="RUN.h5", help="run files (syncbench/1)")
    parser.add_argument("--format", default="md", choices=FORMATS,
                        help="output format (default md)")
    parser.add_argument("--by", default=None, metavar="KEY,...",
                        help="aggregate repeats: one row per distinct value of these keys "
                        "(columns such as algorithm, world_size, model, or any train flag "
                        "such as comm), median with min/max")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also write PNG plots to DIR (needs matplotlib: "
                        "pip install syncbench[plot])")
    parser.add_argument("--series", default=None, metavar="KEY,...",
                        help="more keys that split scaling series (a series already shares "
                        "algorithm, model, dataset, MPI library, backend, dtype, batch, "
                        "slowdowns, the strategy's flags and the budget; the --by keys "
                        "split it too)")
    parser.add_argument("--target-accuracy", type=float, default=None, metavar="X",
                        help="recompute time to target for this test accuracy "
                        "(default: the runs' own --target-accuracy)")
    parser.add_argument("--timeline-steps", default=None, metavar="A:B",
                        help="steps shown in the per-rank timeline plots (default: up to 8 "
                        "steps from the middle of each run)")
    parser.add_argument("--per-rank", action="store_true",
                        help="Markdown: add one per-rank table per run")


def report_main(args: argparse.Namespace) -> int:
    """Run ``syncbench report``; returns the exit status (2 on a bad file or flag)."""
    def err(message: str) -> None:
        print(f"syncbench report: {message}", file=sys.stderr)

    by = _by_keys(getattr(args, "by", None))
    series = _by_keys(getattr(args, "series", None))
    plots_dir = getattr(args, "plots", None)
    try:
        if plots_dir:
            from .plots import require_matplotlib

            require_matplotlib()
        window = parse_steps(args.timeline_steps) if getattr(args, "timeline_steps", None) \
            else None
        runs = load_runs(args.runs, warn=err)
        check_by_keys(runs, by)
        check_by_keys(runs, series, "--series")
        target = getattr(args, "target_accuracy", None)
        rows = report_tables(runs, by, target, series)
    except (RunFileError, ValueError, ImportError) as exc:
        err(str(exc))
        return 2
    contexts = [machine_context(run) for run in runs]  # once per run
    context = format_contexts(contexts)  # context.context_line(runs)
    by_path = {run.path: ctx for run, ctx in zip(runs, contexts, strict=True)}
    for row in rows:  # the JSON and CSV rows carry their own machine line
        paths = row[PATH_KEY] if isinstance(row[PATH_KEY], list) else [row[PATH_KEY]]
        row["machine"] = format_contexts([by_path[p] for p in paths if p in by_path])
    print(format_tables(rows, args.format, by, getattr(args, "per_rank", False), context))
    if plots_dir:
        from .plots import write_plots

        per_run = rows if not by else table_rows(runs, by, target, series)
        written, notes = write_plots(runs, per_run, plots_dir, by=by, window=window)
        for note in notes:
            err(f"note: {note}")
        err(f"wrote {len(written)} plots to {plots_dir}")
    return 0
