"""One simulation behind ``syncbench simulate`` (its command line and what it predicts:
:mod:`syncbench.bench.commands.simulate`): :func:`run_single` checks the outputs, the
strategy's flags and the ranks, simulates the flags' strategy at ``--np`` ranks and
prints its one-line summary.
"""

from __future__ import annotations

import argparse
import math
import sys

from syncbench.algorithms.local_optimizer import check_optimizer_choice
from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.analysis.output_paths import check_new_file, check_output_file
from syncbench.bench.files import WriteError
from syncbench.bench.flags import MAX_RANKS
from syncbench.bench.simulate.inputs import (
    build_platform,
    build_workload,
    link_cpu,
    steps_per_rank,
)
from syncbench.bench.simulate.quota import (
    parse_node_speeds,
    parse_node_throttles,
    parse_wait_cpu,
)
from syncbench.bench.simulate.run import link_burst, simulate
from syncbench.bench.simulate.ticker import Ticker
from syncbench.bench.simulate.workload import parse_stragglers
from syncbench.bench.train.slowdown import parse_slowdown


def check_strategy(args: argparse.Namespace, n: int) -> None:
    """The strategy's own checks of its flags at ``n`` ranks, ``--slowdown``'s,
    ``--node-speed``'s and ``--node-throttle``'s."""
    cls = get_algorithm(args.algorithm)
    validate(cls, args, n)
    check_optimizer_choice(args, args.algorithm, cls.traits)
    parse_slowdown(args.slowdown, n)
    speeds = parse_node_speeds(getattr(args, "node_speed", None), n)
    if getattr(args, "node_throttle", None) and speeds is None:
        raise ValueError("--node-throttle describes a quota's bursts: give --node-speed with "
                         "a rank below 1 too")
    parse_node_throttles(getattr(args, "node_throttle", None), speeds, n)
    if getattr(args, "node_wait_cpu", None) not in (None, "") and not getattr(
            args, "node_throttle", None):
        raise ValueError("--node-wait-cpu is the share of a wait a rank at a quota polls: "
                         "give --node-throttle too")
    parse_wait_cpu(getattr(args, "node_wait_cpu", None))
    link_burst(args)
    link_cpu(args)


def run_single(args: argparse.Namespace) -> int:
    """One simulation of the flags' strategy at ``--np`` ranks; prints its one-line summary."""
    n = args.np
    if not 1 <= n <= MAX_RANKS:
        raise ValueError(f"--np {n} is outside 1..{MAX_RANKS} (the simulated ranks)")
    if args.out:  # before the simulation, which may take minutes: as train checks --out
        check_new_file("--out", args.out, args.overwrite)
    if args.phase_cache:  # read and rewritten after the simulation
        check_output_file("--phase-cache", args.phase_cache)
    spec, xml = build_platform(args)
    workload = build_workload(args)
    steps = steps_per_rank(args, workload, n)
    check_strategy(args, n)
    stragglers = parse_stragglers(args.stragglers)
    # a terminal gets a progress line while SimGrid runs (a pipe or a test gets none)
    ticker = (Ticker("syncbench simulate", f"{args.algorithm} at {n} ranks, {steps} steps",
                     total_steps=steps) if sys.stderr.isatty() else None)
    try:
        result = simulate(args, [(args, n, steps)], spec, xml, workload, stragglers,
                          ticker)[0]
    except WriteError as exc:  # the folder changed during the simulation
        raise ValueError(str(exc)) from None
    summary = result.summary
    flows_per_s = result.flows / result.sim_wall_s if result.sim_wall_s > 0 else math.nan
    out = f" -> {args.out}" if args.out else ""
    print(f"{args.algorithm} {workload.name} np={n} simulated on {spec.kind}: "
          f"{summary['samples_per_s']:.1f} samples/s  wall {summary['wall_s']:.4g}s (simulated)  "
          f"comm {summary['comm_fraction']:.3f}  wait {summary['wait_fraction']:.3f}  "
          f"simulation {result.sim_wall_s:.2f}s wall, {result.flows} flows "
          f"({flows_per_s:.0f} flows/s){out}")
    return 0
