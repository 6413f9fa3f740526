"""Markdown cells and footnotes of the report that are more than one formatted value.

The footnote of each column that has one (the registry, :mod:`.columns`, says
which and in what order): a line under the report's Markdown when one of the rows
needs it (a stopped, recovered, diverged, loaded, overlapped or oversubscribed
run), or always (what sync means, the resolution of time to target). The
``note`` cell of a row says why its figures must be read with care; a phase
cell shows seconds per step with the share of wall time beside them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from .completeness import incomplete_reason
from .context import LOADED_SHARE, loaded_text
from .summary import DIVERGED_CHANCE_MULTIPLE

Row = dict[str, Any]


def _incomplete_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if not r.get("complete", True)]


def note_stopped(rows: Sequence[Row]) -> list[str]:
    incomplete = _incomplete_rows(rows)
    if not any(r.get("stopped_by") for r in incomplete):
        return []
    signals = sorted({s for r in incomplete for s in str(r.get("stopped_by") or "").split(",")
                      if s})
    return [f"stopped by {'/'.join(signals)}: the run was stopped by that signal at "
            "a step boundary before it consumed its sample budget (complete=False)."]


def note_incomplete(rows: Sequence[Row]) -> list[str]:
    incomplete = _incomplete_rows(rows)
    notes = []
    if any("partial (recovered)" in incomplete_note(r) for r in incomplete):
        notes.append("partial (recovered): rebuilt by syncbench recover from the per-rank "
                     "parts of a job that died (complete=False).")
    if incomplete:
        notes.append("incomplete runs get no speedup: a run with complete=False did not "
                     "consume its sample budget, so its accuracy, time to target and samples/s "
                     "are not comparable with complete runs; it gets no speedup, efficiency or "
                     "hidden communication ('-'), is no baseline or reference, and a group "
                     "with an incomplete run gets none either.")
    return notes


def note_diverged(rows: Sequence[Row]) -> list[str]:
    if not any(r.get("diverged") for r in rows):
        return []
    return [f"diverged: non-finite training loss or final accuracy at most "
            f"{DIVERGED_CHANCE_MULTIPLE:g}x chance; no time to target, speedup, efficiency or "
            "hidden communication is shown for it, and its samples/s are left out of group "
            "medians."]


def note_loaded(rows: Sequence[Row]) -> list[str]:
    shares = [float(r.get("foreign_cpu_share", math.nan)) for r in rows if r.get("loaded")]
    if not shares:
        return []
    worst = max((s for s in shares if math.isfinite(s)), default=math.nan)
    used = (f"{loaded_text(worst)}" if math.isfinite(worst)
            else "other processes used the cores during the run")
    return [f"loaded: {used}{' (the most of any loaded run)' if len(shares) > 1 else ''}"
            f", above {100 * LOADED_SHARE:.0f}%; something outside the run competed "
            "for the CPUs, timings contaminated."]


def note_overlapped(rows: Sequence[Row]) -> list[str]:
    overlapped = [r for r in rows if r.get("overlapped")]
    if not overlapped:
        return []
    pairs = sorted({f"{os.path.basename(str(p))}" for r in overlapped
                    for p in (r.get("overlaps_with") or [])})
    return ["overlapped: ran at the same time as another run on the same host ("
            + ", ".join(pairs) + "); timings not comparable, no speedup or "
            "efficiency computed from them."]


def note_oversubscribed(rows: Sequence[Row]) -> list[str]:
    if not any(r.get("oversubscribed") for r in rows):
        return []
    return ["oversubscribed: more ranks than physical cores on a node; timings "
            "include time-sharing of cores."]


def note_sync(rows: Sequence[Row]) -> list[str]:
    return ["sync = comm + wait (shares of all ranks' wall time). The split depends on "
            "the MPI call: time blocked inside a blocking collective counts as comm, "
            "time in Wait/Waitall as wait."]


def note_time_to_target(rows: Sequence[Row]) -> list[str]:
    return ["time_to_target_s can only take evaluation times: its resolution is the "
            "evaluation interval ('eval every s')."]


# ---------------------------------------------------------------- the note cell


def _count_note(row: Row, key: str, word: str) -> str:
    """``word`` for a run (or every run of a group) flagged ``key``, ``k/n word`` for some."""
    value = row.get(key)
    if isinstance(value, bool) or value is None:
        return word if value else ""
    repeats = int(row.get("repeats", 1) or 1)
    return "" if not value else word if value >= repeats else f"{value}/{repeats} {word}"


def incomplete_note(row: Row) -> str:
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


def note_cell(row: Row) -> str:
    notes = [incomplete_note(row),
             _count_note(row, "diverged", "diverged"),
             _count_note(row, "overlapped", "overlapped"),
             _count_note(row, "loaded", "loaded")]
    resumes = row.get("resumes")
    if hasattr(resumes, "item"):
        resumes = resumes.item()
    if isinstance(resumes, int) and not isinstance(resumes, bool) and resumes > 0:
        notes.append(f"resumed {resumes}x")
    if row.get("oversubscribed") is True:
        notes.append("oversubscribed")
    if row.get("simulated") is True:
        notes.append("simulated")
    return ", ".join(n for n in notes if n)


def phase_cell(phase: str) -> Callable[[Row], str]:
    """``0.01234 (45.6%)``: seconds per step and share of wall time of one phase."""
    def cell(row: Row) -> str:
        seconds = _present(row.get(f"{phase}_s_per_step"))
        share = _present(row.get(f"{phase}_fraction"))
        if seconds is None:
            return "-"
        return f"{seconds:.5f}" + ("" if share is None else f" ({100 * share:.1f}%)")
    return cell


def percent_cell(key: str) -> Callable[[Row], str]:
    def cell(row: Row) -> str:
        value = _present(row.get(key))
        return "-" if value is None else f"{100 * value:.1f}%"
    return cell


def _present(value: Any) -> Any:
    """The value, None when missing or NaN (NumPy scalars unwrapped)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value
