"""The emulated cluster's plans, without root: layouts, rates, placement, the launch
commands and the files ``up`` writes (the kernel objects are tests/e2e/test_cluster.py's)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess

import pytest

from syncbench.bench.cluster import actions, launch, network, slurm, state
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.state import Cluster, Node


@pytest.fixture(autouse=True)
def _default_names(monkeypatch):
    """The plans below are checked against the default prefix and subnet (``sb``,
    10.77.0): a second cluster's names in the caller's environment
    (``SYNCBENCH_CLUSTER_PREFIX``/``SUBNET``, read when the modules load) must not
    change them."""
    for module, name, value in ((state, "PREFIX", "sb"), (state, "BRIDGE", "sbbr0"),
                                (state, "SUBNET", "10.77.0"),
                                (state, "BRIDGE_ADDRESS", "10.77.0.254"),
                                (actions, "SUBNET", "10.77.0"), (network, "BRIDGE", "sbbr0"),
                                (slurm, "BRIDGE_ADDRESS", "10.77.0.254")):
        monkeypatch.setattr(module, name, value)


def _args(**kw) -> argparse.Namespace:
    base = {"nodes": 2, "link": "", "burst": "256kb", "node_speed": "", "clock_offset": "",
            "slurm": False, "cpu_period": None}
    return argparse.Namespace(**{**base, **kw})


def _cluster(count: int = 2, **kw) -> Cluster:
    # the bridge's names are the Cluster's defaults, fixed when state loaded
    return dataclasses.replace(actions.requested(_args(nodes=count, **kw)),
                               bridge=state.BRIDGE, bridge_address=state.BRIDGE_ADDRESS)


@pytest.mark.parametrize("rate,expected", [("1gbit", 125e6), ("200mbit", 25e6),
                                           ("100mbps", 100e6), ("1.5Gbit", 187.5e6)])
def test_rates_are_tc_units(rate, expected):
    assert actions.rate_bytes_per_s(rate) == pytest.approx(expected)


@pytest.mark.parametrize("flags,words", [
    ({"link": "fast"}, "--link 'fast'"),
    ({"node_speed": "1,2"}, "each speed must be in [0.01, 1]"),
    ({"node_speed": "1"}, "names 1 nodes, --nodes is 2"),
    ({"clock_offset": "0,1.5"}, "whole seconds"),
    ({"nodes": 0}, "--nodes must be 1 to"),
    ({"node_speed": "1,0.25", "cpu_period": 2}, "--cpu-period 4 or more"),
])
def test_bad_layouts_are_one_line(flags, words):
    with pytest.raises(ClusterError) as err:
        actions.requested(_args(**flags))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_layout_names_nodes_addresses_and_the_shortest_quota_period():
    cluster = _cluster(node_speed="1,0.25", clock_offset="0,1000")
    assert [(n.name, n.address, n.veth) for n in cluster.nodes] == [
        ("sbnode1", "10.77.0.1", "sbv1"), ("sbnode2", "10.77.0.2", "sbv2")]
    assert [n.clock_offset_s for n in cluster.nodes] == [0, 1000]
    assert cluster.cpu_period_us == 4000  # a 0.25 quota of 1 ms, the kernel's minimum
    same, other = _cluster(node_speed="1,0.25", clock_offset="0,1000"), _cluster()
    assert cluster.layout() == same.layout() != other.layout()


def test_nodes_get_cpu_sets_of_their_own_or_an_equal_share_of_one():
    """Disjoint CPU sets when the CPUs suffice; a whole multiple of the CPUs packs k
    consecutive nodes on each (so --node-speed 1/k gives each a fixed share of a known
    core); any other count leaves the nodes sharing every CPU."""
    from syncbench.bench.cluster.cpu import nodes_per_cpu, plan_cpusets

    assert plan_cpusets(2, [0, 1]) == ["0", "1"]
    assert plan_cpusets(1, [0, 1]) == ["0,1"]
    assert plan_cpusets(4, [0, 1]) == ["0", "0", "1", "1"]
    assert plan_cpusets(6, [2, 5]) == ["2", "2", "2", "5", "5", "5"]
    assert plan_cpusets(3, [0, 1]) == ["", "", ""]
    assert [nodes_per_cpu(plan_cpusets(n, [0, 1])) for n in (1, 2, 3, 4)] == [1, 1, 0, 2]


def test_placement_fills_node_by_node():
    cluster = _cluster(3)
    assert launch.placement(cluster, None, None) == (3, 1)
    assert launch.placement(cluster, None, 2) == (6, 2)
    assert launch.placement(cluster, 4, None) == (4, 2)
    with pytest.raises(ClusterError):
        launch.placement(cluster, 0, None)


def test_the_shim_enters_each_node_with_its_clock_cgroups_and_speed(tmp_path):
    node = Node(index=2, name="sbnode2", address="10.77.0.2", veth="sbv2", speed=0.25,
                clock_offset_s=1000, cgroup_procs=["/sys/fs/cgroup/cpu/sbnode2/cgroup.procs"])
    cluster = Cluster(nodes=[Node(index=1, name="sbnode1", address="10.77.0.1", veth="sbv1"),
                             node])
    text = launch.shim_text(cluster)
    line = next(x for x in text.splitlines() if x.startswith("  10.77.0.2|"))
    assert "ns=sbnode2" in line and "offset=1000" in line
    assert "SYNCBENCH_NODE_SPEED=0.25" in line and "cpu/sbnode2/cgroup.procs" in line
    # the shim parses as sh, and refuses a host that is no node, as ssh would (255)
    shim = tmp_path / "node-ssh"
    shim.write_text(text)
    shim.chmod(0o755)
    out = subprocess.run([str(shim), "-x", "10.9.9.9", "true"], capture_output=True, text=True)
    assert out.returncode == 255 and "no node '10.9.9.9'" in out.stderr


def test_launch_commands_force_the_links_for_either_mpi(monkeypatch, tmp_path):
    cluster = _cluster(2)
    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(tmp_path))
    (tmp_path / "node-ssh").write_text(launch.shim_text(cluster))
    monkeypatch.delenv("UCX_TLS", raising=False)
    monkeypatch.setattr(launch, "mpi_flavour", lambda mpiexec: "mpich")
    argv, env = launch.launch_command(cluster, ["prog"], 4, None, mpiexec="mpiexec")
    assert argv[argv.index("-hosts") + 1] == "10.77.0.1:2,10.77.0.2:2"
    assert argv[argv.index("-localhost") + 1] == "10.77.0.254" and argv[-1] == "prog"
    assert env["UCX_TLS"] == "tcp,self"
    monkeypatch.setenv("UCX_TLS", "tcp")  # the user's choice is kept
    assert launch.launch_command(cluster, ["prog"], 2, None, "mpiexec")[1]["UCX_TLS"] == "tcp"
    monkeypatch.setattr(launch, "mpi_flavour", lambda mpiexec: "openmpi")
    argv, env = launch.launch_command(cluster, ["prog"], 2, None, mpiexec="mpiexec")
    assert argv[argv.index("--map-by") + 1] == "ppr:1:node:oversubscribe"
    assert env["OMPI_MCA_pml"] == "ob1" and env["PRTE_MCA_plm_ssh_agent"].endswith("node-ssh")
    assert launch.launch_command(cluster, ["prog"], 1, None, "mpiexec")[0][2] == "10.77.0.1:1"


def test_slurm_lines_and_task_prolog():
    cluster = _cluster(2, node_speed="1,0.5")
    lines = slurm.fragment(cluster).splitlines()
    assert lines[0].startswith("TaskProlog=")
    assert "NodeName=sbnode2 NodeAddr=10.77.0.2" in lines[2]
    assert lines[-1].startswith(f"PartitionName={slurm.PARTITION} Nodes=sbnode1,sbnode2")
    prolog = slurm.task_prolog(cluster)
    out = subprocess.run(["sh", "-c", prolog], capture_output=True, text=True,
                         env={"SLURMD_NODENAME": "sbnode2", "PATH": "/usr/bin:/bin"})
    assert "export UCX_TLS=tcp,self" in out.stdout
    assert "export SYNCBENCH_NODE_SPEED=0.5" in out.stdout
    # a shaped link's token bucket reaches the tasks too (1 Gbit/s: 256 KB)
    shaped = dataclasses.replace(cluster, link="1gbit")
    out = subprocess.run(["sh", "-c", slurm.task_prolog(shaped)], capture_output=True,
                         text=True, env={"SLURMD_NODENAME": "sbnode1", "PATH": "/usr/bin:/bin"})
    assert "export SYNCBENCH_LINK_BURST=262144" in out.stdout
    assert "SYNCBENCH_NODE_SPEED" not in out.stdout
    host = subprocess.run(["sh", "-c", prolog], capture_output=True, text=True,
                          env={"SLURMD_NODENAME": "vm", "PATH": "/usr/bin:/bin"})
    assert host.stdout == ""  # the host's own node keeps its settings
