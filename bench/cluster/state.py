"""The emulated cluster's one state file: its layout and every object ``up`` made.

``up`` records each kernel object (namespace, link, cgroup, daemon) the moment
it exists, so ``down`` removes exactly what was made, also after an ``up``
that failed half-way, and never an object of the same name it did not make.
The file lives in ``$SYNCBENCH_CLUSTER_DIR`` (default ``/run/syncbench-cluster``:
a tmpfs, so a reboot, which removes every object, also forgets them).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .host import ClusterError

#: Names and addresses of the emulated cluster: one prefix, one private /24 subnet
#: (``$SYNCBENCH_CLUSTER_PREFIX``, ``$SYNCBENCH_CLUSTER_SUBNET``: a second cluster can
#: live beside the first under other names).
PREFIX = os.environ.get("SYNCBENCH_CLUSTER_PREFIX", "sb")
BRIDGE = f"{PREFIX}br0"
SUBNET = os.environ.get("SYNCBENCH_CLUSTER_SUBNET", "10.77.0")
BRIDGE_ADDRESS = f"{SUBNET}.254"
MAX_NODES = 64


def state_dir() -> Path:
    """Where the state file, the launcher shim and Slurm's fragments live."""
    default = "/run/syncbench-cluster" + ("" if PREFIX == "sb" else f"-{PREFIX}")
    return Path(os.environ.get("SYNCBENCH_CLUSTER_DIR", default))


@dataclass
class Node:
    """One emulated node."""

    index: int
    #: Network namespace and hostname (the same word).
    name: str
    address: str
    #: Host-side end of its veth pair (the node's end is ``eth0`` inside).
    veth: str
    cpus: str = ""
    speed: float = 1.0
    clock_offset_s: float = 0.0
    #: cgroup.procs files a process joins to take the node's CPU set and quota.
    cgroup_procs: list[str] = field(default_factory=list)
    #: The rate ``cluster link NODE RATE`` set since ``up`` (else the cluster's ``link``).
    link: str = ""

    @property
    def cpu_count(self) -> int:
        """The CPUs of its CPU set (1 when it has none and shares the host's)."""
        return len(self.cpus.split(",")) if self.cpus else 1


@dataclass
class Cluster:
    """The layout asked for and the objects made, in the order they were made."""

    nodes: list[Node]
    link: str = ""
    burst: str = "256kb"
    slurm: bool = False
    #: CFS period of the nodes' CPU quotas, microseconds.
    cpu_period_us: int = 100_000
    made: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The bridge and its address (the names this cluster was made under).
    bridge: str = BRIDGE
    bridge_address: str = BRIDGE_ADDRESS

    def node(self, host: str) -> Node | None:
        """The node a launcher names by address, name or ``name.domain``."""
        for node in self.nodes:
            if host in (node.address, node.name) or host.split(".")[0] == node.name:
                return node
        return None

    def require_node(self, host: str) -> Node:
        """:meth:`node`, or a :class:`ClusterError` that lists the nodes."""
        node = self.node(host)
        if node is None:
            raise ClusterError(f"no node {host!r} (nodes: "
                               f"{', '.join(n.name for n in self.nodes)})")
        return node

    def layout(self) -> dict[str, Any]:
        """What ``up`` was asked for: two ``up`` with the same layout are one cluster."""
        return {"nodes": [(n.name, n.speed, n.clock_offset_s) for n in self.nodes],
                "link": self.link, "burst": self.burst, "slurm": self.slurm,
                "cpu_period_us": self.cpu_period_us}


def node_name(index: int) -> str:
    return f"{PREFIX}node{index}"


def veth_name(index: int) -> str:
    return f"{PREFIX}v{index}"


def state_file() -> Path:
    return state_dir() / "state.json"


def load() -> Cluster | None:
    """The cluster that is up, or None."""
    path = state_file()
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    nodes = [Node(**n) for n in data.pop("nodes")]
    return Cluster(nodes=nodes, **data)


def save(cluster: Cluster) -> None:
    """Write the state atomically (a crash never leaves half a file)."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cluster), indent=1) + "\n")
    tmp.replace(state_file())


def record(cluster: Cluster, kind: str, name: str) -> None:
    """Note an object ``up`` just made (``kind``: netns, link, cgroup, slurm-conf, slurmd)
    in the state file at once, so that ``down`` removes it whatever happens next."""
    cluster.made.append({"kind": kind, "name": name})
    save(cluster)


def forget() -> None:
    """Remove the state folder's files (after ``down`` removed every object)."""
    folder = state_dir()
    if folder.is_dir():
        for path in folder.iterdir():
            if path.is_file():
                path.unlink()
        try:
            folder.rmdir()
        except OSError:
            pass
