"""ASGD vs SSGD throughput on heterogeneous ranks, measured side by side.

With ``--slowdown 1,1,1,4`` SSGD steps at the pace of its slowest rank, while
ASGD's fast workers keep pushing; ideally ASGD processes (3 + 1/4) / 1 = 3.25
times the samples per second of SSGD on four ranks. Each repeat launches one
``mpiexec`` of ``syncbench train`` per algorithm, back to back with the same
flags, reads the ``/summary`` of the run files, and the ratio is the median
of the per-repeat ratios (runs side by side share the machine's noise).

Output: one fixed-column row per algorithm (median/min/max samples/s, final
accuracy, and for ASGD the staleness mean/max of the run files), then the
line ``ratio asgd/ssgd samples/s: median R (per repeat: ...)``.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from syncbench.bench.launch import train_and_read

ALGOS = ("ssgd", "asgd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ASGD-vs-SSGD benchmark."""
    parser.add_argument("--np", type=int, default=4, help="ranks per run (default 4)")
    parser.add_argument("--slowdown", default="1,1,1,4",
                        help="per-rank slowdown factors (default 1,1,1,4)")
    parser.add_argument("--model", default="mlp", help="model (default mlp)")
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="dataset (default fashion-mnist)")
    parser.add_argument("--epochs", type=float, default=0.5,
                        help="sample budget per run in epochs (default 0.5)")
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch (default 64)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="pairs of runs (default 3); the ratio is their median")
    parser.add_argument("--ps-layout", default="sharded",
                        help="ASGD parameter windows layout (default sharded)")
    parser.add_argument("--train-args", default="",
                        help="extra flags for both runs of syncbench train, one quoted string")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else mpiexec next to this Python)")
    parser.add_argument("--out-dir", default=None,
                        help="keep the run files here (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds allowed per run (default 600)")


def _train_args(args: argparse.Namespace, algorithm: str) -> list[str]:
    flags = ["--algorithm", algorithm, "--model", args.model, "--dataset", args.dataset,
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
             "--eval-every", "0"]
    if args.slowdown:
        flags += ["--slowdown", args.slowdown]
    if algorithm == "asgd":
        flags += ["--ps-layout", args.ps_layout]
    return flags + shlex.split(args.train_args)


def _run(args: argparse.Namespace, algorithm: str, out: Path) -> dict[str, float]:
    """One training run; its summary plus, for ASGD, the staleness of every step."""
    run = train_and_read(args.np, _train_args(args, algorithm), out, args.mpiexec,
                         timeout=args.timeout)
    stale = np.concatenate([np.asarray(rows["staleness"]) for rows in run.ranks.values()])
    return {
        "samples_per_s": float(run.summary["samples_per_s"]),
        "accuracy": float(run.summary["final_accuracy"]),
        "staleness_mean": float(stale.mean()) if stale.size else 0.0,
        "staleness_max": float(stale.max()) if stale.size else 0.0,
    }


def format_table(results: dict[str, list[dict[str, float]]]) -> str:
    """Fixed-column rows per algorithm and the ratio line."""
    lines = [f"{'algorithm':<10}{'runs':>5}{'samples/s':>12}{'min':>12}{'max':>12}"
             f"{'accuracy':>10}{'stale_mean':>12}{'stale_max':>11}"]
    for algorithm, runs in results.items():
        rate = np.array([r["samples_per_s"] for r in runs])
        acc = float(np.median([r["accuracy"] for r in runs]))
        stale_mean = float(np.mean([r["staleness_mean"] for r in runs]))
        stale_max = max(r["staleness_max"] for r in runs)
        lines.append(f"{algorithm:<10}{len(runs):>5}{np.median(rate):>12.1f}{rate.min():>12.1f}"
                     f"{rate.max():>12.1f}{acc:>10.4f}{stale_mean:>12.2f}{stale_max:>11.0f}")
    ratios = [a["samples_per_s"] / s["samples_per_s"]
              for s, a in zip(results["ssgd"], results["asgd"])]
    per = " ".join(f"{r:.2f}" for r in ratios)
    lines.append(f"ratio asgd/ssgd samples/s: median {np.median(ratios):.2f} (per repeat: {per})")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run ``--repeats`` pairs of SSGD/ASGD runs and print the table; 0 on success."""
    with tempfile.TemporaryDirectory(prefix="asgd_bench_") as tmp:
        out_dir = Path(args.out_dir or tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[dict[str, float]]] = {a: [] for a in ALGOS}
        try:
            for repeat in range(args.repeats):
                for algorithm in ALGOS:
                    out = out_dir / f"{algorithm}_{repeat}.h5"
                    results[algorithm].append(_run(args, algorithm, out))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"syncbench asgd-bench: {exc}", file=sys.stderr)
            return 1
    print(f"np={args.np} slowdown={args.slowdown} model={args.model} dataset={args.dataset} "
          f"epochs={args.epochs} batch={args.batch_size} ps_layout={args.ps_layout}")
    print(format_table(results))
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
