from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from syncbench.analysis.report import FORMATS
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.launch import launcher_for_runs
from syncbench.bench.commands import compare
from syncbench.bench.experiment.adhoc import SWEEP, SWEEP_SETS, sweep_scenario
from syncbench.bench.experiment.plan import SCALING_RESERVED, check_extra
from syncbench.bench.experiment.runner import add_run_timeout_argument, run_scaling
from syncbench.bench.experiment.scenario import SCALING_MODES, ScenarioError, parse_scenario
from syncbench.bench.flags import rank_counts, renamed

#: ``syncbench sweep``'s description: one for the two commands (sweep and compare).
__doc__ = compare.__doc__

HELP = "strong or weak scaling sweep over rank counts"
PASSTHROUGH = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench sweep``; unknown flags are passed to ``syncbench train``.

    Abbreviations are switched off on ``parser``: ``--out`` or ``--algorithm``
    (train flags) must not be taken for ``--out-dir`` or ``--algorithms``.
    """
    parser.allow_abbrev = False
    parser.add_argument("--mode", choices=SCALING_MODES, default="strong",
                        help="strong: fixed global batch; weak: fixed per-rank batch "
                        "(default strong)")
    parser.add_argument("--np", type=rank_counts, default="1,2,4", metavar="N,...",
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


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Body of ``syncbench sweep``: run (or resume) the sweep, write its results and print
    the report; 0 if all ran."""
    manifest = Path(args.manifest) if args.manifest else Path(args.out_dir) / "manifest.json"
    try:
        check_extra(extra, SCALING_RESERVED, SWEEP_SETS)
        scenario = parse_scenario(sweep_scenario(args), "sweep", SWEEP)
        if args.cluster:
            args.mpiexec = launcher_for_runs()
        return run_scaling(scenario, args, list(extra), manifest, "manifest")
    except (ScenarioError, ClusterError) as exc:
        print(f"{SWEEP}: {exc}", file=sys.stderr)
        return 2
