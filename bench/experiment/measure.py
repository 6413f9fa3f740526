"""One run file's figures for the runner, all taken from :mod:`syncbench.analysis`.

Nothing is defined here: samples/s, accuracy and time to target are the
run file's ``/summary`` (:mod:`syncbench.analysis.summary`), the hidden
communication fraction is the report's (:mod:`syncbench.analysis.tables`),
the realised slowdown factor (per-step medians,
``tables.REALISED_STATISTIC``: robust to a shared machine's preemption
noise) and the interference ratio are :mod:`syncbench.analysis.fairness`'s,
the sync share and the evaluation interval are the report's, and the
machine context (``loaded`` included) is
:mod:`syncbench.analysis.context`'s. ``diverged`` is the ``/summary`` flag
the training driver records (recomputed by the analysis for older files).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from syncbench.analysis import fairness
from syncbench.analysis.context import machine_context, overlapped_indices
from syncbench.analysis.runfile import Run
from syncbench.analysis.summary import run_diverged, time_to_target
from syncbench.analysis.tables import REALISED_STATISTIC, table_rows

#: Figures of one run, in the order the results file lists them.
RUN_KEYS: tuple[str, ...] = (
    "samples_per_s", "wall_s", "final_accuracy", "time_to_target_s", "diverged",
    "realised_factor", "interference_ratio", "hidden_comm_fraction", "buckets",
    "oversubscribed", "overlapped", "sync_fraction", "eval_interval_s", "loaded",
    "foreign_cpu_share",
)


def run_figures(runs: Sequence[Run], target: float) -> list[dict[str, Any]]:
    """:data:`RUN_KEYS` of each run (same order); hidden communication needs all of them."""
    rows = table_rows(runs)
    overlapped = overlapped_indices(runs)
    out = []
    for i, (run, row) in enumerate(zip(runs, rows, strict=True)):
        s = run.summary
        buckets = run.attrs.get("buckets")
        out.append({
            "samples_per_s": float(s["samples_per_s"]),
            "wall_s": float(s["wall_s"]),
            "final_accuracy": float(s["final_accuracy"]),
            "time_to_target_s": time_to_target(run.eval, target),
            "diverged": run_diverged(run),
            "realised_factor": fairness.realised_factor(run, REALISED_STATISTIC),
            "interference_ratio": fairness.interference_ratio(run),
            "hidden_comm_fraction": float(row.get("hidden_comm_fraction", math.nan)),
            "buckets": int(buckets) if buckets is not None else None,
            "oversubscribed": machine_context(run).get("oversubscribed"),
            "overlapped": i in overlapped,
            "sync_fraction": float(row.get("sync_fraction", math.nan)),
            "eval_interval_s": float(row.get("eval_interval_s", math.nan)),
            "loaded": row.get("loaded"),
            "foreign_cpu_share": float(row.get("foreign_cpu_share", math.nan)),
        })
    return out
