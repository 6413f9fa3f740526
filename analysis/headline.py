"""The headline figure: time to target and samples/s of every strategy against the baseline.

One bar per (strategy label, slowdown configuration) in two panels, time to the
target (an accuracy, or a language model's validation loss) over the baseline's
(lower is better) and samples/s over the baseline's (higher is better): the bar
is the median over repeats, the whisker spans min to max where the bar has two
or more repeats, a dashed line marks the baseline at 1.0, the legend gives the
baseline's own figures (s, samples/s) per configuration, and the caption the
experiment, the machine and what the bars are (:func:`headline_note`). A bar
that cannot be drawn says why, horizontally at its place (``diverged``, ``not
reached``, ``incomplete``); a whisker whose maximum is a repeat that never
reached the target ends in an arrow; a bar whose runs were flagged
(:data:`FLAGS`: loaded, some diverged, some incomplete) is hatched, with a
legend entry.

The numbers come from a pure step, so tests compare them with the tables:

- :func:`headline_from_cells`: the runner's cells
  (``bench.experiment.aggregate.scenario_cells``, ``results.json``): the ratios
  there are taken per repeat, against the baseline's run of the same repeat
  and configuration, then summarised (``ttt_ratio``, ``sps_ratio``).
- :func:`headline_from_rows`: ``syncbench report``'s per-run rows
  (``analysis.tables.table_rows``), grouped by configuration and strategy with
  ``analysis.repeats.group_rows``; report files carry no repeat pairing, so the
  ratios are to the baseline group's median (incomplete runs left out).

:func:`headline_figure` draws a :class:`Headline` (matplotlib, lazily through
:mod:`.plot_style`), :func:`plot_headline` writes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .completeness import is_incomplete
from .plot_style import MIN_FONT_PT, PlotOutput, panel_grid, save
from .repeats import group_rows
from .targets import METRICS as METRIC_NAMES
from .targets import Target

#: The baseline of a report when the runs include it (else the first strategy).
DEFAULT_BASELINE = "ssgd"
#: (Headline attribute, the runner cell's ratio key) of the two panels.
METRICS: tuple[tuple[str, str], ...] = (("time_to_target", "ttt_ratio"),
                                         ("samples_per_s", "sps_ratio"))
RUNNER_BASIS = "ratios per repeat, to the baseline's run of the same repeat and configuration"
REPORT_BASIS = "ratios to the baseline's median in the same configuration"
#: Flags a bar's runs may carry: (hatch drawn on the bar, the legend's words).
FLAGS: dict[str, tuple[str, str]] = {
    "loaded": ("////", "LOADED: other processes used the cores"),
    "diverged": ("xxx", "some repeats diverged (left out)"),
    "incomplete": ("...", "some runs incomplete (left out)"),
}


@dataclass(frozen=True)
class Bar:
    """One bar: a ratio's median, min and max (``high`` inf: a repeat never reached the
    target), the number of ratios, and ``status``, why there is no bar (None: drawn)."""

    configuration: str
    label: str
    median: float | None
    low: float | None
    high: float | None
    n: int = 0
    status: str | None = None
    #: what the bar's runs were flagged with (keys of :data:`FLAGS`)
    flags: tuple[str, ...] = ()


@dataclass
class Headline:
    """The plotted numbers of the headline figure (:func:`headline_from_cells`)."""

    name: str
    baseline: str
    target: float | None
    repeats: int
    basis: str
    labels: list[str]
    configurations: list[str]
    time_to_target: list[Bar] = field(default_factory=list)
    samples_per_s: list[Bar] = field(default_factory=list)
    #: configuration -> (the baseline's median time to target in s, its samples/s)
    baseline_values: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    #: What ``target`` is: a test accuracy, or a language model's validation loss.
    target_metric: str = "accuracy"

    def bar(self, metric: str, configuration: str, label: str) -> Bar | None:
        """The bar of ``metric`` (:data:`METRICS`) for one configuration and label."""
        return next((b for b in getattr(self, metric)
                     if b.configuration == configuration and b.label == label), None)

    def heights(self, metric: str) -> dict[tuple[str, str], float]:
        """(configuration, label) -> bar height of the bars that are drawn."""
        return {(b.configuration, b.label): b.median for b in getattr(self, metric)
                if b.status is None and b.median is not None}


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _cell_flags(cell: Mapping[str, Any]) -> tuple[str, ...]:
    """The :data:`FLAGS` of a runner cell: some of its runs loaded, diverged, incomplete."""
    runs = int(cell.get("runs") or 0)
    flags = []
    if int(cell.get("loaded") or 0):
        flags.append("loaded")
    if 0 < int(cell.get("diverged") or 0) < runs:
        flags.append("diverged")
    if 0 < int(cell.get("incomplete") or 0) < runs:
        flags.append("incomplete")
    return tuple(flags)


def _cell_bar(cell: Mapping[str, Any], key: str, title: str) -> Bar:
    """A runner cell's ratio as a bar (results.json writes infinities as null: a maximum
    missing beside a median is a repeat that never reached the target)."""
    stats = cell.get(key) or {}
    median = _finite(stats.get("median"))
    status = stats.get("status")
    flags = _cell_flags(cell)
    if median is None:
        return Bar(title, cell["label"], None, None, None, int(stats.get("n") or 0),
                   status or "-", flags)
    high = stats.get("max")
    high = math.inf if high is None or math.isinf(float(high)) else float(high)
    return Bar(title, cell["label"], median, _finite(stats.get("min")), high,
               int(stats.get("n") or 0), status, flags)


def headline_from_cells(cells: Sequence[Mapping[str, Any]], baseline: str,
                        titles: Mapping[str, str] | None = None, name: str = "",
                        target: float | Target | None = None,
                        repeats: int | None = None) -> Headline:
    """The headline of the runner's cells (module docstring); ``titles``: configuration
    key -> its human title (default: the key); a float ``target`` is an accuracy."""
    titles = dict(titles or {})
    metric = "accuracy"
    if isinstance(target, Target):
        metric, target = target.metric, target.value
    configs = list(dict.fromkeys(titles.get(c["condition"], c["condition"]) for c in cells))
    labels = list(dict.fromkeys(c["label"] for c in cells))
    head = Headline(name, baseline, target,
                    repeats or max((int(c.get("runs") or 0) for c in cells), default=0),
                    RUNNER_BASIS, labels, configs, target_metric=metric)
    for cell in cells:
        title = titles.get(cell["condition"], cell["condition"])
        for metric, key in METRICS:
            getattr(head, metric).append(_cell_bar(cell, key, title))
        if cell["label"] == baseline:
            head.baseline_values[title] = (
                _finite((cell.get("time_to_target_s") or {}).get("median")),
                _finite((cell.get("samples_per_s") or {}).get("median")))
    return head


def headline_from_results(results: Mapping[str, Any]) -> Headline:
    """The headline of a runner's ``results.json`` (read as a dict)."""
    scenario = results.get("scenario") or {}
    titles = {r["condition"]: r["condition_title"] for r in results.get("runs") or ()
              if r.get("condition_title")}
    loss = _finite(scenario.get("target_loss"))
    target = Target("loss", loss) if loss is not None else scenario.get("target_accuracy")
    return headline_from_cells(results.get("cells") or [], str(scenario.get("baseline")),
                               titles, str(scenario.get("name") or ""),
                               target, scenario.get("repeats"))


# ---------------------------------------------------------------- the report's rows


def configuration_title(row: Mapping[str, Any], parts: Sequence[str] = ()) -> str:
    """A run's slowdown configuration as the runner names it (``homogeneous``,
    ``slowdown 1,4 mode work``), after the ``parts`` (world size, model) that vary."""
    config = row.get("_config") or {}
    slowdown = config.get("slowdown")
    if slowdown in (None, "", "none"):
        title = "homogeneous"
    else:
        mode = config.get("slowdown_mode")
        title = f"slowdown {slowdown}" + (f" mode {mode}" if mode else "")
        if config.get("slowdown_schedule"):
            title += f" schedule {config['slowdown_schedule']}"
    return " ".join([*parts, title])


def _varying_parts(rows: Sequence[Mapping[str, Any]],
                   among: Sequence[Mapping[str, Any]] | None = None) -> list[list[str]]:
    """Per row, the world size and model/dataset when they differ across ``among``
    (default: the rows themselves)."""
    among = rows if among is None else among
    sizes = {r.get("world_size") for r in among}
    setups = {(r.get("model"), r.get("dataset")) for r in among}
    return [([f"N={r.get('world_size')}"] if len(sizes) > 1 else [])
            + ([f"{r.get('model')}/{r.get('dataset')}"] if len(setups) > 1 else [])
            for r in rows]


def _ratio_bar(group: Mapping[str, Any], key: str, base: float | None, title: str,
               label: str, missing: str, flags: tuple[str, ...] = ()) -> Bar:
    """``group``'s median (min–max) of ``key`` over the baseline's median ``base``."""
    n = int(group.get("repeats") or 1)
    if n and int(group.get("diverged") or 0) >= n:
        return Bar(title, label, None, None, None, n, "diverged", flags)
    if base is None or base <= 0:
        return Bar(title, label, None, None, None, n, f"baseline {missing}", flags)
    median = _finite(group.get(key))
    if median is None:
        return Bar(title, label, None, None, None, n, missing, flags)
    low = _finite(group.get(f"{key}_min"))
    high = _finite(group.get(f"{key}_max"))
    return Bar(title, label, median / base, None if low is None else low / base,
               math.inf if high is None else high / base, n, None, flags)


def _row_flags(members: Sequence[Mapping[str, Any]], left_out: int) -> tuple[str, ...]:
    """The :data:`FLAGS` of a group of report rows (``left_out``: its incomplete runs)."""
    flags = []
    if any(r.get("loaded") is True for r in members):
        flags.append("loaded")
    if any(r.get("diverged") for r in members) and not all(r.get("diverged")
                                                            for r in members):
        flags.append("diverged")
    if left_out:
        flags.append("incomplete")
    return tuple(flags)


def headline_from_rows(rows: Sequence[Mapping[str, Any]], baseline: str | None = None,
                       name: str = "") -> tuple[Headline | None, str]:
    """The headline of the report's per-run rows, or (None, why it is skipped).

    Rows are grouped by configuration and ``algorithm`` (``group_rows``); the
    baseline is ``baseline``, else :data:`DEFAULT_BASELINE` when present, else the
    first strategy. Skipped without a configuration that has the baseline and
    another strategy.
    """
    complete = [dict(r) for r in rows if not is_incomplete(r)]
    for row, parts in zip(complete, _varying_parts(complete), strict=True):
        row["configuration"] = configuration_title(row, parts)
    incomplete = [r for r in rows if is_incomplete(r)]
    left_out: dict[tuple[str, str], int] = {}
    for row, parts in zip(incomplete, _varying_parts(incomplete, complete or None),
                          strict=True):
        key = (configuration_title(row, parts), str(row.get("algorithm")))
        left_out[key] = left_out.get(key, 0) + 1
    algorithms = list(dict.fromkeys(str(r.get("algorithm")) for r in complete))
    if baseline is None:
        baseline = DEFAULT_BASELINE if DEFAULT_BASELINE in algorithms else \
            (algorithms[0] if algorithms else "")
    groups = group_rows(complete, ("configuration", "algorithm")) if complete else []
    configs = list(dict.fromkeys(r["configuration"] for r in complete))
    by_config = {c: {str(g["algorithm"]): g for g in groups if g["configuration"] == c}
                 for c in configs}
    shown = [c for c in configs if baseline in by_config[c] and len(by_config[c]) > 1]
    if not shown:
        return None, (f"headline plot skipped: no configuration has the baseline "
                      f"({baseline or 'no run'}) and another strategy")
    labels = [a for a in algorithms if any(a in by_config[c] for c in shown)]
    labels.sort(key=lambda a: a != baseline)  # the baseline first
    metric, target = next(((m, r.get(f"target_{m}")) for r in complete for m in METRIC_NAMES
                           if r.get(f"target_{m}") is not None), ("accuracy", None))
    head = Headline(name, baseline, _finite(target),
                    max(int(g.get("repeats") or 1) for g in groups), REPORT_BASIS,
                    labels, shown, target_metric=metric)
    for config in shown:
        base = by_config[config][baseline]
        ttt_b, sps_b = _finite(base.get("time_to_target_s")), _finite(base.get("samples_per_s"))
        head.baseline_values[config] = (ttt_b, sps_b)
        for label in labels:
            group = by_config[config].get(label)
            if group is None:
                continue
            members = [r for r in complete if r["configuration"] == config
                       and str(r.get("algorithm")) == label]
            flags = _row_flags(members, left_out.get((config, label), 0))
            head.time_to_target.append(_ratio_bar(group, "time_to_target_s", ttt_b, config,
                                                  label, "not reached", flags))
            head.samples_per_s.append(_ratio_bar(group, "samples_per_s", sps_b, config,
                                                 label, "diverged", flags))
    return head, ""


# ---------------------------------------------------------------- drawing


def _legend_label(head: Headline, config: str) -> str:
    ttt, sps = head.baseline_values.get(config, (None, None))
    target = f" to {head.target:g}" if head.target is not None else ""
    parts = [f"{ttt:.3g} s{target}" if ttt is not None else "target not reached",
             f"{sps:,.0f} samples/s" if sps is not None else "diverged"]
    return f"{config}: {head.baseline} {', '.join(parts)}"


def _top(bars: Sequence[Bar]) -> float:
    values = [v for b in bars if b.status is None for v in (b.median, b.high)
              if v is not None and math.isfinite(v)]
    return max([1.2, *values]) * 1.15


def _hatch(flags: Sequence[str]) -> str | None:
    """The hatch of a bar's flags (overlaid when several), None without a flag."""
    return "".join(FLAGS[f][0][:2] for f in flags) or None


def _status_label(ax: Any, x: float, width: float, top: float, bar: Bar, color: Any) -> None:
    """A bar that is not drawn: its reason, horizontal and readable, at the bar's place
    (over an outline bar hatched with its flags, when it has some)."""
    words = (bar.status or "-").split(" ", 1)
    ax.bar(x, top * 0.28, width, facecolor="white", edgecolor=color, linewidth=0.6,
           linestyle="--", hatch=_hatch(bar.flags), gid=f"status {bar.label}")
    ax.text(x, top * 0.03, "\n".join(words), ha="center", va="bottom",
            fontsize=MIN_FONT_PT, color="black", linespacing=1.0,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})


def _draw_panel(ax: Any, head: Headline, metric: str, colors: Sequence[Any]
                ) -> tuple[bool, bool]:
    """One panel: grouped bars (strategy on x, one per configuration), whiskers where a
    bar has two or more repeats, statuses, flags; (whether a whisker ends at a repeat
    that never reached the target, whether any whisker is drawn)."""
    bars = getattr(head, metric)
    top = _top(bars)
    width = 0.8 / max(1, len(head.configurations))
    never = whiskers = False
    for j, config in enumerate(head.configurations):
        for i, label in enumerate(head.labels):
            bar = head.bar(metric, config, label)
            if bar is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            if bar.status is not None or bar.median is None:
                _status_label(ax, x, width * 0.9, top, bar, colors[j])
                continue
            ax.bar(x, bar.median, width * 0.9, color=colors[j], edgecolor="black",
                   linewidth=0.5, hatch=_hatch(bar.flags), gid=f"bar {config} {label}")
            if bar.n < 2:  # one repeat: no spread to show
                continue
            low = bar.median if bar.low is None else bar.low
            high = bar.high if bar.high is not None else bar.median
            if math.isinf(high):
                never = True
                high = top * 0.97
                ax.plot([x], [high], marker="^", color="black", markersize=4)
            ax.errorbar([x], [bar.median], yerr=[[bar.median - low], [high - bar.median]],
                        fmt="none", ecolor="black", capsize=2, linewidth=0.8)
            whiskers = True
    ax.axhline(1.0, linestyle="--", color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(head.labels)))
    long = sum(len(label) for label in head.labels) > 40
    ax.set_xticklabels(head.labels, rotation=25 if long else 0, ha="right" if long else "center")
    ax.set_xlim(-0.6, len(head.labels) - 0.4)
    ax.set_ylim(0, top)
    ax.grid(axis="x", visible=False)
    return never, whiskers


def _legend(plt: Any, fig: Any, head: Headline, colors: Sequence[Any], never: bool) -> Any:
    """The figure legend below the panels: each configuration with the baseline's own
    figures, the 1.0 line, the flags some bar carries, the never-reached arrow."""
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", linewidth=0.5)
               for c in colors]
    names = [_legend_label(head, c) for c in head.configurations]
    handles.append(plt.Line2D([], [], linestyle="--", color="black", linewidth=0.8))
    names.append(f"baseline {head.baseline} = 1")
    flagged = {f for b in head.time_to_target + head.samples_per_s for f in b.flags}
    for flag in (f for f in FLAGS if f in flagged):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black",
                                     linewidth=0.5, hatch=FLAGS[flag][0][:2]))
        names.append(FLAGS[flag][1])
    if never:
        handles.append(plt.Line2D([], [], marker="^", color="black", linestyle="none",
                                  markersize=4))
        names.append("whisker to the top: a repeat never reached the target")
    ncol = 1 if fig.get_figwidth() < 5 else 2
    return fig.legend(handles, names, loc="lower center", ncol=ncol, frameon=False,
                      fontsize=MIN_FONT_PT, handlelength=1.6, columnspacing=1.2)


def headline_note(head: Headline) -> str:
    """What the bars are, for the caption: the repeats behind them and the ratios' basis."""
    counts = {b.n for b in head.time_to_target + head.samples_per_s if b.status is None}
    most = max(counts, default=head.repeats) or head.repeats
    if most >= 2:
        many = f"{most} repeats" if len(counts) <= 1 else f"up to {most} repeats"
        stats = f"Bars: median, min-max over {many}"
    else:
        stats = "Bars: one run each, no whiskers"
    return f"{stats}; {head.basis}."


def headline_figure(plt: Any, head: Headline, width: float | None = None) -> Any:
    """The headline figure of ``head`` (module docstring), not yet saved; ``width`` in
    inches (default :class:`PlotOutput`'s): panels stacked on one column."""
    width = PlotOutput().inches if width is None else width
    cmap = plt.get_cmap("tab10")
    colors = [cmap(j % 10) for j in range(len(head.configurations))]
    rows, cols = panel_grid(width)
    fig, (ax_t, ax_s) = plt.subplots(rows, cols, figsize=(width, 2.3 * rows + 0.3),
                                     layout="constrained")
    drawn = [_draw_panel(ax, head, metric, colors)
             for ax, metric in ((ax_t, "time_to_target"), (ax_s, "samples_per_s"))]
    target = f" {head.target:g}" if head.target is not None else ""
    ax_t.set_ylabel(f"time to target {head.target_metric}{target}\n/ {head.baseline}'s "
                    "(ratio, ×)")
    ax_s.set_ylabel(f"samples/s / {head.baseline}'s\n(ratio, ×)")
    ax_t.set_title(f"Time to target {head.target_metric} (lower is better)")
    ax_s.set_title("Training throughput (higher is better)")
    for ax in (ax_t, ax_s):
        ax.set_xlabel("strategy")
    _legend(plt, fig, head, colors, any(never for never, _ in drawn))
    scenario = f", scenario {head.name}" if head.name else ""
    fig.suptitle(f"Strategies against {head.baseline}{scenario}", fontweight="bold")
    return fig


def plot_headline(plt: Any, head: Headline, path: Path, caption: str | None = None,
                  width: float | None = None) -> str:
    """Write the headline figure of ``head`` to ``path`` (format from its suffix) with
    ``caption`` (the experiment) and :func:`headline_note` under it."""
    fig = headline_figure(plt, head, width)
    note = headline_note(head)
    text = f"{caption} {note}" if caption else note
    return save(plt, fig, path, text, fig.legends[-1] if fig.legends else None)
