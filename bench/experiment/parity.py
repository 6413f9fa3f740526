"""The parity table of a scenario's ``[[parity]]`` pairs: does OD-SGD match SSGD?

The OD-SGD paper (Xu et al. 2020, arXiv 2005.06728) claims "similar or even
slightly better accuracy than SSGD". For each pair of run labels (an SSGD
run and an OD-SGD run of one recipe) the table puts the final test accuracy
of both side by side, ``median (min–max)`` over the complete repeats, for the
consensus model (``/summary`` ``final_accuracy``: W_g for OD-SGD) and, where
the runs recorded it (``--eval-model both``), for every worker's own weights
on its test shard (``final_local_accuracy``: W_loc, as the paper scores).

The claim *holds* on a row when OD-SGD's median is at most
:data:`PARITY_TOLERANCE` below SSGD's (or above it): "similar" read as
within one point of accuracy. Each pair is followed by the stability bound
of its recipe on a quadratic (:mod:`syncbench.analysis.stability`): the
largest ``lr * h`` for which SSGD and OD-SGD's recurrence are stable.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from syncbench.algorithms.odsgd import local_learning_rate
from syncbench.analysis.repeats import format_spread, spread
from syncbench.analysis.stability import stability_line
from syncbench.bench.cli import build_parser

from .aggregate import is_complete
from .scenario import RunEntry, Scenario

#: Largest shortfall of OD-SGD's median accuracy below SSGD's that still counts as parity.
PARITY_TOLERANCE = 0.01
#: The two evaluations: row name, and where a run record keeps its final accuracy.
EVALUATIONS = (("global", "final_accuracy"), ("local", "final_local_accuracy"))


def _accuracies(records: Sequence[dict[str, Any]], label: str, key: str) -> list[float]:
    """The final accuracies (``key``) of the complete runs of ``label``."""
    out = []
    for record in records:
        if record["label"] != label or not is_complete(record):
            continue
        value = record.get(key, record.get("summary", {}).get(key))
        if value is not None:
            out.append(float(value))
    return out


def verdict(ssgd_median: float | None, odsgd_median: float | None) -> str:
    """``holds``, ``does not hold (-X.X points)`` or ``-`` (a side has no run)."""
    if ssgd_median is None or odsgd_median is None:
        return "-"
    gap = odsgd_median - ssgd_median
    if gap >= -PARITY_TOLERANCE - 1e-9:  # exactly one point below still counts
        return "holds" + (" (better)" if gap > PARITY_TOLERANCE else "")
    return f"does not hold ({100 * gap:+.1f} points)"


def run_config(scenario: Scenario, label: str) -> argparse.Namespace:
    """The train flags of run ``label`` as ``syncbench train`` parses them (defaults in)."""
    entry = next(e for e in scenario.runs if e.label == label)
    return build_parser("train").parse_args(
        ["train", "--algorithm", entry.algorithm, *scenario.flags, *entry.flags])


def stability_note(scenario: Scenario, pair: dict[str, str], world: int) -> str:
    """The pair's stability line (its OD-SGD run's lr, momentum, lr_local and ranks)."""

    from syncbench.bench.train.config import TrainConfig  # lazy: loads the strategies

    config = TrainConfig.from_args(run_config(scenario, pair["odsgd"]))  # --lr resolved
    return stability_line(lr=config.lr, momentum=config.momentum,
                          lr_local=local_learning_rate(config, config.lr, world),
                          n=world, lookahead=config.local_lookahead == "on",
                          local_momentum=config.local_momentum)


def parity_table(scenario: Scenario, records: Sequence[dict[str, Any]], world: int) -> list[str]:
    """The table's lines (empty without ``[[parity]]`` pairs)."""
    if not scenario.parity:
        return []
    width = max(len(p["name"]) for p in scenario.parity) + 2
    lines = [f"# {scenario.name}: OD-SGD against SSGD, final test accuracy, median (min–max) "
             f"over complete repeats; the paper's parity claim holds within "
             f"{100 * PARITY_TOLERANCE:g} point",
             f"# {'pair':<{width}}{'eval':<8}{'ssgd':>22}{'odsgd':>22}{'gap':>9}  paper's claim"]
    for pair in scenario.parity:
        rows = 0
        for name, key in EVALUATIONS:
            ssgd = spread(_accuracies(records, pair["ssgd"], key))
            odsgd = spread(_accuracies(records, pair["odsgd"], key))
            if not ssgd["n"] and not odsgd["n"]:
                continue
            rows += 1
            gap = ("-" if ssgd["median"] is None or odsgd["median"] is None
                   else f"{odsgd['median'] - ssgd['median']:+.3f}")
            lines.append(f"  {pair['name']:<{width}}{name:<8}{format_spread(ssgd, 3):>22}"
                         f"{format_spread(odsgd, 3):>22}{gap:>9}  "
                         f"{verdict(ssgd['median'], odsgd['median'])}")
        if rows:
            lines.append(f"    {stability_note(scenario, pair, world)}")
    return lines


def parity_tables(scenario: Scenario, records: Sequence[dict[str, Any]],
                  counts: Sequence[int]) -> list[str]:
    """The parity table at each rank count of ``counts`` (the runs of ``--np 2,4``,
    by their record's ``np``, each count under a line of its own); one count: its table."""
    if not scenario.parity:
        return []
    if len(counts) == 1:
        return parity_table(scenario, records, counts[0])
    lines: list[str] = []
    for n in counts:
        mine = [r for r in records if r.get("np") == n]
        lines += [*([""] if lines else []), f"# at {n} ranks", *parity_table(scenario, mine, n)]
    return lines


def recorded_scenario(head: dict[str, Any]) -> Scenario:
    """The scenario of a results file's ``scenario`` record, what the parity table reads
    of it (name, shared flags, run entries, parity pairs); ``KeyError`` or ``TypeError``
    for a record that lacks them."""
    runs = [RunEntry(str(r["label"]), str(r["algorithm"]), tuple(r.get("flags") or ()),
                     str(r.get("group") or r["label"]), r.get("lr")) for r in head["runs"]]
    np_ = head.get("np")
    return Scenario(name=str(head["name"]), source=str(head.get("source", "")),
                    description=str(head.get("description", "")),
                    np=int(np_[0] if isinstance(np_, list) else np_), runs=runs,
                    flags=tuple(head.get("flags") or ()),
                    parity=[dict(p) for p in head.get("parity") or []])


def recorded_parity(head: dict[str, Any], records: Sequence[dict[str, Any]]) -> list[str]:
    """The parity tables of a results file (``head``: its ``scenario``; ``records``: its
    runs), as the runner printed them; empty when it recorded no pairs (files written
    before the results file held them, too)."""
    if not head.get("parity"):
        return []
    np_ = head.get("np")
    counts = [int(n) for n in np_] if isinstance(np_, list) else [int(np_)]
    return parity_tables(recorded_scenario(head), records, counts)
