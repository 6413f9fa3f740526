"""``syncbench run SCENARIO``: one experiment runner for every side-by-side comparison.

A scenario file names the runs (label, algorithm, flags, an optional lr
grid), the shared flags, the slowdowns (the homogeneous configuration is
added to every heterogeneous scenario), the ranks, the repeats, the target
accuracy and the headline metric (docs/USAGE.md, "Scenario files"; copy a
shipped file to write your own). An ``np`` list makes it a scaling scenario
(strong or weak, as ``syncbench sweep``).

The runner launches one ``mpiexec -n NP syncbench train`` per run, one at a
time, in a seeded random order within each repeat (seed and order are
recorded; ``--dry-run`` prints each run's launch line and launches nothing),
prints one line per run, and writes the run files and
``results.json`` (scenario, seed, order, machine context, every run's
figures, per label and configuration the medians with min-max) into
``--out-dir``. Then it prints, per configuration, the machine context and a
table: time to the target accuracy and samples/s against the baseline, the
sync share, accuracy, as median (min-max) over repeats; diverged runs are
left out of the samples/s medians and never count as faster, overlapped and
loaded runs are flagged. Heterogeneous configurations add the het/hom
throughput beside the ceiling sum(1/f)/N and the realised slowdown factor.

Timing claims need at least 5 repeats. Flags the runner does not know go to
every ``syncbench train`` and come last (``--seed``, ``--out``,
``--algorithm``, ``--slowdown*`` and ``--target-accuracy`` are the
runner's: repeat r trains with ``--seed r``). ``--resume`` keeps the complete
run files of a stopped invocation of the same plan. A run stopped by a
signal (``complete=False``) is counted but gives no figure; the runner goes
on and exits 3. SIGINT or SIGTERM to the runner starts no new run, waits for
the current one, prints and records the tables of the runs that ended and
exits 128 + the signal; a second signal ends it at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.experiment.runner import add_runner_arguments, run_scenario, use_cluster
from syncbench.bench.experiment.scenario import ScenarioError, describe_shipped, load_scenario

HELP = ("a comparison scenario (demo, hetero, overlap, asgd, peers or a .toml): repeated, "
        "randomised runs, then tables")
PASSTHROUGH = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench run``; ``--help`` lists the shipped scenarios. (An old command
    name takes :func:`add_runner_arguments`, its scenario fixed.)"""
    parser.add_argument("scenario", metavar="SCENARIO",
                        help="a shipped scenario (below) or the path of a scenario .toml file")
    add_runner_arguments(parser)
    parser.epilog = "shipped scenarios:\n" + describe_shipped()


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Body of ``syncbench run``, and of an old command name (``syncbench overlap``: the
    scenario set by the command line), whose errors then name it."""
    prog = f"syncbench {getattr(args, 'command', None) or 'run'}"
    try:
        scenario = load_scenario(args.scenario)
        use_cluster(args)
    except (ScenarioError, ClusterError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return run_scenario(scenario, args, extra, prog)
