"""The simulator's network: MPICH's choice of collective algorithms as the installed
MPICH makes it, node-aware allreduce, SimGrid's flow model without the TCP window
cap, platforms that SimGrid can route at every size, and what the run file says.

SimGrid's engine runs once per process, so the tests that simulate run a short
script in a subprocess (a crash there fails the test, not pytest). They skip
without SimGrid's Python module, except when ``SYNCBENCH_REQUIRE_SIMGRID`` is set
(``make test``): then they fail, as in ``tests/test_simulate.py``.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sim_helpers import needs_simgrid, python, simulate

from syncbench.bench.simulate.collectives import (
    MPICH_NAMES,
    allreduce_link_terms,
    allreduce_phases,
    choose_allreduce,
    choose_bcast,
    choose_composition,
    choose_iallreduce,
    choose_reduce,
    flat_allreduce_phases,
    node_bcast_phases,
    node_reduce_phases,
)


def last_json(proc: subprocess.CompletedProcess) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- MPICH's selection tables, read from the installed library ------------------------

def mpich_libraries() -> list[Path]:
    """The MPI libraries of the installed MPICH wheel (skip when the wheel is absent)."""
    try:
        dist = importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the MPICH wheel is not installed (pip install mpich)")
    libs = [Path(str(dist.locate_file(f))) for f in dist.files or ()
            if re.fullmatch(r"libmpi\.so\.\d+", Path(str(f)).name)]
    assert libs, f"the MPICH wheel {dist.version} has no libmpi.so.<N>"
    return libs


def selection_tables(lib: Path) -> dict[str, dict[str, Any]]:
    """MPICH's compiled-in collective selection trees (``coll_selection.json`` and the
    ch4 and POSIX ones), by what their allreduce leaf names: mpir, ch4, posix."""
    data = lib.read_bytes()
    tables: dict[str, dict[str, Any]] = {}
    for match in re.finditer(rb'\{"collective=[^\x00]*', data):
        try:
            tree = json.loads(match.group())
        except ValueError:
            continue
        text = json.dumps(tree.get("collective=allreduce", {}))
        kind = ("ch4" if "composition=MPIDI_Allreduce" in text
                else "posix" if "MPIDI_POSIX" in text
                else "mpir" if "MPIR_Allreduce_intra" in text else "")
        if kind:
            tables[kind] = tree
    assert set(tables) == {"mpir", "ch4", "posix"}, (
        f"{lib}: expected MPICH's mpir, ch4 and posix selection tables, found {sorted(tables)}")
    return tables


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[str, Any]]:
    found = [selection_tables(lib) for lib in mpich_libraries()]
    assert all(t == found[0] for t in found)
    return found[0]


def _pof2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _holds(key: str, f: dict[str, Any]) -> bool:
    """One node of MPICH's tree (``src/mpi/coll/src/csel.c``: ``parse_json_tree``, and
    ``prune_tree`` for the communicator's keys: ``comm_size<N`` is strict there)."""
    if key == "any" or key.endswith("=any"):
        return True
    name, op, value = re.fullmatch(r"([a-z_]+)(<=|<|=)(.+)", key).groups()
    size = f["comm_size"]
    if name in ("is_commutative", "is_op_built_in", "is_multi_threaded"):
        return f[name] == (value == "yes")
    checks = {
        ("collective", "="): lambda: f["collective"] == value,
        ("comm_type", "="): lambda: f["comm_type"] == value,
        ("comm_hierarchy", "="): lambda: f["parent"] == (value == "parent"),
        ("count", "<"): lambda: value == "pow2" and f["count"] < _pof2(size),
        ("avg_msg_size", "<="): lambda: f["bytes"] <= int(value),
        ("avg_msg_size", "<"): lambda: f["bytes"] < int(value),
        ("comm_size", "<="): lambda: size <= int(value),
        ("comm_size", "<"): lambda: size < int(value),
        ("comm_size", "="): lambda: (f["nodes"] == 1 if value == "node_comm_size"
                                     else value == "pow2" and size == _pof2(size)),
    }
    assert (name, op) in checks, f"a selection key this evaluator does not know: {key}"
    return checks[name, op]()


def select(tree: dict[str, Any], **facts: Any) -> str | None:
    """The algorithm MPICH's tree picks: the first key that holds at each level, no
    backtracking (a branch that ends without a leaf selects nothing: MPICH's fallback)."""
    f = {"comm_type": "intra", "is_commutative": True, "is_op_built_in": True,
         "is_multi_threaded": True, "parent": False, "nodes": 0, **facts}
    node: dict[str, Any] = tree
    while True:
        for key, child in node.items():
            if key.startswith(("algorithm=", "composition=")):
                return key.split("=", 1)[1]
            if _holds(key, f):
                node = child
                break
        else:
            return None


COUNTS = (1, 2, 3, 4, 7, 8, 100, 511, 512, 513, 1024, 2048, 4096, 1 << 20, 25_000_000)
SIZES_N = (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 33, 64, 100, 512, 1000, 1024, 4096, 16384)


@pytest.mark.parametrize("collective,choose", [("allreduce", choose_allreduce),
                                               ("iallreduce", choose_iallreduce)])
def test_allreduce_choice_is_the_installed_mpich_table(tables, collective, choose):
    """Every (count of floats, N) of the grid: the simulator's choice is the table's, for
    MPI_Allreduce and for MPI_Iallreduce (recursive doubling up to 2048 bytes there)."""
    tree = tables["mpir"][f"collective={collective}"]
    for n in SIZES_N:
        for count in COUNTS:
            nbytes = 4 * count
            picked = select(tree, collective=collective, comm_size=n, count=count, bytes=nbytes)
            assert MPICH_NAMES[picked] == choose(nbytes, n), (collective, n, nbytes, picked)
            # an intercommunicator has its own algorithm; the strategies run on COMM_WORLD
            inter = select(tree, comm_type="inter", comm_size=n, count=count, bytes=nbytes)
            assert inter.startswith(f"MPIR_{collective.capitalize()}_inter_"), inter
    # where the two differ: 1 KiB on 16 ranks (256 floats >= pof2)
    assert (choose_allreduce(1024, 16), choose_iallreduce(1024, 16)) == (
        "rabenseifner", "recursive-doubling")


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


# -- node-aware allreduce (phases) -----------------------------------------------------

def test_allreduce_with_ranks_per_node_is_composition_alpha():
    size = 64e6
    phases = allreduce_phases(size, 16, ranks_per_node=4)
    roots = [p for p in phases if p.stride == 4]  # the 4 roots' Rabenseifner
    assert roots == flat_allreduce_phases(size, 4, "rabenseifner", stride=4)
    assert [p.key()[:4] for p in roots] == [p.key() for p in allreduce_phases(size, 4)]
    assert {r for p in roots for pair in p.pairs() for r in pair} == {0, 4, 8, 12}
    local = [p for p in phases if p.stride == 1]
    assert local == node_reduce_phases(size, 16, 4) + node_bcast_phases(size, 16, 4)
    # every node-local flow stays on its node (rank r on node r // 4)
    assert all(s // 4 == d // 4 for p in local for s, d in p.pairs())
    # reduce-scatter-gather (S/2, S/4, then S/4, S/2) then binomial bcast (2 steps of S)
    assert [(p.pattern, p.nbytes / size) for p in local] == [
        ("xor", 0.5), ("xor", 0.25), ("halves-in", 0.25), ("halves-in", 0.5),
        ("tree-down", 1.0), ("tree-down", 1.0)]
    # one rank per node, all ranks on one node, and the nonblocking one: flat
    assert allreduce_phases(size, 16, ranks_per_node=1) == allreduce_phases(size, 16)
    assert allreduce_phases(size, 4, ranks_per_node=4) == allreduce_phases(size, 4)
    assert allreduce_phases(size, 16, ranks_per_node=4, nonblocking=True) == (
        allreduce_phases(size, 16))
    # what calibration counts on the links is the roots' part
    k_l = sum(p.repeat for p in roots)
    assert (k_l, sum(p.nbytes for p in roots) / size) == allreduce_link_terms(size, 16, 4)


# -- calibration: a clipped latency and the bandwidth fitted with it ---------------------

def test_fit_refits_bandwidth_when_latency_is_clipped():
    """Sizes up to 128 KiB ride a burst at 50x the link's rate: the latency estimate goes
    negative and is clipped; the bandwidth must be fitted with the clipped latency (it
    was 1.64x the link's, fitted with the previous, positive estimate)."""
    from syncbench.bench.simulate.platform import MIN_LATENCY, fit_link

    sizes = np.array([4 << k for k in range(21)], dtype=float)
    terms = [allreduce_link_terms(s, 2) for s in sizes]
    k_l = np.array([k for k, _ in terms])
    k_b = np.array([k for _, k in terms]) * sizes
    bandwidth = 119.5e6
    for latency in (0.0, 2e-8, 1e-7):
        seconds = k_l * latency + k_b / bandwidth
        burst = sizes <= 131072
        seconds[burst] = k_b[burst] / (50 * bandwidth)
        fitted_l, fitted_b, details = fit_link(sizes, seconds, terms)
        assert fitted_l == MIN_LATENCY
        assert fitted_b == pytest.approx(bandwidth, rel=1e-4)
        used = np.isin(sizes, details["bandwidth_sizes"])
        rates = k_b[used] / (seconds[used] - k_l[used] * fitted_l)
        assert fitted_b == pytest.approx(float(np.median(rates)), rel=1e-9)


# -- the run file -------------------------------------------------------------------------

def test_simgrid_version_is_the_bindings_string():
    from syncbench.bench.simulate.run import simgrid_version

    assert simgrid_version(SimpleNamespace(simgrid_version="3.32.0")) == "3.32.0"
    assert simgrid_version(SimpleNamespace(simgrid_version=(3, 36, 0))) == "3.36.0"
    assert simgrid_version(SimpleNamespace()) == ""


def test_hosts_of_the_ranks():
    from syncbench.bench.simulate.writer import MAX_LISTED_NODES, node_attrs

    root, names = node_attrs(10, 4)
    assert names == ["node-0"] * 4 + ["node-1"] * 4 + ["node-2"] * 2
    assert root == {"nodes": 3, "ranks_per_host": 4, "hostnames": ["node-0", "node-1", "node-2"],
                    "ranks_per_node": [4, 4, 2]}
    root, names = node_attrs(4, 2, ["a", "b"])
    assert names == ["a", "a", "b", "b"]
    root, _ = node_attrs(MAX_LISTED_NODES + 1, 1)  # too many for a root attribute
    assert (root["nodes"], root["hostnames"], root["ranks_per_node"]) == (
        MAX_LISTED_NODES + 1, [], [])


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


# -- SimGrid: the flow model and the platforms ---------------------------------------------

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
