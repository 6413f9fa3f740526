"""The figures' common style and output: file format, resolution, caption, flags.

Every figure of :mod:`.plots` and :mod:`.headline` is drawn with the same
pyplot settings (:func:`pyplot`: the non-interactive Agg backend, font sizes,
a light grid) and written by :func:`save`, which puts the machine context
line (``analysis.context``) along the figure's bottom edge. The output is a
:class:`PlotOutput`: PNG at a chosen resolution for screens, PDF or SVG
(vector, text kept as text: TrueType fonts in PDF, ``svg.fonttype`` none)
for papers, as matplotlib's ``savefig`` writes them (matplotlib docs,
"Saving figures"). :func:`add_plot_arguments` gives ``syncbench report`` and
``syncbench run`` the same ``--plot-format``, ``--dpi`` and
``--per-run-plots`` flags.

matplotlib is imported only when a figure is drawn, so reports work without it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: File formats of ``--plot-format``.
PLOT_FORMATS: tuple[str, ...] = ("png", "pdf", "svg")
#: Dots per inch of a PNG unless ``--dpi`` says otherwise (vector formats scale freely).
DEFAULT_DPI = 100
MARKERS = "osD^v<>px*"
FIGSIZE = (11.0, 4.8)
#: Height of the strip along the bottom edge that the machine context line takes.
CAPTION_INCHES = 0.22

MISSING_MATPLOTLIB = "matplotlib is needed for --plots: pip install syncbench[plot]"


@dataclass(frozen=True)
class PlotOutput:
    """How figures are written: file format (:data:`PLOT_FORMATS`) and dots per inch."""

    fmt: str = "png"
    dpi: int = DEFAULT_DPI

    def __post_init__(self) -> None:
        if self.fmt not in PLOT_FORMATS:
            raise ValueError(f"plot format {self.fmt!r}: expected one of "
                             f"{', '.join(PLOT_FORMATS)}")
        if not isinstance(self.dpi, int) or self.dpi < 1:
            raise ValueError(f"--dpi must be a positive integer, got {self.dpi!r}")

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
    """matplotlib's pyplot on the Agg backend, styled; figures are saved at ``dpi``."""
    require_matplotlib()
    import matplotlib  # lazy: optional dependency, reports work without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10,
                         "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": dpi,
                         "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"})
    return plt


def save(plt: Any, fig: Any, path: Path, context: str | None = None) -> str:
    """Write ``fig`` (format from the suffix, resolution from :func:`pyplot`), with the
    machine ``context`` line along its bottom edge; the path written. A figure made with
    ``layout="constrained"`` keeps its layout (it reserves the caption's strip itself:
    :data:`CAPTION_INCHES`)."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine  # lazy: as pyplot()

    engine = fig.get_layout_engine()
    constrained = isinstance(engine, ConstrainedLayoutEngine)
    if context:
        fig.text(0.005, 0.005, context, fontsize=8, color="0.3", ha="left", va="bottom")
        if not constrained:
            fig.tight_layout(rect=(0, 0.04, 1, 1))
    elif not constrained:
        fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """``--plot-format``, ``--dpi`` and ``--per-run-plots`` (with ``--plots DIR``)."""
    parser.add_argument("--plot-format", default="png", choices=PLOT_FORMATS,
                        help="file format of the --plots figures (default png; pdf and svg "
                        "are vector, for papers)")
    parser.add_argument("--dpi", type=_positive_int, default=DEFAULT_DPI,
                        help=f"resolution of PNG figures in dots per inch (default "
                        f"{DEFAULT_DPI})")
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
    return PlotOutput(getattr(args, "plot_format", "png") or "png",
                      getattr(args, "dpi", DEFAULT_DPI) or DEFAULT_DPI)
