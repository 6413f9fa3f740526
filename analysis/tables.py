"""Tidy tables from run files: per-run metrics, per-rank breakdown, repeats, scaling.

Only NumPy on the columns of :mod:`~syncbench.analysis.runfile` (no MPI).
Every number below is computed from the recorded per-rank step rows
(``t_<phase>`` seconds, ``samples``, ``local_steps``, ``round``), the
evaluation rows and the ``/summary`` attributes of ``syncbench/1`` files.
Notation: N = world size of a run, ``wall`` = its ``wall_s`` (training time,
evaluation excluded), X = its ``samples_per_s`` (all ranks' samples / wall).

Time breakdown (per run, over every recorded row of every rank)
    ``<phase>_s_per_step``: mean seconds of the phase per step (mean over all
    rows of all ranks); ``step_s_mean`` is their sum, the mean step time.
    ``<phase>_fraction``: seconds of the phase summed over all ranks divided by
    ``N_recorded * wall`` (the share of all ranks' wall time; for ``comm`` and
    ``wait`` this is exactly the ``/summary`` definition).
    ``untracked_fraction`` = 1 - the sum of the six phase fractions: time in
    no recorded step (``finish()``'s drain, gaps between steps).

Hidden communication (needs a blocking reference run in the same set)
    The *exposed* communication of a rank is the time it spends inside MPI
    rather than computing: ``t_comm + t_wait``. A *round* is one
    synchronisation: one step for step-synchronous algorithms, one value of the
    ``round`` column for round-based ones (rows with ``local_steps > 0``).
    ``exposed_comm_s_per_round`` = mean over ranks of (exposed seconds / rounds).
    The reference cost of one round, C_ref, is the median
    ``exposed_comm_s_per_round`` of the *blocking* SSGD runs
    (``algorithm == "ssgd"`` and ``--comm blocking``) with the same N, model,
    dataset, ``--batch-size`` and ``--slowdown``/``--slowdown-schedule``: a
    blocking Allreduce hides nothing, so C_ref is the full price of
    synchronising once. Then
    ``hidden_comm_fraction = 1 - exposed_comm_s_per_round / C_ref``:
    0 for the blocking reference itself, 1 when the whole price is hidden
    behind computation, negative when a schedule exposes more than a blocking
    Allreduce (polling overhead, stragglers), NaN when there is no reference
    and at N = 1 (nothing to hide).

Stragglers (per run)
    ``step_s_median`` / ``step_s_max``: median / max step duration (sum of the
    six phases of one row) over every row of every rank; ``step_max_over_median``
    is their ratio (the tail of the step-time distribution).
    A rank's *busy* time is its non-``wait`` phases (data, compute, comm,
    update, delay); ``busy_max_over_median`` = max over ranks / median over
    ranks of busy seconds per step (1 = balanced; 4 = one rank 4x slower), and
    ``slowest_rank`` the rank with the largest. Per rank, ``wait_share`` =
    wait seconds / wall and ``idle_share`` = 1 - busy seconds / wall (waiting
    plus untracked time); ``wait_share_max`` / ``idle_share_max`` are their
    maxima over ranks.

Accuracy
    ``final_accuracy`` / ``final_loss`` of the last evaluation, ``best_accuracy``
    the highest; ``time_to_target_s`` is the ``/summary`` value, or, when a
    target is given here, the ``t`` of the first evaluation with
    ``accuracy >= target`` (NaN if never reached; ``target_reached`` 1 or 0).

Scaling (rows of one *series*: the same algorithm, model and dataset, and the
same values of any ``--by`` or ``--series`` key other than ``world_size``, so
``--series comm`` keeps blocking and overlapping SSGD apart; baseline N0 = the
smallest N of the series, X0 / wall0 / work0 = the medians over its runs at N0
of samples/s, wall and total samples)
    ``speedup = X / X0`` and ``efficiency = speedup * N0 / N`` for both kinds
    of scaling. Under *strong* scaling (the same total samples at every N)
    ``X / X0 = wall0 / wall``: the classic T(N0) / T(N). Under *weak* scaling
    (the same samples per rank) ``efficiency = (X / N) / (X0 / N0)``, the ratio
    of throughput per rank, which equals ``wall0 / wall``; ``speedup`` is then
    the scaled (Gustafson) speedup. Throughput ratios stay meaningful when the
    sample budget is rounded differently at different N.
    ``scaling`` says which kind the files are: ``strong`` if every run of the
    series has total samples within 1 % of work0, else ``weak`` if every run
    has samples per rank within 1 % of work0 / N0, else ``mixed``.
    The wall-time forms check that: strong ``speedup_wall = wall0 / wall``,
    weak ``efficiency_wall = wall0 / wall``, and in both
    ``efficiency_wall = speedup_wall * N0 / N`` (NaN for ``mixed``).

Repeats (``--by KEY,...``)
    Runs with equal values of the keys form a group; every numeric column of a
    group row is the median over its runs, and the columns of
    :data:`SPREAD_KEYS` also get ``<key>_min`` / ``<key>_max``. NaN values are
    ignored, except ``time_to_target_s``, where a run that missed the target
    counts as infinitely slow (median NaN when half or more missed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .runfile import Run
from .schema import PHASES, REPORT_KEYS

NAN = float("nan")
PATH_KEY = "path"

#: Phases counted as a rank's own work (everything but ``wait``).
BUSY_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p != "wait")

#: Keys that may be used in ``--by``: root attributes, or any ``config`` flag.
ROOT_GROUP_KEYS: tuple[str, ...] = ("algorithm", "world_size", "model", "dataset", "backend")

#: Keys of a series (speedup baseline) besides the non-world-size ``--by`` keys.
SERIES_KEYS: tuple[str, ...] = ("algorithm", "model", "dataset")

#: Relative tolerance of "the same work" when classifying strong / weak scaling.
WORK_RTOL = 0.01

#: Per-run columns beyond ``schema.REPORT_KEYS`` and ``path``, in order.
NEW_KEYS: tuple[str, ...] = (
    "complete", "repeats", "model", "dataset",
    "samples", "steps", "samples_per_s_per_rank", "final_loss", "best_accuracy",
    "target_accuracy", "target_reached",
    "step_s_mean",
    *(f"{p}_s_per_step" for p in PHASES),
    *(f"{p}_fraction" for p in PHASES if f"{p}_fraction" not in REPORT_KEYS),
    "untracked_fraction",
    "rounds", "exposed_comm_s_per_round", "hidden_comm_fraction",
    "step_s_median", "step_s_max", "step_max_over_median",
    "busy_max_over_median", "slowest_rank", "wait_share_max", "idle_share_max",
    "scaling", "baseline_world_size", "speedup", "efficiency", "speedup_wall",
    "efficiency_wall",
)

#: Columns that get ``_min`` / ``_max`` companions in group rows.
SPREAD_KEYS: tuple[str, ...] = (
    "samples_per_s", "wall_s", "final_accuracy", "time_to_target_s", "comm_fraction",
    "wait_fraction", "hidden_comm_fraction", "step_s_median", "step_max_over_median",
    "speedup", "efficiency",
)

# Columns that are labels, not measurements (never medians).
_LABEL_KEYS = frozenset(
    {"algorithm", "world_size", "model", "dataset", "scaling", "complete", "repeats",
     PATH_KEY, "baseline_world_size", "slowest_rank", "target_accuracy", "target_reached"}
)


# ---------------------------------------------------------------- small helpers


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ratio(num: float, den: float) -> float:
    """num / den, NaN when either is not finite or den is 0."""
    if not (_finite(num) and _finite(den)) or den == 0:
        return NAN
    return float(num) / float(den)


def _concat(run: Run, name: str) -> np.ndarray:
    cols = [np.asarray(c[name], dtype=np.float64) for c in run.ranks.values()]
    return np.concatenate(cols) if cols else np.zeros(0)


def step_durations(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Duration of each step row of one rank: the sum of its six phases (s)."""
    return np.sum([np.asarray(cols[f"t_{p}"], dtype=np.float64) for p in PHASES], axis=0)


def rounds_of(cols: dict[str, np.ndarray]) -> int:
    """Synchronisation rounds of one rank (see the module docstring)."""
    local = np.asarray(cols["local_steps"])
    if local.size and np.any(local > 0):
        return int(np.unique(np.asarray(cols["round"])).size)
    return int(np.asarray(cols["step"]).size)


def time_to_target(evals: dict[str, np.ndarray], target: float) -> float:
    """``t`` of the first evaluation with ``accuracy >= target``; NaN if none."""
    acc = np.asarray(evals.get("accuracy", ()), dtype=np.float64)
    t = np.asarray(evals.get("t", ()), dtype=np.float64)
    n = min(acc.size, t.size)
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(acc[:n] >= float(target))
    return float(t[hits[0]]) if hits.size else NAN


# ---------------------------------------------------------------- per rank


def rank_table(run: Run) -> list[dict[str, Any]]:
    """One row per recorded rank: phase seconds and shares, busy/idle, step times.

    Keys: ``rank``, ``hostname``, ``slowdown``, ``steps``, ``samples``,
    ``<phase>_s`` (total seconds), ``<phase>_fraction`` (total / wall),
    ``busy_s`` (non-wait phases), ``busy_s_per_step``, ``wait_share``,
    ``idle_share`` (1 - busy_s / wall), ``step_s_median``, ``step_s_max``.
    """
    wall = float(run.summary.get("wall_s", NAN))
    rows = []
    for rank in sorted(run.ranks):
        cols = run.ranks[rank]
        attrs = run.rank_attrs.get(rank, {})
        steps = int(np.asarray(cols["step"]).size)
        row: dict[str, Any] = {
            "rank": rank,
            "hostname": attrs.get("hostname"),
            "slowdown": attrs.get("slowdown"),
            "steps": steps,
            "samples": int(np.sum(cols["samples"])),
        }
        totals = {p: float(np.sum(cols[f"t_{p}"], dtype=np.float64)) for p in PHASES}
        for p in PHASES:
            row[f"{p}_s"] = totals[p]
        for p in PHASES:
            row[f"{p}_fraction"] = _ratio(totals[p], wall)
        busy = sum(totals[p] for p in BUSY_PHASES)
        row["busy_s"] = busy
        row["busy_s_per_step"] = _ratio(busy, steps)
        row["wait_share"] = _ratio(totals["wait"], wall)
        row["idle_share"] = 1.0 - _ratio(busy, wall)
        durations = step_durations(cols)
        row["step_s_median"] = float(np.median(durations)) if steps else NAN
        row["step_s_max"] = float(np.max(durations)) if steps else NAN
        rows.append(row)
    return rows


# ---------------------------------------------------------------- per run


def _phase_metrics(run: Run, wall: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n_rows = sum(int(np.asarray(c["step"]).size) for c in run.ranks.values())
    n_ranks = len(run.ranks)
    sums = {p: float(np.sum(_concat(run, f"t_{p}"))) for p in PHASES}
    per_step = {p: _ratio(sums[p], n_rows) for p in PHASES}
    out["step_s_mean"] = float(sum(per_step.values())) if n_rows else NAN
    for p in PHASES:
        out[f"{p}_s_per_step"] = per_step[p]
    fractions = {p: _ratio(sums[p], n_ranks * wall) for p in PHASES}
    for p in PHASES:
        if f"{p}_fraction" not in REPORT_KEYS:
            out[f"{p}_fraction"] = fractions[p]
    out["untracked_fraction"] = 1.0 - sum(fractions.values())
    return out


def _straggler_metrics(ranks: list[dict[str, Any]], run: Run) -> dict[str, Any]:
    durations = np.concatenate([step_durations(c) for c in run.ranks.values()]) if run.ranks \
        else np.zeros(0)
    median = float(np.median(durations)) if durations.size else NAN
    biggest = float(np.max(durations)) if durations.size else NAN
    busy = np.array([r["busy_s_per_step"] for r in ranks], dtype=np.float64)
    ok = np.isfinite(busy)
    out: dict[str, Any] = {
        "step_s_median": median,
        "step_s_max": biggest,
        "step_max_over_median": _ratio(biggest, median),
        "busy_max_over_median": _ratio(float(np.max(busy[ok])), float(np.median(busy[ok])))
        if ok.any() else NAN,
        "slowest_rank": int(ranks[int(np.nanargmax(np.where(ok, busy, -np.inf)))]["rank"])
        if ok.any() else None,
    }
    for key in ("wait_share", "idle_share"):
        values = [r[key] for r in ranks if _finite(r[key])]
        out[f"{key}_max"] = float(max(values)) if values else NAN
    return out


def _comm_metrics(run: Run) -> dict[str, Any]:
    per_round = []
    rounds = []
    for cols in run.ranks.values():
        n = rounds_of(cols)
        exposed = float(np.sum(cols["t_comm"], dtype=np.float64)
                        + np.sum(cols["t_wait"], dtype=np.float64))
        rounds.append(n)
        per_round.append(_ratio(exposed, n))
    finite = [v for v in per_round if math.isfinite(v)]
    return {
        "rounds": float(np.mean(rounds)) if rounds else NAN,
        "exposed_comm_s_per_round": float(np.mean(finite)) if finite else NAN,
        "hidden_comm_fraction": NAN,  # needs the other runs: see add_hidden_comm
    }


def run_metrics(run: Run, target_accuracy: float | None = None) -> dict[str, Any]:
    """Every per-run column: ``schema.REPORT_KEYS``, ``path``, then :data:`NEW_KEYS`.

    The ``REPORT_KEYS`` values are those of ``syncbench report`` (the stored
    ``/summary``), except ``time_to_target_s`` when ``target_accuracy`` is
    given (recomputed from the evaluation rows). The scaling and
    hidden-communication columns are NaN until :func:`add_scaling` and
    :func:`add_hidden_comm` see the other runs.
    """
    summary = run.summary
    wall = float(summary.get("wall_s", NAN))
    row: dict[str, Any] = {}
    root = {"algorithm": run.algorithm, "world_size": run.world_size}
    for key in REPORT_KEYS:
        row[key] = root[key] if key in root else float(summary.get(key, NAN))
    row[PATH_KEY] = run.path

    target = target_accuracy
    if target is None:
        cfg_target = run.config.get("target_accuracy")
        target = float(cfg_target) if _finite(cfg_target) else None
    if target_accuracy is not None:
        row["time_to_target_s"] = time_to_target(run.eval, target_accuracy)

    acc = np.asarray(run.eval.get("accuracy", ()), dtype=np.float64)
    samples = int(sum(int(np.sum(c["samples"])) for c in run.ranks.values()))
    steps = sum(int(np.asarray(c["step"]).size) for c in run.ranks.values())
    ranks = rank_table(run)
    row.update(
        complete=bool(run.complete),
        repeats=1,
        model=run.model,
        dataset=run.dataset,
        samples=samples,
        steps=steps,
        samples_per_s_per_rank=_ratio(row["samples_per_s"], run.world_size),
        final_loss=float(summary.get("final_loss", NAN)),
        best_accuracy=float(np.nanmax(acc)) if acc.size and np.isfinite(acc).any() else NAN,
        target_accuracy=target,
        target_reached=None if target is None else int(_finite(row["time_to_target_s"])),
    )
    row.update(_phase_metrics(run, wall))
    row.update(_comm_metrics(run))
    row.update(_straggler_metrics(ranks, run))
    row.update(scaling=None, baseline_world_size=None, speedup=NAN, efficiency=NAN,
               speedup_wall=NAN, efficiency_wall=NAN)
    row["_config"] = run.config  # dropped by the formatters (keys starting with "_")
    return {k: row[k] for k in (*REPORT_KEYS, PATH_KEY, *NEW_KEYS, "_config")}


# ---------------------------------------------------------------- across runs


def group_value(row: dict[str, Any], key: str) -> Any:
    """Value of a ``--by`` key for one per-run row: a column, else a ``config`` flag."""
    if key in row and not key.startswith("_"):
        return row[key]
    value = row.get("_config", {}).get(key)
    return tuple(value) if isinstance(value, list) else value


def _median(values: Iterable[float]) -> float:
    arr = np.array([v for v in values if _finite(v)], dtype=np.float64)
    return float(np.median(arr)) if arr.size else NAN


def series_keys(by: Sequence[str] = (), series: Sequence[str] = ()) -> tuple[str, ...]:
    """Keys whose values define a scaling series (world_size never is one)."""
    keys: list[str] = []
    for k in (*SERIES_KEYS, *series, *by):
        if k != "world_size" and k not in keys:
            keys.append(k)
    return tuple(keys)


def _series_key(row: dict[str, Any], keys: Sequence[str]) -> tuple:
    return tuple((k, group_value(row, k)) for k in keys)


def _close(a: float, b: float) -> bool:
    return _finite(a) and _finite(b) and abs(a - b) <= WORK_RTOL * max(abs(a), abs(b))


def add_scaling(rows: list[dict[str, Any]], by: Sequence[str] = (),
                series: Sequence[str] = ()) -> None:
    """Fill the scaling columns of per-run rows in place (definitions: module docstring).

    A series is the runs with equal values of :func:`series_keys` (``by`` and
    ``series``: e.g. ``comm`` keeps blocking and overlapping SSGD apart).
    """
    keys = series_keys(by, series)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_series_key(row, keys), []).append(row)
    for members in groups.values():
        n0 = min(int(r["world_size"]) for r in members)
        base = [r for r in members if int(r["world_size"]) == n0]
        x0 = _median(r["samples_per_s"] for r in base)
        wall0 = _median(r["wall_s"] for r in base)
        work0 = _median(r["samples"] for r in base)
        if all(_close(r["samples"], work0) for r in members):
            kind = "strong"
        elif all(_close(r["samples"] / r["world_size"], work0 / n0) for r in members):
            kind = "weak"
        else:
            kind = "mixed"
        label = " ".join(
            [str(members[0].get("algorithm")),
             *(f"{k}={group_value(members[0], k)}" for k in keys if k not in SERIES_KEYS)])
        for r in members:
            n = int(r["world_size"])
            speedup = _ratio(r["samples_per_s"], x0)
            r["_series"] = (label, _series_key(r, keys))
            wall_ratio = _ratio(wall0, r["wall_s"])
            r["scaling"] = kind
            r["baseline_world_size"] = n0
            r["speedup"] = speedup
            r["efficiency"] = speedup * n0 / n
            if kind == "strong":
                r["speedup_wall"] = wall_ratio
                r["efficiency_wall"] = wall_ratio * n0 / n
            elif kind == "weak":
                r["speedup_wall"] = wall_ratio * n / n0
                r["efficiency_wall"] = wall_ratio
            else:
                r["speedup_wall"] = r["efficiency_wall"] = NAN


def is_blocking_reference(row: dict[str, Any]) -> bool:
    """A blocking SSGD run: the reference cost of one synchronisation round."""
    return row.get("algorithm") == "ssgd" and row.get("_config", {}).get("comm") == "blocking"


def _reference_key(row: dict[str, Any]) -> tuple:
    config = row.get("_config", {})
    return (row["world_size"], row["model"], row["dataset"], config.get("batch_size"),
            config.get("slowdown"), config.get("slowdown_schedule"))


def add_hidden_comm(rows: list[dict[str, Any]]) -> None:
    """Fill ``hidden_comm_fraction`` of per-run rows in place (module docstring).

    The reference must match N, model, dataset, ``--batch-size``,
    ``--slowdown`` and ``--slowdown-schedule``; at N = 1 there is nothing to
    hide and the fraction is NaN.
    """
    refs: dict[tuple, list[float]] = {}
    for row in rows:
        if is_blocking_reference(row):
            refs.setdefault(_reference_key(row), []).append(row["exposed_comm_s_per_round"])
    for row in rows:
        ref = _median(refs.get(_reference_key(row), ()))
        hidden = 1.0 - _ratio(row["exposed_comm_s_per_round"], ref)
        row["hidden_comm_fraction"] = hidden if row["world_size"] > 1 else NAN


def table_rows(runs: Sequence[Run], by: Sequence[str] = (),
               target_accuracy: float | None = None,
               series: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Per-run rows of ``runs`` (input order) with scaling and hidden-comm filled."""
    rows = [run_metrics(run, target_accuracy) for run in runs]
    add_scaling(rows, by, series)
    add_hidden_comm(rows)
    return rows


def _sort_key(values: tuple) -> tuple:
    return tuple((v is None, str(type(v).__name__), v if v is not None else 0) for v in values)


def _merge_labels(values: list[Any]) -> Any:
    unique = []
    for v in values:
        if v not in unique:
            unique.append(v)
    if len(unique) == 1:
        return unique[0]
    if all(isinstance(v, str) for v in unique):
        return "|".join(sorted(unique))
    return None


def _spread(key: str, values: list[Any]) -> tuple[float, float, float]:
    """(median, min, max) of one numeric column over a group's runs."""
    arr = np.array([v if _finite(v) else NAN for v in values], dtype=np.float64)
    if key == "time_to_target_s":  # a missed target is infinitely slow
        arr = np.where(np.isnan(arr), np.inf, arr)
        if not arr.size:
            return NAN, NAN, NAN
        med, lo, hi = (float(f(arr)) for f in (np.median, np.min, np.max))
        return tuple(v if math.isfinite(v) else NAN for v in (med, lo, hi))  # type: ignore
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return NAN, NAN, NAN
    return float(np.median(arr)), float(np.min(arr)), float(np.max(arr))


def aggregate(rows: Sequence[dict[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """One row per distinct value of the ``by`` keys, sorted by them (module docstring).

    Label columns keep the common value (strings that differ are joined with
    ``|``), ``complete`` is True only if every run is complete, ``repeats``
    counts the runs, ``target_reached`` counts the runs that reached the
    target and ``path`` becomes the list of the group's files.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(group_value(row, k) for k in by), []).append(row)
    out = []
    for values in sorted(groups, key=_sort_key):
        members = groups[values]
        g: dict[str, Any] = {}
        for key in (*REPORT_KEYS, PATH_KEY, *NEW_KEYS):
            column = [m[key] for m in members]
            if key == PATH_KEY:
                g[key] = column
            elif key == "complete":
                g[key] = all(column)
            elif key == "repeats":
                g[key] = len(members)
            elif key == "target_reached":
                g[key] = None if all(v is None for v in column) else sum(v or 0 for v in column)
            elif key in _LABEL_KEYS:
                g[key] = _merge_labels(column)
            else:
                med, lo, hi = _spread(key, column)
                g[key] = med
                if key in SPREAD_KEYS:
                    g[f"{key}_min"], g[f"{key}_max"] = lo, hi
        for key, value in zip(by, values, strict=True):
            if key not in g:
                g[key] = value
        out.append(g)
    return out
