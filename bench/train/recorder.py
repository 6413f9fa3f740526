"""The run-file recorder: per-rank step rows, gathered to rank 0, written atomically.

Every rank appends one row per step (timestamps relative to the barrier at
the start of the run, seconds per phase, loss, samples and the algorithm's
extra columns). At the end the rows are gathered to rank 0, which writes the
``syncbench/1`` file (names from :mod:`syncbench.analysis.schema`): built in
memory, written to a temporary name in the target directory, synced and
renamed, so a run file that exists is complete, and a failed write (a full
disk, a read-only folder) is one :class:`~syncbench.bench.train.checkpoint.WriteError`
that leaves nothing behind. This works with every h5py build (PyPI's has no MPI).
Every dataset carries its ``units`` and ``description`` (``schema.DATASET_INFO``,
:func:`describe`); an attribute whose value is unknown is NaN when it is a float
(``schema.FLOAT_ATTRS``) and absent otherwise, never ``""``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from syncbench.algorithms.base import StepStats
from syncbench.analysis import schema
from syncbench.analysis.summary import divergence, summarize
from syncbench.bench.train.checkpoint import hdf5_image, write_atomic


class StepRecorder:
    """Rows of one rank, kept in growable NumPy columns (no per-step allocation)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._cols = {
            name: np.zeros(max(capacity, 16), dtype=dtype)
            for name, dtype in schema.RANK_COLUMNS.items()
        }
        self.count = 0

    def append(
        self, step: int, t_start: float, phases: Mapping[str, float], stats: StepStats
    ) -> None:
        if self.count == len(self._cols["step"]):
            for name, col in self._cols.items():
                self._cols[name] = np.concatenate([col, np.zeros_like(col)])
        i = self.count
        cols = self._cols
        cols["step"][i] = step
        cols["t_start"][i] = t_start
        for phase in schema.PHASES:
            cols[f"t_{phase}"][i] = phases[phase]
        cols["loss"][i] = stats.loss
        cols["samples"][i] = stats.samples
        cols["staleness"][i] = stats.staleness
        cols["staleness_min"][i] = stats.staleness_min
        cols["speed"][i] = stats.speed
        cols["local_steps"][i] = stats.local_steps
        cols["round"][i] = stats.round
        self.count += 1

    def add_to_last(self, phases: Mapping[str, float]) -> None:
        """Add seconds per phase to the last row (work done on the clock after its step)."""
        if self.count:
            for phase in schema.PHASES:
                self._cols[f"t_{phase}"][self.count - 1] += phases.get(phase, 0.0)

    def extend(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append rows saved earlier (resuming a run)."""
        n = len(columns["step"])
        while len(self._cols["step"]) < self.count + n:
            for name, col in self._cols.items():
                self._cols[name] = np.concatenate([col, np.zeros_like(col)])
        for name, col in self._cols.items():
            default = schema.RANK_COLUMN_DEFAULTS.get(name, 0)
            col[self.count : self.count + n] = columns.get(name, default)
        self.count += n

    def columns(self) -> dict[str, np.ndarray]:
        """The recorded rows (copies trimmed to the row count)."""
        return {name: col[: self.count].copy() for name, col in self._cols.items()}

    def view(self) -> dict[str, np.ndarray]:
        """The recorded rows as views (no copy; valid until the next append)."""
        return {name: col[: self.count] for name, col in self._cols.items()}


class EvalRecorder:
    """Evaluation rows of the consensus model (kept on rank 0)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int, float, float]] = []

    def append(self, t: float, step: int, samples_seen: int, loss: float, accuracy: float) -> None:
        self.rows.append((t, step, samples_seen, loss, accuracy))

    def extend(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append rows saved earlier (resuming a run)."""
        names = list(schema.EVAL_COLUMNS)
        self.rows.extend(zip(*(columns[n].tolist() for n in names)))

    def columns(self) -> dict[str, np.ndarray]:
        names = list(schema.EVAL_COLUMNS)
        data = list(zip(*self.rows)) if self.rows else [[] for _ in names]
        return {
            name: np.asarray(values, dtype=schema.EVAL_COLUMNS[name])
            for name, values in zip(names, data)
        }


def _write_ranks(f: h5py.File, rank_rows: Mapping[int, Mapping[str, np.ndarray]],
                 rank_attrs: Mapping[int, Mapping[str, Any]]) -> None:
    """One ``/ranks/RRRRR`` group per rank: its columns and attributes."""
    for rank in sorted(rank_rows):
        group = f.create_group(schema.rank_group(rank))
        _write_table(group, rank_rows[rank], schema.RANK_COLUMNS,
                     schema.DATASET_INFO[schema.RANKS_GROUP])
        for name in schema.RANK_ATTRS:
            _set_attr(group, name, rank_attrs.get(rank, {}).get(name))


def _write_table(group: h5py.Group, table: Mapping[str, np.ndarray],
                 columns: Mapping[str, str], info: Mapping[str, tuple[str, str]]) -> None:
    """The ``columns`` of ``table`` as 1-D datasets, each with its ``units`` and
    ``description`` from ``info`` (``schema.DATASET_INFO``)."""
    for name, dtype in columns.items():
        dataset = group.create_dataset(name, data=np.asarray(table[name], dtype=dtype))
        describe(dataset, info[name])


def describe(dataset: h5py.Dataset, info: tuple[str, str]) -> None:
    """Give ``dataset`` its unit and description (``schema.DATASET_INFO``'s entry)."""
    units, description = info
    dataset.attrs[schema.UNITS_ATTR] = units
    dataset.attrs[schema.DESCRIPTION_ATTR] = description


def write_events(rank: h5py.Group, columns: Mapping[str, np.ndarray],
                 attrs: Mapping[str, Any]) -> None:
    """A rank's ``events`` subgroup: its columns (``schema.EVENT_COLUMNS``) and attributes
    (``schema.EVENT_ATTRS``; ``names`` are ``schema.EVENT_KINDS``)."""
    group = rank.create_group(schema.EVENTS_GROUP)
    _write_table(group, columns, schema.EVENT_COLUMNS, schema.DATASET_INFO[schema.EVENTS_GROUP])
    group.attrs["names"] = _attr_value(list(schema.EVENT_KINDS))
    for name in schema.EVENT_COUNT_ATTRS:
        group.attrs[name] = int(attrs[name])


def _write_summary(group: h5py.Group, summary: Mapping[str, Any]) -> None:
    """``/summary``: the numbers, the flags, complete, stopped_by, and (``--eval-model
    both``) the local evaluation's final accuracy."""
    for name in schema.SUMMARY_ATTRS:
        group.attrs[name] = float(summary[name])
    for name in schema.SUMMARY_FLAGS:
        group.attrs[name] = bool(summary[name])
    group.attrs[schema.COMPLETE_ATTR] = bool(summary[schema.COMPLETE_ATTR])
    _set_attr(group, schema.STOPPED_BY_ATTR, str(summary[schema.STOPPED_BY_ATTR]))
    if schema.FINAL_LOCAL_ACCURACY in summary:
        group.attrs[schema.FINAL_LOCAL_ACCURACY] = float(summary[schema.FINAL_LOCAL_ACCURACY])


def _set_attr(obj: h5py.HLObject, name: str, value: Any) -> None:
    """Set attribute ``name``; an unknown value (None, "") is NaN for a float attribute
    (``schema.FLOAT_ATTRS``) and leaves any other attribute absent."""
    if value is None or (isinstance(value, str) and not value):
        if name not in schema.FLOAT_ATTRS:
            return
        value = math.nan
    obj.attrs[name] = _attr_value(value)


def _attr_value(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return np.asarray(value, dtype=np.int64)  # e.g. ranks_per_node
        return np.array([str(v) for v in value], dtype=h5py.string_dtype())
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def run_summary(
    rank_rows: Mapping[int, Mapping[str, np.ndarray]],
    eval_rows: Mapping[str, np.ndarray],
    wall_s: float,
    target_accuracy: float | None,
    num_classes: int | None = None,
    local_evals: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The run's summary attributes (:func:`summarize`) and its ``diverged`` flag.

    ``diverged`` is :func:`divergence`'s verdict; without ``num_classes`` only a
    non-finite training loss counts. With ``local_evals`` (``--eval-model both``)
    also ``final_local_accuracy``, their last accuracy (NaN without rows). What
    :func:`write_run_file` writes and returns.
    """
    summary: dict[str, Any] = dict(summarize(rank_rows, eval_rows, wall_s, target_accuracy))
    summary["diverged"] = divergence(rank_rows, eval_rows, num_classes) is not None
    if local_evals is not None:
        accuracy = local_evals["accuracy"]
        summary[schema.FINAL_LOCAL_ACCURACY] = (
            float(accuracy[-1]) if len(accuracy) else math.nan)
    return summary


def write_run_file(
    path: str | os.PathLike,
    root_attrs: Mapping[str, Any],
    rank_rows: Mapping[int, Mapping[str, np.ndarray]],
    rank_attrs: Mapping[int, Mapping[str, Any]],
    eval_rows: Mapping[str, np.ndarray],
    wall_s: float,
    target_accuracy: float | None,
    complete: bool = True,
    num_classes: int | None = None,
    extra_attrs: Mapping[str, Any] | None = None,
    diverged: bool | None = None,
    stopped_by: str = "",
    local_evals: Mapping[str, np.ndarray] | None = None,
    events: Mapping[int, tuple[Mapping[str, np.ndarray], Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Write one ``syncbench/1`` file atomically; returns its summary attributes.

    The summary also holds the flags of ``schema.SUMMARY_FLAGS`` (``diverged``;
    without ``num_classes`` only a non-finite training loss counts). ``extra_attrs``:
    root attributes beyond ``schema.ROOT_ATTRS`` (the simulator's); ``diverged``, when
    given, is the flag instead of the verdict on the rows (a simulation trains nothing).
    ``complete`` and ``stopped_by`` (the signal that stopped the run, "" if none) go
    to ``/summary`` too (``schema.COMPLETE_ATTR``, ``schema.STOPPED_BY_ATTR``).
    ``local_evals`` (``--eval-model both``): every rank's own model's evaluations,
    written to ``/eval_local`` with their last accuracy as ``/summary``'s
    ``final_local_accuracy``. ``events`` (``--events on``): per rank, its collective
    events' columns and attributes, written to ``/ranks/<r>/events`` (:func:`write_events`).
    """
    path = Path(path)
    summary = run_summary(rank_rows, eval_rows, wall_s, target_accuracy, num_classes,
                          local_evals)
    if diverged is not None:
        summary["diverged"] = bool(diverged)
    summary[schema.COMPLETE_ATTR] = bool(complete)
    summary[schema.STOPPED_BY_ATTR] = str(stopped_by)

    def build(f: h5py.File) -> None:
        f.attrs["schema"] = schema.SCHEMA
        for name in schema.ROOT_ATTRS:
            if name != "schema":
                _set_attr(f, name, root_attrs.get(name))
        f.attrs[schema.COMPLETE_ATTR] = bool(complete)
        for name, value in (extra_attrs or {}).items():
            _set_attr(f, name, value)
        _write_ranks(f, rank_rows, rank_attrs)
        for rank, (columns, attrs) in sorted((events or {}).items()):
            write_events(f[schema.rank_group(rank)], columns, attrs)
        for group_name, table in ((schema.EVAL_GROUP, eval_rows),
                                  (schema.EVAL_LOCAL_GROUP, local_evals)):
            if table is not None:
                _write_table(f.create_group(group_name), table, schema.EVAL_COLUMNS,
                             schema.DATASET_INFO[group_name])
        _write_summary(f.create_group(schema.SUMMARY_GROUP), summary)

    # built in memory, then written whole and renamed: a full disk or a read-only
    # folder is one WriteError, never a half-written file or an HDF5 library error
    write_atomic(path, hdf5_image(build))
    return summary
