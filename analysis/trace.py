"""Every rank's per-step phases as a Chrome trace, behind ``syncbench trace`` (its command
line: :mod:`syncbench.bench.commands.trace`, whose description says what a trace holds).

:func:`trace_events` builds the trace of a run (a sample of at most
:data:`DEFAULT_MAX_RANKS` ranks, :func:`sample_ranks`), :func:`write_trace` writes it;
:func:`parse_steps` reads a step window ``A:B``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import schema
from .collectives import RankEvents, kind_names, read_events
from .runfile import Run
from .schema import PHASES

#: Ranks traced at most by default (``--max-ranks``); a larger run is sampled.
DEFAULT_MAX_RANKS = 256

#: Per-step columns copied into every phase slice's ``args``.
STEP_ARGS: tuple[str, ...] = ("step", "loss", "samples", "staleness", "staleness_min",
                             "local_steps", "round", "speed")


def parse_steps(text: str | None) -> tuple[int, int | None] | None:
    """``"A:B"`` -> ``(A, B)``; ``"A:"`` -> ``(A, None)``; ``":B"`` -> ``(0, B)``.

    None or empty text means every step. ``ValueError`` with a one-line message
    for anything else (negative bounds, ``B <= A``, not integers).
    """
    if text is None or not text.strip():
        return None
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"--steps {text!r}: expected A:B, A: or :B (steps A <= step < B)")
    try:
        lo = int(parts[0]) if parts[0].strip() else 0
        hi = int(parts[1]) if parts[1].strip() else None
    except ValueError:
        raise ValueError(f"--steps {text!r}: A and B must be integers") from None
    if lo < 0 or (hi is not None and hi <= lo):
        raise ValueError(f"--steps {text!r}: need 0 <= A < B")
    return lo, hi


def in_window(step: np.ndarray, window: tuple[int, int | None] | None) -> np.ndarray:
    """Boolean mask of the steps inside ``window`` (all when None)."""
    step = np.asarray(step)
    if window is None:
        return np.ones(step.shape, dtype=bool)
    lo, hi = window
    mask = step >= lo
    if hi is not None:
        mask &= step < hi
    return mask


NS = 1_000_000_000  # nanoseconds per second


def step_order(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The phases of ``schema.PHASES`` in the order the run's strategy runs them in a step."""
    order = schema.strategy_traits(attrs).step_order
    return (*order, *(p for p in PHASES if p not in order))


def phase_bounds_ns(cols: dict[str, np.ndarray],
                    order: tuple[str, ...] = schema.LOCK_STEP_ORDER) -> np.ndarray:
    """Integer-ns boundaries of each step's phases, shape (rows, len(order) + 1).

    Column 0 is the step's start, column k + 1 the end of ``order[k]``: cumulative
    sums of the phase seconds from ``t_start``, rounded once to nanoseconds, so
    consecutive phases share a boundary exactly. A step whose end passes the
    next row's start is clipped to it (clock skew between timers).
    """
    t0 = np.asarray(cols["t_start"], dtype=np.float64)
    secs = np.stack([np.asarray(cols[f"t_{p}"], dtype=np.float64) for p in order], axis=1) \
        if len(t0) else np.zeros((0, len(order)))
    cum = np.concatenate([np.zeros((len(t0), 1)), np.cumsum(secs, axis=1)], axis=1)
    bounds = np.rint((t0[:, None] + cum) * NS).astype(np.int64)
    if len(t0) > 1:
        nxt = np.append(bounds[1:, 0], np.iinfo(np.int64).max)
        later = nxt >= bounds[:, 0]  # only clip against a later start
        bounds = np.where(later[:, None], np.minimum(bounds, nxt[:, None]), bounds)
    return bounds


def step_ends(cols: dict[str, np.ndarray]) -> np.ndarray:
    """End time (s) of each step: ``t_start`` plus the sum of its phases (ns-rounded)."""
    return phase_bounds_ns(cols)[:, -1] / NS


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _bound(value: int | None) -> str:
    return "" if value is None else str(value)


def _metadata(run: Run, rank: int) -> list[dict[str, Any]]:
    host = run.rank_attrs.get(rank, {}).get("hostname")
    name = f"rank {rank}" + (f" ({host})" if host else "")
    return [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": name}},
        {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
         "args": {"sort_index": rank}},
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "steps"}},
    ]


def _rank_slices(rank: int, cols: dict[str, np.ndarray],
                 window: tuple[int, int | None] | None,
                 order: tuple[str, ...] = schema.LOCK_STEP_ORDER) -> list[dict[str, Any]]:
    keep = np.flatnonzero(in_window(cols["step"], window))
    bounds = phase_bounds_ns(cols, order)
    events = []
    for i in keep:
        args = {k: _plain(cols[k][i]) for k in STEP_ARGS if k in cols}
        b = bounds[i]
        if b[-1] > b[0]:
            events.append({
                "name": f"step {int(cols['step'][i])}", "cat": "step", "ph": "X",
                "pid": rank, "tid": 0, "ts": int(b[0]) / 1000, "dur": int(b[-1] - b[0]) / 1000,
                "args": args,
            })
        for k, p in enumerate(order):
            if b[k + 1] <= b[k]:
                continue  # a phase that did not run (or was clipped away)
            events.append({
                "name": p, "cat": "phase", "ph": "X", "pid": rank, "tid": 0,
                "ts": int(b[k]) / 1000, "dur": int(b[k + 1] - b[k]) / 1000, "args": args,
            })
    return events


def _eval_instants(run: Run, window: tuple[int, int | None] | None) -> list[dict[str, Any]]:
    if 0 not in run.ranks:
        return []
    cols = run.ranks[0]
    steps = np.asarray(cols["step"])
    ends = phase_bounds_ns(cols)[:, -1]
    snapshot = schema.strategy_traits(run.attrs).snapshot_evaluations
    events = []
    for j in range(len(run.eval["step"])):
        after = int(run.eval["step"][j]) - 1  # the last step before the evaluation
        hit = np.flatnonzero(steps == after)
        if hit.size:
            ts = int(ends[hit[-1]]) / 1000
        elif after < 0:
            ts = 0.0
        else:
            continue  # its step was not recorded (partial run)
        if window is not None and not in_window(np.array([max(after, 0)]), window)[0]:
            continue
        events.append({
            "name": "snapshot eval" if snapshot else "eval",
            "cat": "snapshot" if snapshot else "eval", "ph": "i", "s": "g", "pid": 0, "tid": 0,
            "ts": ts,
            "args": {k: _plain(run.eval[k][j])
                     for k in ("accuracy", "loss", "samples_seen", "t", "step")},
        })
    return events


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """First-fit track of each interval (sorted by start) so that a track's intervals
    never overlap: the Trace Event Format needs a thread's slices properly nested."""
    last: list[int] = []  # end of each track's last slice
    lanes = np.zeros(len(starts), dtype=np.int64)
    for i in np.argsort(starts, kind="stable"):
        lane = next((k for k, end in enumerate(last) if end <= starts[i]), len(last))
        if lane == len(last):
            last.append(0)
        last[lane] = int(ends[i])
        lanes[i] = lane
    return lanes


def collective_slices(rank: int, events: RankEvents,
                      window: tuple[int, int | None] | None = None) -> list[dict[str, Any]]:
    """The rank's recorded collectives as slices from post to completion (module docstring),
    with their tracks' ``thread_name`` metadata first."""
    cols = events.columns
    done = np.isfinite(cols["t_done"]) & in_window(cols["step"], window)
    keep = np.flatnonzero(done)
    starts = np.rint(cols["t_post"][keep] * NS).astype(np.int64)
    ends = np.maximum(np.rint(cols["t_done"][keep] * NS).astype(np.int64), starts)
    lanes = _lanes(starts, ends)
    names = kind_names(events)[keep]
    out: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": 1 + lane,
         "args": {"name": "collectives" if lane == 0 else f"collectives {lane + 1}"}}
        for lane in range(int(lanes.max()) + 1 if len(lanes) else 0)]
    for j, i in enumerate(keep):
        out.append({
            "name": str(names[j]), "cat": "collective", "ph": "X", "pid": rank,
            "tid": 1 + int(lanes[j]), "ts": int(starts[j]) / 1000,
            "dur": int(ends[j] - starts[j]) / 1000,
            "args": {"step": int(cols["step"][i]), "index": int(cols["index"][i]),
                     "bytes": int(cols["bytes"][i]), "wait_s": float(cols["wait_s"][i])},
        })
    return out


def sample_ranks(run: Run, max_ranks: int = DEFAULT_MAX_RANKS) -> dict[str, Any] | None:
    """Which ranks to trace when the run holds more than ``max_ranks`` (0: no limit);
    None when every rank fits.

    ``max_ranks`` ranks evenly spaced over the recorded ones (by position, so the
    sample spans nodes and the whole rank range), always with the first recorded rank
    (rank 0, whose track holds the evaluations) and the slowest
    (:func:`~syncbench.analysis.run_metrics.slowest_rank`, the report's: most busy
    seconds per step), so the straggler of a large run is in its trace. Returns the
    record written to ``otherData["ranks_sampled"]``: ``ranks`` (sorted), ``of`` (the
    ranks recorded), ``max_ranks``, ``slowest`` and ``how``.
    """
    from .run_metrics import slowest_rank  # lazy: the tables' module, only for a sample

    recorded = sorted(run.ranks)
    if max_ranks <= 0 or len(recorded) <= max_ranks:
        return None
    slowest = slowest_rank(run)
    # the first rank always; the slowest too where there is room for two
    required = {recorded[0]} if slowest is None or max_ranks == 1 else {recorded[0], slowest}
    # the largest evenly spaced grid (it starts at the first rank) that leaves room for
    # the slowest: with n <= len(recorded) points, rounding keeps them distinct
    for n in range(max_ranks, 0, -1):
        grid = np.rint(np.linspace(0, len(recorded) - 1, n)).astype(np.int64)
        chosen = required | {recorded[int(i)] for i in grid}
        if len(chosen) <= max_ranks:
            break
    return {"ranks": sorted(chosen), "of": len(recorded), "max_ranks": int(max_ranks),
            "slowest": slowest,
            "how": "evenly spaced over the recorded ranks, with the first and the slowest "
                   "(most busy seconds per step)"}


def trace_events(run: Run, window: tuple[int, int | None] | None = None,
                 max_ranks: int = 0) -> dict[str, Any]:
    """The Chrome trace of one run (see the module docstring); of a sample of
    ``max_ranks`` ranks (:func:`sample_ranks`) when it holds more (0: every rank)."""
    sample = sample_ranks(run, max_ranks)
    ranks = sample["ranks"] if sample is not None else sorted(run.ranks)
    events: list[dict[str, Any]] = []
    for rank in ranks:
        events += _metadata(run, rank)
    order = step_order(run.attrs)
    for rank in ranks:
        events += _rank_slices(rank, run.ranks[rank], window, order)
    recorded = read_events(run.path)  # --events on; empty for other files
    traced = set(ranks)
    for rank in sorted(recorded):
        if rank in traced:
            events += collective_slices(rank, recorded[rank], window)
    events += _eval_instants(run, window)
    other: dict[str, Any] = {
        "source": run.path, "algorithm": run.algorithm, "world_size": run.world_size,
        "model": run.model, "dataset": run.dataset, "complete": run.complete,
        "steps": None if window is None else f"{window[0]}:{_bound(window[1])}",
    }
    if sample is not None:
        other["ranks_sampled"] = sample
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


#: ``--beside``: the second run's processes are numbered from here (ranks + this).
BESIDE_PID = 1_000_000


def _first_start_us(events: list[dict[str, Any]]) -> float:
    return min((e["ts"] for e in events if e.get("ph") == "X"), default=0.0)


def side_by_side(first: dict[str, Any], second: dict[str, Any],
                 labels: tuple[str, str]) -> dict[str, Any]:
    """Two runs' traces in one: each run's time from its own first step (a measured run
    is on the Unix clock, a simulated one from 0), the second's processes numbered from
    :data:`BESIDE_PID` and sorted after the first's, every process named with its
    run's label (e.g. a measured run and the simulator's prediction of it)."""
    out: list[dict[str, Any]] = []
    for index, (trace, label) in enumerate(zip((first, second), labels)):
        t0 = _first_start_us(trace["traceEvents"])
        for event in trace["traceEvents"]:
            event = dict(event)
            event["pid"] = event.get("pid", 0) + index * BESIDE_PID
            if "ts" in event:
                event["ts"] = event["ts"] - t0
            if event.get("name") == "process_name":
                event["args"] = {"name": f"{label}: {event['args']['name']}"}
            elif event.get("name") == "process_sort_index":
                event["args"] = {"sort_index": event["args"]["sort_index"] + index * BESIDE_PID}
            out.append(event)
    other = {**first["otherData"], "beside": second["otherData"], "labels": list(labels)}
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def write_trace(run: Run, out: str | os.PathLike[str],
                window: tuple[int, int | None] | None = None,
                max_ranks: int = 0, beside: Run | None = None) -> dict[str, Any]:
    """Write the trace of ``run`` to ``out`` (of a sample of ``max_ranks`` ranks when it
    holds more; 0: every rank), with ``beside``'s below it when given
    (:func:`side_by_side`); returns its ``otherData`` with ``phase_slices``, the
    number of phase slices."""
    trace = trace_events(run, window, max_ranks)
    if beside is not None:
        trace = side_by_side(trace, trace_events(beside, window, max_ranks),
                             (_run_label(run), _run_label(beside)))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(trace, f, allow_nan=False)
    slices = sum(1 for e in trace["traceEvents"] if e.get("cat") == "phase")
    return {**trace["otherData"], "phase_slices": slices}


def _run_label(run: Run) -> str:
    """``measured`` or ``simulated``, and the file's name."""
    kind = "simulated" if bool(run.attrs.get("simulated", False)) else "measured"
    return f"{kind} {os.path.basename(run.path)}"
