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
(``schema.FLOAT_ATTRS``) and absent otherwise, never ``""`` (in a per-rank dataset
of the packed layout, where one rank's value cannot be absent, it is ``""`` or -1:
``schema.RANK_ATTR_UNKNOWN``).

The ranks are written packed (``schema.RANK_LAYOUT_PACKED``, root attribute
``rank_layout``): one dataset per column across all ranks and one per rank
attribute, whatever the number of ranks, because HDF5's cost is per object (a
group per rank made a 16,384-rank file 160 MB and ~25 s to read; docs/RESULTS.md).
The one-group-per-rank layout of older files (``layout="groups"``) is still written
on request, for tests and tools that want files as older versions wrote them.
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
        self, step: int, t_start: float, phases: Mapping[str, float], stats: StepStats,
        cpu_compute: float = math.nan, cpu_sync: float = math.nan,
        cpu_step: float = math.nan,
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
        cols["cpu_compute"][i] = cpu_compute
        cols["cpu_sync"][i] = cpu_sync
        cols["cpu_step"][i] = cpu_step
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
    """The groups layout: one ``/ranks/RRRRR`` group per rank, its columns and attributes."""
    for rank in sorted(rank_rows):
        group = f.create_group(schema.rank_group(rank))
        _write_table(group, rank_rows[rank], schema.RANK_COLUMNS,
                     schema.DATASET_INFO[schema.RANKS_GROUP])
        for name in schema.RANK_ATTRS:
            _set_attr(group, name, rank_attrs.get(rank, {}).get(name))


def _row_counts(tables: Mapping[int, Mapping[str, np.ndarray]], order: list[int],
                columns: Mapping[str, str], what: str) -> np.ndarray:
    """Rows of each rank's table (every column as long as ``step``); ValueError otherwise,
    since packed rows of unequal columns would be given to the wrong rank."""
    counts = np.zeros(len(order), dtype=np.int64)
    for i, rank in enumerate(order):
        table = tables[rank]
        n = len(table["step"])
        for name in columns:
            if len(table[name]) != n:
                raise ValueError(f"rank {rank}'s {what} column {name} has {len(table[name])} "
                                 f"rows, its step column {n}")
        counts[i] = n
    return counts


def _write_packed_table(group: h5py.Group, tables: Mapping[int, Mapping[str, np.ndarray]],
                        columns: Mapping[str, str], info: Mapping[str, tuple[str, str]],
                        what: str) -> list[int]:
    """``rank``, ``rows`` and every column of ``tables`` (rank -> its table), the ranks'
    rows one rank after the other in the order of rank; returns that order."""
    order = sorted(tables)
    counts = _row_counts(tables, order, columns, what)
    _dataset(group, "rank", np.asarray(order, dtype=np.int64), info)
    _dataset(group, "rows", counts, info)
    for name, dtype in columns.items():
        parts = [np.asarray(tables[rank][name], dtype=dtype) for rank in order]
        _dataset(group, name, np.concatenate(parts) if parts else np.zeros(0, dtype=dtype),
                 info)
    return order


def _write_ranks_packed(f: h5py.File, rank_rows: Mapping[int, Mapping[str, np.ndarray]],
                        rank_attrs: Mapping[int, Mapping[str, Any]],
                        events: Mapping[int, tuple[Mapping[str, np.ndarray],
                                                   Mapping[str, Any]]] | None) -> None:
    """The packed layout (``schema.RANK_LAYOUT_PACKED``): ``/ranks`` holds every rank's
    rows in one dataset per column, and its attributes in one per-rank dataset each
    (``schema.RANK_ATTR_DTYPES``); the events likewise in ``/ranks/events``."""
    group = f.create_group(schema.RANKS_GROUP)
    info = schema.DATASET_INFO[schema.RANKS_GROUP]
    order = _write_packed_table(group, rank_rows, schema.RANK_COLUMNS, info, "step")
    for name in schema.RANK_ATTRS:
        values = _per_rank_values(name, [rank_attrs.get(rank, {}).get(name) for rank in order])
        if values is not None:
            _dataset(group, name, values, info)
    if events:
        write_events_packed(group, events)


def _unknown(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value)


def _number(value: Any, kind: type) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def _per_rank_values(name: str, values: list[Any]) -> np.ndarray | None:
    """One rank attribute of every rank as a per-rank dataset's data (its dtype from
    ``schema.RANK_ATTR_DTYPES``, an unknown value ``schema.RANK_ATTR_UNKNOWN``'s or NaN);
    None for a string or integer attribute that no rank knows (left out, as the groups
    layout leaves out the attribute)."""
    kind = schema.RANK_ATTR_DTYPES.get(name, "f8" if name in schema.FLOAT_ATTRS else "str")
    if kind == "f8":
        numbers = [None if _unknown(v) else _number(v, float) for v in values]
        return np.array([math.nan if v is None else v for v in numbers], dtype=np.float64)
    if all(_unknown(v) for v in values):
        return None
    if kind == "i8":
        numbers = [None if _unknown(v) else _number(v, int) for v in values]
        return np.array([schema.RANK_ATTR_UNKNOWN["i8"] if v is None else v for v in numbers],
                        dtype=np.int64)
    return np.array([schema.RANK_ATTR_UNKNOWN["str"] if _unknown(v) else str(v)
                     for v in values], dtype=h5py.string_dtype())


def _dataset(group: h5py.Group, name: str, data: np.ndarray,
             info: Mapping[str, tuple[str, str]]) -> None:
    describe(group.create_dataset(name, data=data), info[name])


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
    """The groups layout: a rank's ``events`` subgroup, its columns
    (``schema.EVENT_COLUMNS``) and attributes (``schema.EVENT_ATTRS``; ``names`` are
    ``schema.EVENT_KINDS``)."""
    group = rank.create_group(schema.EVENTS_GROUP)
    _write_table(group, columns, schema.EVENT_COLUMNS, schema.DATASET_INFO[schema.EVENTS_GROUP])
    group.attrs["names"] = _attr_value(list(schema.EVENT_KINDS))
    for name in schema.EVENT_COUNT_ATTRS:
        group.attrs[name] = int(attrs[name])


def write_events_packed(ranks: h5py.Group,
                        events: Mapping[int, tuple[Mapping[str, np.ndarray],
                                                   Mapping[str, Any]]]) -> None:
    """The packed layout: ``/ranks/events`` holds the events of every rank that has some,
    one dataset per column (``schema.EVENT_COLUMNS``) rank after rank, ``rank`` and
    ``rows``, and the counters (``schema.EVENT_COUNT_ATTRS``) as per-rank datasets;
    ``names`` (``schema.EVENT_KINDS``) is the group's attribute."""
    group = ranks.create_group(schema.EVENTS_GROUP)
    info = schema.DATASET_INFO[schema.EVENTS_GROUP]
    columns = {rank: cols for rank, (cols, _) in events.items()}
    order = _write_packed_table(group, columns, schema.EVENT_COLUMNS, info, "event")
    for name in schema.EVENT_COUNT_ATTRS:
        _dataset(group, name, np.array([int(events[r][1][name]) for r in order],
                                       dtype=np.int64), info)
    group.attrs["names"] = _attr_value(list(schema.EVENT_KINDS))


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
    target_loss: float | None = None,
) -> dict[str, Any]:
    """The run's summary attributes (:func:`summarize`) and its ``diverged`` flag.

    ``diverged`` is :func:`divergence`'s verdict; without ``num_classes`` only a
    non-finite training loss counts. With ``local_evals`` (``--eval-model both``)
    also ``final_local_accuracy``, their last accuracy (NaN without rows). What
    :func:`write_run_file` writes and returns.
    """
    summary: dict[str, Any] = dict(summarize(rank_rows, eval_rows, wall_s, target_accuracy,
                                         target_loss))
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
    layout: str = schema.RANK_LAYOUT_PACKED,
    target_loss: float | None = None,
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
    events' columns and attributes, written to ``/ranks/events`` (:func:`write_events_packed`).
    ``layout``: ``schema.RANK_LAYOUT_PACKED`` (the root attribute ``rank_layout`` says so),
    or ``schema.RANK_LAYOUT_GROUPS`` for the layout of older files (a group per rank, its
    events in ``/ranks/<r>/events``; no ``rank_layout`` attribute, as they had none).
    """
    if layout not in schema.RANK_LAYOUTS:
        raise ValueError(f"unknown rank layout {layout!r}; layouts: "
                         f"{', '.join(schema.RANK_LAYOUTS)}")
    path = Path(path)
    summary = run_summary(rank_rows, eval_rows, wall_s, target_accuracy, num_classes,
                          local_evals, target_loss)
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
        if layout == schema.RANK_LAYOUT_PACKED:
            f.attrs[schema.RANK_LAYOUT_ATTR] = layout
            _write_ranks_packed(f, rank_rows, rank_attrs, events)
        else:
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
