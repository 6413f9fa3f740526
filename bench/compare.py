"""``syncbench compare``: the same training flags under several algorithms.

Launches one ``mpiexec -n NP syncbench train`` per algorithm (run files in
``--out-dir``), then prints the report table of those runs with each
algorithm's throughput and wall time as a ratio of the first one's.
Algorithms that are not registered are skipped with a note.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.analysis.report import format_report, report_rows
from syncbench.bench.launch import run_train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench compare`` (unknown flags go to ``syncbench train``)."""
    parser.add_argument("--np", type=int, default=4, help="ranks per run")
    parser.add_argument("--algorithms", default="ssgd,asgd,odsgd,oscars",
                        help="comma-separated algorithms; those not available are skipped "
                        "with a note")
    parser.add_argument("--out-dir", default="runs", help="where the run files go")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else the mpiexec next to this Python)")
    parser.add_argument("--format", default="md", choices=("md", "csv", "json"))


def main(args: argparse.Namespace, train_args: list[str]) -> int:
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    missing = [a for a in names if a not in ALGORITHMS]
    if missing:
        print(f"syncbench compare: skipping {', '.join(missing)} (not available; "
              f"known: {', '.join(ALGORITHMS)})", file=sys.stderr)
    names = [a for a in names if a in ALGORITHMS]
    if not names:
        print("syncbench compare: no algorithm to run", file=sys.stderr)
        return 2
    if any(a in ("--out", "--algorithm") for a in train_args):
        print("syncbench compare: --out and --algorithm are set per run; use --out-dir and "
              "--algorithms", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out_dir / f"{name}-np{args.np}.h5"
        result = run_train(args.np, ["--algorithm", name, "--out", str(path), "--overwrite",
                                     *train_args], args.mpiexec)
        if result.returncode != 0:
            print(f"syncbench compare: {name} failed with exit status {result.returncode}",
                  file=sys.stderr)
            return result.returncode or 1
        paths.append(str(path))
    rows = report_rows(paths)
    print()
    print(format_report(rows, args.format))
    if args.format == "md" and len(rows) > 1:
        print()
        print(format_ratios(rows))
    return 0


def format_ratios(rows: list[dict]) -> str:
    """Throughput and wall-time ratios of every run against the first."""
    base = rows[0]
    lines = [f"# ratios vs {base['algorithm']}",
             f"# {'algorithm':<10}{'samples/s ratio':>17}{'wall ratio':>12}{'accuracy diff':>15}"]
    for row in rows:
        def ratio(key: str, row=row) -> float:
            return row[key] / base[key] if base[key] else math.nan
        diff = row["final_accuracy"] - base["final_accuracy"]
        lines.append(f"  {row['algorithm']:<10}{ratio('samples_per_s'):>17.3f}"
                     f"{ratio('wall_s'):>12.3f}{diff:>+15.4f}")
    return "\n".join(lines)
