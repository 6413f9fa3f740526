"""One run file's figures for the runner, all taken from :mod:`syncbench.analysis`.

Nothing is defined here: the figures and their order are the column registry's
(:func:`syncbench.analysis.columns.runner_figures`), each the report's value of
the run (:func:`syncbench.analysis.tables.table_rows` with the runner's target,
computed once) or, for the runner's own figures (the realised slowdown factor
and the interference ratio of :mod:`syncbench.analysis.fairness`, the
comm:compute ratio of a blocking reference, the posted buckets), computed by
its entry; then the run's machine context (:mod:`syncbench.analysis.context`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from syncbench.analysis.columns import runner_figures
from syncbench.analysis.run_metrics import RunFacts
from syncbench.analysis.runfile import Run
from syncbench.analysis.tables import table_rows
from syncbench.analysis.targets import Target


def run_figures(runs: Sequence[Run], target: float | Target) -> list[dict[str, Any]]:
    """The figures of each run (same order), keyed in the order the results file lists
    them, then its machine ``context``. Hidden communication needs all of the runs.
    ``target``: the runner's (a float is an accuracy)."""
    if not isinstance(target, Target):
        target = Target("accuracy", float(target))
    rows = table_rows(runs, **target.kwargs())
    figures = runner_figures()
    out = []
    for run, row in zip(runs, rows, strict=True):
        facts = RunFacts(run, row=row, **target.kwargs())
        out.append({**{c.key: c.figure(facts) for c in figures}, "context": row["_context"]})
    return out
