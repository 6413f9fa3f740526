"""The figures of one run: its row of every table, and its per-rank table.

:func:`run_metrics` computes every per-run column of the registry
(:mod:`.columns`) from a :class:`RunFacts`, which holds what several columns
share (phase sums, the per-rank table, steady step times, the machine context)
so that each is computed once. Everything comes from the recorded per-rank step
rows (``t_<phase>`` seconds, ``samples``, ``local_steps``, ``round``), the
evaluation rows and the ``/summary`` attributes (no MPI). The columns that need
the other runs (scaling, hidden communication, overlaps) start as NaN / None
here. Definitions: docs/USAGE.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from . import fairness
from .columns import REALISED_STATISTIC, row_columns
from .context import machine_context
from .hidden_comm import all_ranks, steady_step_times
from .labels import run_label
from .numbers import NAN, finite, ratio
from .runfile import Run
from .scaling import SERIES_ROOT_KEYS
from .schema import PHASES, REPORT_KEYS, SCALING_MODE_ATTR, STRATEGY_FLAGS_ATTRS, TRAITS_ATTR
from .summary import run_diverged, time_to_target
from .targets import Target, config_target, target_of

#: Phases counted as a rank's own work: not ``wait``, and not ``comm`` either, since a
#: blocking Allreduce charges the time spent waiting for a slow rank to ``comm``; a
#: codec's encode and decode (``codec``) are the rank's own work (zero in files written
#: before the phase, whose ``update`` holds it).
BUSY_PHASES: tuple[str, ...] = ("data", "compute", "update", "delay", "codec")


def straggler_ratio(busy: Sequence[float] | np.ndarray) -> float:
    """Busy seconds per step of the slowest rank over the median of the OTHER ranks.

    1 = balanced, 4 = one rank four times slower than the others, at any N
    (with 2 ranks a median over all ranks would be the mean and stay below 2).
    NaN with fewer than two finite values or a zero median.
    """
    values = np.asarray(busy, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size < 2:
        return NAN
    slowest = int(np.argmax(values))
    return ratio(float(values[slowest]), float(np.median(np.delete(values, slowest))))


def _nan_if_inf(values: np.ndarray) -> np.ndarray:
    """NaN where not finite (a ratio with a zero or non-finite operand, as ``ratio``)."""
    return np.where(np.isfinite(values), values, NAN)


def row_durations(run: Run) -> np.ndarray:
    """Duration of every step row of every rank, the sum of its seven phases (s), flat in
    ``Run.packed``'s order."""
    table = run.packed
    if not table.rows:
        return np.zeros(0)
    return np.sum([table.column(f"t_{p}") for p in PHASES], axis=0)


def rank_vectors(run: Run) -> dict[str, np.ndarray]:
    """Per-rank figures as arrays, one entry per rank of ``Run.packed`` (ranks ascending).

    ``steps``, ``samples`` (totals), one entry per phase (total seconds),
    ``step_s_median`` / ``step_s_max`` (of :func:`row_durations`; NaN for a
    rank without rows). A few vectorised operations over every rank's rows at once
    (:class:`~.packed.PackedRows`), for any number of ranks and rows per rank.
    """
    table = run.packed
    out: dict[str, np.ndarray] = {"steps": table.counts.copy()}
    out["samples"] = table.sum(table.column("samples", np.int64)).astype(np.int64)
    for p in PHASES:
        out[p] = table.sum(table.column(f"t_{p}"))
    durations = row_durations(run)
    out["step_s_median"] = table.median(durations)
    out["step_s_max"] = table.max(durations)
    return out


def rank_columns(run: Run) -> dict[str, np.ndarray]:
    """The per-rank figures of :func:`rank_table` as arrays (one entry per rank, ranks
    ascending), without the rank attributes: what the straggler columns reduce."""
    wall = float(run.summary.get("wall_s", NAN))
    v = rank_vectors(run)
    n = v["steps"].size
    with np.errstate(divide="ignore", invalid="ignore"):
        ok_wall = finite(wall) and wall != 0
        fraction = {p: (v[p] / wall if ok_wall else np.full(n, NAN)) for p in PHASES}
        busy = np.sum([v[p] for p in BUSY_PHASES], axis=0) if n else np.zeros(0)
        per_step = np.where(v["steps"] > 0, busy / np.where(v["steps"] > 0, v["steps"], 1), NAN)
        busy_frac = busy / wall if ok_wall else np.full(n, NAN)
    return {
        "steps": v["steps"], "samples": v["samples"],
        **{f"{p}_s": v[p] for p in PHASES},
        **{f"{p}_fraction": _nan_if_inf(fraction[p]) for p in PHASES},
        "busy_s": busy, "busy_s_per_step": _nan_if_inf(per_step),
        "wait_share": _nan_if_inf(fraction["wait"]),
        "idle_share": 1.0 - _nan_if_inf(busy_frac),
        "step_s_median": v["step_s_median"], "step_s_max": v["step_s_max"],
    }


def slowest_rank(run: Run, columns: dict[str, np.ndarray] | None = None) -> int | None:
    """The rank with the most busy seconds per step (the report's ``slowest_rank``:
    data + compute + update + delay over its steps); None when no rank has a finite
    value. ``columns``: :func:`rank_columns` of the run, if already computed."""
    busy = (columns if columns is not None else rank_columns(run))["busy_s_per_step"]
    ok = np.isfinite(busy)
    if not ok.any():
        return None
    return int(run.packed.ranks[int(np.nanargmax(np.where(ok, busy, -np.inf)))])


def rank_table(run: Run, columns: dict[str, np.ndarray] | None = None) -> list[dict[str, Any]]:
    """One row per recorded rank: phase seconds and shares, busy/idle, step times.

    Keys: ``rank``, ``hostname``, ``slowdown``, ``slowdown_mode``,
    ``slowdown_realised`` (:func:`syncbench.analysis.fairness.realised_factors`
    with ``REALISED_STATISTIC``, computed from the rows; 1.0 for an unslowed
    rank), ``steps``, ``samples``, ``<phase>_s`` (total seconds),
    ``<phase>_fraction`` (total / wall), ``busy_s`` (data + compute + update +
    delay), ``busy_s_per_step``, ``wait_share``, ``idle_share`` (1 - busy_s /
    wall), ``step_s_median``, ``step_s_max``. ``columns``: :func:`rank_columns` of
    the run, if already computed.
    """
    realised = fairness.realised_factors(run, REALISED_STATISTIC)
    columns = columns if columns is not None else rank_columns(run)
    keys = list(columns)
    rows = []
    for rank, values in zip(run.packed.ranks.tolist(),
                            zip(*(columns[k].tolist() for k in keys))):
        attrs = run.rank_attrs.get(rank, {})
        slowdown = attrs.get("slowdown")
        row: dict[str, Any] = {
            "rank": rank,
            "hostname": attrs.get("hostname"),
            "slowdown": slowdown,
            "slowdown_mode": attrs.get("slowdown_mode"),
            "slowdown_realised": realised.get(rank, 1.0 if slowdown is not None else None),
        }
        row.update(zip(keys, values))
        rows.append(row)
    return rows


def scaling_mode(run: Run) -> str | None:
    """The recorded ``scaling_mode`` root attribute ("strong" or "weak"), else None."""
    value = run.attrs.get(SCALING_MODE_ATTR)
    return value if value in ("strong", "weak") else None


class RunFacts:
    """One run and what its columns share, each computed once, on first use.

    ``row`` is the run's row as far as it is computed (columns come in registry
    order, so a column may read the ones before it); ``goal`` the target of its time
    to target (``target_accuracy`` or ``target_loss``, else the run's own flag),
    ``target`` and ``target_loss`` its value when it is an accuracy or a loss.
    """

    def __init__(self, run: Run, target_accuracy: float | None = None,
                 row: dict[str, Any] | None = None, target_loss: float | None = None) -> None:
        self.run = run
        #: The target that recomputes the time to target (None: the stored one).
        self.override = target_of(target_accuracy, target_loss)
        self.row: dict[str, Any] = {} if row is None else row

    @cached_property
    def label(self) -> str:
        return run_label(self.run.attrs)

    @cached_property
    def goal(self) -> Target | None:
        return self.override if self.override is not None else config_target(self.run.config)

    @cached_property
    def target(self) -> float | None:
        goal = self.goal
        return goal.value if goal is not None and goal.metric == "accuracy" else None

    @cached_property
    def target_loss(self) -> float | None:
        goal = self.goal
        return goal.value if goal is not None and goal.metric == "loss" else None

    @cached_property
    def time_to_target(self) -> float:
        if self.override is not None:
            return time_to_target(self.run.eval, self.override)
        return float(self.run.summary.get("time_to_target_s", NAN))

    @cached_property
    def samples(self) -> int:
        table = self.run.packed
        return int(table.column("samples", np.int64).sum()) if table.rows else 0

    @cached_property
    def steps(self) -> int:
        return self.run.packed.rows

    @cached_property
    def best_accuracy(self) -> float:
        acc = np.asarray(self.run.eval.get("accuracy", ()), dtype=np.float64)
        return float(np.nanmax(acc)) if acc.size and np.isfinite(acc).any() else NAN

    @cached_property
    def rank_columns(self) -> dict[str, np.ndarray]:
        return rank_columns(self.run)

    @cached_property
    def ranks(self) -> list[dict[str, Any]]:
        return rank_table(self.run, self.rank_columns)

    @cached_property
    def phases(self) -> dict[str, float]:
        """``step_s_mean``, ``<phase>_s_per_step``, ``<phase>_fraction``, ``untracked_fraction``."""
        run = self.run
        wall = float(run.summary.get("wall_s", NAN))
        n_rows = self.steps
        sums = {p: float(np.sum(all_ranks(run, f"t_{p}"))) for p in PHASES}
        per_step = {p: ratio(sums[p], n_rows) for p in PHASES}
        out: dict[str, float] = {"step_s_mean": float(sum(per_step.values())) if n_rows else NAN}
        for p in PHASES:
            out[f"{p}_s_per_step"] = per_step[p]
        fractions = {p: ratio(sums[p], len(run.ranks) * wall) for p in PHASES}
        for p in PHASES:
            out[f"{p}_fraction"] = fractions[p]
        out["untracked_fraction"] = 1.0 - sum(fractions.values())
        return out

    @cached_property
    def comm(self) -> dict[str, float]:
        """``rounds`` (mean over ranks) and ``exposed_comm_s_per_round``.

        A rank's synchronisation rounds are its distinct values of ``round`` when it
        took local steps, else one per step."""
        run = self.run
        table = run.packed
        lengths = table.counts
        local = table.column("local_steps", np.int64) > 0 if table.rows else np.zeros(0, bool)
        if lengths.size and lengths.min() > 0 and not np.any(local):
            # lock-step (no rank ran local steps): one round per row, sums by segment
            rounds = lengths.tolist()
            exposed = (np.add.reduceat(all_ranks(run, "t_comm"), table.starts)
                       + np.add.reduceat(all_ranks(run, "t_wait"), table.starts))
            per_round = (exposed / lengths).tolist()
        else:
            counts = np.where(table.any(local), table.distinct(table.column("round", np.int64)),
                              lengths) if table.rows else lengths
            exposed = table.sum(table.column("t_comm")) + table.sum(table.column("t_wait"))
            rounds = counts.tolist()
            per_round = [ratio(e, n) for e, n in zip(exposed.tolist(), rounds)]
        finite_rounds = [v for v in per_round if math.isfinite(v)]
        return {"rounds": float(np.mean(rounds)) if rounds else NAN,
                "exposed_comm_s_per_round": (float(np.mean(finite_rounds)) if finite_rounds
                                             else NAN)}

    @cached_property
    def stragglers(self) -> dict[str, Any]:
        """Step-time tail, busy max over the others' median, slowest rank, share maxima."""
        columns, run = self.rank_columns, self.run
        durations = row_durations(run)
        median = float(np.median(durations)) if durations.size else NAN
        biggest = float(np.max(durations)) if durations.size else NAN
        busy = columns["busy_s_per_step"]
        ok = np.isfinite(busy)
        out: dict[str, Any] = {
            "step_s_median": median,
            "step_s_max": biggest,
            "step_max_over_median": ratio(biggest, median),
            "busy_max_over_median": straggler_ratio(busy[ok]),
            "slowest_rank": slowest_rank(run, columns),
        }
        for key in ("wait_share", "idle_share"):
            values = columns[key][np.isfinite(columns[key])]
            out[f"{key}_max"] = float(values.max()) if values.size else NAN
        return out

    @cached_property
    def steady(self) -> tuple[float, float, int]:
        return steady_step_times(self.run)

    @cached_property
    def diverged(self) -> bool:
        return run_diverged(self.run)

    @cached_property
    def eval_interval(self) -> float:
        t_eval = np.asarray(self.run.eval.get("t", ()), dtype=np.float64)
        return float(np.median(np.diff(t_eval))) if t_eval.size > 1 else NAN

    @cached_property
    def scaling_mode(self) -> str | None:
        return scaling_mode(self.run)

    @cached_property
    def context(self) -> dict[str, Any]:
        return machine_context(self.run)


#: Root attributes a row keeps for the passes over every run (overlaps, series,
#: hidden communication): formatters drop them (keys starting with "_").
ROW_ATTRS: tuple[str, ...] = (*SERIES_ROOT_KEYS, "hostnames", "t_begin_unix", "t_end_unix",
                              *STRATEGY_FLAGS_ATTRS, TRAITS_ATTR)


def run_metrics(run: Run, target_accuracy: float | None = None,
                target_loss: float | None = None) -> dict[str, Any]:
    """Every per-run column of the registry (``schema.REPORT_KEYS`` and ``path`` first).

    The ``REPORT_KEYS`` values are the stored ``/summary``'s, except
    ``time_to_target_s`` when ``target_accuracy`` or ``target_loss`` is given
    (recomputed from the evaluation rows). Private keys (``_config``, ``_attrs``, ``_context``,
    ``_ranks``, ``_nominal``) carry what the passes over every run need.
    """
    facts = RunFacts(run, target_accuracy, target_loss=target_loss)
    for entry in row_columns():
        facts.row[entry.key] = entry.compute(facts)  # type: ignore[misc]
    row = facts.row
    row["_config"] = run.config  # dropped by the formatters (keys starting with "_")
    row["_attrs"] = {k: run.attrs.get(k) for k in ROW_ATTRS}
    row["_context"] = facts.context
    row["_ranks"] = facts.ranks  # the report's per-rank table (report.report_tables)
    # each rank's nominal slowdown, --slowdown's and its node's CPU quota's (reference_key)
    row["_nominal"] = tuple(round(f, 6) for _, f in sorted(fairness.nominal_factors(run).items()))
    if tuple(row)[:len(REPORT_KEYS)] != REPORT_KEYS:  # pragma: no cover - a registry edit
        raise RuntimeError("the column registry does not start with schema.REPORT_KEYS")
    return row
