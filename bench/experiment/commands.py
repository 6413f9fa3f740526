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
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from syncbench.analysis.report import FORMATS
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.launch import launcher_for_runs
from syncbench.bench.flags import renamed

from .plan import SCALING_RESERVED, check_extra
from .runner import add_run_timeout_argument, add_runner_arguments, run_scaling, run_scenario
from .scenario import SCALING_MODES, ScenarioError, parse_scenario

COMPARE = "syncbench compare"
SWEEP = "syncbench sweep"
#: Why the sweep refuses a train flag of :data:`plan.SCALING_RESERVED`.
SWEEP_SETS = ("is set per run by the sweep; use --out-dir, --algorithms, --global-batch "
              "(strong) or --batch-size (weak)")


# -- syncbench compare ----------------------------------------------------------------

def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench compare`` (unknown flags go to ``syncbench train``)."""
    parser.add_argument("--algorithms", default="ssgd,asgd,odsgd,oscars",
                        help="comma-separated algorithms, the first is the baseline "
                        "(an unknown name is an error)")
    add_runner_arguments(parser)
    defaults = {"np": 4, "repeats": 1, "out_dir": "runs/compare", "target_accuracy": 0.80}
    parser.set_defaults(**defaults)
    for action in parser._actions:  # no scenario's value: the help shows compare's default
        if action.dest in defaults and action.help:
            action.help = action.help.split(" (default")[0]


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


def compare_main(args: argparse.Namespace, train_args: Sequence[str] | None = None) -> int:
    """Body of ``syncbench compare``."""
    from syncbench.algorithms.registry import ALGORITHMS  # lazy: imports mpi4py.MPI

    names = list(dict.fromkeys(a.strip() for a in args.algorithms.split(",") if a.strip()))
    problem = unknown_algorithms(names, ALGORITHMS) if names else "--algorithms is empty"
    if problem:
        print(f"{COMPARE}: error: {problem}", file=sys.stderr)
        return 2
    data = {"description": f"{', '.join(names)} with the same flags", "np": args.np,
            "repeats": args.repeats, "target_accuracy": args.target_accuracy,
            "run": [{"label": a, "algorithm": a} for a in names]}
    try:
        scenario = parse_scenario(data, "compare", COMPARE)
    except ScenarioError as exc:
        print(f"{COMPARE}: error: {exc}", file=sys.stderr)
        return 2
    return run_scenario(scenario, args, train_args or [], COMPARE)


# -- syncbench sweep ------------------------------------------------------------------

def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench sweep``; unknown flags are passed to ``syncbench train``.

    Abbreviations are switched off on ``parser``: ``--out`` or ``--algorithm``
    (train flags) must not be taken for ``--out-dir`` or ``--algorithms``.
    """
    parser.allow_abbrev = False
    parser.add_argument("--mode", choices=SCALING_MODES, default="strong",
                        help="strong: fixed global batch; weak: fixed per-rank batch "
                        "(default strong)")
    parser.add_argument("--np", default="1,2,4",
                        help="comma-separated task counts (default 1,2,4)")
    parser.add_argument("--algorithms", default="ssgd",
                        help="comma-separated algorithms (default ssgd)")
    parser.add_argument("--out-dir", default="runs/sweep",
                        help="run files, manifest.json and report (default runs/sweep)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per point (default 1)")
    parser.add_argument("--repeat-index", type=int, default=None,
                        help="run only this repeat (0-based; one element of a Slurm job array)")
    parser.add_argument("--global-batch", type=int, default=256,
                        help="strong mode: global batch, split over the N ranks (default 256)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="weak mode: per-rank batch (default 64)")
    parser.add_argument("--cluster", action="store_true",
                        help="launch every run across the emulated cluster that is up "
                        "(syncbench cluster up; replaces --mpiexec)")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher, e.g. 'srun --mpi=pmi2' (default: $MPIEXEC, else the "
                        "mpiexec next to this Python)")
    add_run_timeout_argument(parser)
    parser.add_argument("--order-seed", dest="seed", type=int, default=None, metavar="SEED",
                        help="seed of the run order within each repeat (default: a fresh "
                        "one, printed and recorded)")
    parser.add_argument("--manifest", default=None,
                        help="manifest path (default OUT_DIR/manifest.json; with "
                        "--repeat-index K, -rK is added before .json)")
    renamed(parser, ("--no-run",), "--collect-only", dest="no_run", action="store_true",
            help="launch nothing: collect the existing run files into the manifest and the "
            "report (a run without a complete file is missing)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan, one launch line per run (mpiexec -n N ... "
                        "syncbench train ...), and exit: nothing is run or written")
    parser.add_argument("--format", default="md", choices=FORMATS,
                        help="report format (default md)")
    parser.add_argument("--simulate", action="store_true",
                        help="simulate every point with syncbench simulate (SimGrid) instead "
                        "of launching it; unknown flags go to simulate (--workload, "
                        "--platform, --stragglers, --steps, ...)")


def parse_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: positive, distinct task counts in the given order."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScenarioError(f"--np {text!r}: expected comma-separated integers") from None
    if not counts or any(n < 1 for n in counts):
        raise ScenarioError(f"--np {text!r}: task counts must be >= 1")
    if len(set(counts)) != len(counts):
        raise ScenarioError(f"--np {text!r}: task counts repeat")
    return counts


def sweep_scenario(args: argparse.Namespace) -> dict:
    """The scaling scenario of the sweep's flags, as the data of a scenario file."""
    counts = parse_counts(args.np)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        raise ScenarioError("--algorithms is empty")
    if not getattr(args, "simulate", False):  # simulate checks its own --algorithm
        from syncbench.algorithms.registry import ALGORITHMS  # lazy: imports mpi4py.MPI

        if problem := unknown_algorithms(algorithms, ALGORITHMS):
            raise ScenarioError(problem)
    if args.repeats < 1:
        raise ScenarioError(f"--repeats must be >= 1, got {args.repeats}")
    batch = ({"global_batch": args.global_batch} if args.mode == "strong"
             else {"batch_size": args.batch_size})
    return {"description": f"{args.mode} scaling of {', '.join(algorithms)} at np "
            f"{args.np}", "np": counts, "scaling": args.mode, **batch,
            "repeats": args.repeats, "run": [{"label": a, "algorithm": a} for a in algorithms]}


def sweep_main(args: argparse.Namespace, train_args: list[str] | None = None) -> int:
    """Run (or resume) the sweep, write its results and print the report; 0 if all ran."""
    if train_args is None:
        train_args = list(getattr(args, "train_args", None) or [])
    manifest = Path(args.manifest) if args.manifest else Path(args.out_dir) / "manifest.json"
    try:
        check_extra(train_args, SCALING_RESERVED, SWEEP_SETS)
        scenario = parse_scenario(sweep_scenario(args), "sweep", SWEEP)
        if args.cluster:
            args.mpiexec = launcher_for_runs()
        return run_scaling(scenario, args, train_args, manifest, "manifest")
    except (ScenarioError, ClusterError) as exc:
        print(f"{SWEEP}: {exc}", file=sys.stderr)
        return 2
