"""Nodes' namespaces and links: a bridge in the root namespace, one veth pair per node.

A link is shaped with a token bucket (``tc qdisc ... tbf``) on both ends, so
traffic to and from the node is limited to the rate. ``burst 256kb`` reaches
0.95 of the rate at 1 Gbit/s on this kind of host (64 kB only 0.64-0.74: the
bucket empties faster than TCP refills it). The kernel has no ``netem``, so
no latency is added; a link's latency is the network stack's.
"""

from __future__ import annotations

from pathlib import Path

from .host import ClusterError, sh, works
from .state import BRIDGE, BRIDGE_ADDRESS, Cluster, Node, save


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def check_names_free(cluster: Cluster) -> None:
    """Refuse names already taken by something this cluster did not make."""
    taken = [f"link {BRIDGE}"] if link_exists(BRIDGE) else []
    for node in cluster.nodes:
        if netns_exists(node.name):
            taken.append(f"network namespace {node.name}")
        if link_exists(node.veth):
            taken.append(f"link {node.veth}")
    if taken:
        raise ClusterError(f"{', '.join(taken)} already exist(s) and syncbench cluster did not "
                           "make them (no state file): remove them or pick other names")


def make_bridge(cluster: Cluster) -> None:
    sh(["ip", "link", "add", BRIDGE, "type", "bridge"], f"creating bridge {BRIDGE}")
    cluster.made.append({"kind": "link", "name": BRIDGE})
    save(cluster)
    sh(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE], "addressing the bridge")
    sh(["ip", "link", "set", BRIDGE, "up"], "bringing the bridge up")


def make_node(cluster: Cluster, node: Node) -> None:
    """The node's namespace, its veth pair (``eth0`` inside) and address."""
    sh(["ip", "netns", "add", node.name], f"creating namespace {node.name}")
    cluster.made.append({"kind": "netns", "name": node.name})
    save(cluster)
    peer = f"{node.veth}n"
    sh(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer],
       f"creating the link of {node.name}")
    cluster.made.append({"kind": "link", "name": node.veth})
    save(cluster)
    inside = ["ip", "-n", node.name]
    sh(["ip", "link", "set", peer, "netns", node.name], f"moving the link into {node.name}")
    sh(["ip", "link", "set", node.veth, "master", BRIDGE, "up"], "joining the bridge")
    sh([*inside, "link", "set", peer, "name", "eth0"], "naming eth0")
    sh([*inside, "addr", "add", f"{node.address}/24", "dev", "eth0"], "addressing eth0")
    sh([*inside, "link", "set", "eth0", "up"], "bringing eth0 up")
    sh([*inside, "link", "set", "lo", "up"], "bringing lo up")


def shape(node: Node, rate: str, burst: str) -> None:
    """Shape both ends of the node's link to ``rate`` (``tc`` units: 1gbit, 200mbit)."""
    for prefix, dev in ((["tc"], node.veth), (["ip", "netns", "exec", node.name, "tc"], "eth0")):
        sh([*prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
            "burst", burst, "latency", "50ms"], f"shaping the link of {node.name} to {rate}")


def unshape(node: Node) -> None:
    sh(["tc", "qdisc", "del", "dev", node.veth, "root"], "unshaping", check=False)
    sh(["ip", "netns", "exec", node.name, "tc", "qdisc", "del", "dev", "eth0", "root"],
       "unshaping", check=False)


def tbf_available() -> bool:
    """Whether the kernel has the tbf qdisc (probed on a throwaway dummy link)."""
    probe = f"{BRIDGE}probe"
    if not works(["ip", "link", "add", probe, "type", "dummy"]):
        return True  # cannot probe: let the real call report
    try:
        return works(["tc", "qdisc", "add", "dev", probe, "root", "tbf", "rate", "1mbit",
                      "burst", "32kb", "latency", "50ms"])
    finally:
        works(["ip", "link", "del", probe])


def set_link(node: Node, up: bool) -> None:
    """Take a node's link down or up (both ends), as a pulled cable would."""
    state = "up" if up else "down"
    sh(["ip", "link", "set", node.veth, state], f"setting the link of {node.name} {state}")


def link_is_up(node: Node) -> bool:
    """Whether the node's host-side link is up (``operstate``)."""
    try:
        return Path("/sys/class/net", node.veth, "operstate").read_text().strip() == "up"
    except OSError:
        return False


def pids(namespace: str) -> list[int]:
    """The processes inside a node's network namespace (``ip netns pids``)."""
    return [int(p) for p in sh(["ip", "netns", "pids", namespace], "listing the processes "
                               f"of {namespace}", check=False).stdout.split()]


def byte_counters(node: Node) -> dict[str, int]:
    """The node's link counters, seen from the bridge side (rx: sent by the node)."""
    base = Path("/sys/class/net", node.veth, "statistics")
    return {"tx_bytes_by_node": int((base / "rx_bytes").read_text()),
            "rx_bytes_by_node": int((base / "tx_bytes").read_text())}


def remove(kind: str, name: str) -> None:
    """Remove one made object if it still exists (a veth removes its peer with it)."""
    if kind == "link" and link_exists(name):
        sh(["ip", "link", "del", name], f"removing link {name}")
    elif kind == "netns" and netns_exists(name):
        sh(["ip", "netns", "del", name], f"removing namespace {name}")
