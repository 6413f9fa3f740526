"""``syncbench compare``: the same training flags under several algorithms.

A scenario made on the spot and handed to the experiment runner
(``syncbench run``): one run entry per algorithm of ``--algorithms`` (the
first is the baseline of the ratios), homogeneous ranks, ``--repeats``
repeats (default 1: a quick look; use 5 or more for timing claims) in a
seeded random order, the run files and ``results.json`` in ``--out-dir``,
then the runner's tables (time to ``--target-accuracy`` first). Flags the
runner does not know go to every ``syncbench train``. Algorithms that are
not registered are skipped with a note. For slowdowns, lr grids and
per-algorithm flags, write a scenario file and use ``syncbench run``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.bench.experiment.runner import add_runner_arguments, run_scenario
from syncbench.bench.experiment.scenario import ScenarioError, parse_scenario

PROG = "syncbench compare"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench compare`` (unknown flags go to ``syncbench train``)."""
    parser.add_argument("--algorithms", default="ssgd,asgd,odsgd,oscars",
                        help="comma-separated algorithms, the first is the baseline; those "
                        "not available are skipped with a note")
    add_runner_arguments(parser)
    parser.set_defaults(np=4, repeats=1, out_dir="runs/compare", target_accuracy=0.80)


def main(args: argparse.Namespace, train_args: Sequence[str] | None = None) -> int:
    names = list(dict.fromkeys(a.strip() for a in args.algorithms.split(",") if a.strip()))
    missing = [a for a in names if a not in ALGORITHMS]
    if missing:
        print(f"{PROG}: skipping {', '.join(missing)} (not available; "
              f"known: {', '.join(ALGORITHMS)})", file=sys.stderr)
    names = [a for a in names if a in ALGORITHMS]
    if not names:
        print(f"{PROG}: error: no algorithm to run", file=sys.stderr)
        return 2
    data = {"description": f"{', '.join(names)} with the same flags", "np": args.np,
            "repeats": args.repeats, "target_accuracy": args.target_accuracy,
            "run": [{"label": a, "algorithm": a} for a in names]}
    try:
        scenario = parse_scenario(data, "compare", PROG)
    except ScenarioError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return run_scenario(scenario, args, train_args or [], PROG)
