"""A scenario on the emulated cluster: the layout it needs, and each configuration's node speeds.

A scenario's ``cluster`` table (``link``, ``ppn``) says what it was written
for: ``syncbench run NAME --cluster`` refuses, in one line that gives the
command to fix it, a cluster with another number of nodes or another link
rate, since the comparison would then be made in another regime than the
one its header states. A scenario's ``node_speeds`` configurations slow
nodes by a CPU quota; the runner sets each run's speeds live
(:func:`syncbench.bench.cluster.actions.set_speeds`, what ``syncbench cluster
speed`` does) so that quota, ``--slowdown-mode work`` and homogeneous runs
interleave on one cluster, and puts back the speeds it found when it ends.
Each change reads the state afresh under its lock and writes it back there
(never a copy read when the runner started), so a ``cluster link`` or
``cluster speed`` made meanwhile stays in the state ``down`` works from.
"""

from __future__ import annotations

from collections.abc import Callable

from syncbench.bench.cluster.actions import rate_bytes_per_s, set_speeds
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.state import load

from .plan import PlannedRun
from .scenario import Scenario


def _rate(text: str) -> float:
    return rate_bytes_per_s(text) if text else 0.0


def layout_problem(scenario: Scenario, np_: int) -> str | None:
    """Why the cluster that is up does not fit the scenario at ``np_`` ranks, else None."""
    cluster = load()
    if cluster is None:
        return "--cluster: no emulated cluster is up (syncbench cluster up --nodes N)"
    ppn = scenario.ranks_per_node()
    nodes = -(-np_ // ppn)
    link = str(scenario.cluster.get("link", ""))
    up = f"syncbench cluster up --nodes {nodes}" + (f" --link {link}" if link else "")
    have = len(cluster.nodes)
    if have != nodes:
        return (f"scenario {scenario.name} at {np_} ranks ({ppn} per node) needs {nodes} "
                f"emulated nodes, the cluster that is up has {have}: run 'syncbench cluster "
                f"down' and '{up}'")
    if link:
        rates = {n.name: (n.link or cluster.link) for n in cluster.nodes}
        wrong = {name: r for name, r in rates.items() if _rate(r) != _rate(link)}
        if wrong:
            said = ", ".join(f"{name} {r or 'unshaped'}" for name, r in wrong.items())
            return (f"scenario {scenario.name} is written for {link} links, the cluster has "
                    f"{said}: run 'syncbench cluster down' and '{up}'")
    return None


def relative_speeds(base: dict[str, float], speeds: list[float] | tuple[float, ...] | None,
                    ) -> dict[str, float]:
    """Node speeds of a configuration: its ``speeds`` (1 where absent) times each node's
    ``base``; a product under the kernel's 0.01 is one line naming both factors."""
    names = list(base)
    given = list(speeds or [])
    given += [1.0] * (len(names) - len(given))
    out = {}
    for name, s in zip(names, given):
        product = base[name] * s
        if product < 0.01:
            raise ClusterError(f"node {name}: the configuration's speed {s:g} x the speed "
                               f"it was brought up with ({base[name]:g}) is {product:g}, "
                               "under the 0.01 a CPU quota can give")
        out[name] = product
    return out


def speed_setter(plan: list[PlannedRun] | None = None,
                 ) -> tuple[Callable[[PlannedRun], None], Callable[[], None]]:
    """(before each run: set its configuration's node speeds, at the end: restore).

    A configuration's speeds are relative to the ones the cluster was brought up with
    (each node's ``up_speed``, which neither ``cluster speed`` nor an interrupted run
    changes): on a cluster brought up with ``--node-speed 0.5`` on every node (4 nodes
    sharing 2 CPUs, two to a core), the homogeneous configuration keeps every node at
    0.5 and ``last:0.5`` puts the last one at 0.25, so no configuration oversubscribes a
    core. The end restores the speeds the runner found."""
    cluster = load()
    if cluster is None:
        raise ClusterError("no emulated cluster is up (syncbench cluster up --nodes N)")
    base = {n.name: n.up_speed for n in cluster.nodes}
    found = {n.name: n.speed for n in cluster.nodes}
    for p in plan or []:  # every configuration's speeds, checked before the first run
        relative_speeds(base, p.condition.speeds)

    def before(p: PlannedRun) -> None:
        set_speeds(relative_speeds(base, p.condition.speeds))

    def restore() -> None:
        set_speeds(found)

    return before, restore
