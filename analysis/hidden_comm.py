"""Hidden communication from step time, against a blocking-Allreduce reference.

A blocking ``Allreduce`` hides nothing, so the sync time per step C_ref of a
blocking SSGD run (``--comm blocking``) is the full price of synchronising once;
a run of the same scenario that steps in T against the reference's T_ref hid
``(T_ref - T) / C_ref`` of it (:func:`hidden_fraction`). Only strategies whose
traits say they hide the same synchronisation (``StrategyTraits.hides_comm``:
SSGD's overlap, OD-SGD) get a value; the others communicate less per step, by
design. Warm-up rows are left out on both sides. Definitions and the reasoning
behind them: docs/USAGE.md (hidden communication).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import fairness
from .completeness import is_incomplete
from .numbers import NAN, finite, hashable, median, name_list
from .runfile import Run
from .schema import PHASES, STRATEGY_FLAGS_ATTRS, strategy_traits

#: Root attributes a reference shares with the run (with N and the flags below).
REFERENCE_ROOT_KEYS: tuple[str, ...] = ("model", "dataset", "mpi_library", "backend",
                                        "simulated")

#: ``config`` flags of the scenario a hidden-communication reference must share
#: (with N, model, dataset, MPI library, backend): not the strategy's own flags.
REFERENCE_FLAGS: tuple[str, ...] = (
    "batch_size", "epochs", "dtype", "slowdown", "slowdown_schedule", "slowdown_mode",
    "synthetic_samples", "cuda_aware",
)


def all_ranks(run: Run, name: str) -> np.ndarray:
    """Column ``name`` of every rank's rows, one float64 array (rank by rank, ranks
    ascending: ``Run.packed``'s column, not a copy when stored as float64, so not to be
    modified)."""
    table = run.packed
    return table.column(name) if table.rows or name in table.columns else np.zeros(0)


def steady_step_times(run: Run) -> tuple[float, float, int]:
    """(T, C, rows): mean step seconds and mean sync (comm + wait) seconds per step.

    Pooled over every rank's rows after the warm-up (:func:`fairness.warmup_steps`), so
    ranks that take more steps weigh more: T is the rank-time per step, the
    inverse of throughput per rank. NaN, NaN, 0 when no row is left.
    """
    if not run.ranks:
        return NAN, NAN, 0
    keep = all_ranks(run, "step") >= fairness.warmup_steps(run)  # every rank's rows at once
    rows = int(np.count_nonzero(keep))
    if not rows:
        return NAN, NAN, 0
    phases = {p: all_ranks(run, f"t_{p}")[keep] for p in PHASES}
    total = float(np.sum(np.sum([phases[p] for p in PHASES], axis=0)))
    sync = float(np.sum(phases["comm"]) + np.sum(phases["wait"]))
    return total / rows, sync / rows, rows


def hidden_fraction(step_s: float, ref_step_s: float, ref_sync_s: float) -> float:
    """``(T_ref - T) / C_ref``: 1 = the whole price of synchronising hidden, 0 = none,
    negative = slower than blocking. NaN when an input is not finite or ``C_ref <= 0``."""
    if not (finite(step_s) and finite(ref_step_s) and finite(ref_sync_s)) or ref_sync_s <= 0:
        return NAN
    return (float(ref_step_s) - float(step_s)) / float(ref_sync_s)


def comm_compute_ratio(step_s: float, sync_s: float) -> float:
    """A blocking run's sync per step over its local work per step (``step_s - sync_s``):
    the regime a comparison is made in (below 1 an overlap can hide all of it). NaN when
    an input is not finite or the local part is not positive."""
    if not (finite(step_s) and finite(sync_s)) or step_s - sync_s <= 0:
        return NAN
    return float(sync_s) / (float(step_s) - float(sync_s))


def hidden_communication(run: Run, references: Sequence[Run]) -> float:
    """:func:`hidden_fraction` of ``run`` against blocking ``references`` of the same
    scenario (the medians of their :func:`steady_step_times`). NaN at N = 1 (nothing to
    hide) or without references."""
    if run.world_size <= 1 or not references:
        return NAN
    step_s, _, _ = steady_step_times(run)
    ref = [steady_step_times(r) for r in references]
    return hidden_fraction(step_s, median(t for t, _, _ in ref), median(c for _, c, _ in ref))


def _hides_comm(row: dict[str, Any]) -> bool:
    return strategy_traits(row.get("_attrs", {})).hides_comm


def is_blocking_reference(row: dict[str, Any]) -> bool:
    """A blocking-Allreduce run: a strategy that hides communication, run with its own
    ``--comm blocking`` (SSGD); the reference cost of one synchronisation round."""
    if not _hides_comm(row) or row.get("_config", {}).get("comm") != "blocking":
        return False
    own = name_list(row.get("_attrs", {}).get(STRATEGY_FLAGS_ATTRS[0]))
    return own is None or "comm" in own  # files without the record: every flag is its own


def blocking_comm_compute_ratio(row: dict[str, Any]) -> float:
    """:func:`comm_compute_ratio` of a blocking reference's row; NaN for any other run."""
    if not is_blocking_reference(row):
        return NAN
    return comm_compute_ratio(row["steady_step_s"], row["sync_s_per_step"])


def reference_key(row: dict[str, Any]) -> tuple:
    """The scenario a reference must share with a run: everything but the strategy.

    N, each rank's nominal factor (``--slowdown`` over its node's speed), model,
    dataset, MPI library, backend, simulated and the ``config`` flags
    :data:`REFERENCE_FLAGS`.
    """
    config = row.get("_config", {})
    attrs = row.get("_attrs", {})
    return (row["world_size"], row.get("_nominal"),
            *(hashable(attrs.get(k, row.get(k))) for k in REFERENCE_ROOT_KEYS),
            *(hashable(config.get(k)) for k in REFERENCE_FLAGS))


def add_hidden_comm(rows: list[dict[str, Any]]) -> None:
    """Fill ``hidden_comm_fraction`` of per-run rows in place.

    Against the median steady step and sync times of the blocking references with the
    same :func:`reference_key` that neither overlapped, diverged nor are incomplete.
    NaN at N = 1, without a reference, for a diverged, overlapped or incomplete run,
    and for a strategy that does not hide communication (``hides_comm``).
    """
    refs: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if is_blocking_reference(row) and not row.get("overlapped") \
                and not row.get("diverged") and not is_incomplete(row):
            refs.setdefault(reference_key(row), []).append(row)
    for row in rows:
        ref = refs.get(reference_key(row), [])
        if row["world_size"] <= 1 or not ref or not _hides_comm(row) \
                or row.get("diverged") or row.get("overlapped") or is_incomplete(row):
            row["hidden_comm_fraction"] = NAN
            continue
        row["hidden_comm_fraction"] = hidden_fraction(
            row["steady_step_s"], median(r["steady_step_s"] for r in ref),
            median(r["sync_s_per_step"] for r in ref))
