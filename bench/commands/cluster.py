"""``syncbench cluster``: an emulated cluster of N nodes on this host (run as root).

  syncbench cluster up --nodes N [--link RATE] [--node-speed F1,F2,...]
                       [--clock-offset S1,S2,...] [--slurm]
  syncbench cluster status
  syncbench cluster mpiexec [-n N] [--ppn P] -- COMMAND ...
  syncbench cluster exec NODE -- COMMAND ...      (one command inside one node)
  syncbench cluster link NODE up|down|RATE        (a fault or a slower link, live)
  syncbench cluster speed NODE F                  (a node's CPU quota, live; 1: none)
  syncbench cluster down

Nodes are ``sbnode1`` ... at ``10.77.0.1`` ..., joined by bridge ``sbbr0``
(``10.77.0.254``); ``$SYNCBENCH_CLUSTER_PREFIX`` and ``$SYNCBENCH_CLUSTER_SUBNET``
name a second cluster beside it. ``up`` is idempotent (the same layout again is a no-op; a
different one must be taken ``down`` first); ``down`` removes exactly what
``up`` made, as listed in the state file, and ends the processes still
running inside the nodes. ``mpiexec`` is the active venv's launcher (MPICH's
hydra or Open MPI's prterun) with what makes inter-node traffic cross the
links; it can stand in for ``mpiexec`` anywhere (``MPIEXEC="syncbench
cluster mpiexec"``, ``syncbench run SCENARIO --cluster``). What it cannot
show: the nodes share one kernel and one memory bus, a link adds no latency
of its own, and a slow node's CPU quota throttles it in bursts, not evenly
(docs/CLUSTER.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from syncbench.bench.cluster import actions, state
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.state import MAX_NODES

HELP = "an emulated cluster on this host (root): up, status, mpiexec, down"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench cluster``: one action and its own flags."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="make the nodes (idempotent)")
    up.add_argument("--nodes", type=int, required=True, help=f"number of nodes (1-{MAX_NODES})")
    up.add_argument("--link", default="",
                    help="rate of every node's link, both directions (tc units: 1gbit, "
                         "200mbit); unshaped if absent")
    up.add_argument("--burst", default="auto",
                    help="token bucket size, e.g. 256kb; auto (default): 2.1 ms of the link's "
                    "rate, at least 32kb (256kb at 1gbit, 0.95 of the rate; 51kb at 200mbit, "
                    "0.94), so that little of a message after an idle spell passes unshaped")
    up.add_argument("--node-speed", default="",
                    help="speed of each node, e.g. 1,0.25: a CPU quota of that share of its "
                         "core(s)")
    up.add_argument("--cpu-period", type=float, default=None, metavar="MS",
                    help="CFS period of the --node-speed quotas in ms (1-1000; default: the "
                         "shortest the kernel allows, 1 ms / the slowest speed): a node runs "
                         "its share of each period, then waits, so steps shorter than the "
                         "period are slowed in bursts, not evenly")
    up.add_argument("--clock-offset", default="",
                    help="CLOCK_MONOTONIC offset of each node in seconds, e.g. 0,1000")
    up.add_argument("--slurm", action="store_true",
                    help="add the nodes to the local Slurm cluster as partition 'emulated'")
    sub.add_parser("status", help="the nodes, their links and byte counters")
    run = sub.add_parser("mpiexec", help="launch COMMAND across the nodes")
    run.add_argument("-n", "--np", type=int, default=None, dest="ranks",
                     help="ranks (default: nodes x --ppn)")
    run.add_argument("--ppn", type=int, default=None, help="ranks per node (default ceil(n/nodes))")
    run.add_argument("--mpiexec", default=None, help="launcher (default: the venv's mpiexec)")
    run.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND")
    inside = sub.add_parser("exec", help="run COMMAND inside one node")
    inside.add_argument("node")
    inside.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND")
    link = sub.add_parser("link", help="take a node's link down or up, or change its rate")
    link.add_argument("node")
    link.add_argument("state", help="up, down, or a rate (1gbit, 200mbit)")
    speed = sub.add_parser("speed", help="set a node's speed (CPU quota) live; 1 lifts it")
    speed.add_argument("node")
    speed.add_argument("speed", help="share of the node's CPUs, 0.01-1")
    sub.add_parser("down", help="remove everything 'up' made")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench cluster``: the action; 1 on a cluster error."""
    try:
        state.check_names()
        if args.action == "up":
            return actions.up(args)
        if args.action == "status":
            return actions.status()
        if args.action == "mpiexec":
            return actions.run_mpiexec(args)
        if args.action == "exec":
            return actions.run_in_node(args)
        if args.action == "link":
            return actions.set_link(args)
        if args.action == "speed":
            return actions.set_node_speed(args)
        return actions.down()
    except ClusterError as exc:
        print(f"syncbench cluster: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # status piped into head: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
