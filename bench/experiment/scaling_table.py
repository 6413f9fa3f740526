"""The scaling table of a sweep: medians per (series, np), speedup and efficiency.

With X(N) the samples/s of a run and X0 the median at the smallest N0 of its
series, the table gives the medians over repeats of

* strong: speedup S = X / X0 (= T(N0) / T(N), the same work), efficiency
  E = S * N0 / N;
* weak: efficiency E = (X / N) / (X0 / N0) (throughput per rank, = T(N0) /
  T(N) for the same work per rank), and the scaled speedup S = X / X0.

Runs that overlapped on a host (``analysis.context``: their wall-clock
intervals intersect) are flagged "overlapped" and get no speedup or
efficiency; a point with a single world size shows "-". The machine context
(cores, ranks per core, oversubscription) heads the table. Samples/s are
medians over the runs that did not diverge ("diverged" when none is left).
The report printed before it is ``syncbench report``'s tables.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from typing import Any, Protocol

from syncbench.analysis.context import context_line
from syncbench.analysis.report import format_tables, report_tables
from syncbench.analysis.runfile import read_run

NAN = float("nan")


class ScalingPoint(Protocol):
    """One planned run of a sweep, as the table reads it."""

    algorithm: str
    np: int
    path: str


def _cell(value: float, spec: str, flag: str = "") -> str:
    if flag:
        return flag
    return "-" if not isinstance(value, float) or not math.isfinite(value) else spec.format(value)


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
    formulas = ("# strong: speedup S = X/X0 = T(N0)/T(N), efficiency E = S*N0/N; "
                "weak: E = (X/N)/(X0/N0) = T(N0)/T(N), scaled speedup S = X/X0")
    lines = [header, formulas, f"# {context}",
             f"| {'series':<10} | {'np':>3} | {'sync':>5} | {'batch/rank':>10} | "
             f"{'steps/rank':>10} | {'runs':>4} | {'samples/s':>10} | {'speedup':>10} | "
             f"{'efficiency':>10} | note |",
             f"| {'-' * 10} | {'-' * 2}: | {'-' * 4}: | {'-' * 9}: | {'-' * 9}: | {'-' * 3}: | "
             f"{'-' * 9}: | {'-' * 9}: | {'-' * 9}: | ---- |"]
    order = {a: i for i, a in enumerate(dict.fromkeys(r.algorithm for r in runs))}

    def sort_key(key: tuple[str, int]) -> tuple:
        return (order.get(key[0].split()[0], len(order)), key[0], key[1])

    for series, np_ in sorted(points, key=sort_key):
        members = points[(series, np_)]
        # a diverged run's throughput is no result: samples/s over the others
        speeds = [float(r["samples_per_s"]) for r in members if not r.get("diverged")]
        x = statistics.median(speeds) if speeds else NAN
        syncs = [r["sync_fraction"] for r in members if math.isfinite(r["sync_fraction"])]
        sync = statistics.median(syncs) if syncs else NAN
        steps = statistics.median(r["steps"] / r["world_size"] for r in members)
        batch = statistics.median(
            float(r["samples"]) / max(1, r["steps"]) for r in members)
        finite = [r for r in members if math.isfinite(r["speedup"])]
        speedup = statistics.median(r["speedup"] for r in finite) if finite else NAN
        eff = statistics.median(r["efficiency"] for r in finite) if finite else NAN
        flag = ("overlapped" if all(r.get("overlapped") for r in members) else
                "diverged" if all(r.get("diverged") for r in members) else "")
        notes = [n for n, k in (("overlapped", "overlapped"), ("diverged", "diverged"))
                 if any(r.get(k) for r in members)]
        if any(r.get("scaling") == "mixed" for r in members):
            notes.append("mixed work")
        if any(r.get("oversubscribed") for r in members):
            notes.append("oversubscribed")
        lines.append(f"| {series:<10} | {np_:>3} | {_cell(sync, '{:.3f}'):>5} | "
                     f"{batch:>10.0f} | {steps:>10.0f} | "
                     f"{len(members):>4} | {_cell(x, '{:.1f}', flag if not speeds else ''):>10} | "
                     f"{_cell(speedup, '{:.3f}', flag):>10} | "
                     f"{_cell(eff, '{:.3f}', flag):>10} | {', '.join(notes)} |")
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
