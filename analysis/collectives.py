"""A run's recorded collective events (``--events on``): reading them, and per-kind totals.

``/ranks/events`` (packed layout; ``/ranks/<r>/events`` in the groups layout of
older files) holds one row per collective call of each rank (its step,
kind, place in the step, post and completion on the run's clock, bytes, time
blocked; ``schema.EVENT_COLUMNS``). :func:`read_events` reads them back, from
either layout (an empty dict for a file without them); :func:`collective_rows` sums
them per run and kind as DeepSpeed's communication logger does per operation
(count, message size, latency), and :func:`format_collectives_md` prints the
table ``syncbench report`` adds when some run has events.

``in flight`` is t_done - t_post (a blocking call's duration; for a nonblocking
one, until the rank saw it complete), ``waited`` the time blocked in Wait,
Waitall or Barrier for it. A rank whose buffer filled kept a stride sample of
whole steps (attribute ``stride``): its totals are of the kept steps, and
``calls/step`` divides by those steps only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from . import schema
from .runfile import Run, RunFileError, get_checked, packed_columns, packed_index


@dataclass
class RankEvents:
    """One rank's events: the columns of ``schema.EVENT_COLUMNS`` and the group's attributes."""

    columns: dict[str, np.ndarray]
    names: tuple[str, ...]
    attrs: dict[str, int] = field(default_factory=dict)

    @property
    def stride(self) -> int:
        return int(self.attrs.get("stride", 1))


def read_events(path: str | os.PathLike[str]) -> dict[int, RankEvents]:
    """rank -> its events; empty when rank 0 has none (the flag is the run's)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return {}
    try:
        with h5py.File(path, "r") as f:  # no link followed out of the file (get_checked)
            ranks = get_checked(path, f, schema.RANKS_GROUP)
            if _text(f.attrs.get(schema.RANK_LAYOUT_ATTR, "")) == schema.RANK_LAYOUT_PACKED:
                group = get_checked(path, ranks, schema.EVENTS_GROUP) \
                    if ranks is not None else None
                return _packed_events(path, group) if group is not None else {}
            first = get_checked(path, ranks, f"{0:05d}") if ranks is not None else None
            if first is None or get_checked(path, first, schema.EVENTS_GROUP) is None:
                return {}
            found = {int(name): get_checked(path, ranks, f"{name}/{schema.EVENTS_GROUP}")
                     for name in sorted(ranks)}
            return {rank: _rank_events(path, group) for rank, group in found.items()
                    if group is not None}
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise RunFileError(path, f"has unreadable events ({exc})") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _packed_events(path: str, group: h5py.Group) -> dict[int, RankEvents]:
    """The packed layout's ``/ranks/events``: every rank's events (empty when rank 0 has
    none, as the groups layout reads them)."""
    order, counts = packed_index(path, group)
    if 0 not in order.tolist():
        return {}
    cols = packed_columns(path, group, schema.EVENT_COLUMNS, int(counts.sum()))
    names = tuple(_text(n) for n in group.attrs.get("names", schema.EVENT_KINDS))
    counters = {k: v.tolist() for k, v in packed_columns(
        path, group, {k: "i8" for k in schema.EVENT_COUNT_ATTRS
                     if get_checked(path, group, k) is not None},
        len(order)).items()}
    ends = np.cumsum(counts).tolist()
    out = {}
    for i, (rank, start, end) in enumerate(zip(order.tolist(), [0, *ends[:-1]], ends)):
        out[rank] = RankEvents({k: c[start:end] for k, c in cols.items()}, names,
                               {k: int(v[i]) for k, v in counters.items()})
    return out


def _rank_events(path: str, group: h5py.Group) -> RankEvents:
    cols = {}
    for name, dtype in schema.EVENT_COLUMNS.items():
        dataset = get_checked(path, group, name)
        if not isinstance(dataset, h5py.Dataset):
            raise RunFileError(path, f"is malformed: {group.name} has no dataset '{name}'")
        cols[name] = np.asarray(dataset[()], dtype=dtype)
    names = tuple(n.decode() if isinstance(n, bytes) else str(n)
                  for n in group.attrs.get("names", schema.EVENT_KINDS))
    attrs = {k: int(group.attrs[k]) for k in schema.EVENT_COUNT_ATTRS if k in group.attrs}
    return RankEvents(cols, names, attrs)


def kind_names(events: RankEvents) -> np.ndarray:
    """The kind of every event as its name."""
    names = np.array(events.names, dtype=object)
    return names[events.columns["kind"].astype(np.int64)]


def collective_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per run and collective kind with events, in the order of ``runs`` and of
    ``schema.EVENT_KINDS``: ranks, calls, calls per kept step, bytes, seconds in flight
    and waited, and whether some rank kept only a stride sample."""
    rows = []
    for run in runs:
        events = read_events(run.path)
        if not events:
            continue
        kept_steps = sum(int(np.count_nonzero(np.asarray(run.ranks[r]["step"]) % e.stride == 0))
                         for r, e in events.items() if r in run.ranks)
        sampled = any(e.stride > 1 or e.attrs.get("dropped", 0) for e in events.values())
        per_kind: dict[str, dict[str, Any]] = {}
        for rank_events in events.values():
            cols, kinds = rank_events.columns, kind_names(rank_events)
            flight = cols["t_done"] - cols["t_post"]
            for kind in dict.fromkeys(kinds.tolist()):
                mask = kinds == kind
                row = per_kind.setdefault(kind, {"ranks": 0, "calls": 0, "bytes": 0,
                                                 "flight_s": 0.0, "wait_s": 0.0})
                row["ranks"] += 1
                row["calls"] += int(np.count_nonzero(mask))
                row["bytes"] += int(cols["bytes"][mask].sum())
                row["flight_s"] += float(np.nansum(flight[mask]))
                row["wait_s"] += float(cols["wait_s"][mask].sum())
        order = [k for k in schema.EVENT_KINDS if k in per_kind] + \
            [k for k in per_kind if k not in schema.EVENT_KINDS]
        for kind in order:
            row = per_kind[kind]
            rows.append({"path": run.path, "kind": kind, **row,
                         "per_step": row["calls"] / kept_steps if kept_steps else float("nan"),
                         "sampled": sampled})
    return rows


def format_collectives_md(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of :func:`collective_rows` (with its note), or "" without rows."""
    if not rows:
        return ""
    header = ["run", "collective", "ranks", "calls", "calls/step", "MB", "MB/call",
              "in flight s", "mean ms", "waited s"]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
    for row in rows:
        calls = row["calls"]
        cells = [os.path.basename(row["path"]) + (" (sampled)" if row["sampled"] else ""),
                 row["kind"], str(row["ranks"]), str(calls), f"{row['per_step']:.2f}",
                 f"{row['bytes'] / 1e6:.3f}", f"{row['bytes'] / 1e6 / calls:.4f}",
                 f"{row['flight_s']:.4f}", f"{row['flight_s'] / calls * 1e3:.3f}",
                 f"{row['wait_s']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["Collectives: recorded calls (--events on), summed over ranks; in flight = "
             "t_done - t_post (until the rank saw it complete), waited = blocked in "
             "Wait/Waitall/Barrier; calls/step per rank step."]
    if any(row["sampled"] for row in rows):
        notes.append("(sampled): a rank's event buffer filled and kept a stride sample of "
                     "whole steps (events attribute stride): totals are of those steps.")
    return "\n".join(["## Collectives", "", *lines, "", *notes])
