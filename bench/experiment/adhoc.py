"""The scenarios that ``syncbench compare`` and ``syncbench sweep`` make on the spot from
their flags (:mod:`syncbench.bench.commands.compare`, :mod:`~syncbench.bench.commands.sweep`),
for the runner to run: ``--algorithms`` checked against the registry, a sweep's task
counts and its scaling scenario.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from syncbench.algorithms.registry import ALGORITHMS

from .scenario import ScenarioError

COMPARE = "syncbench compare"
SWEEP = "syncbench sweep"
#: Why the sweep refuses a train flag of :data:`plan.SCALING_RESERVED`.
SWEEP_SETS = ("is set per run by the sweep; use --out-dir, --algorithms, --global-batch "
              "(strong) or --batch-size (weak)")


def unknown_algorithms(names: Sequence[str], known: Sequence[str]) -> str | None:
    """``--algorithms``: the one line naming the names that are no registered strategy,
    the known ones and the closest match of each (a typo must not plan a comparison
    without that strategy), else None."""
    unknown = [a for a in names if a not in known]
    if not unknown:
        return None
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return (f"--algorithms: unknown {', '.join(unknown)}{hint}; known: "
            f"{', '.join(known)}")


def sweep_scenario(args: argparse.Namespace) -> dict:
    """The scaling scenario of the sweep's flags, as the data of a scenario file."""
    counts = list(args.np)  # --np's type, flags.rank_counts
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        raise ScenarioError("--algorithms is empty")
    if not getattr(args, "simulate", False):  # simulate checks its own --algorithm
        if problem := unknown_algorithms(algorithms, ALGORITHMS):
            raise ScenarioError(problem)
    if args.repeats < 1:
        raise ScenarioError(f"--repeats must be >= 1, got {args.repeats}")
    batch = ({"global_batch": args.global_batch} if args.mode == "strong"
             else {"batch_size": args.batch_size})
    return {"description": f"{args.mode} scaling of {', '.join(algorithms)} at np "
            f"{','.join(map(str, counts))}", "np": counts, "scaling": args.mode, **batch,
            "repeats": args.repeats, "run": [{"label": a, "algorithm": a} for a in algorithms]}
