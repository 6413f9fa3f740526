"""Tidy tables from run files: one row per run, with every registered column filled.

:func:`table_rows` computes each run's row (:mod:`.run_metrics`, the columns of
:mod:`.columns`) and then the columns that need the other runs: which runs
overlapped on a shared host (:func:`add_overlaps`, whose timings are then not
comparable), the scaling series and their ratios (:mod:`.scaling`) and the
hidden communication (:mod:`.hidden_comm`). Rows of ``--by`` groups of
repeats are :func:`syncbench.analysis.repeats.group_rows`. Only NumPy on the
columns of :mod:`.runfile` (no MPI).

Every figure is defined in docs/USAGE.md: the sync share (comm + wait) that
leads every table, the time per phase, hidden communication against a blocking
reference, stragglers, accuracy and divergence, contaminated (overlapped,
loaded) and incomplete runs, strong and weak scaling, and repeats.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .columns import PATH_KEY
from .context import overlapping_runs
from .hidden_comm import add_hidden_comm
from .run_metrics import run_metrics
from .runfile import Run
from .scaling import add_scaling

#: Keys that may be used in ``--by``: root attributes, or any ``config`` flag.
ROOT_GROUP_KEYS: tuple[str, ...] = ("algorithm", "world_size", "model", "dataset", "backend",
                                    "mpi_library", "scaling_mode")


def add_overlaps(rows: list[dict[str, Any]]) -> None:
    """Flag per-run rows whose runs overlapped on a shared host (``analysis.context``).

    Sets ``overlapped`` (bool) and ``overlaps_with`` (the other files' names).
    """
    pairs = overlapping_runs([r.get("_attrs", {}) for r in rows])
    for i, j in pairs:
        for a, b in ((i, j), (j, i)):
            rows[a]["overlapped"] = True
            others = rows[a]["overlaps_with"] or []
            rows[a]["overlaps_with"] = [*others, os.path.basename(str(rows[b][PATH_KEY]))]


def table_rows(runs: Sequence[Run], by: Sequence[str] = (),
               target_accuracy: float | None = None,
               series: Sequence[str] = (),
               target_loss: float | None = None) -> list[dict[str, Any]]:
    """Per-run rows of ``runs`` (input order) with overlaps, scaling and hidden-comm filled.

    ``by`` and ``series`` keys split scaling series (``scaling.series_keys``);
    ``target_accuracy`` (``target_loss``) recomputes every run's time to target for
    that accuracy (validation loss).
    """
    rows = [run_metrics(run, target_accuracy, target_loss) for run in runs]
    add_overlaps(rows)
    add_scaling(rows, by, series)
    add_hidden_comm(rows)
    return rows
