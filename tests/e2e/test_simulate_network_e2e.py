"""The simulator's network: MPICH's choice of collective algorithms as the installed: the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_simulate_network.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from sim_helpers import needs_simgrid, python, simulate
from test_simulate_network import (
    COUNTS,
    select,
    tables,  # noqa: F401  (fixtures)
)

from syncbench.bench.simulate.collectives import (
    MPICH_NAMES,
    choose_bcast,
    choose_composition,
    choose_reduce,
)


def last_json(proc: subprocess.CompletedProcess) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_composition_and_node_parts_are_the_installed_mpich_tables(tables):
    """ch4's composition (alpha with several ranks on each of several nodes), and the
    node communicator's reduce and bcast, which are MPIR's: syncbench runs at
    MPI_THREAD_MULTIPLE, where the POSIX table selects nothing (MPIR fallback)."""
    import mpi4py

    assert mpi4py.rc.thread_level == "multiple"  # what bench/runtime.start_mpi asks for
    ch4 = tables["ch4"]["collective=allreduce"]
    for n in (2, 3, 4, 8, 16, 17, 64, 1024):
        for g in (1, 2, 3, 4, 8, 16):
            nodes = -(-n // g)
            picked = select(ch4, comm_size=n, nodes=nodes, parent=nodes != n)
            assert MPICH_NAMES[picked] == choose_composition(n, g), (n, g, picked)
    for collective in ("reduce", "bcast", "allreduce"):
        posix = tables["posix"][f"collective={collective}"]
        assert select(posix, comm_size=4, count=1 << 20, bytes=4 << 20) is None
        assert select(posix, comm_size=4, is_multi_threaded=False) is not None
    for g in range(2, 17):
        for count in COUNTS:
            nbytes = 4 * count
            facts = {"comm_size": g, "count": count, "bytes": nbytes, "nodes": 1}
            reduce = select(tables["mpir"]["collective=reduce"], collective="reduce", **facts)
            bcast = select(tables["mpir"]["collective=bcast"], collective="bcast", **facts)
            assert MPICH_NAMES[reduce] == choose_reduce(nbytes, g), (g, nbytes, reduce)
            assert MPICH_NAMES[bcast] == choose_bcast(nbytes, g), (g, nbytes, bcast)


@needs_simgrid
def test_run_file_names_each_host_once_and_simgrid_as_released(tmp_path):
    from syncbench.analysis import schema
    from syncbench.analysis.context import machine_context
    from syncbench.analysis.runfile import read_run
    from syncbench.bench.simulate.engine import load_simgrid

    out = tmp_path / "g4.h5"
    proc = simulate("--algorithm", "ssgd", "--np", "10", "--gpus-per-node", "4", "--steps", "2",
                    "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    hosts = [run.rank_attrs[k]["hostname"] for k in range(10)]
    assert hosts == ["node-0"] * 4 + ["node-1"] * 4 + ["node-2"] * 2
    assert [run.rank_attrs[k]["node"] for k in range(10)] == [0] * 4 + [1] * 4 + [2] * 2
    assert list(run.attrs["hostnames"]) == ["node-0", "node-1", "node-2"]
    assert list(run.attrs["ranks_per_node"]) == [4, 4, 2] and run.attrs["nodes"] == 3
    ctx = machine_context(run)
    assert (ctx["hosts"], ctx["ranks_per_host"]) == (3, 4)
    version = json.loads(run.attrs[schema.SIM_RUN_ATTR])["simgrid_version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert version == load_simgrid().simgrid_version


RING = """
    import json
    from syncbench.bench.simulate import engine
    from syncbench.bench.simulate.collectives import allreduce_phases, cost
    from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
    out = {}
    def body(net):
        tp = lambda p: net.phase(p.key(), p.pairs, p.nbytes)
        out["ring"] = cost(allreduce_phases(SIZE, 8, "ring"), tp)
    spec = PlatformSpec(kind=KIND, bandwidth=12.5e9, latency=250e-6)
    engine.run_in_simgrid(platform_xml(spec, 8), body, 1, natural_key)
    print(json.dumps(out))
"""


#: VGG-16's gradient (138,357,544 floats), the ring of the figures in engine.py.
VGG16_BYTES = 553_430_176


@needs_simgrid
@pytest.mark.parametrize("kind", ["fat-tree", "crossbar"])
def test_ring_with_long_links_matches_the_closed_form(kind):
    """250 us links at 12.5 GB/s, N = 8: SimGrid's default TCP window (4 MiB) capped each
    flow at 4 MiB / (2 x 500 us) = 4.2 GB/s (237.9 ms instead of 84.5 ms)."""
    code = RING.replace("SIZE", str(VGG16_BYTES)).replace("KIND", repr(kind))
    seconds = last_json(python(code, timeout=600))["ring"]
    route = 2 * 250e-6  # host link, switch (or none), host link
    expected = 2 * 7 * route + 2 * 7 / 8 * VGG16_BYTES / 12.5e9
    assert expected == pytest.approx(84.5e-3, abs=1e-4)
    assert seconds == pytest.approx(expected, rel=0.01)


NODE_AWARE = """
    import json
    from syncbench.bench.simulate.collectives import allreduce_phases, cost, flat_allreduce_phases
    from syncbench.bench.simulate.engine import run_in_simgrid
    from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
    out = {}
    def body(net):
        tp = lambda p: net.phase(p.key(), p.pairs, p.nbytes)
        out["aware"] = cost(allreduce_phases(64e6, 16, ranks_per_node=4), tp)
        out["flat"] = cost(allreduce_phases(64e6, 16), tp)
        out["roots"] = cost([p for p in allreduce_phases(64e6, 16, ranks_per_node=4)
                             if p.stride == 4], tp)
    spec = PlatformSpec(kind="crossbar", bandwidth=12.5e9, latency=1e-6, gpus_per_node=4,
                        loopback_bandwidth=150e9, loopback_latency=1e-6)
    run_in_simgrid(platform_xml(spec, 16), body, 4, natural_key)
    print(json.dumps(out))
"""


@needs_simgrid
def test_node_aware_allreduce_is_the_roots_allreduce_plus_the_nodes_parts():
    """G = 4, N = 16, 64 MB on a crossbar: the 4 node roots' Rabenseifner over the links
    (4 exchanges of a 2 us route, 1.5 S through each), a reduce-scatter-gather inside
    each node (1.5 S over the loopback in 4 steps) and a binomial bcast (2 steps of S)."""
    got = last_json(python(NODE_AWARE, timeout=600))
    size, bw, route, lb_bw, lb_lat = 64e6, 12.5e9, 2e-6, 150e9, 1e-6
    roots = 4 * route + 1.5 * size / bw
    local = 4 * lb_lat + 1.5 * size / lb_bw + 2 * lb_lat + 2 * size / lb_bw
    assert got["roots"] == pytest.approx(roots, rel=1e-3)
    assert got["aware"] == pytest.approx(roots + local, rel=1e-3)
    # the flat 16-rank Rabenseifner (what was simulated: its first two steps inside the
    # nodes, the next two with four ranks sharing each host link) is another time
    assert abs(got["flat"] / got["aware"] - 1) > 0.05


DRAGONFLY = """
    import json, sys, time
    from syncbench.bench.simulate.collectives import Phase
    from syncbench.bench.simulate.engine import run_in_simgrid
    from syncbench.bench.simulate.platform import PlatformSpec, natural_key, platform_xml
    hosts = int(sys.argv[1])
    spec = PlatformSpec(kind="dragonfly", bandwidth=12.5e9, latency=1e-6)
    out = {}
    def body(net):
        last = net.capacity - 1
        out["capacity"] = net.capacity
        out["far"] = net.phase(("far",), lambda: [(0, last), (last, 0)], 1e6)
        out["half"] = net.phase(("half",), lambda: [(i, (i + hosts // 2) % hosts)
                                                    for i in range(0, hosts, 97)], 1e6)
    run_in_simgrid(platform_xml(spec, hosts), body, 1, natural_key)
    print(json.dumps(out))
"""


@needs_simgrid
@pytest.mark.parametrize("hosts", [1025, 4096, 16384])
def test_dragonfly_routes_between_its_farthest_hosts(hosts):
    """SimGrid 3.32 segfaulted routing between groups once there were more groups than
    routers per chassis (above 1,024 hosts with 8 routers)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(DRAGONFLY), str(hosts)],
                          capture_output=True, text=True, timeout=600)
    got = last_json(proc)
    assert got["capacity"] >= hosts
    # node-router, green, black, blue, green, black, router-node: at most 7 hops of 1 us
    assert 1e6 / 12.5e9 + 2e-6 <= got["far"] <= 1e6 / 12.5e9 + 7e-6 + 1e-9
    assert math.isfinite(got["half"]) and got["half"] > 0
