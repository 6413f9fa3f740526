"""The figures' common style and output: file format, size, fonts, caption, flags.

Every figure of :mod:`.plots` and :mod:`.headline` is drawn for print: the
width of one paper column (3.5 in) or of two (7.2 in, the default:
:data:`FIGURE_WIDTHS`), text no smaller than :data:`MIN_FONT_PT` at that size
(:func:`pyplot` sets the fonts), a vector file by default (PDF; SVG on request,
text kept as text: TrueType fonts in PDF, ``svg.fonttype`` none), PNG at
:data:`DEFAULT_DPI` when asked (matplotlib docs, "Saving figures").
:func:`save` writes a figure with its caption under it: what the experiment
was and on which machine (:func:`experiment_caption`), wrapped to the figure's
width; the figure grows by the caption's height so the panels keep theirs.
:func:`add_plot_arguments` gives ``syncbench report`` and ``syncbench run`` the
same ``--plot-format``, ``--dpi``, ``--figure-width`` and ``--per-run-plots``.

matplotlib is imported only when a figure is drawn, so reports work without it.
"""

from __future__ import annotations

import argparse
import json
import socket
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import format_contexts, machine_context

#: File formats of ``--plot-format``; the first is the default (vector).
PLOT_FORMATS: tuple[str, ...] = ("pdf", "svg", "png")
DEFAULT_FORMAT = "pdf"
#: Dots per inch of a PNG unless ``--dpi`` says otherwise (vector formats scale freely).
DEFAULT_DPI = 300
#: ``--figure-width``: one paper column or the full width of a two-column page, inches.
FIGURE_WIDTHS: dict[str, float] = {"one": 3.5, "two": 7.2}
DEFAULT_WIDTH = "two"
#: The smallest text of a figure at print size, points.
MIN_FONT_PT = 8.0
MARKERS = "osD^v<>px*"
#: Margin around the caption and between the caption and what is above it, inches.
PAD_INCHES = 0.05

MISSING_MATPLOTLIB = "matplotlib is needed for --plots: pip install syncbench[plot]"


@dataclass(frozen=True)
class PlotOutput:
    """How figures are written: file format (:data:`PLOT_FORMATS`), dots per inch of a
    PNG, and the figure width (a key of :data:`FIGURE_WIDTHS`)."""

    fmt: str = DEFAULT_FORMAT
    dpi: int = DEFAULT_DPI
    width: str = DEFAULT_WIDTH

    def __post_init__(self) -> None:
        if self.fmt not in PLOT_FORMATS:
            raise ValueError(f"plot format {self.fmt!r}: expected one of "
                             f"{', '.join(PLOT_FORMATS)}")
        if not isinstance(self.dpi, int) or self.dpi < 1:
            raise ValueError(f"--dpi must be a positive integer, got {self.dpi!r}")
        if self.width not in FIGURE_WIDTHS:
            raise ValueError(f"figure width {self.width!r}: expected one of "
                             f"{', '.join(FIGURE_WIDTHS)}")

    @property
    def inches(self) -> float:
        """The figure width in inches."""
        return FIGURE_WIDTHS[self.width]

    def path(self, out_dir: Path, stem: str) -> Path:
        """``out_dir/stem.<format>``."""
        return out_dir / f"{stem}.{self.fmt}"


def require_matplotlib() -> None:
    """``ImportError`` with the install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(MISSING_MATPLOTLIB) from None


def pyplot(dpi: int = DEFAULT_DPI) -> Any:
    """matplotlib's pyplot on the Agg backend, styled for print; PNGs are saved at ``dpi``."""
    require_matplotlib()
    import matplotlib  # lazy: optional dependency, reports work without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = MIN_FONT_PT
    plt.rcParams.update({
        "font.size": size, "axes.titlesize": size + 1, "axes.labelsize": size,
        "xtick.labelsize": size, "ytick.labelsize": size, "legend.fontsize": size,
        "figure.titlesize": size + 1, "legend.title_fontsize": size,
        "axes.linewidth": 0.6, "lines.linewidth": 1.2, "lines.markersize": 4,
        "xtick.major.width": 0.6, "ytick.major.width": 0.6, "patch.linewidth": 0.5,
        "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5,
        "savefig.dpi": dpi, "figure.dpi": 100,
        "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"})
    return plt


def panel_grid(width: float, panels: int = 2) -> tuple[int, int]:
    """(rows, columns) of ``panels`` side by side on a two-column figure, stacked on one."""
    return (panels, 1) if width < FIGURE_WIDTHS["two"] else (1, panels)


# ---------------------------------------------------------------- the caption


def _attrs(run: Any) -> Mapping[str, Any]:
    attrs = getattr(run, "attrs", run)
    return attrs if isinstance(attrs, Mapping) else {}


def local_cpu_model() -> str | None:
    """``model name`` of this machine's /proc/cpuinfo (None elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split()) or None
    except OSError:
        return None
    return None


def cpu_model(runs: Sequence[Any]) -> str | None:
    """The CPU model the runs ran on: the run files' ``environment`` fact ``CPU`` when
    recorded, else this machine's when a run's host is this one; None when unknown."""
    names: list[str] = []
    here = socket.gethostname()
    for run in runs:
        attrs = _attrs(run)
        try:
            facts = json.loads(attrs.get("environment") or "{}")
        except (TypeError, ValueError):
            facts = {}
        fact = facts.get("CPU") if isinstance(facts, dict) else None
        if isinstance(fact, dict) and fact.get("value") not in (None, "", "unknown"):
            names.append(str(fact["value"]))
            continue
        hosts = attrs.get("hostnames")
        hosts = [hosts] if isinstance(hosts, str) else list(hosts or ())
        if here in {str(h) for h in hosts}:
            local = local_cpu_model()
            if local:
                names.append(local)
    distinct = list(dict.fromkeys(names))
    return " | ".join(distinct) if distinct else None


def _values(runs: Sequence[Any], get: Any) -> str:
    """The distinct values of ``get(attrs)`` over the runs, joined (``?`` when none)."""
    seen = [str(v) for v in dict.fromkeys(get(_attrs(r)) for r in runs) if v not in (None, "")]
    return ", ".join(seen) or "?"


def _global_batch(attrs: Mapping[str, Any]) -> int | None:
    config = attrs.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = {}
    try:
        return int(config.get("batch_size")) * int(attrs.get("world_size"))
    except (AttributeError, TypeError, ValueError):
        return None


def experiment_caption(runs: Sequence[Any], note: str = "") -> str:
    """The caption of a figure of ``runs``: model, dataset, global batch, ranks, the
    machine (CPU model, cores and the context line's other facts), then ``note``."""
    if not runs:
        return note
    ranks = sorted({int(_attrs(r).get("world_size") or 0) for r in runs} - {0})
    rank_text = ", ".join(str(n) for n in ranks) or "?"
    setup = (f"Model {_values(runs, lambda a: a.get('model'))}, dataset "
             f"{_values(runs, lambda a: a.get('dataset'))}, global batch "
             f"{_values(runs, _global_batch)} samples, {rank_text} "
             f"{'rank' if ranks == [1] else 'ranks'}.")
    machine = format_contexts([machine_context(r) for r in runs])
    machine = machine.removeprefix("machine: ")
    cpu = cpu_model(runs) or "CPU model not recorded"
    text = f"{setup} Machine: {cpu}, {machine}."
    return f"{text} {note}".strip() if note else text


def _wrap(text: str, chars: int) -> str:
    return "\n".join(textwrap.fill(part, max(20, chars)) for part in text.split("\n"))


def _fit(text: Any, limit: float, renderer: Any) -> None:
    """Wrap ``text`` (a matplotlib Text) onto more lines until it is at most ``limit``
    pixels wide."""
    words = " ".join(text.get_text().split())
    chars = len(words)
    while text.get_window_extent(renderer).width > limit and chars > 12:
        chars = int(chars * 0.85)
        text.set_text(textwrap.fill(words, chars))


def fit_labels(fig: Any) -> None:
    """Wrap every axes' title and x label, and the figure's title, that is wider than
    its axes (the figure) after the layout: narrow one-column panels keep them whole."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        limit = ax.get_window_extent(renderer).width * 1.05
        for text in (ax.title, ax.xaxis.label):
            if text.get_text():
                _fit(text, limit, renderer)
    if fig._suptitle is not None:
        _fit(fig._suptitle, fig.get_figwidth() * fig.dpi * 0.95, renderer)


def save(plt: Any, fig: Any, path: Path, caption: str | None = None,
         legend: Any = None) -> str:
    """Write ``fig`` (format from the suffix; a PNG at :func:`pyplot`'s dpi) with the
    ``caption`` under it, wrapped to the figure's width, and ``legend`` (a figure legend
    made with ``loc="lower center"``) between the panels and the caption; the figure
    grows by their height so the panels keep theirs. The layout is constrained."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine  # lazy: as pyplot()

    if not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        fig.set_layout_engine("constrained")
    engine = fig.get_layout_engine()
    engine.set(w_pad=0.03, h_pad=0.03)
    width, height = fig.get_figwidth(), fig.get_figheight()
    renderer = fig.canvas.get_renderer()
    strip = 0.0
    text = None
    if caption:
        chars = int(width * 17)
        text = fig.text(PAD_INCHES / width, 0.0, _wrap(caption, chars), fontsize=MIN_FONT_PT,
                        color="0.1", ha="left", va="bottom")
        usable = (width - 2 * PAD_INCHES) * fig.dpi
        while text.get_window_extent(renderer).width > usable and chars > 20:
            chars -= 3
            text.set_text(_wrap(caption, chars))
        strip = text.get_window_extent(renderer).height / fig.dpi + 2 * PAD_INCHES
    legend_h = 0.0
    if legend is not None:
        legend_h = legend.get_window_extent(renderer).height / fig.dpi + PAD_INCHES
    total = height + strip + legend_h
    fig.set_figheight(total)
    if text is not None:
        text.set_y(PAD_INCHES / total)
    if legend is not None:
        legend.set_bbox_to_anchor((0.5, strip / total), transform=fig.transFigure)
    bottom = (strip + legend_h) / total
    engine.set(rect=(0, bottom, 1, 1 - bottom))  # (x, y, w, h)
    fit_labels(fig)
    fig.savefig(path)
    plt.close(fig)
    return str(path)


# ---------------------------------------------------------------- flags


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """``--plot-format``, ``--dpi``, ``--figure-width`` and ``--per-run-plots``
    (with ``--plots DIR``)."""
    parser.add_argument("--plot-format", default=DEFAULT_FORMAT, choices=PLOT_FORMATS,
                        help=f"file format of the --plots figures (default {DEFAULT_FORMAT}; "
                        "pdf and svg are vector, png a bitmap at --dpi)")
    parser.add_argument("--dpi", type=_positive_int, default=DEFAULT_DPI,
                        help=f"resolution of PNG figures in dots per inch (default "
                        f"{DEFAULT_DPI})")
    parser.add_argument("--figure-width", default=DEFAULT_WIDTH, choices=tuple(FIGURE_WIDTHS),
                        help="width of the figures: one paper column (3.5 in, panels "
                        "stacked) or two (7.2 in, panels side by side; default "
                        f"{DEFAULT_WIDTH})")
    parser.add_argument("--per-run-plots", action="store_true",
                        help="with --plots, also the three figures of every run (phases, "
                        "timeline, local steps); default: the summary figures only")


def plot_flags_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the plot flags (``--per-run-plots`` without ``--plots``)."""
    if getattr(args, "per_run_plots", False) and not getattr(args, "plots", None):
        return "--per-run-plots needs --plots DIR"
    return None


def plot_output(args: argparse.Namespace) -> PlotOutput:
    """The :class:`PlotOutput` of parsed :func:`add_plot_arguments` flags."""
    return PlotOutput(getattr(args, "plot_format", DEFAULT_FORMAT) or DEFAULT_FORMAT,
                      getattr(args, "dpi", DEFAULT_DPI) or DEFAULT_DPI,
                      getattr(args, "figure_width", DEFAULT_WIDTH) or DEFAULT_WIDTH)
