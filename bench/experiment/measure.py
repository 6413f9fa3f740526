"""One run file's figures for the runner, all taken from :mod:`syncbench.analysis`.

Nothing is defined here: samples/s, accuracy and time to target are the
run file's ``/summary`` (:mod:`syncbench.analysis.summary`), the hidden
communication fraction is the report's (:mod:`syncbench.analysis.tables`),
the realised slowdown factor (per-step medians,
``tables.REALISED_STATISTIC``: robust to a shared machine's preemption
noise) and the interference ratio are :mod:`syncbench.analysis.fairness`'s,
the sync share and the evaluation interval are the report's, the
comm:compute ratio of a blocking SSGD run is the report's
``comm_compute_ratio`` of its steady step and sync times, and the
machine context (``loaded`` included) is
:mod:`syncbench.analysis.context`'s. ``diverged`` is the ``/summary`` flag
the training driver records (recomputed by the analysis for older files);
``complete``, ``stopped_by`` and ``resumes`` are the run file's (``Run``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from syncbench.analysis import fairness
from syncbench.analysis.runfile import Run
from syncbench.analysis.tables import (
    REALISED_STATISTIC,
    comm_compute_ratio,
    is_blocking_reference,
    table_rows,
)


def run_figures(runs: Sequence[Run], target: float) -> list[dict[str, Any]]:
    """The figures of each run (same order), keyed in the order the results file lists
    them, then its machine ``context``.

    Hidden communication needs all of the runs. Everything but the fairness
    figures and ``buckets`` is taken from the report's row of the run
    (``table_rows`` with the runner's target), computed once.
    """
    rows = table_rows(runs, target_accuracy=target)
    out = []
    for run, row in zip(runs, rows, strict=True):
        buckets = run.attrs.get("buckets")
        out.append({
            "samples_per_s": float(row["samples_per_s"]),
            "wall_s": float(row["wall_s"]),
            "final_accuracy": float(row["final_accuracy"]),
            "time_to_target_s": row["time_to_target_s"],
            "diverged": row["diverged"],
            "realised_factor": fairness.realised_factor(run, REALISED_STATISTIC),
            "interference_ratio": fairness.interference_ratio(run),
            "hidden_comm_fraction": float(row.get("hidden_comm_fraction", math.nan)),
            "comm_compute_ratio": (comm_compute_ratio(row["steady_step_s"],
                                                      row["sync_s_per_step"])
                                   if is_blocking_reference(row) else math.nan),
            "buckets": int(buckets) if buckets is not None else None,
            "oversubscribed": row["_context"].get("oversubscribed"),
            "overlapped": row["overlapped"],
            "sync_fraction": float(row.get("sync_fraction", math.nan)),
            "eval_interval_s": float(row.get("eval_interval_s", math.nan)),
            "loaded": row.get("loaded"),
            "foreign_cpu_share": float(row.get("foreign_cpu_share", math.nan)),
            "complete": bool(row["complete"]),
            "stopped_by": str(row.get("stopped_by") or ""),
            "resumes": int(row.get("resumes") or 0),
            "context": row["_context"],
        })
    return out
