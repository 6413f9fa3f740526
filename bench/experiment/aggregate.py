"""A scenario's cells: medians with min-max over repeats, and ratios to the baseline.

Input: one record per run (``label``, ``group``, ``condition``, ``repeat`` and
the figures of :mod:`.measure`). Output: one cell per (configuration, label)
(:func:`scenario_cells`). The rules, in short (in full: docs/USAGE.md):

- An incomplete run (stopped by a signal, or written ``complete=False``) is
  counted (``runs``, ``incomplete``, ``incomplete_reasons``) and left out of
  every figure and ratio, as the run and as a baseline; a label with no
  complete run shows ``incomplete`` everywhere.
- Every figure (``columns.runner_statistics``) is the median with min and max
  over the label's repeats (``analysis.repeats.spread``); time to target
  counts a missed or diverged run as infinitely slow, the columns that leave
  diverged runs out do so (``diverged`` when none is left).
- Ratios to the baseline label are taken per repeat, between the two runs of
  that repeat in the same slowdown configuration (they ran next to each other),
  then summarised the same way; a baseline run that overlapped another gives
  none. ``ttt_ratio``: time to target (a miss is inf, never faster);
  ``sps_ratio``: samples/s (non-diverged runs); ``het_hom``: samples/s over the
  same label's in the homogeneous configuration of the repeat. ``status`` says
  why a ratio is missing (``diverged``, ``not reached``, ``-``).
- ``best_lr`` marks an lr grid's best label per configuration by the median
  headline, chosen on the repeats it is reported on (optimistic; the tables
  say so). ``factor_spread``: max/min of a configuration's realised factors,
  flagged above :data:`FACTOR_TOLERANCE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from syncbench.analysis.columns import runner_statistics
from syncbench.analysis.completeness import incomplete_reason
from syncbench.analysis.repeats import spread

#: Relative spread of realised factors above which a comparison is flagged, and the
#: largest relative distance of a realised factor from the nominal one that is not.
FACTOR_TOLERANCE = 0.10
#: Largest distance of the interference ratio from 1 that is not flagged.
INTERFERENCE_TOLERANCE = 0.07
def _ttt(record: dict[str, Any]) -> float:
    """Time to target, inf when the run diverged or never reached it."""
    t = record["time_to_target_s"]
    if record["diverged"] or t is None or not math.isfinite(t):
        return math.inf
    return float(t)


def _status(stats: dict[str, Any], n_diverged: int, usable: int) -> str | None:
    if usable == 0 and n_diverged:
        return "diverged"
    if stats["median"] is None:
        return "-"
    if math.isinf(stats["median"]):
        return "diverged" if n_diverged else "not reached"
    return None


def _index(records: Sequence[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {(r["condition"], r["label"], r["repeat"]): r for r in records}


def is_complete(record: dict[str, Any]) -> bool:
    """False for a run that did not consume its sample budget (records without the key:
    complete)."""
    return record.get("complete", True) is not False


def _usable(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A baseline (or homogeneous) run that a ratio may use: complete, not overlapped."""
    if record is None or not is_complete(record) or record.get("overlapped"):
        return None
    return record


def _ratios(runs: Sequence[dict[str, Any]], at: dict[tuple, dict[str, Any]], cond: str,
            baseline: str, homogeneous: str, label: str
            ) -> tuple[list[float], list[float], list[float]]:
    """Per-repeat time-to-target, samples/s and het/hom ratios of a label's complete
    ``runs`` (module docstring); a baseline or homogeneous run that overlapped or is
    incomplete gives none."""
    ttt, sps, het = [], [], []
    for r in runs:
        # a contaminated timing or an incomplete run is no baseline
        base = _usable(at.get((cond, baseline, r["repeat"])))
        if base is not None and math.isfinite(_ttt(base)):
            ttt.append(_ttt(r) / _ttt(base))
        if base is not None and not r["diverged"] and not base["diverged"] \
                and base["samples_per_s"] > 0:
            sps.append(r["samples_per_s"] / base["samples_per_s"])
        hom = _usable(at.get((homogeneous, label, r["repeat"])))
        if (cond != homogeneous and hom is not None and not r["diverged"]
                and not hom["diverged"] and hom["samples_per_s"] > 0):
            het.append(r["samples_per_s"] / hom["samples_per_s"])
    return ttt, sps, het


def scenario_cells(records: Sequence[dict[str, Any]], labels: Sequence[str],
              conditions: Sequence[str], baseline: str, homogeneous: str = "hom",
              groups: dict[str, str] | None = None,
              headline: str = "time_to_target") -> list[dict[str, Any]]:
    """One cell per (condition, label) present in ``records`` (module docstring)."""
    at = _index(records)
    cells = []
    for cond in conditions:
        for label in labels:
            every = [r for r in records if r["condition"] == cond and r["label"] == label]
            if not every:
                continue
            runs = [r for r in every if is_complete(r)]  # the figures' runs
            left_out = [r for r in every if not is_complete(r)]
            n_div = sum(bool(r["diverged"]) for r in runs)
            ok = [r for r in runs if not r["diverged"]]
            cell: dict[str, Any] = {
                "condition": cond, "label": label,
                "group": (groups or {}).get(label, label),
                "runs": len(every), "diverged": n_div,
                "incomplete": len(left_out),
                "incomplete_reasons": [incomplete_reason(False, r.get("stopped_by"))
                                       for r in left_out],
                "reached": sum(math.isfinite(_ttt(r)) for r in runs),
                "overlapped": sum(bool(r.get("overlapped")) for r in runs),
                "loaded": sum(bool(r.get("loaded")) for r in runs),
                # the most other processes took of the cores in a loaded run (NaN: unknown)
                "foreign_cpu_share": max(
                    (float(r["foreign_cpu_share"]) for r in runs if r.get("loaded")
                     and math.isfinite(float(r.get("foreign_cpu_share") or math.nan))),
                    default=math.nan),
                "time_to_target_s": spread((_ttt(r) for r in runs), keep_inf=True),
            }
            for column in runner_statistics():
                ok_only = column.diverged_excluded
                cell[column.key] = spread(r.get(column.key) for r in (ok if ok_only else runs))
                if ok_only and not ok:
                    cell[column.key]["status"] = "diverged"
            ttt, sps, het = _ratios(runs, at, cond, baseline, homogeneous, label)
            cell["ttt_ratio"] = spread(ttt, keep_inf=True)
            cell["ttt_ratio"]["status"] = _status(cell["ttt_ratio"], n_div, len(ok))
            if label == baseline and cell["ttt_ratio"]["status"] == "-":
                cell["ttt_ratio"]["status"] = "not reached"
            cell["sps_ratio"] = spread(sps)
            cell["sps_ratio"]["status"] = _status(cell["sps_ratio"], n_div, len(ok))
            cell["het_hom"] = spread(het)
            cell["het_hom"]["status"] = (None if cond == homogeneous else
                                         _status(cell["het_hom"], n_div, len(ok)))
            if not runs:  # every run incomplete: no figure at all
                for value in cell.values():
                    if isinstance(value, dict) and "median" in value:
                        value["status"] = "incomplete"
            cells.append(cell)
    mark_best(cells, headline)
    return cells




def _headline_key(cell: dict[str, Any], headline: str) -> tuple[float, float]:
    """Sort key, smaller is better: median time to target, then minus median samples/s
    (the other way round when samples/s is the headline; a diverged cell has none)."""
    ttt = cell["time_to_target_s"]["median"]
    sps = cell["samples_per_s"]["median"] if cell["diverged"] < cell["runs"] else None
    key = (math.inf if ttt is None else ttt, -(sps or 0.0))
    return key if headline == "time_to_target" else (key[1], key[0])


def mark_best(cells: list[dict[str, Any]], headline: str = "time_to_target") -> None:
    """Set ``best_lr`` on the best cell of every lr-grid group per condition."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        cell["best_lr"] = False
        groups.setdefault((cell["condition"], cell["group"]), []).append(cell)
    for members in groups.values():
        if len(members) > 1:
            min(members, key=lambda c: _headline_key(c, headline))["best_lr"] = True


def factor_spread(records: Sequence[dict[str, Any]], condition: str) -> dict[str, Any]:
    """Realised factors of every run of a configuration: min, max and the flag."""
    values = [r["realised_factor"] for r in records if r["condition"] == condition
              and is_complete(r)
              and r["realised_factor"] is not None and math.isfinite(r["realised_factor"])]
    if not values:
        return {"min": None, "max": None, "flag": False}
    lo, hi = min(values), max(values)
    return {"min": lo, "max": hi, "flag": bool(lo > 0 and hi / lo - 1 > FACTOR_TOLERANCE)}
