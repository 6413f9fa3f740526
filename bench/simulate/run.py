"""Run simulations in one SimGrid engine and write their run files.

SimGrid's engine runs once per process, so every job of a call (one
``simulate``, or every row of a ``--validate`` table) shares one platform
sized for the largest job, and the phase cache. The run file's
``simulation`` attribute splits a job's wall time into SimGrid's phases
(``phases_s``) and the composition of the timeline around them
(``compose_s``, :mod:`.strategies`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from syncbench.analysis.schema import EVAL_COLUMNS
from syncbench.analysis.summary import summarize
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.network import size_bytes
from syncbench.bench.simulate import local_update
from syncbench.bench.simulate.collectives import PlacedClock
from syncbench.bench.simulate.engine import Network, load_simgrid, run_in_simgrid
from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
from syncbench.bench.simulate.progress import PROGRESS_SEGMENT_BYTES
from syncbench.bench.simulate.quota import (
    parse_node_speeds,
    parse_node_throttles,
    parse_wait_cpu,
    realised_shares,
)
from syncbench.bench.simulate.strategies import simulator_for
from syncbench.bench.simulate.timeline import LocalTimes, Timeline
from syncbench.bench.simulate.workload import Stragglers, Workload
from syncbench.bench.simulate.writer import write_simulated_run
from syncbench.bench.train.slowdown import parse_slowdown

#: Re-simulations at most while the throttled ranks' realised shares move, and by how
#: little they must move to stop (the shares settle in two or three on the validation's
#: runs).
THROTTLE_ROUNDS = 4
THROTTLE_SETTLED = 0.005


@dataclass
class Result:
    """One simulated job."""

    timeline: Timeline
    summary: dict[str, Any]
    sim_wall_s: float
    flows: int
    phases: int
    extra: dict[str, Any] = field(default_factory=dict)


def simgrid_version(sg: Any) -> str:
    """SimGrid's version as "3.32.0".

    The bindings' ``simgrid_version`` is that string already
    (``src/bindings/python/simgrid_python.cpp``: ``sg_version_get`` formatted
    as "major.minor.patch"); joining its characters with dots wrote
    "3...3.2...0". A tuple of numbers (other builds) is joined.
    """
    version = getattr(sg, "simgrid_version", "")
    if isinstance(version, str):
        return version
    return ".".join(str(v) for v in version)


def _simulate_one(cfg: argparse.Namespace, n: int, steps: int, workload: Workload,
                  stragglers: Stragglers, network: Network,
                  simulator: Callable[..., Timeline],
                  on_phase: Callable[[Network, int], None] | None = None) -> Timeline:
    if n > network.capacity:
        raise ValueError(f"the platform has room for {network.capacity} ranks, not {n}")
    workload = local_update.matched(cfg, workload)  # the run's local optimizer's step
    speeds = parse_node_speeds(getattr(cfg, "node_speed", None), n)
    throttles = parse_node_throttles(getattr(cfg, "node_throttle", None), speeds, n)
    if throttles is not None:  # how much of a wait in MPI the quota charges
        wait_cpu = parse_wait_cpu(getattr(cfg, "node_wait_cpu", None))
        throttles = [None if t is None else dataclasses.replace(t, wait_cpu=wait_cpu)
                     for t in throttles]
    base = parse_slowdown(cfg.slowdown, n)

    local: LocalTimes | None = None  # the simulation under way (its furthest step)

    def local_times(shares: list[float] | None) -> LocalTimes:
        # a quota slows compute as a factor 1/s (and data, update, codec: .quota)
        nonlocal local
        factors = base if shares is None else [f / s for f, s in zip(base, shares)]
        local = LocalTimes(workload, n, factors, stragglers, cfg.seed, shares)
        if on_phase is not None:  # also each step further than any before
            local.on_step = lambda j: on_phase(network, j)
        return local

    in_phases = [0.0]

    def time_phase(phase: Any) -> float:
        t0 = time.perf_counter()
        seconds = network.phase(phase.key(), phase.pairs, phase.nbytes)
        in_phases[0] += time.perf_counter() - t0
        if on_phase is not None:
            on_phase(network, local.reached if local is not None else 0)
        return seconds

    # over TCP (a platform calibrated from this suite's links) a progress call moves one
    # segment of a flow; RDMA (the modelled platforms) moves an issued transfer on its own
    segment = PROGRESS_SEGMENT_BYTES if getattr(cfg, "calibrate", None) else 0.0
    clock = PlacedClock(time_phase, network.ranks_per_host, link_burst(cfg), segment)
    t0 = time.perf_counter()
    shares = speeds
    timeline = simulator(cfg, local_times(shares), steps, clock)
    if throttles is not None and speeds is not None:
        # the kernel's bursts: each throttled rank's share as its pattern realises it on
        # the timeline's own busy and idle times, until the shares settle (.quota)
        for _ in range(THROTTLE_ROUNDS):
            again = realised_shares(timeline.rows.arrays(), shares, throttles)
            if max(abs(a - b) for a, b in zip(again, shares)) < THROTTLE_SETTLED:
                break
            shares = again
            timeline = simulator(cfg, local_times(shares), steps, clock)
        timeline.notes["realised_node_speed"] = [round(s, 4) for s in shares]
    # wall seconds of SimGrid's phases, and of composing the timeline around them
    timeline.notes.update(phases_s=in_phases[0],
                          compose_s=time.perf_counter() - t0 - in_phases[0])
    return timeline


def link_burst(cfg: argparse.Namespace) -> float:
    """``--link-burst``'s bytes (a ``tc`` size such as 256kb, or bytes; 0: none)."""
    value = getattr(cfg, "link_burst", None)
    if value in (None, "", 0, "0"):
        return 0.0
    try:
        burst = float(value)
    except (TypeError, ValueError):
        try:
            burst = size_bytes(str(value))
        except ClusterError:
            raise ValueError(f"--link-burst {value!r} is not a size such as 256kb or a "
                             "number of bytes") from None
    if not (math.isfinite(burst) and burst >= 0):
        raise ValueError(f"--link-burst {value!r} must be a size >= 0")
    return burst


def simulate(args: argparse.Namespace, jobs: list[tuple[argparse.Namespace, int, int]],
             spec: PlatformSpec, xml: str, workload: Workload | list[Workload],
             stragglers: Stragglers,
             on_phase: Callable[[Network, int], None] | None = None) -> list[Result]:
    """Simulate every ``(config, ranks, steps per rank)`` job; write ``config.out`` if set.
    ``workload``: one for every job, or one per job (``--validate`` with
    ``--compressed-workload``). ``on_phase`` is called with the network and the furthest
    step reached after every phase and at every step further than any before (a
    progress line)."""
    workloads = workload if isinstance(workload, list) else [workload] * len(jobs)
    if len(workloads) != len(jobs):
        raise ValueError(f"{len(workloads)} workloads for {len(jobs)} jobs")
    sg = load_simgrid()
    largest = max(n for _, n, _ in jobs)
    text = xml or platform_xml(spec, largest)
    timings: list[tuple[Timeline, float, int, int]] = []
    simulators = [simulator_for(cfg.algorithm) for cfg, _, _ in jobs]

    def body(network: Network) -> None:
        for (cfg, n, steps), simulator, work in zip(jobs, simulators, workloads):
            t0, flows0, phases0 = time.perf_counter(), network.flows, network.phases
            timeline = _simulate_one(cfg, n, steps, work, stragglers, network, simulator,
                                     on_phase)
            timings.append((timeline, time.perf_counter() - t0, network.flows - flows0,
                            network.phases - phases0))

    _, network, wall = run_in_simgrid(text, body, spec.gpus_per_node, natural_key,
                                      args.phase_cache)
    results = []
    host_names = [h.name for h in network.hosts]
    setup_s = wall - sum(t[1] for t in timings)
    for (cfg, n, steps), (timeline, seconds, flows, phases), work in zip(jobs, timings,
                                                                         workloads):
        sim_wall = seconds + (setup_s if len(jobs) == 1 else 0.0)
        simulation = {"simgrid_version": simgrid_version(sg),
                      "wall_s": sim_wall, "flows": flows, "phases": phases,
                      "flows_per_s": flows / sim_wall if sim_wall > 0 else 0.0,
                      "allreduce": cfg.allreduce, "stragglers": stragglers.spec,
                      "steps_per_rank": steps, "seed": cfg.seed, **timeline.notes}
        summary = _write(cfg, n, timeline, spec, work, simulation, host_names)
        results.append(Result(timeline, summary, sim_wall, flows, phases, simulation))
    return results


def _write(cfg: argparse.Namespace, n: int, timeline: Timeline, spec: PlatformSpec,
           workload: Workload, simulation: dict[str, Any],
           host_names: list[str]) -> dict[str, Any]:
    rows = timeline.rows.arrays()
    if not cfg.out:
        empty = {name: np.zeros(0, dtype=d) for name, d in EVAL_COLUMNS.items()}
        return dict(summarize(rows, empty, timeline.wall_s, None))
    # N is the root attribute world_size, not a flag of the series (as in train)
    config = {k: v for k, v in vars(cfg).items() if k not in ("func", "validate", "np")}
    extra = {"warmup_steps": int(timeline.notes.get("warmup_steps", 0)),
             "buckets": int(timeline.notes.get("buckets", 0)),
             "scaling_mode": cfg.scaling_mode or ""}
    return write_simulated_run(cfg.out, algorithm=cfg.algorithm, world_size=n, config=config,
                               rows=rows, wall_s=timeline.wall_s, platform=spec.describe(),
                               workload=workload.describe(), simulation=simulation,
                               extra_root=extra, ranks_per_node=spec.gpus_per_node,
                               host_names=host_names)
