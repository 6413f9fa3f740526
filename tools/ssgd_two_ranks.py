"""Where 2-rank SSGD loses: interleaved 1- and 2-rank runs, their phases side by side.

Usage: python tools/ssgd_two_ranks.py OUT_DIR [REPEATS] [-- TRAIN FLAGS...]

Runs ``mpiexec -n 1`` and ``mpiexec -n 2 syncbench train --algorithm ssgd --model
mlp --dataset fashion-mnist --epochs 1 --batch-size 64`` REPEATS times (default 5),
alternating, with ``OMP_NUM_THREADS=1``; extra flags after ``--`` go to every run
(e.g. ``--comm blocking``). From each run file: samples/s, milliseconds per step
(wall / steps of a rank) and each phase's mean per step (mean over ranks). Prints
every run, then median (min–max) over repeats, the parallel efficiency of each
pair (samples/s at 2 ranks over twice that at 1 rank) and the per-step time that
2 ranks add, phase by phase. Set it beside ``mpiexec -n 2 syncbench ssgd-comm
--model mlp`` (the bare Allreduce of the same gradient) to split the ``wait``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from syncbench.analysis.runfile import read_run

PHASES = ("data", "compute", "comm", "wait", "update")
BIN = Path(sys.executable).parent


def one_run(path: Path, ranks: int, seed: int, extra: list[str]) -> dict[str, float]:
    """Train once on ``ranks`` ranks into ``path``; the run's figures (ms per step)."""
    path.unlink(missing_ok=True)
    cmd = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "syncbench"), "train",
           "--algorithm", "ssgd", "--model", "mlp", "--dataset", "fashion-mnist",
           "--epochs", "1", "--batch-size", "64", "--seed", str(seed), "--out", str(path),
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode:
        sys.exit(f"ssgd_two_ranks: {' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    run = read_run(path)
    steps = min(len(rows["step"]) for rows in run.ranks.values())
    figures = {ph: 1e3 * float(np.mean([np.mean(rows[f"t_{ph}"])
                                        for rows in run.ranks.values()])) for ph in PHASES}
    figures["phases"] = sum(figures[ph] for ph in PHASES)
    figures["step"] = 1e3 * run.summary["wall_s"] / steps
    figures["samples_per_s"] = run.summary["samples_per_s"]
    return figures


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = argv[: argv.index("--")] if "--" in argv else argv
    if not args:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out, repeats = Path(args[0]), int(args[1]) if len(args) > 1 else 5
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for repeat in range(repeats):
        for ranks in (1, 2):
            fig = one_run(out / f"np{ranks}-r{repeat}.h5", ranks, repeat, extra)
            runs[ranks].append(fig)
            print(f"np{ranks} r{repeat}: {fig['samples_per_s']:.0f} samples/s, "
                  f"{fig['step']:.4f} ms/step; "
                  + " ".join(f"{ph} {fig[ph]:.4f}" for ph in PHASES), flush=True)
    keys = ("samples_per_s", "step", *PHASES, "phases")
    print(f"\nmedian (min-max) over {repeats} repeats; ms per step, phases: mean per step")
    for ranks in (1, 2):
        print(f"np{ranks}: " + "  ".join(f"{k} {spread([r[k] for r in runs[ranks]])}"
                                         for k in keys))
    efficiency = [b["samples_per_s"] / (2 * a["samples_per_s"]) for a, b in zip(*runs.values())]
    print(f"efficiency (pairwise): {spread(efficiency)}")
    med = {n: {k: statistics.median(r[k] for r in runs[n]) for k in keys} for n in (1, 2)}
    print("2 ranks add per step (medians, ms): " + "  ".join(
        f"{k} {med[2][k] - med[1][k]:+.4f}" for k in ("step", *PHASES)))
    print("outside the phases (step - phases): " + "  ".join(
        f"np{n} {med[n]['step'] - med[n]['phases']:.4f}" for n in (1, 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
