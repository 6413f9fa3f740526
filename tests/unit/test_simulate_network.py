"""The simulator's network: MPICH's choice of collective algorithms as the installed
MPICH makes it, node-aware allreduce, SimGrid's flow model without the TCP window
cap, platforms that SimGrid can route at every size, and what the run file says.

SimGrid's engine runs once per process, so the tests that simulate run a short
script in a subprocess (a crash there fails the test, not pytest). They skip
without SimGrid's Python module, except when ``SYNCBENCH_REQUIRE_SIMGRID`` is set
(``make test``): then they fail, as in ``tests/unit/test_simulate.py``.

Split off this module: ``tests/e2e/test_simulate_network_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from syncbench.bench.simulate.collectives import (
    MPICH_NAMES,
    allreduce_link_terms,
    allreduce_phases,
    choose_allreduce,
    choose_iallreduce,
    flat_allreduce_phases,
    node_bcast_phases,
    node_reduce_phases,
)

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


# -- SimGrid: the flow model and the platforms ---------------------------------------------
