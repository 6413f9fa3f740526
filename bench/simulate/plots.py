"""Strong and weak scaling of simulated runs on log axes (8 to 16,384 ranks).

``python -m syncbench.bench.simulate.plots WEAK_DIR STRONG_DIR -o scaling.pdf``
reads every run file of the sweep directories (``syncbench sweep --simulate``)
and draws, per scaling mode, samples/s against N and the parallel efficiency
(weak: (X/N) / (X0/N0); strong: X N0 / (X0 N)), one line per strategy. The
report's own scaling plot uses linear axes, which hide everything below a
thousand ranks at this range. Only run files are read (h5py, no MPI, no
SimGrid); the per-rank rows are not needed, so each file's summary is read
directly.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import h5py

from syncbench.analysis import schema
from syncbench.analysis.output_paths import OutputError, check_output_file


def read_points(paths: Sequence[str]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(mode, algorithm) -> sorted [(N, samples/s)] of simulated runs."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for path in paths:
        try:
            f = h5py.File(path, "r")
        except OSError:  # missing, unreadable, or not HDF5
            raise ValueError(f"{path}: not a readable HDF5 run file") from None
        with f:
            if not bool(f.attrs.get(schema.SIMULATED_ATTR, False)):
                continue
            mode = f.attrs.get(schema.SCALING_MODE_ATTR, "")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            try:
                algorithm = f.attrs["algorithm"]
                n = int(f.attrs["world_size"])
                rate = float(f[schema.SUMMARY_GROUP].attrs["samples_per_s"])
            except KeyError:
                raise ValueError(f"{path}: a simulated run file without its algorithm, world "
                                 "size or samples/s") from None
            algorithm = algorithm.decode() if isinstance(algorithm, bytes) else str(algorithm)
        points[(mode or "-", algorithm)].append((n, rate))
    return {k: sorted(v) for k, v in points.items()}


def efficiency(series: list[tuple[int, float]]) -> list[float]:
    """Efficiency vs the smallest N: (X/N) / (X0/N0) (the same formula for both modes)."""
    n0, x0 = series[0]
    return [(x / n) / (x0 / n0) for n, x in series]


def plot(points: dict[tuple[str, str], list[tuple[int, float]]], out: str, title: str,
         caption: str = "", width: str = "two", dpi: int = 300) -> None:
    """The figure of ``points`` in ``out`` (format from its suffix: pdf, svg or png at
    ``dpi``), ``width`` one or two paper columns, in the report figures' style
    (``analysis.plot_style``: 8 pt text or larger, ``caption`` under the panels)."""
    from syncbench.analysis.plot_style import FIGURE_WIDTHS, panel_grid, pyplot, save

    plt = pyplot(dpi)
    inches = FIGURE_WIDTHS[width]
    modes = sorted({m for m, _ in points})
    rows, cols = panel_grid(inches)
    fig, axes = plt.subplots(len(modes) * rows, cols, squeeze=False, layout="constrained",
                             figsize=(inches, 2.3 * len(modes) * rows + 0.3))
    panels = axes.reshape(len(modes), 2)
    for row, mode in zip(panels, modes):
        for (m, algorithm), series in sorted(points.items()):
            if m != mode:
                continue
            ns = [n for n, _ in series]
            row[0].plot(ns, [x for _, x in series], marker="o", label=algorithm)
            row[1].plot(ns, efficiency(series), marker="o", label=algorithm)
        row[0].set(yscale="log", xlabel="ranks N (log scale)",
                   ylabel="throughput (samples/s, simulated)",
                   title=f"Throughput, {mode} scaling")
        row[1].set(xlabel="ranks N (log scale)",
                   ylabel="efficiency against the\nsmallest N (fraction)",
                   title=f"Efficiency, {mode} scaling", ylim=(0, 1.15))
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = panels[0][0].get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="lower center", frameon=False,
                        ncol=max(1, min(len(labels), 4 if inches > 5 else 2)))
    fig.suptitle(title, fontweight="bold")
    save(plt, fig, Path(out), caption or None, legend)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncbench.bench.simulate.plots",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="run files or directories of run files")
    parser.add_argument("-o", "--out", default="scaling-simulated.pdf",
                        help="the figure; its suffix picks the format: pdf and svg are "
                        "vector, png a bitmap at --dpi (default scaling-simulated.pdf)")
    parser.add_argument("--title", default="")
    parser.add_argument("--dpi", type=int, default=300,
                        help="resolution of a PNG in dots per inch (default 300)")
    parser.add_argument("--figure-width", default="two", choices=("one", "two"),
                        help="one paper column (3.5 in) or two (7.2 in; default)")
    args = parser.parse_args(argv)
    paths: list[str] = []
    for item in args.inputs:
        paths += sorted(glob.glob(os.path.join(item, "*.h5"))) if os.path.isdir(item) else [item]
    try:
        points = read_points(paths)
    except ValueError as exc:
        print(f"plots: error: {exc}", file=sys.stderr)
        return 2
    if not points:
        print("plots: error: no simulated run files", file=sys.stderr)
        return 2
    with h5py.File(paths[0], "r") as f:
        platform = json.loads(f.attrs.get(schema.SIM_PLATFORM_ATTR, "{}"))
        sim = json.loads(f.attrs.get(schema.SIM_RUN_ATTR, "{}"))
        model, dataset = f.attrs.get("model", "?"), f.attrs.get("dataset", "")
    title = args.title or (f"{model} on a simulated {platform.get('kind', '?')}, "
                           f"stragglers {sim.get('stragglers') or 'none'}")
    # a simulation reads no data: the dataset is named only where the run file has one
    caption = (f"Simulated with SimGrid: model {model}, "
               + (f"dataset {dataset}, " if dataset else "") + "platform "
               f"{platform.get('kind', '?')}, stragglers {sim.get('stragglers') or 'none'}; "
               "weak scaling efficiency (X/N)/(X0/N0), strong X N0/(X0 N).")
    suffix = os.path.splitext(args.out)[1].lstrip(".").lower()
    if suffix not in ("pdf", "svg", "png") or args.dpi < 1:
        print(f"plots: error: -o {args.out}: expected a .pdf, .svg or .png file and "
              f"--dpi >= 1", file=sys.stderr)
        return 2
    try:  # before the figure is drawn: one line, not a traceback from the save
        check_output_file("-o", args.out)
    except OutputError as exc:
        print(f"plots: error: {exc}", file=sys.stderr)
        return 2
    plot(points, args.out, title, caption, args.figure_width, args.dpi)
    print(f"plots: wrote {args.out}")
    for (mode, algorithm), series in sorted(points.items()):
        eff = efficiency(series)
        print(f"{mode:>6} {algorithm:<9} " + "  ".join(
            f"N={n}: {x:.3g}/s ({e:.2f})" for (n, x), e in zip(series, eff)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
