"""Tidy tables from run files: per-run metrics, per-rank breakdown, repeats, scaling.

Only NumPy on the columns of :mod:`~syncbench.analysis.runfile` (no MPI).
Every number below is computed from the recorded per-rank step rows
(``t_<phase>`` seconds, ``samples``, ``local_steps``, ``round``), the
evaluation rows and the ``/summary`` attributes of ``syncbench/1`` files.
Notation: N = world size of a run, ``wall`` = its ``wall_s`` (training time,
evaluation excluded), X = its ``samples_per_s`` (all ranks' samples / wall).

Sync share (leads every table)
    ``sync_fraction = comm_fraction + wait_fraction``: the share of all ranks'
    wall time spent synchronising. The split between the two depends on the
    MPI call, not on what the time was spent on: a blocking ``Allreduce``
    (blocking SSGD, Local SGD's averaging) charges the whole call, including
    waiting for a slow rank, to ``comm``; ``Wait``/``Waitall``/``Test`` on a
    nonblocking request (SSGD overlap, OD-SGD, Oscars) charge it to ``wait``.
    Compare strategies on ``sync``; read ``comm`` and ``wait`` second.

Time breakdown (per run, over every recorded row of every rank)
    ``<phase>_s_per_step``: mean seconds of the phase per step (mean over all
    rows of all ranks); ``step_s_mean`` is their sum, the mean step time.
    ``<phase>_fraction``: seconds of the phase summed over all ranks divided by
    ``N_recorded * wall`` (the share of all ranks' wall time; for ``comm`` and
    ``wait`` this is exactly the ``/summary`` definition).
    ``untracked_fraction`` = 1 - the sum of the six phase fractions: time in
    no recorded step (``finish()``'s drain, gaps between steps).

Hidden communication, from step time (needs a blocking reference in the set)
    Warm-up rows are excluded everywhere here: the first ``warmup_steps`` steps
    of each rank (root attribute; OD-SGD's blocking warm-up; 0 when absent).
    ``steady_step_s`` (T) is the mean duration of the remaining rows, pooled
    over ranks (rank-time per step), ``sync_s_per_step`` their mean
    ``t_comm + t_wait``. The reference is the blocking SSGD runs
    (``algorithm == "ssgd"`` and ``--comm blocking``) of the same scenario
    (:func:`reference_key`: N, model, dataset, MPI library, backend, batch,
    budget, dtype, slowdowns and their mode), not overlapped with another run;
    T_ref and C_ref are the medians of their T and sync per step. Only SSGD
    and OD-SGD runs that neither diverged nor overlapped get a value (NaN
    otherwise): Local SGD, Oscars and ASGD communicate less per step, which is
    a different algorithm, not hidden communication. A blocking
    Allreduce hides nothing, so C_ref is the full price of synchronising once:
    ``hidden_comm_fraction = (T_ref - T) / C_ref`` (:func:`hidden_fraction`):
    0 for the reference itself, 1 when the run steps as fast as the
    reference would without communicating, negative when it is slower than
    blocking. It sees every cost of overlapping (compute and update slowed by
    the communication in flight, polling), which ``1 - (comm + wait) / C_ref``
    would not. NaN without a reference and at N = 1 (nothing to hide).
    ``exposed_comm_s_per_round`` (older column) is the mean over ranks of
    ``t_comm + t_wait`` per synchronisation round (one step for
    step-synchronous algorithms, one value of ``round`` for round-based ones).

Stragglers (per run)
    ``step_s_median`` / ``step_s_max``: median / max step duration (sum of the
    six phases of one row) over every row of every rank; ``step_max_over_median``
    is their ratio (the tail of the step-time distribution).
    A rank's *busy* time is its own work: data, compute, update and delay
    (not ``wait``, and not ``comm``: a blocking ``Allreduce`` charges waiting
    for the slowest rank to ``comm``, so counting it would make every rank
    look as busy as the straggler); ``busy_max_over_median`` = busy seconds per step of the
    slowest rank / the median over the OTHER ranks (:func:`straggler_ratio`:
    1 = balanced, 4 = one rank 4x slower than the rest, at any N; NaN at
    N = 1), and ``slowest_rank`` that rank. Per rank, ``wait_share`` =
    wait seconds / wall and ``idle_share`` = 1 - busy seconds / wall (waiting,
    communication and untracked time); ``wait_share_max`` / ``idle_share_max`` are their
    maxima over ranks.

Accuracy and divergence
    ``final_accuracy`` / ``final_loss`` of the last evaluation, ``best_accuracy``
    the highest; ``time_to_target_s`` is the ``/summary`` value, or, when a
    target is given here, the ``t`` of the first evaluation with
    ``accuracy >= target`` (NaN if never reached; ``target_reached`` 1 or 0).
    It can only take evaluation times: ``eval_interval_s``, the median
    training time between evaluations, is its resolution. ``diverged`` is the
    ``/summary`` flag (non-finite loss or final accuracy <= 1.5x chance;
    recomputed from the rows for older files,
    :func:`syncbench.analysis.summary.run_diverged`): a diverged run gets no
    time to target, speedup, efficiency or hidden communication in the
    tables, its samples/s are left out of group medians (a group whose runs
    all diverged shows "diverged"), and it never counts as faster.

Contaminated timings
    ``overlapped``: the run's wall-clock interval ``[t_begin_unix,
    t_end_unix]`` intersects another run's in the set on a shared host
    (:func:`syncbench.analysis.context.overlapping_runs`; ``overlaps_with``
    names them). Its timings are not comparable: it gets no speedup or
    efficiency, serves as no baseline and no hidden-communication reference.
    ``cores``, ``ranks_per_core``, ``oversubscribed`` come from
    :func:`~syncbench.analysis.context.machine_context`, and so does
    ``loaded``: other processes used more than
    :data:`~syncbench.analysis.context.LOADED_SHARE` of the hosts' cores
    during the run (``foreign_cpu_share``, root attribute of the same name:
    the hosts' busy CPU time less the run's own, over wall time x cores),
    i.e. something outside the run competed for the CPUs (None in older
    files).

Incomplete runs
    ``complete`` is False on a run that did not consume its whole sample
    budget: stopped by a signal at a step boundary (``stopped_by``, the
    signal's name: "stopped by SIGTERM") or rebuilt by ``syncbench recover``
    from the parts of a job that died (``stopped_by`` "": "partial
    (recovered)"); :func:`incomplete_reason` names it. ``resumes`` counts the
    run's continuations with ``--resume``. Its accuracy, time to target and
    samples/s are not comparable with complete runs: like an overlapped run
    it gets no speedup, efficiency (both forms) or hidden communication, is no
    scaling baseline and no hidden-communication reference, and does not
    decide a series' scaling kind. A group (``--by``) with an incomplete run
    gets none of these either (``complete`` False; ``stopped_by`` joins its
    runs' signals, ``resumes`` sums theirs).

Scaling
    A *series* is the runs with equal :func:`series_identity`: algorithm,
    model, dataset, MPI library, backend, simulated, every ``config`` flag
    but :data:`NON_IDENTITY_FLAGS` and other strategies' options (root
    attributes ``option_flags`` less ``strategy_flags``; older files: none
    left out) (so dtype, slowdowns and their mode, the
    strategy's own flags such as ``comm``), the scaling mode and the batch
    and budget as that mode defines them (strong: global batch and total
    ``epochs``; weak: per-rank batch and ``epochs / N``; unrecorded:
    per-rank batch and total ``epochs``), plus any ``--by`` / ``--series``
    key. ``series`` is its label (the algorithm and the identity parts that
    differ between that algorithm's series). Baseline N0 = the smallest N of
    the series among its runs that neither overlapped nor diverged; X0 /
    wall0 / work0 = the medians over those runs at N0 of samples/s, wall and
    total samples.
    ``scaling`` is the kind: the run files' ``scaling_mode`` root attribute
    (recorded by ``syncbench sweep`` / ``train --scaling-mode``) when every
    run of the series records the same one and the samples agree (strong:
    total samples within 1 % of work0; weak: samples per rank within 1 % of
    work0 / N0; or within the rounding of the budget to whole steps: one
    step of every rank, resp. of one rank), ``mixed`` when they do not;
    without a record, ``strong`` or
    ``weak`` as the samples say, else ``mixed``.
    ``speedup = X / X0`` and ``efficiency = speedup * N0 / N`` for both kinds.
    Under *strong* scaling (the same total samples at every N)
    ``X / X0 = wall0 / wall``: the classic T(N0) / T(N). Under *weak* scaling
    (the same samples per rank) ``efficiency = (X / N) / (X0 / N0)``, the
    ratio of throughput per rank, which equals ``wall0 / wall``; ``speedup``
    is then the scaled (Gustafson) speedup. The wall-time forms check that:
    strong ``speedup_wall = wall0 / wall``, weak ``efficiency_wall = wall0 /
    wall``, and in both ``efficiency_wall = speedup_wall * N0 / N``.
    Speedup and efficiency are NaN (shown ``-``) for a series with a single
    world size (no baseline), a ``mixed`` series, an incomplete run, and an
    overlapped or diverged run (shown ``overlapped`` / ``diverged``); the
    baseline and the kind are taken from the series' complete runs only.

Repeats (``--by KEY,...``)
    Runs with equal values of the keys form a group; every numeric column of a
    group row is the median over its runs, and the columns of
    :data:`SPREAD_KEYS` also get ``<key>_min`` / ``<key>_max``. NaN values are
    ignored, except ``time_to_target_s``, where a run that missed the target
    or diverged counts as infinitely slow (median NaN when half or more did).
    ``diverged`` and ``overlapped`` count the group's runs that were.
    ``complete`` is True only if every run of the group is; a group with an
    incomplete run gets no speedup, efficiency or hidden communication (NaN),
    whatever its complete runs' values.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import fairness
from .context import machine_context, overlapping_runs
from .labels import run_label
from .runfile import Run
from .schema import (
    FINAL_LOCAL_ACCURACY,
    PHASES,
    REPORT_KEYS,
    SCALING_MODE_ATTR,
    STRATEGY_FLAGS_ATTRS,
)
from .summary import run_diverged, time_to_target

NAN = float("nan")
PATH_KEY = "path"

#: Statistic of the realised slowdown factor in every table (per-step medians: robust to
#: the preemption noise of a shared machine, see fairness.realised_factors).
REALISED_STATISTIC = "median"

#: Phases counted as a rank's own work: not ``wait``, and not ``comm`` either, since a
#: blocking Allreduce charges the time spent waiting for a slow rank to ``comm``.
BUSY_PHASES: tuple[str, ...] = ("data", "compute", "update", "delay")

#: Keys that may be used in ``--by``: root attributes, or any ``config`` flag.
ROOT_GROUP_KEYS: tuple[str, ...] = ("algorithm", "world_size", "model", "dataset", "backend",
                                    "mpi_library", "scaling_mode")

#: Root attributes that are part of a scaling series' identity.
SERIES_ROOT_KEYS: tuple[str, ...] = ("algorithm", "model", "dataset", "mpi_library", "backend",
                                     "simulated")

#: ``config`` flags that say nothing about the work or how it is synchronised:
#: left out of a series' identity (repeats with other seeds, outputs, reliability).
#: ``batch_size`` and ``epochs`` enter it as the scaling mode's batch and budget.
NON_IDENTITY_FLAGS: frozenset[str] = frozenset({
    "out", "overwrite", "progress", "seed", "eval_every", "target_accuracy", "timeout",
    "flush_every", "checkpoint_every", "resume", "save_model", "inject_fault", "data_dir",
    "device", "func", "algorithm", "model", "dataset", "batch_size", "epochs", "scaling_mode",
    "command", "train_args",
})

#: ``config`` flags of the scenario a hidden-communication reference must share
#: (with N, model, dataset, MPI library, backend): not the strategy's own flags.
REFERENCE_FLAGS: tuple[str, ...] = (
    "batch_size", "epochs", "dtype", "slowdown", "slowdown_schedule", "slowdown_mode",
    "synthetic_samples", "cuda_aware",
)

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
    # added later (after every older key, so old readers see the same prefix)
    "sync_fraction", "diverged", "eval_interval_s", "warmup_steps", "steady_step_s",
    "sync_s_per_step", "overlapped", "overlaps_with", "series", "mpi_library", "backend",
    "scaling_mode", "cores", "ranks_per_core", "oversubscribed", "simulated", "loaded",
    "foreign_cpu_share",
    # --eval-model both: every rank's own weights on its test shard (/summary; NaN without)
    "final_local_accuracy",
)

#: Columns that get ``_min`` / ``_max`` companions in group rows.
SPREAD_KEYS: tuple[str, ...] = (
    "samples_per_s", "wall_s", "final_accuracy", "time_to_target_s", "comm_fraction",
    "wait_fraction", "hidden_comm_fraction", "step_s_median", "step_max_over_median",
    "speedup", "efficiency", "sync_fraction",
)

# Columns that are labels, not measurements (never medians).
_LABEL_KEYS = frozenset(
    {"algorithm", "world_size", "model", "dataset", "scaling", "complete", "repeats",
     PATH_KEY, "baseline_world_size", "slowest_rank", "target_accuracy", "target_reached",
     "diverged", "overlapped", "overlaps_with", "series", "mpi_library", "backend",
     "scaling_mode", "cores", "ranks_per_core", "oversubscribed", "simulated", "warmup_steps",
     "loaded"}
)


#: The columns that compare a run with a baseline or reference run: never computed from
#: an incomplete run (as the run, as the baseline, or in a group with one).
BASELINE_RATIO_KEYS: tuple[str, ...] = (
    "speedup", "efficiency", "speedup_wall", "efficiency_wall", "hidden_comm_fraction",
)


def incomplete_reason(complete: Any, stopped_by: Any = "") -> str:
    """Why a run is incomplete: ``"stopped by SIGTERM"`` (a signal stopped it at a step
    boundary) or ``"partial (recovered)"`` (``syncbench recover`` rebuilt it from the
    parts of a job that died); "" for a complete run."""
    if complete is None or bool(complete):
        return ""
    return f"stopped by {stopped_by}" if stopped_by else "partial (recovered)"


def _incomplete(row: dict[str, Any]) -> bool:
    return row.get("complete") is False


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


# ---------------------------------------------------------------- steady state


def steady_step_times(run: Run) -> tuple[float, float, int]:
    """(T, C, rows): mean step seconds and mean sync (comm + wait) seconds per step.

    Pooled over every rank's rows after the warm-up (:func:`fairness.warmup_steps`), so
    ranks that take more steps weigh more: T is the rank-time per step, the
    inverse of throughput per rank. NaN, NaN, 0 when no row is left.
    """
    if not run.ranks:
        return NAN, NAN, 0
    keep = _concat(run, "step") >= fairness.warmup_steps(run)  # every rank's rows at once
    rows = int(np.count_nonzero(keep))
    if not rows:
        return NAN, NAN, 0
    phases = {p: _concat(run, f"t_{p}")[keep] for p in PHASES}
    total = float(np.sum(np.sum([phases[p] for p in PHASES], axis=0)))
    sync = float(np.sum(phases["comm"]) + np.sum(phases["wait"]))
    return total / rows, sync / rows, rows


def hidden_fraction(step_s: float, ref_step_s: float, ref_sync_s: float) -> float:
    """Hidden communication from step time: ``(T_ref - T) / C_ref``.

    ``T`` is the step time of the run, ``T_ref`` and ``C_ref`` the step time and
    the sync (comm + wait) time per step of a blocking SSGD reference measured
    in the same scenario. A blocking Allreduce hides nothing, so ``C_ref`` is
    the full price of synchronising once: 1 means the whole price was hidden
    (the run steps as fast as the reference would without communication), 0
    means nothing was, negative values mean the run is slower than blocking
    (its overlap slowed compute or update, polling cost more than it hid).
    Unlike ``1 - (comm + wait) / C_ref`` this sees every cost of overlapping.
    NaN when an input is not finite or ``C_ref <= 0``.
    """
    if not (_finite(step_s) and _finite(ref_step_s) and _finite(ref_sync_s)) or ref_sync_s <= 0:
        return NAN
    return (float(ref_step_s) - float(step_s)) / float(ref_sync_s)


def comm_compute_ratio(step_s: float, sync_s: float) -> float:
    """A blocking SSGD run's synchronisation per step over its local work per step.

    ``sync_s`` (comm + wait per step) over ``step_s - sync_s`` (data, compute,
    update, delay), both from :func:`steady_step_times`: how many times a
    step's computation one Allreduce of the gradient costs, the regime a
    comparison is made in (below 1 an overlap can hide all of it, above it
    at most the compute's share). NaN when an input is not finite or the
    local part is not positive.
    """
    if not (_finite(step_s) and _finite(sync_s)) or step_s - sync_s <= 0:
        return NAN
    return float(sync_s) / (float(step_s) - float(sync_s))


def hidden_communication(run: Run, references: Sequence[Run]) -> float:
    """:func:`hidden_fraction` of ``run`` against blocking SSGD ``references``.

    The references are runs of the same scenario (same N, model, data, batch,
    MPI, backend, dtype, slowdowns, budget: the caller chooses them, e.g.
    :func:`reference_key`); T_ref and C_ref are the medians of their
    :func:`steady_step_times`. Warm-up rows are excluded on both sides. NaN
    at N = 1 (nothing to hide) or without references.
    """
    if run.world_size <= 1 or not references:
        return NAN
    step_s, _, _ = steady_step_times(run)
    ref = [steady_step_times(r) for r in references]
    return hidden_fraction(step_s, _median(t for t, _, _ in ref), _median(c for _, c, _ in ref))


# ---------------------------------------------------------------- per rank


def rank_table(run: Run) -> list[dict[str, Any]]:
    """One row per recorded rank: phase seconds and shares, busy/idle, step times.

    Keys: ``rank``, ``hostname``, ``slowdown``, ``slowdown_mode``,
    ``slowdown_realised`` (:func:`syncbench.analysis.fairness.realised_factors`
    with :data:`REALISED_STATISTIC`, computed from the rows, never the stored
    attribute: one definition; 1.0 for an unslowed rank), ``steps``, ``samples``,
    ``<phase>_s`` (total seconds), ``<phase>_fraction`` (total / wall),
    ``busy_s`` (data + compute + update + delay), ``busy_s_per_step``, ``wait_share``,
    ``idle_share`` (1 - busy_s / wall), ``step_s_median``, ``step_s_max``.
    """
    wall = float(run.summary.get("wall_s", NAN))
    realised = fairness.realised_factors(run, REALISED_STATISTIC)
    order = sorted(run.ranks)
    v = rank_vectors(run, order)
    with np.errstate(divide="ignore", invalid="ignore"):
        ok_wall = _finite(wall) and wall != 0
        fraction = {p: (v[p] / wall if ok_wall else np.full(len(order), NAN)) for p in PHASES}
        busy = np.sum([v[p] for p in BUSY_PHASES], axis=0) if order else np.zeros(0)
        per_step = np.where(v["steps"] > 0, busy / np.where(v["steps"] > 0, v["steps"], 1), NAN)
    busy_frac = busy / wall if ok_wall else np.full(len(order), NAN)
    columns = {
        "steps": v["steps"].tolist(), "samples": v["samples"].tolist(),
        **{f"{p}_s": v[p].tolist() for p in PHASES},
        **{f"{p}_fraction": _nan_if_inf(fraction[p]).tolist() for p in PHASES},
        "busy_s": busy.tolist(), "busy_s_per_step": _nan_if_inf(per_step).tolist(),
        "wait_share": _nan_if_inf(fraction["wait"]).tolist(),
        "idle_share": (1.0 - _nan_if_inf(busy_frac)).tolist(),
        "step_s_median": v["step_s_median"].tolist(), "step_s_max": v["step_s_max"].tolist(),
    }
    rows = []
    for i, rank in enumerate(order):
        attrs = run.rank_attrs.get(rank, {})
        row: dict[str, Any] = {
            "rank": rank,
            "hostname": attrs.get("hostname"),
            "slowdown": attrs.get("slowdown"),
            "slowdown_mode": attrs.get("slowdown_mode"),
            "slowdown_realised": realised.get(rank, 1.0 if attrs.get("slowdown") is not None
                                              else None),
        }
        for key, values in columns.items():
            row[key] = values[i]
        rows.append(row)
    return rows


def _nan_if_inf(values: np.ndarray) -> np.ndarray:
    """NaN where not finite (a ratio with a zero or non-finite operand, as :func:`_ratio`)."""
    return np.where(np.isfinite(values), values, NAN)


def rank_vectors(run: Run, order: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-rank figures of ``order``'s ranks as arrays (one entry per rank).

    ``steps``, ``samples`` (totals), one entry per phase (total seconds),
    ``step_s_median`` / ``step_s_max`` (of :func:`step_durations`; NaN for a
    rank without rows). When every rank has the same number of rows (a
    lock-step run) the columns are stacked into one ranks x steps array and
    reduced along the rows: a 16,384-rank file costs a few vectorised
    operations instead of tens of NumPy calls per rank.
    """
    cols = [run.ranks[r] for r in order]
    lengths = np.array([np.asarray(c["step"]).size for c in cols], dtype=np.int64)
    out: dict[str, np.ndarray] = {"steps": lengths}
    if cols and lengths.min() == lengths.max() and lengths[0] > 0:
        stack = {p: np.array([c[f"t_{p}"] for c in cols], dtype=np.float64) for p in PHASES}
        out["samples"] = np.array([c["samples"] for c in cols]).sum(axis=1).astype(np.int64)
        for p in PHASES:
            out[p] = stack[p].sum(axis=1)
        durations = np.sum([stack[p] for p in PHASES], axis=0)
        out["step_s_median"] = np.median(durations, axis=1)
        out["step_s_max"] = durations.max(axis=1)
        return out
    out["samples"] = np.array([int(np.sum(c["samples"])) for c in cols], dtype=np.int64)
    for p in PHASES:
        out[p] = np.array([float(np.sum(c[f"t_{p}"], dtype=np.float64)) for c in cols])
    durations = [step_durations(c) for c in cols]
    out["step_s_median"] = np.array([float(np.median(d)) if d.size else NAN for d in durations])
    out["step_s_max"] = np.array([float(np.max(d)) if d.size else NAN for d in durations])
    return out


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


def straggler_ratio(busy: Sequence[float] | np.ndarray) -> float:
    """Busy seconds per step of the slowest rank over the median of the OTHER ranks.

    1 = balanced, 4 = one rank four times slower than the others, at any N
    (with 2 ranks a median over all ranks would be the mean and stay below 2).
    NaN with fewer than two finite values or a zero median.
    """
    values = np.asarray([v for v in busy if _finite(float(v))], dtype=np.float64)
    if values.size < 2:
        return NAN
    slowest = int(np.argmax(values))
    return _ratio(float(values[slowest]), float(np.median(np.delete(values, slowest))))


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
        "busy_max_over_median": straggler_ratio(busy[ok]),
        "slowest_rank": int(ranks[int(np.nanargmax(np.where(ok, busy, -np.inf)))]["rank"])
        if ok.any() else None,
    }
    for key in ("wait_share", "idle_share"):
        values = [r[key] for r in ranks if _finite(r[key])]
        out[f"{key}_max"] = float(max(values)) if values else NAN
    return out


def _comm_metrics(run: Run) -> dict[str, Any]:
    cols = list(run.ranks.values())
    lengths = np.array([np.asarray(c["step"]).size for c in cols], dtype=np.int64)
    if cols and lengths.min() > 0 and not np.any(_concat(run, "local_steps") > 0):
        # lock-step (no rank ran local steps): one round per row, sums by segment
        rounds = lengths.tolist()
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        exposed = (np.add.reduceat(_concat(run, "t_comm"), starts)
                   + np.add.reduceat(_concat(run, "t_wait"), starts))
        per_round = (exposed / lengths).tolist()
    else:
        rounds, per_round = [], []
        for c in cols:
            n = rounds_of(c)
            rounds.append(n)
            per_round.append(_ratio(float(np.sum(c["t_comm"], dtype=np.float64)
                                          + np.sum(c["t_wait"], dtype=np.float64)), n))
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
    root = {"algorithm": run_label(run.attrs), "world_size": run.world_size,
            "stopped_by": run.stopped_by, "resumes": run.resumes}
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
        final_local_accuracy=float(run.summary_extra.get(FINAL_LOCAL_ACCURACY, NAN)),
        best_accuracy=float(np.nanmax(acc)) if acc.size and np.isfinite(acc).any() else NAN,
        target_accuracy=target,
        target_reached=None if target is None else int(_finite(row["time_to_target_s"])),
    )
    row.update(_phase_metrics(run, wall))
    row.update(_comm_metrics(run))
    row.update(_straggler_metrics(ranks, run))
    row.update(scaling=None, baseline_world_size=None, speedup=NAN, efficiency=NAN,
               speedup_wall=NAN, efficiency_wall=NAN)
    steady_s, sync_s, _ = steady_step_times(run)
    ctx = machine_context(run)
    t_eval = np.asarray(run.eval.get("t", ()), dtype=np.float64)
    row.update(
        sync_fraction=_sum_finite(row["comm_fraction"], row["wait_fraction"]),
        diverged=run_diverged(run),
        eval_interval_s=float(np.median(np.diff(t_eval))) if t_eval.size > 1 else NAN,
        warmup_steps=fairness.warmup_steps(run),
        steady_step_s=steady_s,
        sync_s_per_step=sync_s,
        overlapped=False,
        overlaps_with=None,
        series=None,
        mpi_library=run.attrs.get("mpi_library"),
        backend=run.attrs.get("backend"),
        scaling_mode=scaling_mode(run),
        cores=ctx["cores"],
        ranks_per_core=ctx["ranks_per_core"],
        oversubscribed=ctx["oversubscribed"],
        simulated=ctx["simulated"],
        loaded=ctx["loaded"],
        foreign_cpu_share=NAN if ctx["foreign_cpu_share"] is None else ctx["foreign_cpu_share"],
    )
    row["_config"] = run.config  # dropped by the formatters (keys starting with "_")
    row["_attrs"] = {k: run.attrs.get(k) for k in (*SERIES_ROOT_KEYS, "hostnames",
                                                   "t_begin_unix", "t_end_unix",
                                                   *STRATEGY_FLAGS_ATTRS)}
    row["_context"] = ctx
    row["_ranks"] = ranks  # the report's per-rank table (report.report_tables)
    # each rank's nominal slowdown, --slowdown's and its node's CPU quota's (reference_key)
    row["_nominal"] = tuple(round(f, 6) for _, f in sorted(fairness.nominal_factors(run).items()))
    return {k: row[k] for k in (*REPORT_KEYS, PATH_KEY, *NEW_KEYS, "_config", "_attrs",
                                "_context", "_ranks", "_nominal")}


def _sum_finite(a: float, b: float) -> float:
    return float(a) + float(b) if _finite(a) and _finite(b) else NAN


def scaling_mode(run: Run) -> str | None:
    """The recorded ``scaling_mode`` root attribute ("strong" or "weak"), else None."""
    value = run.attrs.get(SCALING_MODE_ATTR)
    return value if value in ("strong", "weak") else None


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
    """Extra keys (``--by``, ``--series``) that split scaling series; never world_size."""
    keys: list[str] = []
    for k in (*series, *by):
        if k != "world_size" and k not in keys:
            keys.append(k)
    return tuple(keys)


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _mode_of(row: dict[str, Any]) -> str:
    return row.get("scaling_mode") or "unrecorded"


def series_identity(row: dict[str, Any], extra: Sequence[str] = ()) -> tuple:
    """What must be equal for two runs to be points of one scaling series.

    The root attributes :data:`SERIES_ROOT_KEYS` (algorithm, model, dataset,
    MPI library, backend, simulated), every ``config`` flag except
    :data:`NON_IDENTITY_FLAGS` and another strategy's options
    (:func:`other_strategy_flags`; so dtype, slowdowns and their mode, the
    strategy's own flags such as ``comm`` or ``overlap``), the recorded scaling
    mode, and the batch and sample budget as that mode defines them:

    - ``strong``: the global batch (``batch_size * N``) and the total budget
      (``epochs``, passes over the training set);
    - ``weak``: the per-rank batch and the budget per rank (``epochs / N``);
    - not recorded: the per-rank batch and the total budget (``epochs``).

    ``extra`` adds ``--by`` / ``--series`` keys (see :func:`group_value`).
    """
    config = row.get("_config", {})
    attrs = row.get("_attrs", {})
    n = int(row["world_size"])
    mode = _mode_of(row)
    batch, epochs = config.get("batch_size"), config.get("epochs")
    if mode == "strong" and _finite(batch):
        batch_key = ("batch", f"{int(batch) * n} global")
    else:
        batch_key = ("batch", f"{batch}/rank")
    if mode == "weak" and _finite(epochs):
        budget_key = ("budget", f"{round(float(epochs) / n, 9):g} epochs/rank")
    else:
        budget_key = ("budget", f"{epochs:g} epochs" if _finite(epochs) else f"{epochs} epochs")
    key = [("scaling_mode", mode), batch_key, budget_key]
    key += [(k, _hashable(attrs.get(k, row.get(k)))) for k in SERIES_ROOT_KEYS]
    others = other_strategy_flags(attrs)
    key += [(k, _hashable(v)) for k, v in sorted(config.items())
            if k not in NON_IDENTITY_FLAGS and not k.startswith("_") and k not in others]
    key += [(f"by:{k}", _hashable(group_value(row, k))) for k in extra]
    return tuple(key)


def _name_list(value: Any) -> set[str] | None:
    """A recorded JSON list of names (or an already decoded list); None if absent or bad."""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return set(value)
    return None


def other_strategy_flags(attrs: dict[str, Any]) -> frozenset[str]:
    """``config`` keys that are options of a strategy other than the run's own.

    From the root attributes ``option_flags`` (every registered strategy's
    options) less ``strategy_flags`` (the run's strategy's), both recorded by
    the training driver: a run's config carries every strategy's defaults,
    and a change in another strategy's default must not split a series.
    Empty for files without them (every flag then counts, as before).
    """
    own, every = (_name_list(attrs.get(k)) for k in STRATEGY_FLAGS_ATTRS)
    return frozenset() if own is None or every is None else frozenset(every - own)


def _close(a: float, b: float, slack: float = 0.0) -> bool:
    """Equal within :data:`WORK_RTOL`, or within ``slack`` (whole-step rounding)."""
    return _finite(a) and _finite(b) and \
        abs(a - b) <= max(WORK_RTOL * max(abs(a), abs(b)), slack)


def _batch_per_rank(row: dict[str, Any]) -> float:
    """Samples per step of one rank (0 when the run has no step)."""
    return float(row["samples"]) / row["steps"] if row.get("steps") else 0.0


def _series_labels(groups: dict[tuple, list[dict[str, Any]]]) -> dict[tuple, str]:
    """A short label per series: the algorithm plus the identity parts that differ."""
    by_algorithm: dict[Any, list[tuple]] = {}
    for key in groups:
        by_algorithm.setdefault(dict(key).get("algorithm"), []).append(key)
    labels = {}
    for keys in by_algorithm.values():
        labels.update(_labels_of(keys))
    return labels


def _labels_of(keys: list[tuple]) -> dict[tuple, str]:
    """Labels of one algorithm's series: the identity parts whose values differ."""
    varying: list[str] = []
    if len(keys) > 1:
        names = list(dict.fromkeys(name for key in keys for name, _ in key))
        for name in names:
            values = {dict(key).get(name, "<absent>") for key in keys}
            if len(values) > 1 and name != "algorithm":
                varying.append(name)
    labels = {}
    for key in keys:
        d = dict(key)
        parts = [str(d.get("algorithm"))]
        for name in varying:
            value = d.get(name, "-")
            if name == "mpi_library" and isinstance(value, str):
                value = " ".join(value.split()[:3]).rstrip(",")
            parts.append(f"{name.removeprefix('by:')}={value}")
        labels[key] = " ".join(parts)
    return labels


def _scaling_kind(members: list[dict[str, Any]], n0: int, work0: float) -> str:
    """strong / weak as recorded (checked against the samples), else as the samples say."""
    recorded = {_mode_of(r) for r in members}
    # a budget is rounded to whole steps per rank: allow one step of every rank
    # of the larger run (strong) or one step of a rank (weak) besides 1 %
    b = max((_batch_per_rank(r) for r in members), default=0.0)
    n_max = max(int(r["world_size"]) for r in members)
    strong = all(_close(r["samples"], work0, b * n_max) for r in members)
    weak = all(_close(r["samples"] / r["world_size"], work0 / n0, b) for r in members)
    if recorded == {"strong"}:
        return "strong" if strong else "mixed"
    if recorded == {"weak"}:
        return "weak" if weak else "mixed"
    return "strong" if strong else "weak" if weak else "mixed"


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


def add_scaling(rows: list[dict[str, Any]], by: Sequence[str] = (),
                series: Sequence[str] = ()) -> None:
    """Fill the scaling columns of per-run rows in place (definitions: module docstring).

    A series is the runs with equal :func:`series_identity` (plus the ``by`` and
    ``series`` keys). Its baseline N0 is the smallest N among its runs that did
    not overlap another run on their host and did not diverge. No speedup or
    efficiency (NaN) for: a series with a single world size, a ``mixed``
    series, a run that overlapped another one, a diverged run, an incomplete
    run (which is no baseline either and does not decide the kind).
    """
    extra = series_keys(by, series)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(series_identity(row, extra), []).append(row)
    labels = _series_labels(groups)
    for key, members in groups.items():
        label = labels[key]
        for r in members:
            r["_series"] = (label, key)
            r["series"] = label
        clean = [r for r in members if not r.get("overlapped") and not r.get("diverged")
                 and not _incomplete(r)]
        sizes = {int(r["world_size"]) for r in clean}
        if len(sizes) < 2:
            continue  # nothing to scale against: speedup and efficiency stay NaN
        n0 = min(sizes)
        base = [r for r in clean if int(r["world_size"]) == n0]
        x0 = _median(r["samples_per_s"] for r in base)
        wall0 = _median(r["wall_s"] for r in base)
        work0 = _median(r["samples"] for r in base)
        kind = _scaling_kind(clean, n0, work0)
        for r in members:
            r["scaling"] = kind
            r["baseline_world_size"] = n0
            if kind == "mixed" or r.get("overlapped") or r.get("diverged") \
                    or _incomplete(r):
                continue
            n = int(r["world_size"])
            speedup = _ratio(r["samples_per_s"], x0)
            wall_ratio = _ratio(wall0, r["wall_s"])
            r["speedup"] = speedup
            r["efficiency"] = speedup * n0 / n
            if kind == "strong":
                r["speedup_wall"] = wall_ratio
                r["efficiency_wall"] = wall_ratio * n0 / n
            else:
                r["speedup_wall"] = wall_ratio * n / n0
                r["efficiency_wall"] = wall_ratio


def is_blocking_reference(row: dict[str, Any]) -> bool:
    """A blocking SSGD run: the reference cost of one synchronisation round."""
    return row.get("algorithm") == "ssgd" and row.get("_config", {}).get("comm") == "blocking"


def reference_key(row: dict[str, Any]) -> tuple:
    """The scenario a hidden-communication reference must share with a run.

    N, model, dataset, MPI library, backend, simulated, the ``config``
    flags :data:`REFERENCE_FLAGS` (batch, budget, dtype, slowdowns and their
    mode, synthetic size, CUDA-awareness) and each rank's nominal factor
    (``--slowdown`` over its node's speed: a node slowed by the kernel's
    CPU quota has no train flag to tell it apart): everything but the strategy.
    """
    config = row.get("_config", {})
    attrs = row.get("_attrs", {})
    return (row["world_size"], row.get("_nominal"),
            *(_hashable(attrs.get(k, row.get(k))) for k in SERIES_ROOT_KEYS if k != "algorithm"),
            *(_hashable(config.get(k)) for k in REFERENCE_FLAGS))


#: Strategies whose hidden communication is measured: the same synchronisation as
#: blocking SSGD per step, only overlapped (the others communicate less, by design).
HIDDEN_COMM_ALGORITHMS: frozenset[str] = frozenset({"ssgd", "odsgd"})

#: Group-row columns whose medians leave diverged runs out (a diverged run's speed is
#: no result); time to target counts them as infinitely slow instead.
DIVERGED_EXCLUDED_KEYS: frozenset[str] = frozenset(
    {"samples_per_s", "samples_per_s_per_rank", "hidden_comm_fraction"})


def add_hidden_comm(rows: list[dict[str, Any]]) -> None:
    """Fill ``hidden_comm_fraction`` of per-run rows in place.

    :func:`hidden_fraction` of the run's steady step time against the median
    step and sync times of the blocking SSGD runs with the same
    :func:`reference_key`; runs that overlapped another on their host, diverged or
    are incomplete are not used as references. NaN at N = 1 (nothing to hide),
    without a reference, for a diverged, overlapped or incomplete run, and for
    strategies other than :data:`HIDDEN_COMM_ALGORITHMS`.
    """
    refs: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if is_blocking_reference(row) and not row.get("overlapped") \
                and not row.get("diverged") and not _incomplete(row):
            refs.setdefault(reference_key(row), []).append(row)
    for row in rows:
        ref = refs.get(reference_key(row), [])
        algorithm = row.get("_attrs", {}).get("algorithm", row.get("algorithm"))
        if row["world_size"] <= 1 or not ref or algorithm not in HIDDEN_COMM_ALGORITHMS \
                or row.get("diverged") or row.get("overlapped") or _incomplete(row):
            row["hidden_comm_fraction"] = NAN
            continue
        row["hidden_comm_fraction"] = hidden_fraction(
            row["steady_step_s"], _median(r["steady_step_s"] for r in ref),
            _median(r["sync_s_per_step"] for r in ref))


def table_rows(runs: Sequence[Run], by: Sequence[str] = (),
               target_accuracy: float | None = None,
               series: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Per-run rows of ``runs`` (input order) with overlaps, scaling and hidden-comm filled."""
    rows = [run_metrics(run, target_accuracy) for run in runs]
    add_overlaps(rows)
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


def _merge_column(g: dict[str, Any], key: str, column: list[Any]) -> None:
    """Set ``g[key]`` (and spreads) from a group's values of ``key`` (see :func:`aggregate`)."""
    if key == PATH_KEY:
        g[key] = column
    elif key == "complete":
        g[key] = all(column)
    elif key == "stopped_by":  # the signals that stopped some of the group's runs
        g[key] = ",".join(sorted({str(v) for v in column if v}))
    elif key == "resumes":
        g[key] = int(sum(int(v or 0) for v in column))
    elif key == "repeats":
        g[key] = len(column)
    elif key == "target_reached":
        g[key] = None if all(v is None for v in column) else sum(v or 0 for v in column)
    elif key in ("diverged", "overlapped", "loaded"):  # how many of the group's runs
        g[key] = sum(bool(v) for v in column)
    elif key == "overlaps_with":
        g[key] = sorted({f for v in column for f in (v or ())}) or None
    elif key in _LABEL_KEYS:
        g[key] = _merge_labels(column)
    else:
        med, lo, hi = _spread(key, column)
        g[key] = med
        if key in SPREAD_KEYS:
            g[f"{key}_min"], g[f"{key}_max"] = lo, hi


def aggregate(rows: Sequence[dict[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """One row per distinct value of the ``by`` keys, sorted by them (module docstring).

    Label columns keep the common value (strings that differ are joined with
    ``|``), ``complete`` is True only if every run is complete, ``stopped_by``
    joins the signals that stopped its runs (``,``), ``resumes`` sums theirs,
    ``repeats`` counts the runs, ``target_reached`` counts the runs that
    reached the target and ``path`` becomes the list of the group's files. A
    group with an incomplete run gets NaN for :data:`BASELINE_RATIO_KEYS` (and
    their spreads); ``_incomplete`` lists its incomplete runs' reasons
    (:func:`incomplete_reason`, for the notes; formatters drop it).
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
            if key == "time_to_target_s" or key in DIVERGED_EXCLUDED_KEYS:
                # a diverged run never counts as faster (ttt: inf; speeds: left out)
                column = [NAN if m.get("diverged") else v for m, v in zip(members, column)]
            _merge_column(g, key, column)
        reasons = [incomplete_reason(m.get("complete"), m.get("stopped_by"))
                   for m in members if _incomplete(m)]
        if reasons:  # a group with an incomplete run gets no ratio to a baseline
            for key in BASELINE_RATIO_KEYS:
                g[key] = NAN
                if key in SPREAD_KEYS:
                    g[f"{key}_min"] = g[f"{key}_max"] = NAN
        g["_incomplete"] = reasons
        for key, value in zip(by, values, strict=True):
            if key not in g:
                g[key] = value
        out.append(g)
    return out
