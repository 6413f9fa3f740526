"""The report's figures of run files (matplotlib, imported only when plotting).

:func:`write_plots` writes, into one directory, in the ``--plot-format``
(png, pdf, svg; :mod:`.plot_style`) at ``--dpi``, the summary figures:

- ``headline``: time to target and samples/s of every strategy against the
  baseline per slowdown configuration, median with min-max whiskers
  (:mod:`.headline`); skipped with a note without a configuration that has
  the baseline and another strategy.
- ``scaling``: speedup and parallel efficiency against N, with the ideal
  lines; medians over repeats, bars min to max; series with a speedup at two
  or more world sizes only (else skipped with a note).
- ``convergence``: test accuracy of the consensus model against training
  time and against samples seen, per series and N: the median over repeats
  with a band from the lowest to the highest repeat.
- ``consensus``: the decentralized strategies' consensus distance
  (1/N) sum_i ||x_i - x_bar||^2 at each evaluation against training time, on a
  log scale, the same way (skipped without a run that records it).

and, only when asked (``--per-run-plots``), three figures per run:

- ``<run>_phases``: per-rank stacked bars of seconds per phase.
- ``<run>_timeline``: per-rank Gantt chart of a window of steps, phases drawn
  as ``syncbench trace`` draws them (the strategy's step order); evaluations
  and ASGD's parameter snapshots marked on rank 0.
- ``<run>_local_steps``: Oscars' and Local SGD's local steps per round of
  every rank against time (skipped without them and at N = 1).

Every figure is sized for a paper (``--figure-width``: one or two columns)
and carries a caption under it: the experiment (model, dataset, global batch,
ranks), the machine (CPU model, cores, the context line of
``analysis.context``) and what the marks are (median, min-max over the
repeats; whiskers and bands only with two or more).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .completeness import incomplete_reason
from .headline import Headline, headline_from_rows, plot_headline
from .plot_style import (
    MARKERS,
    MIN_FONT_PT,
    PlotOutput,
    experiment_caption,
    panel_grid,
    pyplot,
    save,
)
from .runfile import Run
from .schema import PHASES, strategy_traits
from .trace import NS, in_window, phase_bounds_ns, step_ends, step_order

#: One colour per phase, the same in every plot.
PHASE_COLORS: dict[str, str] = {
    "data": "#9e9e9e", "compute": "#1f77b4", "comm": "#ff7f0e",
    "wait": "#d62728", "update": "#2ca02c", "delay": "#9467bd", "codec": "#bcbd22",
}
#: The phases in plain words, for legends.
PHASE_NAMES: dict[str, str] = {
    "data": "data loading", "compute": "computation", "comm": "communication",
    "wait": "waiting for other ranks", "update": "parameter update",
    "delay": "emulated slowdown", "codec": "encoding and decoding",
}
#: Steps of the default timeline window.
TIMELINE_STEPS = 8


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _stems(runs: Sequence[Run]) -> list[str]:
    """A unique file-name stem per run (the run file's, suffixed when repeated)."""
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        stem = Path(run.path).stem or "run"
        seen[stem] = seen.get(stem, 0) + 1
        out.append(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}")
    return out


def _title(run: Run) -> str:
    """``asgd, 2 ranks, run.h5`` (and why the run is incomplete)."""
    reason = incomplete_reason(run.complete, run.stopped_by)
    ranks = f"{run.world_size} rank{'' if run.world_size == 1 else 's'}"
    return f"{run.algorithm}, {ranks}, {Path(run.path).name}" + (f"; {reason}" if reason
                                                                 else "")


def _legend_below(fig: Any, handles: Sequence[Any], labels: Sequence[str]) -> Any:
    """A figure legend under the panels (:func:`~.plot_style.save` places it)."""
    chars = fig.get_figwidth() * 13  # 8 pt characters across, with each entry's handle
    longest = max(map(len, labels), default=1) + 6
    ncol = max(1, min(len(labels), int(chars // longest)))
    return fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False,
                      fontsize=MIN_FONT_PT, handlelength=1.8, columnspacing=1.2)


def _axes_legend(fig: Any, axes: Sequence[Any]) -> Any:
    """The figure legend of every labelled artist of ``axes``, each label once."""
    unique: dict[str, Any] = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            unique.setdefault(label, handle)
    return _legend_below(fig, list(unique.values()), list(unique))


def _spread(values: Sequence[float]) -> tuple[float, float, float, int]:
    """(median, min, max, count) of the finite ``values`` (NaN and 0 when none)."""
    vals = np.asarray(values, dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return math.nan, math.nan, math.nan, 0
    return float(np.median(vals)), float(np.min(vals)), float(np.max(vals)), int(vals.size)


# ---------------------------------------------------------------- scaling


def scaling_series(rows: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """The series with a speedup at two or more world sizes: (label, key) -> their rows."""
    series: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        label, key = row.get("_series") or (str(row.get("algorithm")), ())
        series.setdefault((label, key), []).append(row)
    return {k: v for k, v in series.items()
            if len({int(r["world_size"]) for r in v
                    if isinstance(r.get("speedup"), float) and math.isfinite(r["speedup"])}) >= 2}


def plot_scaling(plt: Any, rows: Sequence[dict[str, Any]], path: Path,
                 caption: str | None = None,
                 series: dict[tuple, list[dict[str, Any]]] | None = None,
                 width: float | None = None) -> str:
    """Speedup and efficiency against N, one line per series with two or more N, ideal lines.

    Only series of :func:`scaling_series` are drawn (the caller skips the
    figure when there is none; ``series``: that result, when the caller has it).
    A point is the median over its repeats; whiskers (min to max) only where a
    point has two or more.
    """
    width = PlotOutput().inches if width is None else width
    series = scaling_series(rows) if series is None else series
    rows = [r for members in series.values() for r in members]
    labels = [label for label, _ in series]
    nrows, ncols = panel_grid(width)
    fig, (ax_s, ax_e) = plt.subplots(nrows, ncols, figsize=(width, 2.3 * nrows + 0.3),
                                     layout="constrained")
    all_n: set[int] = set()
    kinds = sorted({str(r.get("scaling")) for r in rows})
    ordered = sorted(series.items(), key=lambda kv: str(kv[0]))
    for i, ((label, _key), members) in enumerate(ordered):
        ns = sorted({int(r["world_size"]) for r in members})
        all_n.update(ns)
        if labels.count(label) > 1:  # same label, other model/dataset
            label = f"{label} {members[0].get('model')} {members[0].get('dataset')}"
        marker = MARKERS[i % len(MARKERS)]
        for ax, col in ((ax_s, "speedup"), (ax_e, "efficiency")):
            stats = [_spread([r[col] for r in members if int(r["world_size"]) == n])
                     for n in ns]
            med = np.array([s[0] for s in stats])
            line = ax.plot(ns, med, marker=marker, label=label)[0]
            for n, (m, lo, hi, count) in zip(ns, stats, strict=True):
                if count >= 2:
                    ax.errorbar([n], [m], yerr=[[m - lo], [hi - m]], fmt="none", capsize=2,
                                ecolor=line.get_color(), linewidth=0.8)
    ns = sorted(all_n) or [1]
    n0s = sorted({int(r["baseline_world_size"]) for r in rows
                  if r.get("baseline_world_size") is not None}) or [ns[0]]
    for j, n0 in enumerate(n0s):
        xs = np.array([n for n in ns if n >= n0], dtype=np.float64)
        if xs.size > 1:
            ax_s.plot(xs, xs / n0, linestyle="--", color="black", linewidth=0.8,
                      dashes=(4 + 2 * j, 2), label=f"ideal, N/{n0}")
    ax_e.axhline(1.0, linestyle=":", color="black", linewidth=0.8, label="ideal efficiency")
    for ax in (ax_s, ax_e):
        ax.set_xlabel("ranks N")
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
    ax_s.set_ylabel("speedup over N0 ranks\n(samples/s ratio, ×)")
    ax_e.set_ylabel("parallel efficiency\n(speedup × N0 / N)")
    top = max([1.2, *(float(v) for r in rows for v in [r.get("efficiency")]
                      if v is not None and math.isfinite(v))]) * 1.1
    ax_e.set_ylim(0, top)
    ax_s.set_ylim(bottom=0)
    ax_s.set_title("Speedup, " + " and ".join(kinds) + " scaling")
    ax_e.set_title("Parallel efficiency")
    legend = _axes_legend(fig, (ax_s, ax_e))
    counts = [_spread([r["speedup"] for r in members if int(r["world_size"]) == n])[3]
              for members in series.values() for n in {int(r["world_size"]) for r in members}]
    most = max(counts, default=1)
    note = (f"Points: median, min-max over {most} repeats." if most >= 2
            else "Points: one run each, no whiskers.")
    return save(plt, fig, path, f"{caption} {note}" if caption else note, legend)


# ---------------------------------------------------------------- convergence


def _series_name(row: dict[str, Any]) -> str:
    series = row.get("_series")
    return series[0] if series else str(row.get("algorithm"))


def _has_curve(run: Run) -> bool:
    acc = np.asarray(run.eval.get("accuracy", ()), dtype=np.float64)
    return bool(acc.size and np.isfinite(acc).any())


def convergence_groups(runs: Sequence[Run], rows: Sequence[dict[str, Any]]
                       ) -> list[tuple[str, int, list[Run]]]:
    """(series label, N, the repeats) of every run with a finite accuracy curve."""
    groups: dict[tuple, list[Run]] = {}
    for run, row in zip(runs, rows, strict=True):
        if _has_curve(run):
            groups.setdefault((_series_name(row), run.world_size), []).append(run)
    return [(name, n, groups[(name, n)]) for name, n in sorted(groups, key=str)]


def median_band(curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 60
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, median, min, max) of step curves (accuracy held from each evaluation on).

    The grid spans the x range every repeat covers (from the latest first
    evaluation to the earliest last one), so every point has every repeat.
    """
    lo = max(float(x[0]) for x, _ in curves)
    hi = min(float(x[-1]) for x, _ in curves)
    if not hi > lo:
        lo, hi = min(float(x[0]) for x, _ in curves), max(float(x[-1]) for x, _ in curves)
    grid = np.linspace(lo, hi, points)
    held = []
    for x, y in curves:
        idx = np.clip(np.searchsorted(x, grid, side="right") - 1, 0, len(x) - 1)
        held.append(y[idx])
    stack = np.vstack(held)
    return grid, np.median(stack, axis=0), np.min(stack, axis=0), np.max(stack, axis=0)


def draw_curves(ax: Any, curves: Sequence[tuple[np.ndarray, np.ndarray]], color: Any,
                marker: str, label: str) -> None:
    """One series: a single run as measured (with markers), repeats as their median with
    a band from the lowest to the highest (:func:`median_band`)."""
    if len(curves) == 1:
        ax.plot(*curves[0], marker=marker, markersize=3, color=color, label=label)
        return
    grid, med, lo, hi = median_band(curves)
    ax.plot(grid, med, color=color, label=label)
    ax.fill_between(grid, lo, hi, color=color, alpha=0.2, linewidth=0)


def plot_convergence(plt: Any, runs: Sequence[Run], rows: Sequence[dict[str, Any]],
                     path: Path, caption: str | None = None,
                     groups: list[tuple[str, int, list[Run]]] | None = None,
                     width: float | None = None) -> str:
    """Test accuracy against training time and against samples seen.

    One curve per (series, N): a single run as measured; repeats as their
    median (accuracy held from each evaluation to the next) with a band from
    the lowest to the highest repeat. The legend sits under the panels.
    ``groups``: :func:`convergence_groups` of the runs, when the caller has it.
    """
    width = PlotOutput().inches if width is None else width
    groups = convergence_groups(runs, rows) if groups is None else groups
    names = sorted({name for name, _, _ in groups})
    sizes = sorted({n for _, n, _ in groups})
    cmap = plt.get_cmap("tab10")
    nrows, ncols = panel_grid(width)
    fig, (ax_t, ax_n) = plt.subplots(nrows, ncols, figsize=(width, 2.2 * nrows + 0.3),
                                     layout="constrained")
    for name, n, members in groups:
        color = cmap(names.index(name) % 10)
        marker = MARKERS[sizes.index(n) % len(MARKERS)]
        partial = "" if all(r.complete for r in members) else ", incomplete"
        label = f"{name}, {n} rank{'' if n == 1 else 's'}" + partial
        for ax, xkey in ((ax_t, "t"), (ax_n, "samples_seen")):
            curves = []
            for run in members:
                x = np.asarray(run.eval[xkey], dtype=np.float64)
                y = np.asarray(run.eval["accuracy"], dtype=np.float64)
                ok = np.isfinite(x) & np.isfinite(y)
                order = np.argsort(x[ok], kind="stable")
                curves.append((x[ok][order], y[ok][order]))
            draw_curves(ax, curves, color, marker, label)
    ax_t.set_xlabel("training time (s, evaluation excluded)")
    ax_n.set_xlabel("training samples seen, all ranks")
    for ax in (ax_t, ax_n):
        ax.set_ylabel("test accuracy (fraction)")
        ax.set_xlim(left=0)
    ax_t.set_title("Test accuracy against time")
    ax_n.set_title("Test accuracy against samples")
    legend = _axes_legend(fig, (ax_t, ax_n))
    most = max((len(members) for _, _, members in groups), default=1)
    note = (f"Lines: median, band min-max over {most} repeats." if most >= 2
            else "One run per line.")
    return save(plt, fig, path, f"{caption} {note}" if caption else note, legend)


def consensus_curve(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """(training time, consensus distance) at a D-PSGD or AD-PSGD run's evaluations (its
    root attributes, matched to ``/eval`` by samples seen); None without them."""
    samples = np.asarray(run.attrs.get("consensus_samples", ()), dtype=np.int64)
    distance = np.asarray(run.attrs.get("consensus_distance", ()), dtype=np.float64)
    if not samples.size or samples.shape != distance.shape:
        return None
    when = dict(zip(np.asarray(run.eval.get("samples_seen", ()), dtype=np.int64).tolist(),
                    np.asarray(run.eval.get("t", ()), dtype=np.float64).tolist()))
    t = np.array([when.get(int(s), np.nan) for s in samples])
    ok = np.isfinite(t) & np.isfinite(distance) & (distance > 0)
    if not ok.any():
        return None
    order = np.argsort(t[ok], kind="stable")
    return t[ok][order], distance[ok][order]


def plot_consensus(plt: Any, runs: Sequence[Run], rows: Sequence[dict[str, Any]],
                   path: Path, caption: str | None = None,
                   width: float | None = None) -> str | None:
    """Consensus distance against training time, one curve per (series, N) as
    :func:`plot_convergence` draws them (log scale); None when no run records it."""
    width = PlotOutput().inches if width is None else width
    groups: dict[tuple[str, int], list[tuple[np.ndarray, np.ndarray]]] = {}
    for run, row in zip(runs, rows, strict=True):
        curve = consensus_curve(run)
        if curve is not None:
            groups.setdefault((_series_name(row), run.world_size), []).append(curve)
    if not groups:
        return None
    names = sorted({name for name, _ in groups})
    sizes = sorted({n for _, n in groups})
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(width, 2.4), layout="constrained")
    for (name, n), curves in sorted(groups.items(), key=str):
        color = cmap(names.index(name) % 10)
        marker = MARKERS[sizes.index(n) % len(MARKERS)]
        label = f"{name}, {n} rank{'' if n == 1 else 's'}"
        draw_curves(ax, curves, color, marker, label)
    ax.set_yscale("log")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("consensus distance\n(mean squared distance to x_bar)")
    ax.set_xlim(left=0)
    ax.set_title("How far the ranks' models are apart")
    legend = _axes_legend(fig, (ax,))
    most = max(len(c) for c in groups.values())
    note = (f"Lines: median, band min-max over {most} repeats." if most >= 2
            else "One run per line.")
    return save(plt, fig, path, f"{caption} {note}" if caption else note, legend)


# ---------------------------------------------------------------- per run


def plot_phases(plt: Any, run: Run, path: Path, width: float | None = None) -> str:
    """Per-rank stacked bars: seconds spent in each phase over the whole run."""
    width = PlotOutput().inches if width is None else width
    ranks = sorted(run.ranks)
    fig, ax = plt.subplots(figsize=(width, 2.4), layout="constrained")
    bottom = np.zeros(len(ranks))
    for p in PHASES:
        seconds = np.array([float(np.sum(run.ranks[r][f"t_{p}"])) for r in ranks])
        ax.bar(ranks, seconds, bottom=bottom, color=PHASE_COLORS[p], label=PHASE_NAMES[p],
               width=0.7)
        bottom += seconds
    wall = run.summary.get("wall_s", math.nan)
    if math.isfinite(wall):
        ax.axhline(wall, linestyle="--", color="black", linewidth=0.8,
                   label=f"wall time {wall:.3g} s")
    ax.set_xticks(ranks)
    ax.set_xticklabels([_rank_label(run, r) for r in ranks])
    if len(ranks) <= 2:  # keep one or two bars from filling the whole width
        ax.set_xlim(min(ranks, default=0) - 1.0, max(ranks, default=0) + 1.0)
    ax.set_xlabel("rank")
    ax.set_ylabel("time over the run (s)")
    ax.set_title(f"Time per phase per rank: {_title(run)}")
    legend = _axes_legend(fig, (ax,))
    return save(plt, fig, path, experiment_caption([run]), legend)


def _rank_label(run: Run, rank: int) -> str:
    slow = run.rank_attrs.get(rank, {}).get("slowdown")
    try:
        slow = float(slow)
    except (TypeError, ValueError):
        slow = 1.0
    return str(rank) if slow == 1.0 or not math.isfinite(slow) else f"{rank}\n(x{slow:g})"


def _reference_rank(run: Run) -> int:
    """The rank whose steps define the timeline's time interval (rank 0 if recorded)."""
    return 0 if 0 in run.ranks else min(run.ranks)


def default_window(run: Run) -> tuple[int, int]:
    """Up to :data:`TIMELINE_STEPS` steps from the middle of the reference rank's steps."""
    steps = np.asarray(run.ranks[_reference_rank(run)]["step"]) if run.ranks \
        else np.zeros(0, dtype=int)
    if steps.size <= TIMELINE_STEPS:
        return (int(steps[0]) if steps.size else 0), (int(steps[-1]) + 1 if steps.size else 1)
    lo = int(steps[steps.size // 2 - TIMELINE_STEPS // 2])
    return lo, lo + TIMELINE_STEPS


def timeline_interval(run: Run, window: tuple[int, int | None]) -> tuple[float, float]:
    """(start, end) in seconds of the reference rank's steps inside ``window``.

    Falls back to the whole run when the reference rank has no step there.
    """
    cols = run.ranks[_reference_rank(run)]
    mask = in_window(cols["step"], window)
    if not mask.any():
        mask = np.ones(np.asarray(cols["step"]).shape, dtype=bool)
    if not mask.any():
        return 0.0, 1.0
    return (float(np.min(np.asarray(cols["t_start"], np.float64)[mask])),
            float(np.max(step_ends(cols)[mask])))


def plot_timeline(plt: Any, run: Run, path: Path,
                  window: tuple[int, int | None] | None = None,
                  width: float | None = None) -> str:
    """Per-rank Gantt chart of the time interval of a window of steps.

    The window (``A <= step < B``, default :func:`default_window`) is taken on
    the reference rank (rank 0); every rank's steps that overlap the same time
    interval are drawn, so ranks that step at different rates (Oscars, ASGD)
    are compared at the same moments.
    """
    width = PlotOutput().inches if width is None else width
    window = window or default_window(run)
    ranks = sorted(run.ranks)
    t_lo, t_hi = timeline_interval(run, window)
    span = max(t_hi - t_lo, 1e-9)
    scale, unit = (1e3, "ms") if span < 2.0 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(width, 0.9 + 0.32 * len(ranks)), layout="constrained")
    order = step_order(run.attrs)
    for row, r in enumerate(ranks):
        cols = run.ranks[r]
        bounds = phase_bounds_ns(cols, order)[:, :] / NS
        mask = (bounds[:, -1] >= t_lo) & (bounds[:, 0] <= t_hi)
        for k, p in enumerate(order):
            x = bounds[mask, k] * scale
            w = (bounds[mask, k + 1] - bounds[mask, k]) * scale
            ax.broken_barh(list(zip(x, w)), (row - 0.38, 0.76), facecolors=PHASE_COLORS[p],
                           label=PHASE_NAMES[p] if np.any(w > 0) else None)
        for s0 in bounds[mask, 0] * scale:  # step boundaries
            ax.plot([s0, s0], [row - 0.45, row + 0.45], color="black", linewidth=0.5)
    ref = _reference_rank(run) if run.ranks else 0
    if ref == 0 and 0 in run.ranks:
        c0 = run.ranks[0]
        steps0 = np.asarray(c0["step"])
        ends = step_ends(c0)
        xs = [float(ends[np.flatnonzero(steps0 == int(s) - 1)[-1]])
              for s in run.eval["step"] if np.any(steps0 == int(s) - 1)]
        xs = [x * scale for x in xs if t_lo <= x <= t_hi]
        if xs and strategy_traits(run.attrs).snapshot_evaluations:
            ax.plot(xs, [ranks.index(0) - 0.5] * len(xs), "v", markerfacecolor="none",
                    color="black", markersize=5, clip_on=False,
                    label="parameter snapshot, no pause")
        elif xs:
            ax.plot(xs, [ranks.index(0) - 0.5] * len(xs), "v", color="black", markersize=5,
                    label="evaluation", clip_on=False)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {_rank_label(run, r).replace(chr(10), ' ')}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.6)
    ax.set_xlim(t_lo * scale, (t_hi + 0.01 * span) * scale)
    ax.set_xlabel(f"time since the start of the run ({unit}, evaluation pauses included)")
    last = "" if window[1] is None else f"-{int(window[1]) - 1}"
    ax.set_title(f"Steps {window[0]}{last} of rank {ref}, every rank: {_title(run)}")
    ax.grid(axis="y", visible=False)
    legend = _axes_legend(fig, (ax,))
    note = ("Phases of a step drawn back to back in the order they run; ticks mark step "
            "starts.")
    return save(plt, fig, path, f"{experiment_caption([run])} {note}", legend)


def has_local_steps(run: Run) -> bool:
    """True when some rank recorded a non-zero ``local_steps``."""
    return any(np.any(np.asarray(c["local_steps"]) > 0) for c in run.ranks.values())


def plot_local_steps(plt: Any, run: Run, path: Path, width: float | None = None) -> str:
    """Local steps per round of every rank against time (step plot)."""
    width = PlotOutput().inches if width is None else width
    fig, ax = plt.subplots(figsize=(width, 2.4), layout="constrained")
    top = 1
    for r in sorted(run.ranks):
        cols = run.ranks[r]
        t = np.asarray(cols["t_start"], dtype=np.float64)
        tau = np.asarray(cols["local_steps"])
        top = max(top, int(tau.max()) if tau.size else 1)
        label = f"rank {r}" + _rank_label(run, r)[len(str(r)):].replace("\n", " ")
        ax.step(t, tau, where="post", label=label,
                marker=MARKERS[r % len(MARKERS)], markersize=3)
    ax.set_xlabel("time since the start of the run (s, evaluation pauses included)")
    ax.set_ylabel("local steps per round (steps)")
    ax.yaxis.set_major_locator(_integer_locator())
    ax.set_ylim(0, top * 1.15 + 0.5)
    ax.set_xlim(left=0)
    ax.set_title(f"Local-step schedule: {_title(run)}")
    legend = _axes_legend(fig, (ax,))
    return save(plt, fig, path, experiment_caption([run]), legend)


# ---------------------------------------------------------------- all


def _summary_plots(plt: Any, runs: Sequence[Run], rows: Sequence[dict[str, Any]], out: Path,
                   output: PlotOutput, headline: Headline | None
                   ) -> tuple[list[str], list[str]]:
    """The headline, scaling and convergence figures; (files written, notes)."""
    caption = experiment_caption(runs)
    width = output.inches
    written: list[str] = []
    notes: list[str] = []
    why = ""
    if headline is None:
        headline, why = headline_from_rows(rows)
    if headline is not None:
        written.append(plot_headline(plt, headline, output.path(out, "headline"), caption,
                                     width))
    else:
        notes.append(why)
    series = scaling_series(rows)
    if series:
        written.append(plot_scaling(plt, rows, output.path(out, "scaling"), caption, series,
                                    width))
    else:
        notes.append("scaling plot skipped: no series has a speedup at two or more world "
                     "sizes (one N per series, or runs mixed, overlapped or diverged)")
    groups = convergence_groups(runs, rows)
    if groups:
        written.append(plot_convergence(plt, runs, rows, output.path(out, "convergence"),
                                        caption, groups, width))
    else:
        notes.append("convergence plot skipped: no run has a finite accuracy curve")
    consensus = plot_consensus(plt, runs, rows, output.path(out, "consensus"), caption, width)
    if consensus is not None:
        written.append(consensus)
    return written, notes


def _per_run_plots(plt: Any, runs: Sequence[Run], out: Path, output: PlotOutput,
                   window: tuple[int, int | None] | None) -> tuple[list[str], list[str]]:
    """The three figures of every run; (files written, notes)."""
    written: list[str] = []
    notes: list[str] = []
    flat = []
    width = output.inches
    local = [has_local_steps(run) for run in runs]
    for run, stem, has_local in zip(runs, _stems(runs), local, strict=True):
        written.append(plot_phases(plt, run, output.path(out, f"{stem}_phases"), width))
        written.append(plot_timeline(plt, run, output.path(out, f"{stem}_timeline"), window,
                                     width))
        if has_local and run.world_size > 1:
            written.append(plot_local_steps(plt, run, output.path(out, f"{stem}_local_steps"),
                                            width))
        elif has_local:
            flat.append(Path(run.path).name)
    if not any(local):
        notes.append("no run has non-zero local_steps (Oscars / Local SGD): "
                     "local-step schedule plot skipped")
    if flat:
        notes.append("local-step schedule plot skipped at N=1 (one rank: a flat line): "
                     + ", ".join(flat))
    return written, notes


def write_plots(runs: Sequence[Run], rows: Sequence[dict[str, Any]],
                out_dir: str | os.PathLike[str], by: Sequence[str] = (),
                window: tuple[int, int | None] | None = None,
                output: PlotOutput | None = None, per_run: bool = False,
                headline: Headline | None = None) -> tuple[list[str], list[str]]:
    """Write the figures of the module docstring; returns (files written, notes).

    ``rows`` are the per-run rows of :func:`~syncbench.analysis.tables.table_rows`
    (same order as ``runs``); ``output`` the format, dpi and width (default
    :class:`~.plot_style.PlotOutput`: PDF, two columns wide);
    ``per_run`` adds the three figures of every run (``window``: the timeline's
    steps, ``A <= step < B``); ``headline`` the runner's headline
    (:func:`~syncbench.analysis.headline.headline_from_cells`; default: from
    ``rows``). ``by`` is accepted for symmetry with the report (the series are
    already in the rows' scaling columns). A figure with nothing to show is
    skipped with a one-line note.
    """
    output = output or PlotOutput()
    plt = pyplot(output.dpi)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, notes = _summary_plots(plt, runs, rows, out, output, headline)
    if per_run:
        more, more_notes = _per_run_plots(plt, runs, out, output, window)
        written += more
        notes += more_notes
    return written, notes
