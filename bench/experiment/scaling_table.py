"""The scaling table of a sweep: medians per (series, np), speedup and efficiency.

With X(N) the samples/s of a run and X0 the median at the smallest N0 of its
series, the table gives the medians over repeats (``analysis.repeats.spread``)
of the speedup and efficiency of :mod:`syncbench.analysis.scaling` (its
``FORMULAS`` head the table). The columns, their headers, widths and formats are
the column registry's ``sweep`` table (:mod:`syncbench.analysis.columns`).

Runs that overlapped on a host (``analysis.context``: their wall-clock
intervals intersect) are flagged "overlapped" and get no speedup or
efficiency; a point with a single world size shows "-". The machine context
(cores, ranks per core, oversubscription) heads the table. Samples/s are
medians over the runs that did not diverge ("diverged" when none is left).
The report printed before it is ``syncbench report``'s tables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from syncbench.analysis import columns
from syncbench.analysis.context import context_line
from syncbench.analysis.repeats import spread
from syncbench.analysis.report import format_tables, report_tables
from syncbench.analysis.runfile import read_run
from syncbench.analysis.scaling import FORMULAS


class ScalingPoint(Protocol):
    """One planned run of a sweep, as the table reads it."""

    algorithm: str
    np: int
    path: str


def _value(column: columns.Column, members: list[dict[str, Any]]) -> Any:
    """A point's value of one column: from its rows, else the median of the runs' values
    (a diverged run left out where the column says so); None when there is none."""
    if column.of_rows is not None:
        return column.of_rows(members)
    values = [column.of_row(r) if column.of_row is not None else r[column.key]
              for r in members if not (column.diverged_excluded and r.get("diverged"))]
    return spread(values)["median"]


def _cell(column: columns.Column, fmt: str, value: Any, flag: str) -> str:
    """The point's flag in a ratio (and in a figure without a value), else the value."""
    if flag and (column.flag_overlapped or (column.diverged_excluded and value is None)):
        return flag
    return "-" if value is None else fmt.format(value)


def scaling_table(runs: list[ScalingPoint], rows: list[dict[str, Any]], context: str) -> str:
    """Medians per (series, np) with speedup and efficiency (module docstring).

    ``rows`` are the per-run rows of :func:`syncbench.analysis.tables.table_rows`
    (the same definitions as ``syncbench report``); the scaling kind printed is
    the one the run files record.
    """
    by_path = {row["path"]: row for row in rows}
    points: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        row = by_path.get(run.path)
        if row is not None:
            points.setdefault((row.get("series") or run.algorithm, run.np), []).append(row)
    recorded = sorted({str(r.get("scaling_mode")) for r in rows if r.get("scaling_mode")})
    kinds = sorted({str(r.get("scaling")) for r in rows if r.get("scaling")}) or recorded \
        or ["-"]
    header = (f"# {', '.join(kinds)} scaling (run files record scaling_mode="
              f"{','.join(recorded) or 'none'}): medians over repeats; speedup and "
              "efficiency vs the smallest np of each series; sync = comm + wait share")
    shown = [(c, how, how.fmt or c.fmt or "{}", how.width or max(len(how.header), 5))
             for c, how in columns.table("sweep")]
    lines = [header, f"# {FORMULAS}", f"# {context}",
             f"| {'series':<10} | {'np':>3} | "
             + "".join(f"{how.header:>{w}} | " for _, how, _, w in shown) + "note |",
             f"| {'-' * 10} | {'-' * 2}: | "
             + "".join(f"{'-' * (w - 1)}: | " for *_, w in shown) + "---- |"]
    order = {a: i for i, a in enumerate(dict.fromkeys(r.algorithm for r in runs))}

    def sort_key(key: tuple[str, int]) -> tuple:
        return (order.get(key[0].split()[0], len(order)), key[0], key[1])

    for series, np_ in sorted(points, key=sort_key):
        members = points[(series, np_)]
        flag = ("overlapped" if all(r.get("overlapped") for r in members) else
                "diverged" if all(r.get("diverged") for r in members) else "")
        notes = [n for n, k in (("overlapped", "overlapped"), ("diverged", "diverged"))
                 if any(r.get(k) for r in members)]
        if any(r.get("scaling") == "mixed" for r in members):
            notes.append("mixed work")
        if any(r.get("oversubscribed") for r in members):
            notes.append("oversubscribed")
        cells = "".join(f"{_cell(c, fmt, _value(c, members), flag):>{w}} | "
                        for c, _, fmt, w in shown)
        lines.append(f"| {series:<10} | {np_:>3} | {cells}{', '.join(notes)} |")
    overlapped = sorted({os.path.basename(r["path"]) for r in rows if r.get("overlapped")})
    if overlapped:
        lines.append(f"# overlapped: {', '.join(overlapped)} ran at the same time as another "
                     "run on the same host; their timings are not comparable (run the sweep "
                     "serially)")
    return "\n".join(lines)


def _report_text(runs: list, good: list, fmt: str) -> str:
    """The report of the complete runs: ``syncbench report``'s tables (the same
    definitions: sync share first, context line, diverged / overlapped flags);
    Markdown adds the scaling table."""
    done = [read_run(r.path) for r in good]
    context = context_line(done)
    table = report_tables(done)  # the per-run rows of table_rows, plus their ranks
    text = format_tables(table, fmt, context=context)
    if fmt != "md":
        return text
    text += "\n\n" + scaling_table(runs, table, context)
    overlapped = [r for r in table if r.get("overlapped")]
    if overlapped:
        print(f"sweep: warning: {len(overlapped)} run(s) overlapped another run on the "
              "same host: their speedup and efficiency are not computed", file=sys.stderr)
    return text


def recorded_scaling(path: Path, data: dict[str, Any], runs: Sequence[Any]) -> list[str]:
    """The scaling table of a scaling scenario's results file (a sweep's manifest), as the
    sweep printed it: its points are the file's records of runs with a run file (ran or
    kept), their rows those of ``runs`` (read from those files, ``Run.path`` as
    :func:`~syncbench.analysis.inputs.record_path` names them); empty when none was read."""
    from syncbench.analysis.inputs import RAN, record_path

    by_path = {run.path: run for run in runs}
    points = [SimpleNamespace(algorithm=str(r["algorithm"]), np=int(r["np"]),
                              path=record_path(r, path))
              for r in data["runs"] if isinstance(r, dict) and r.get("path")
              and r.get("algorithm") and r.get("np") and r.get("status", "ran") in RAN]
    points = [p for p in points if p.path in by_path]
    if not points:
        return []
    done = [by_path[p.path] for p in points]
    return [f"# {path}: the scaling table of its runs", "",
            scaling_table(points, report_tables(done), context_line(done))]
