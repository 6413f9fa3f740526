"""What the rows flush costs: ``--flush-every 1`` (the default) against flushing off.

Runs ``mpiexec -n NP python -m syncbench train --algorithm ssgd --model mlp
--dataset synthetic --epochs E --out TMP/run.h5`` with ``--flush-every 1`` and
with ``--flush-every 1e9`` (no periodic flush), interleaved, ``--repeats`` times
each, and prints for each the median (min-max) of two throughputs:

* ``samples/s``: the run file's figure (the training clock, which a flush is
  taken off, like an evaluation);
* ``end-to-end``: samples over the run's whole interval (``t_end_unix -
  t_begin_unix``: setup, evaluations and flushes included), where a flush's
  time shows.

and the ratios flush/off. Then, in this process (quiet: no job, no MPI), the time of
one flush of 250 new rows (about a second of one rank's steps) into a rows file of
1e3 to 1e6 rows, against rewriting all of them (``np.savez``, the flush before
``rows-RRRRR.bin``). Usage::

    python -m syncbench.bench.micro.flush [--repeats 5] [--epochs 3] [--np 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from syncbench.analysis import schema
from syncbench.analysis.runfile import read_run
from syncbench.bench.train.checkpoint import RowsFile


def one_run(np_: int, epochs: int, flush_every: str, folder: Path) -> tuple[float, float]:
    """(samples/s of the run file, samples over the run's whole interval per second)."""
    out = folder / f"run-{flush_every}.h5"
    mpiexec = os.environ.get("MPIEXEC", str(Path(sys.executable).parent / "mpiexec"))
    cmd = [mpiexec, "-n", str(np_), sys.executable, "-m", "syncbench", "train",
           "--algorithm", "ssgd", "--model", "mlp", "--dataset", "synthetic",
           "--epochs", str(epochs), "--progress", "never", "--flush-every", flush_every,
           "--out", str(out), "--overwrite"]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"flush_bench: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    run = read_run(out)
    samples = sum(float(r["samples"].sum()) for r in run.ranks.values())
    elapsed = float(run.attrs["t_end_unix"]) - float(run.attrs["t_begin_unix"])
    return float(run.summary["samples_per_s"]), samples / elapsed


def flush_costs(folder: Path, sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000),
                new: int = 250, repeats: int = 20) -> list[tuple[int, float, float]]:
    """(rows in the file, seconds per incremental flush of ``new`` rows, seconds per
    full rewrite of every row), medians of ``repeats``."""
    out = []
    for n in sizes:
        total = n + new * repeats
        rows = {name: np.arange(total).astype(dt) for name, dt in schema.RANK_COLUMNS.items()}
        attrs = {"hostname": "h", "slowdown": 1.0}
        file = RowsFile(folder / f"costs-{n}", 0)
        file.flush({k: v[:n] for k, v in rows.items()}, attrs, None)
        appends, rewrites = [], []
        for i in range(1, repeats + 1):
            started = time.perf_counter()
            file.flush({k: v[:n + new * i] for k, v in rows.items()}, attrs, None)
            appends.append(time.perf_counter() - started)
            started = time.perf_counter()
            np.savez(folder / "full.npz", **{f"row_{k}": v[:n] for k, v in rows.items()})
            rewrites.append(time.perf_counter() - started)
        out.append((n, statistics.median(appends), statistics.median(rewrites)))
    return out


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    """Both benchmarks; the tables on stdout, each run's figures on stderr as they come."""
    parser = argparse.ArgumentParser(prog="python -m syncbench.bench.micro.flush",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--np", type=int, default=2, dest="np_")
    args = parser.parse_args(argv)
    modes = {"flush 1 s": "1", "flush off": "1e9"}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    with tempfile.TemporaryDirectory(prefix="syncbench-flush-bench-") as tmp:
        for i in range(args.repeats):
            for name, every in (modes.items() if i % 2 == 0 else reversed(modes.items())):
                results[name].append(one_run(args.np_, args.epochs, every, Path(tmp)))
                print(f"  repeat {i + 1} {name}: {results[name][-1][0]:.1f} samples/s, "
                      f"{results[name][-1][1]:.1f} end-to-end", file=sys.stderr, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ssgd mlp synthetic np={args.np_} epochs={args.epochs}, {args.repeats} repeats each, "
          f"interleaved (1-min load average at the end {load:.2f}, {os.cpu_count()} CPUs)")
    print(f"{'':10} {'samples/s median (min-max)':>30} {'end-to-end median (min-max)':>30}")
    for name in modes:
        print(f"{name:10} {_stats([r[0] for r in results[name]]):>30} "
              f"{_stats([r[1] for r in results[name]]):>30}")
    for col, label in ((0, "samples/s"), (1, "end-to-end")):
        on = statistics.median(r[col] for r in results["flush 1 s"])
        off = statistics.median(r[col] for r in results["flush off"])
        print(f"ratio flush/off, {label}: {on / off:.4f} ({(on / off - 1) * 100:+.2f}%)")
    with tempfile.TemporaryDirectory(prefix="syncbench-flush-costs-") as tmp:
        costs = flush_costs(Path(tmp))
    print("one flush of 250 new rows (median of 20): rows in the file, append, full rewrite")
    for n, append, rewrite in costs:
        print(f"  {n:>9,} rows: {append * 1e3:8.3f} ms  {rewrite * 1e3:9.3f} ms"
              f"  (append = {append * 100:.3f}% of a 1 s interval)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
