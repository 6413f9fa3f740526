"""Strong and weak scaling of simulated runs on log axes (8 to 16,384 ranks).

``python -m syncbench.bench.simulate.plots WEAK_DIR STRONG_DIR -o scaling.png``
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

import h5py

from syncbench.analysis import schema


def read_points(paths: Sequence[str]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(mode, algorithm) -> sorted [(N, samples/s)] of simulated runs."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for path in paths:
        with h5py.File(path, "r") as f:
            if not bool(f.attrs.get(schema.SIMULATED_ATTR, False)):
                continue
            mode = f.attrs.get(schema.SCALING_MODE_ATTR, "")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            algorithm = f.attrs["algorithm"]
            algorithm = algorithm.decode() if isinstance(algorithm, bytes) else str(algorithm)
            n = int(f.attrs["world_size"])
            rate = float(f[schema.SUMMARY_GROUP].attrs["samples_per_s"])
        points[(mode or "-", algorithm)].append((n, rate))
    return {k: sorted(v) for k, v in points.items()}


def efficiency(series: list[tuple[int, float]]) -> list[float]:
    """Efficiency vs the smallest N: (X/N) / (X0/N0) (the same formula for both modes)."""
    n0, x0 = series[0]
    return [(x / n) / (x0 / n0) for n, x in series]


def plot(points: dict[tuple[str, str], list[tuple[int, float]]], out: str, title: str) -> None:
    import matplotlib  # lazy: matplotlib is optional (only drawing needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    modes = sorted({m for m, _ in points})
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 4.2 * len(modes)), squeeze=False)
    for row, mode in zip(axes, modes):
        for (m, algorithm), series in sorted(points.items()):
            if m != mode:
                continue
            ns = [n for n, _ in series]
            row[0].plot(ns, [x for _, x in series], marker="o", label=algorithm)
            row[1].plot(ns, efficiency(series), marker="o", label=algorithm)
        row[0].set(xscale="log", yscale="log", xlabel="ranks N", ylabel="samples/s (simulated)",
                   title=f"{mode} scaling: throughput")
        row[1].set(xscale="log", xlabel="ranks N", ylabel="efficiency vs smallest N",
                   title=f"{mode} scaling: efficiency", ylim=(0, 1.15))
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncbench.bench.simulate.plots",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="run files or directories of run files")
    parser.add_argument("-o", "--out", default="scaling-simulated.png")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    paths: list[str] = []
    for item in args.inputs:
        paths += sorted(glob.glob(os.path.join(item, "*.h5"))) if os.path.isdir(item) else [item]
    points = read_points(paths)
    if not points:
        print("plots: error: no simulated run files", file=sys.stderr)
        return 2
    title = args.title
    if not title:
        with h5py.File(paths[0], "r") as f:
            platform = json.loads(f.attrs.get(schema.SIM_PLATFORM_ATTR, "{}"))
            sim = json.loads(f.attrs.get(schema.SIM_RUN_ATTR, "{}"))
            title = (f"{f.attrs['model']} on a simulated {platform.get('kind', '?')}, "
                     f"stragglers {sim.get('stragglers') or 'none'}")
    plot(points, args.out, title)
    print(f"plots: wrote {args.out}")
    for (mode, algorithm), series in sorted(points.items()):
        eff = efficiency(series)
        print(f"{mode:>6} {algorithm:<9} " + "  ".join(
            f"N={n}: {x:.3g}/s ({e:.2f})" for (n, x), e in zip(series, eff)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
