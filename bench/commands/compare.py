"""``syncbench compare`` and ``syncbench sweep``: a scenario made on the spot, run by the runner.

``compare``: one run entry per algorithm of ``--algorithms`` (the first is
the baseline of the ratios), homogeneous ranks, ``--repeats`` repeats
(default 1: a quick look; use 5 or more for timing claims) in a seeded
random order, the run files and ``results.json`` in ``--out-dir``, then the
runner's tables (time to ``--target-accuracy`` first). A name that is no
registered strategy is an error. For slowdowns, lr grids and
per-algorithm flags, write a scenario file and use ``syncbench run``.

``sweep``: a scaling scenario (as a scenario file with an ``np`` list), one
run per (repeat, task count of ``--np``, algorithm of ``--algorithms``),
each ``mpiexec -n N syncbench train`` (or ``--mpiexec``, e.g. ``srun
--mpi=pmi2``; ``--simulate``: ``syncbench simulate``) writing
``<out-dir>/<A>-<mode>-np<N>-r<r>.h5``. ``--mode strong`` keeps the global
batch (``--global-batch`` B, b = B / N per rank) and the sample budget
(``--epochs E`` in all): for SSGD every N applies the same large-batch
update (docs/ALGORITHMS.md), so only the time per step changes.
``--mode weak`` keeps the per-rank batch (``--batch-size``) and the budget
per rank (``--epochs E*N`` on N ranks). The results file is
``--manifest`` (default ``<out-dir>/manifest.json``, ``-rK`` added with
``--repeat-index K``), in the runner's format with every run's status;
the report (``syncbench report``'s tables and the scaling table) is printed
and written beside it. Complete run files of the same point are kept.

Flags these commands do not know go to every ``syncbench train``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.bench.experiment.adhoc import COMPARE, unknown_algorithms
from syncbench.bench.experiment.runner import add_runner_arguments, run_scenario
from syncbench.bench.experiment.scenario import ScenarioError, parse_scenario

HELP = ("the same training flags under several algorithms, then a table (syncbench run with "
        "a scenario made of --algorithms)")
PASSTHROUGH = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench compare`` (unknown flags go to ``syncbench train``)."""
    parser.add_argument("--algorithms", default="ssgd,asgd,odsgd,oscars",
                        help="comma-separated algorithms, the first is the baseline "
                        "(an unknown name is an error)")
    add_runner_arguments(parser)
    defaults = {"np": [4], "repeats": 1, "out_dir": "runs/compare", "target_accuracy": None}
    parser.set_defaults(**defaults)
    for action in parser._actions:  # no scenario's value: the help shows compare's default
        if action.dest in defaults and action.help:
            action.help = action.help.split(" (default")[0]


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Body of ``syncbench compare``."""
    names = list(dict.fromkeys(a.strip() for a in args.algorithms.split(",") if a.strip()))
    problem = unknown_algorithms(names, ALGORITHMS) if names else "--algorithms is empty"
    if problem:
        print(f"{COMPARE}: error: {problem}", file=sys.stderr)
        return 2
    target = ({"target_loss": args.target_loss} if args.target_loss is not None else
              {"target_accuracy": 0.80 if args.target_accuracy is None else args.target_accuracy})
    # every count of --np 2,4 is planned by the runner (args.np); the scenario holds one
    data = {"description": f"{', '.join(names)} with the same flags", "np": args.np[0],
            "repeats": args.repeats, **target,
            "run": [{"label": a, "algorithm": a} for a in names]}
    try:
        scenario = parse_scenario(data, "compare", COMPARE)
    except ScenarioError as exc:
        print(f"{COMPARE}: error: {exc}", file=sys.stderr)
        return 2
    return run_scenario(scenario, args, extra, COMPARE)
