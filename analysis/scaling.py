"""Scaling series, their baselines and the speedup and efficiency of every run.

A *series* is the runs that differ only in their world size N
(:func:`series_identity`); its baseline N0 is the smallest N among its runs that
count (complete, not overlapped, not diverged), X0 / wall0 the medians of their
samples/s and wall time there. The kind (strong: the same total samples at every
N; weak: the same samples per rank) is the run files' ``scaling_mode`` when the
samples agree with it, else what the samples say, else ``mixed``. Then
(:func:`scaling_ratios`, the one place these formulas are written)

- ``speedup = X / X0`` and ``efficiency = speedup * N0 / N``, for both kinds
  (under weak scaling the speedup is Gustafson's scaled speedup);
- the wall-time forms: strong ``speedup_wall = wall0 / wall``, weak
  ``efficiency_wall = wall0 / wall``, and ``efficiency_wall = speedup_wall * N0 / N``.

Definitions and the reasons for them: docs/USAGE.md (scaling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .completeness import is_incomplete
from .numbers import finite, hashable, median, name_list, ratio
from .schema import STRATEGY_FLAGS_ATTRS

#: The formulas of :func:`scaling_ratios`, as the printed tables state them.
FORMULAS = ("strong: speedup S = X/X0 = T(N0)/T(N), efficiency E = S*N0/N; "
            "weak: E = (X/N)/(X0/N0) = T(N0)/T(N), scaled speedup S = X/X0")

#: Root attributes that are part of a scaling series' identity.
SERIES_ROOT_KEYS: tuple[str, ...] = ("algorithm", "model", "dataset", "mpi_library", "backend",
                                     "simulated")

#: ``config`` flags that say nothing about the work or how it is synchronised:
#: left out of a series' identity (repeats with other seeds, outputs, reliability).
#: ``batch_size`` and ``epochs`` enter it as the scaling mode's batch and budget.
NON_IDENTITY_FLAGS: frozenset[str] = frozenset({
    "out", "overwrite", "progress", "seed", "eval_every", "target_accuracy", "target_loss",
    "timeout", "flush_every", "checkpoint_every", "resume", "save_model", "inject_fault",
    "data_dir", "device", "func", "algorithm", "model", "dataset", "batch_size", "epochs",
    "scaling_mode", "command", "train_args",
})

#: Relative tolerance of "the same work" when classifying strong / weak scaling.
WORK_RTOL = 0.01


def scaling_ratios(kind: str, x: float, x0: float, wall: float, wall0: float,
                   n: int, n0: int) -> dict[str, float]:
    """``speedup``, ``efficiency``, ``speedup_wall``, ``efficiency_wall`` of a run at N
    (samples/s ``x``, wall time ``wall``) against its series' baseline at N0."""
    speedup = ratio(x, x0)
    wall_ratio = ratio(wall0, wall)
    if kind == "strong":
        speedup_wall, efficiency_wall = wall_ratio, wall_ratio * n0 / n
    else:
        speedup_wall, efficiency_wall = wall_ratio * n / n0, wall_ratio
    return {"speedup": speedup, "efficiency": speedup * n0 / n,
            "speedup_wall": speedup_wall, "efficiency_wall": efficiency_wall}


def group_value(row: dict[str, Any], key: str) -> Any:
    """Value of a ``--by`` key for one per-run row: a column, else a ``config`` flag."""
    if key in row and not key.startswith("_"):
        return row[key]
    value = row.get("_config", {}).get(key)
    return tuple(value) if isinstance(value, list) else value


def series_keys(by: Sequence[str] = (), series: Sequence[str] = ()) -> tuple[str, ...]:
    """Extra keys (``--by``, ``--series``) that split scaling series; never world_size."""
    keys: list[str] = []
    for k in (*series, *by):
        if k != "world_size" and k not in keys:
            keys.append(k)
    return tuple(keys)


def _mode_of(row: dict[str, Any]) -> str:
    return row.get("scaling_mode") or "unrecorded"


def other_strategy_flags(attrs: dict[str, Any]) -> frozenset[str]:
    """``config`` keys that are options of a strategy other than the run's own.

    The root attributes ``option_flags`` (every strategy's options) less
    ``strategy_flags`` (the run's own): a run's config carries every strategy's
    defaults, and a change in another strategy's default must not split a series.
    Empty for files without them (every flag then counts).
    """
    own, every = (name_list(attrs.get(k)) for k in STRATEGY_FLAGS_ATTRS)
    return frozenset() if own is None or every is None else frozenset(every - own)


def series_identity(row: dict[str, Any], extra: Sequence[str] = ()) -> tuple:
    """What must be equal for two runs to be points of one scaling series.

    :data:`SERIES_ROOT_KEYS`, every ``config`` flag but :data:`NON_IDENTITY_FLAGS`
    and another strategy's options, the recorded scaling mode, and the batch and
    budget as that mode defines them (strong: global batch and total ``epochs``;
    weak: per-rank batch and ``epochs / N``; unrecorded: per-rank batch and total
    ``epochs``); ``extra`` adds ``--by`` / ``--series`` keys (:func:`group_value`).
    """
    config = row.get("_config", {})
    attrs = row.get("_attrs", {})
    n = int(row["world_size"])
    mode = _mode_of(row)
    batch, epochs = config.get("batch_size"), config.get("epochs")
    if mode == "strong" and finite(batch):
        batch_key = ("batch", f"{int(batch) * n} global")
    else:
        batch_key = ("batch", f"{batch}/rank")
    if mode == "weak" and finite(epochs):
        budget_key = ("budget", f"{round(float(epochs) / n, 9):g} epochs/rank")
    else:
        budget_key = ("budget", f"{epochs:g} epochs" if finite(epochs) else f"{epochs} epochs")
    key = [("scaling_mode", mode), batch_key, budget_key]
    key += [(k, hashable(attrs.get(k, row.get(k)))) for k in SERIES_ROOT_KEYS]
    others = other_strategy_flags(attrs)
    key += [(k, hashable(v)) for k, v in sorted(config.items())
            if k not in NON_IDENTITY_FLAGS and not k.startswith("_") and k not in others]
    key += [(f"by:{k}", hashable(group_value(row, k))) for k in extra]
    return tuple(key)


def _close(a: float, b: float, slack: float = 0.0) -> bool:
    """Equal within :data:`WORK_RTOL`, or within ``slack`` (whole-step rounding)."""
    return finite(a) and finite(b) and \
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


def _counts(row: dict[str, Any]) -> bool:
    """A run that may be a baseline and get ratios: not overlapped, diverged, incomplete."""
    return not row.get("overlapped") and not row.get("diverged") and not is_incomplete(row)


def add_scaling(rows: list[dict[str, Any]], by: Sequence[str] = (),
                series: Sequence[str] = ()) -> None:
    """Fill ``series``, ``scaling``, ``baseline_world_size`` and the four ratios of
    per-run rows in place (module docstring). No ratio (NaN) for a series with a single
    world size, a ``mixed`` series, an overlapped, diverged or incomplete run (which is
    no baseline either and does not decide the kind)."""
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
        clean = [r for r in members if _counts(r)]
        sizes = {int(r["world_size"]) for r in clean}
        if len(sizes) < 2:
            continue  # nothing to scale against: speedup and efficiency stay NaN
        n0 = min(sizes)
        base = [r for r in clean if int(r["world_size"]) == n0]
        x0 = median(r["samples_per_s"] for r in base)
        wall0 = median(r["wall_s"] for r in base)
        work0 = median(r["samples"] for r in base)
        kind = _scaling_kind(clean, n0, work0)
        for r in members:
            r["scaling"] = kind
            r["baseline_world_size"] = n0
            if kind == "mixed" or not _counts(r):
                continue
            r.update(scaling_ratios(kind, r["samples_per_s"], x0, r["wall_s"], wall0,
                                    int(r["world_size"]), n0))
