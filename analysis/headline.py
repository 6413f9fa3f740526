"""The headline figure: time to target and samples/s of every strategy against the baseline.

One bar per (strategy label, slowdown configuration) in two panels, time to
the target accuracy over the baseline's (lower is better) and samples/s over
the baseline's (higher is better): the bar is the median over repeats, the
whisker spans min to max, a dashed line marks the baseline at 1.0, the legend
gives the baseline's own figures (s, samples/s) per configuration, the title
the repeat count and the caption the machine context. A bar that cannot be
drawn says why (``diverged``, ``not reached``, ``incomplete``); a whisker
whose maximum is a repeat that never reached the target ends in an arrow.

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
from .plot_style import CAPTION_INCHES, save
from .repeats import group_rows

#: The baseline of a report when the runs include it (else the first strategy).
DEFAULT_BASELINE = "ssgd"
#: (Headline attribute, the runner cell's ratio key) of the two panels.
METRICS: tuple[tuple[str, str], ...] = (("time_to_target", "ttt_ratio"),
                                         ("samples_per_s", "sps_ratio"))
RUNNER_BASIS = "ratios per repeat, to the baseline's run of the same repeat and configuration"
REPORT_BASIS = "ratios to the baseline's median in the same configuration"
#: Height of one row of the legend below the panels.
LEGEND_ROW_INCHES = 0.26


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


def _cell_bar(cell: Mapping[str, Any], key: str, title: str) -> Bar:
    """A runner cell's ratio as a bar (results.json writes infinities as null: a maximum
    missing beside a median is a repeat that never reached the target)."""
    stats = cell.get(key) or {}
    median = _finite(stats.get("median"))
    status = stats.get("status")
    if median is None:
        return Bar(title, cell["label"], None, None, None, int(stats.get("n") or 0),
                   status or "-")
    high = stats.get("max")
    high = math.inf if high is None or math.isinf(float(high)) else float(high)
    return Bar(title, cell["label"], median, _finite(stats.get("min")), high,
               int(stats.get("n") or 0), status)


def headline_from_cells(cells: Sequence[Mapping[str, Any]], baseline: str,
                        titles: Mapping[str, str] | None = None, name: str = "",
                        target: float | None = None, repeats: int | None = None) -> Headline:
    """The headline of the runner's cells (module docstring); ``titles``: configuration
    key -> its human title (default: the key)."""
    titles = dict(titles or {})
    configs = list(dict.fromkeys(titles.get(c["condition"], c["condition"]) for c in cells))
    labels = list(dict.fromkeys(c["label"] for c in cells))
    head = Headline(name, baseline, target,
                    repeats or max((int(c.get("runs") or 0) for c in cells), default=0),
                    RUNNER_BASIS, labels, configs)
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
    return headline_from_cells(results.get("cells") or [], str(scenario.get("baseline")),
                               titles, str(scenario.get("name") or ""),
                               scenario.get("target_accuracy"), scenario.get("repeats"))


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


def _varying_parts(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per row, the world size and model/dataset when they differ across the rows."""
    sizes = {r.get("world_size") for r in rows}
    setups = {(r.get("model"), r.get("dataset")) for r in rows}
    return [([f"N={r.get('world_size')}"] if len(sizes) > 1 else [])
            + ([f"{r.get('model')}/{r.get('dataset')}"] if len(setups) > 1 else [])
            for r in rows]


def _ratio_bar(group: Mapping[str, Any], key: str, base: float | None, title: str,
               label: str, missing: str) -> Bar:
    """``group``'s median (min–max) of ``key`` over the baseline's median ``base``."""
    n = int(group.get("repeats") or 1)
    if n and int(group.get("diverged") or 0) >= n:
        return Bar(title, label, None, None, None, n, "diverged")
    if base is None or base <= 0:
        return Bar(title, label, None, None, None, n, f"baseline {missing}")
    median = _finite(group.get(key))
    if median is None:
        return Bar(title, label, None, None, None, n, missing)
    low = _finite(group.get(f"{key}_min"))
    high = _finite(group.get(f"{key}_max"))
    return Bar(title, label, median / base, None if low is None else low / base,
               math.inf if high is None else high / base, n)


def headline_from_rows(rows: Sequence[Mapping[str, Any]], baseline: str | None = None,
                       name: str = "report") -> tuple[Headline | None, str]:
    """The headline of the report's per-run rows, or (None, why it is skipped).

    Rows are grouped by configuration and ``algorithm`` (``group_rows``); the
    baseline is ``baseline``, else :data:`DEFAULT_BASELINE` when present, else the
    first strategy. Skipped without a configuration that has the baseline and
    another strategy.
    """
    complete = [dict(r) for r in rows if not is_incomplete(r)]
    for row, parts in zip(complete, _varying_parts(complete), strict=True):
        row["configuration"] = configuration_title(row, parts)
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
    target = next((r.get("target_accuracy") for r in complete
                   if r.get("target_accuracy") is not None), None)
    head = Headline(name, baseline, _finite(target),
                    max(int(g.get("repeats") or 1) for g in groups), REPORT_BASIS,
                    labels, shown)
    for config in shown:
        base = by_config[config][baseline]
        ttt_b, sps_b = _finite(base.get("time_to_target_s")), _finite(base.get("samples_per_s"))
        head.baseline_values[config] = (ttt_b, sps_b)
        for label in labels:
            group = by_config[config].get(label)
            if group is None:
                continue
            head.time_to_target.append(_ratio_bar(group, "time_to_target_s", ttt_b, config,
                                                  label, "not reached"))
            head.samples_per_s.append(_ratio_bar(group, "samples_per_s", sps_b, config,
                                                 label, "diverged"))
    return head, ""


# ---------------------------------------------------------------- drawing


def _legend_label(head: Headline, config: str) -> str:
    ttt, sps = head.baseline_values.get(config, (None, None))
    target = f" to {head.target:g}" if head.target is not None else ""
    parts = [f"{ttt:.3g} s{target}" if ttt is not None else "target not reached",
             f"{sps:,.0f} samples/s" if sps is not None else "diverged"]
    return f"{config} ({head.baseline}: {', '.join(parts)})"


def _top(bars: Sequence[Bar]) -> float:
    values = [v for b in bars if b.status is None for v in (b.median, b.high)
              if v is not None and math.isfinite(v)]
    return max([1.2, *values]) * 1.15


def _draw_panel(ax: Any, head: Headline, metric: str, colors: Sequence[Any]) -> bool:
    """One panel: grouped bars (strategy on x, one per configuration), whiskers, statuses;
    whether a whisker ends at a repeat that never reached the target."""
    bars = getattr(head, metric)
    top = _top(bars)
    width = 0.8 / max(1, len(head.configurations))
    never = False
    for j, config in enumerate(head.configurations):
        for i, label in enumerate(head.labels):
            bar = head.bar(metric, config, label)
            if bar is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            if bar.status is not None or bar.median is None:
                ax.text(x, top * 0.02, bar.status or "-", rotation=90, ha="center",
                        va="bottom", fontsize=8, color=colors[j])
                continue
            ax.bar(x, bar.median, width * 0.9, color=colors[j], edgecolor="black",
                   linewidth=0.5)
            low = bar.median if bar.low is None else bar.low
            high = bar.high if bar.high is not None else bar.median
            if math.isinf(high):
                never = True
                high = top * 0.97
                ax.plot([x], [high], marker="^", color="black", markersize=6)
            ax.errorbar([x], [bar.median], yerr=[[bar.median - low], [high - bar.median]],
                        fmt="none", ecolor="black", capsize=3, linewidth=1.2)
    ax.axhline(1.0, linestyle="--", color="black", linewidth=1.2)
    ax.set_xticks(np.arange(len(head.labels)))
    ax.set_xticklabels(head.labels)
    ax.set_xlim(-0.6, len(head.labels) - 0.4)
    ax.set_ylim(0, top)
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("strategy (scenario label)" if head.basis == RUNNER_BASIS else "strategy")
    return never


def _legend(plt: Any, fig: Any, head: Headline, colors: Sequence[Any], never: bool) -> None:
    """Below the panels, above the caption: each configuration with the baseline's
    figures, the 1.0 line; the layout leaves room for both."""
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", linewidth=0.5)
               for c in colors]
    names = [_legend_label(head, c) for c in head.configurations]
    handles.append(plt.Line2D([], [], linestyle="--", color="black"))
    names.append(f"baseline {head.baseline} = 1")
    if never:
        handles.append(plt.Line2D([], [], marker="^", color="black", linestyle="none"))
        names.append("whisker to the top: a repeat never reached the target")
    height = fig.get_figheight()
    rows = math.ceil(len(names) / 2)
    fig.legend(handles, names, loc="lower center", ncol=min(2, len(names)), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, CAPTION_INCHES / height))
    bottom = (CAPTION_INCHES + 0.12 + LEGEND_ROW_INCHES * rows) / height
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))  # (x, y, w, h)


def headline_figure(plt: Any, head: Headline) -> Any:
    """The headline figure of ``head`` (module docstring), not yet saved."""
    cmap = plt.get_cmap("tab10")
    colors = [cmap(j % 10) for j in range(len(head.configurations))]
    width = max(11.0, 4.0 + 0.55 * len(head.labels) * max(1, len(head.configurations)))
    rows = math.ceil((len(head.configurations) + 2) / 2)
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(width, 5.0 + LEGEND_ROW_INCHES * rows),
                                     layout="constrained")
    never = [_draw_panel(ax, head, metric, colors)
             for ax, metric in ((ax_t, "time_to_target"), (ax_s, "samples_per_s"))]
    target = f" {head.target:g}" if head.target is not None else ""
    ax_t.set_ylabel(f"time to target accuracy{target} / {head.baseline}'s\n"
                    "(ratio ×, lower is better)")
    ax_s.set_ylabel(f"samples/s / {head.baseline}'s\n(ratio ×, higher is better)")
    ax_t.set_title("Time to target accuracy")
    ax_s.set_title("Training throughput (samples/s)")
    _legend(plt, fig, head, colors, any(never))
    many = f"median of {head.repeats} repeats" if head.repeats > 1 else "one repeat (no spread)"
    fig.suptitle(f"{head.name}: time to target and samples/s against {head.baseline} "
                 f"({many}, whiskers min–max)\n{head.basis}", fontsize=12)
    return fig


def plot_headline(plt: Any, head: Headline, path: Path, context: str | None = None) -> str:
    """Write the headline figure of ``head`` to ``path`` (format from its suffix)."""
    return save(plt, headline_figure(plt, head), path, context)
