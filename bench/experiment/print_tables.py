"""The runner's printed tables of a scenario's cells (see :mod:`.aggregate` for every figure).

Per slowdown configuration, a machine-context line and then the comparison
table: time to the target accuracy against the baseline (the headline,
unless the scenario names samples/s), samples/s against the baseline, the
sync share (comm + wait, as in ``syncbench report``), the median time to
target with the evaluation interval that bounds its resolution beside it,
samples/s and final accuracy, each as ``median (min–max)`` over repeats
(:func:`syncbench.analysis.repeats.format_spread`); these columns, their headers
and their order are the column registry's ``runner`` table
(:mod:`syncbench.analysis.columns`).
Heterogeneous configurations get a second table: each strategy's het/hom
throughput next to the ceiling sum(1/f)/N, the realised slowdown factor
(per-step medians) and the interference ratio, with a
flag when the realised factors of the compared runs differ by more than 10%
and an ``OVERSUBSCRIBED`` label when ranks outnumber cores.

Incomplete runs (stopped by a signal, or rebuilt from a dead job's parts) are
counted in the ``runs`` column (``2 (1 inc)``) and named in a note with their
reason; every figure and ratio is of the complete runs only, and a label with
no complete run shows ``incomplete``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from syncbench.analysis import columns
from syncbench.analysis.context import format_contexts, loaded_text, merge_contexts
from syncbench.analysis.repeats import format_spread, format_value
from syncbench.analysis.summary import DIVERGED_CHANCE_MULTIPLE

from .aggregate import FACTOR_TOLERANCE, INTERFERENCE_TOLERANCE

#: The note of a label with incomplete runs (see :func:`incomplete_note`).
INCOMPLETE_NOTE = ("left out of every figure and ratio (they did not consume their sample "
                   "budget; no ratio has them as its baseline either)")

VALUE_WIDTH = 22
OVERSUBSCRIBED_NOTE = (
    "OVERSUBSCRIBED: ranks outnumber physical cores, so the homogeneous runs are CPU-bound "
    "themselves and a rank that waits or sleeps lends its core to the others; het/hom "
    "throughput against the ceiling is not a clean comparison here")


def _widths(names: Sequence[str]) -> list[int]:
    """Each column's width: ``VALUE_WIDTH``, or its name and two spaces if longer."""
    return [max(VALUE_WIDTH, len(n) + 2) for n in names]


def _row(label: str, width: int, cells: Sequence[str], widths: Sequence[int] = ()) -> str:
    widths = list(widths) + [VALUE_WIDTH] * (len(cells) - len(widths))
    # a cell wider than its column still gets one space before it ("340.35–inf)115.37")
    return f"  {label:<{width}}" + "".join(f" {c:>{w - 1}}" for c, w in zip(cells, widths))


def _header(width: int, names: Sequence[str]) -> str:
    return f"# {'label':<{width}}" + "".join(f"{n:>{w}}" for n, w in zip(names, _widths(names)))


def oversubscribed(contexts: Sequence[dict[str, Any]]) -> bool:
    """True when some run's ranks outnumbered a node's physical cores (per node)."""
    over = merge_contexts(list(contexts)).get("oversubscribed") if contexts else None
    return over is True or over == "some oversubscribed"


def _reasons(cell: dict[str, Any]) -> str:
    """``stopped by SIGTERM``, ``2 partial (recovered)``: a cell's incomplete runs' reasons."""
    reasons = list(cell.get("incomplete_reasons") or ())
    return ", ".join(r if reasons.count(r) == 1 else f"{reasons.count(r)} {r}"
                     for r in dict.fromkeys(reasons))


def incomplete_note(cell: dict[str, Any]) -> str | None:
    """``  ! label: 1 of 2 run(s) incomplete (stopped by SIGTERM): left out ...``, or None."""
    k = int(cell.get("incomplete") or 0)
    if not k:
        return None
    reasons = _reasons(cell)
    return (f"  ! {cell['label']}: {k} of {cell['runs']} run(s) incomplete"
            f"{f' ({reasons})' if reasons else ''}: {INCOMPLETE_NOTE}")


def _runs_cell(cell: dict[str, Any]) -> str:
    """``5``, ``5 (1 div)``, ``5 (1 inc)``, ``5 (1 div, 1 inc)``."""
    extra = [f"{cell['diverged']} div"] if cell["diverged"] else []
    extra += [f"{cell['incomplete']} inc"] if cell.get("incomplete") else []
    return f"{cell['runs']}" + (f" ({', '.join(extra)})" if extra else "")


def regime_line(cells: Sequence[dict[str, Any]]) -> list[str]:
    """``# comm:compute ...`` from the blocking SSGD cells, if the scenario has one."""
    blocking = [c for c in cells if c.get("comm_compute_ratio", {}).get("median") is not None]
    if not blocking:
        return []
    c = blocking[0]
    return [f"# comm:compute {format_spread(c['comm_compute_ratio'])} ({c['label']}: one "
            "Allreduce of the gradient per step (comm + wait) over the step's local work)"]


def _figure(cell: dict[str, Any], column: columns.Column) -> str:
    """One registered column's ``median (min–max)`` in a cell's row; a figure whose
    misses count as infinitely slow (time to target) says why it has none."""
    stats = cell.get(column.key, {})
    if column.missing_is_slow and not cell["reached"] and not stats.get("status"):
        return "diverged" if cell["diverged"] else "not reached"
    return format_spread(stats, column.digits)


def comparison_table(scenario: str, title: str, cells: Sequence[dict[str, Any]],
                     baseline: str, target: float, headline: str,
                     contexts: Sequence[dict[str, Any]]) -> list[str]:
    """The headline table of one configuration (lines)."""
    width = max([12, *(len(c["label"]) + 2 for c in cells)])
    ttt_col = (f"to {target:g} / {baseline}", "ttt_ratio")
    sps_col = (f"samples/s / {baseline}", "sps_ratio")
    ratio_cols = [ttt_col, sps_col] if headline == "time_to_target" else [sps_col, ttt_col]
    shown = [(c, how.header.format(target=target)) for c, how in columns.table("runner")
             if not c.optional or any((cell.get(c.key) or {}).get("median") is not None
                                      for cell in cells)]
    names = [n for n, _ in ratio_cols] + [header for _, header in shown]
    over = oversubscribed(contexts)
    reps = max(c["runs"] for c in cells)
    lines = [format_contexts(list(contexts)),
             f"# {scenario}: {title}{' | OVERSUBSCRIBED' if over else ''} | {reps} repeat(s), "
             f"median (min–max) over repeats; ratios per repeat against {baseline}"]
    lines += regime_line(cells)
    lines.append(_header(width, names + ["runs"]))
    notes = []
    for c in cells:
        values = [format_spread(c[key]) for _, key in ratio_cols]
        values += [_figure(c, column) for column, _ in shown]
        runs = _runs_cell(c)
        label = c["label"] + (" <" if c.get("best_lr") else "")
        if c["diverged"] and c["sps_ratio"].get("status") is None:
            values[[k for _, k in ratio_cols].index("sps_ratio")] += "*"
            notes.append(f"  * {c['label']}: {c['diverged']} of {c['runs']} runs diverged; "
                         "their samples/s are left out and their time to target is infinite")
        if incomplete_note(c):
            notes.append(incomplete_note(c))
        if c.get("overlapped"):
            notes.append(f"  ! {c['label']}: {c['overlapped']} run(s) overlapped another run "
                         "on the same host: timings not comparable, no baseline")
        if c.get("loaded"):
            share = c.get("foreign_cpu_share", math.nan)
            used = (loaded_text(share) if isinstance(share, float) and math.isfinite(share)
                    else "other processes used the cores during the run")
            notes.append(f"  ! {c['label']}: {c['loaded']} run(s) loaded: {used}"
                         f"{' (the most of them)' if c['loaded'] > 1 else ''} (something "
                         "outside the run set competed for the CPUs)")
        lines.append(_row(label, width, values + [runs], _widths(names + ["runs"])))
    posts = [f"{c['label']} {format_value(c['buckets']['median'], 0)}" for c in cells
             if c.get("buckets", {}).get("median")]
    if posts:
        notes.append("  reductions posted per step (run files' buckets): " + ", ".join(posts))
    if any(c.get("best_lr") for c in cells):
        notes.append("  < best lr of its grid by the median " + (
            "time to target (ties: samples/s)" if headline == "time_to_target"
            else "samples/s (ties: time to target)")
            + ", chosen on the same repeats it is reported on: its figures are optimistic "
            "(selection bias; confirm with a fresh set of repeats at that lr)")
    if any(c["diverged"] for c in cells):
        notes.append("  diverged: non-finite training loss or final accuracy <= "
                     f"{DIVERGED_CHANCE_MULTIPLE:g}x chance; never counted as faster")
    return lines + notes


def hetero_table(scenario: str, title: str, cells: Sequence[dict[str, Any]],
                 ceiling: float, nominal: float, factors: dict[str, Any],
                 contexts: Sequence[dict[str, Any]]) -> list[str]:
    """Het/hom throughput vs the ceiling, then the registry's ``hetero`` columns (the
    realised factor, interference) and their notes (lines)."""
    width = max([12, *(len(c["label"]) + 2 for c in cells)])
    over = oversubscribed(contexts)
    shown = columns.table("hetero")
    lines = [format_contexts(list(contexts)),
             f"# {scenario}: {title} against homogeneous{' | OVERSUBSCRIBED' if over else ''}"
             f" | ceiling sum(1/f)/N = {ceiling:.3f}, nominal factor {nominal:g}",
             _header(width, ["het/hom samples/s", "ceiling",
                             *(how.header for _, how in shown)])]
    for c in cells:
        lines.append(_row(c["label"] + (" <" if c.get("best_lr") else ""), width, [
            format_spread(c["het_hom"], 3), f"{ceiling:.3f}",
            *(_figure(c, column) for column, _ in shown)]))
    lines += [note for note in map(incomplete_note, cells) if note]
    lines += [f"  {column.runner_footnote}" for column, _ in shown if column.runner_footnote]
    off = [c["label"] for c in cells if c["realised_factor"]["median"] is not None
           and abs(c["realised_factor"]["median"] / nominal - 1) > FACTOR_TOLERANCE]
    if off:
        lines.append(f"  ! realised factor more than {FACTOR_TOLERANCE:.0%} off the nominal "
                     f"{nominal:g}: {', '.join(off)}")
    leaky = [c["label"] for c in cells if c["interference_ratio"]["median"] is not None
             and abs(c["interference_ratio"]["median"] - 1) > INTERFERENCE_TOLERANCE]
    if leaky:
        lines.append(f"  ! interference ratio more than {INTERFERENCE_TOLERANCE:.0%} from 1 "
                     f"(the slowed rank gave resources away or took them): {', '.join(leaky)}")
    if factors.get("flag"):
        lines.append(f"  ! realised factors of the compared runs differ by more than "
                     f"{FACTOR_TOLERANCE:.0%} ({factors['min']:.2f}–{factors['max']:.2f}): "
                     "the strategies did not meet the same straggler")
    if over:
        lines.append(f"  ! {OVERSUBSCRIBED_NOTE}")
    return lines
