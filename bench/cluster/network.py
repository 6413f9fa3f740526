"""Nodes' namespaces and links: a bridge in the root namespace, one veth pair per node.

A link is shaped with a token bucket (``tc qdisc ... tbf``, tc-tbf(8)) on
both ends, so traffic to and from the node is limited to the rate. The
bucket must be large enough that TCP refills it before it empties, or a link
carries less than its rate; and every byte it holds is a byte that a message
after an idle spell (a compute phase) sends at the veth's speed, not the rate's,
which a real link of that rate never does. ``--burst auto`` (the default) sizes
it to 2.1 ms of the rate (:func:`bucket`), at least 32 KB: 256 KB at 1 Gbit/s
(the earlier fixed default), which reached 0.95 of the rate where 64 KB reached
only 0.64-0.74; 51 KB at 200 Mbit/s, which reached 0.94 (256 KB: 0.96) and lets a
fifth of the old bucket through unshaped (docs/RESULTS.md). A shaped link also caps the
stack's TCP segments (``gso_max_size``, :func:`segment_limit`) below the bucket: ``tbf``
cuts a segment larger than its bucket into packets (``tbf_segment`` in the kernel's
``net/sched/sch_tbf.c``), and those cost this host 11-13 ns of interrupt CPU a byte
sent at 200 Mbit/s with 51 KB and 64 KB segments, against 1.1 ns with 32 KB segments
(``syncbench comm``'s ``link_cpu_s_per_byte``), time taken from the ranks' compute.
The kernel has no ``netem``, so no latency is added; a link's latency is the network
stack's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path

from .host import ClusterError, sh, works
from .state import BRIDGE, BURST_RE, Cluster, Node, record, subnet_network


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def link_index(name: str) -> int | None:
    """A link's interface index in the root namespace (its identity), or None if none."""
    try:
        return int(Path("/sys/class/net", name, "ifindex").read_text())
    except (OSError, ValueError):
        return None


def netns_inode(name: str) -> int | None:
    """The inode of a named namespace (``st_ino`` of /run/netns/NAME: its identity)."""
    try:
        return os.stat(Path("/run/netns", name)).st_ino
    except OSError:
        return None


def check_names_free(cluster: Cluster) -> None:
    """Refuse names already taken by something this cluster did not make."""
    taken = [f"link {cluster.bridge}"] if link_exists(cluster.bridge) else []
    for node in cluster.nodes:
        if netns_exists(node.name):
            taken.append(f"network namespace {node.name}")
        if link_exists(node.veth):
            taken.append(f"link {node.veth}")
    if taken:
        raise ClusterError(f"{', '.join(taken)} already exist(s) and syncbench cluster did not "
                           "make them (no state file): remove them or pick other names")


def host_routes() -> list[dict]:
    """The host's IPv4 routes, every table (``ip -4 -j route show table all``)."""
    proc = sh(["ip", "-4", "-j", "route", "show", "table", "all"], "listing the host's routes")
    try:
        routes = json.loads(proc.stdout or "[]")
    except ValueError:
        raise ClusterError("cannot read the host's routes (ip -j route: iproute2 without "
                           "JSON output)") from None
    return [r for r in routes if isinstance(r, dict)]


def check_subnet_free(subnet: str) -> None:
    """Refuse a subnet that overlaps a route the host already has (one line, naming it)."""
    ours = subnet_network(subnet)
    clashes = []
    for route in host_routes():
        dst = str(route.get("dst", ""))
        if dst in ("", "default"):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.overlaps(ours) and net.prefixlen > 0:
            clashes.append(f"{dst} dev {route.get('dev', '?')}"
                           + (f" table {route['table']}" if route.get("table") else ""))
    if clashes:
        raise ClusterError(f"subnet {ours} overlaps the host's route(s) {', '.join(clashes)}: "
                           "pick another with SYNCBENCH_CLUSTER_SUBNET")


def make_bridge(cluster: Cluster) -> None:
    bridge = cluster.bridge
    sh(["ip", "link", "add", bridge, "type", "bridge"], f"creating bridge {bridge}")
    record(cluster, "link", bridge, ifindex=link_index(bridge))
    sh(["ip", "addr", "add", f"{cluster.bridge_address}/24", "dev", bridge],
       "addressing the bridge")
    sh(["ip", "link", "set", bridge, "up"], "bringing the bridge up")


def make_node(cluster: Cluster, node: Node) -> None:
    """The node's namespace, its veth pair (``eth0`` inside) and address."""
    sh(["ip", "netns", "add", node.name], f"creating namespace {node.name}")
    record(cluster, "netns", node.name, inode=netns_inode(node.name))
    peer = f"{node.veth}n"
    sh(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer],
       f"creating the link of {node.name}")
    record(cluster, "link", node.veth, ifindex=link_index(node.veth))
    inside = ["ip", "-n", node.name]
    sh(["ip", "link", "set", peer, "netns", node.name], f"moving the link into {node.name}")
    sh(["ip", "link", "set", node.veth, "master", cluster.bridge, "up"], "joining the bridge")
    sh([*inside, "link", "set", peer, "name", "eth0"], "naming eth0")
    sh([*inside, "addr", "add", f"{node.address}/24", "dev", "eth0"], "addressing eth0")
    sh([*inside, "link", "set", "eth0", "up"], "bringing eth0 up")
    sh([*inside, "link", "set", "lo", "up"], "bringing lo up")


def _link_ends(node: Node, tool: str = "tc") -> tuple[tuple[list[str], str], ...]:
    """``(tool command, device)`` of both ends of a node's link: the host's veth, and
    ``eth0`` inside the node's namespace."""
    return ([tool], node.veth), (["ip", "netns", "exec", node.name, tool], "eth0")


#: ``--burst auto``: the bucket holds this many seconds of the link's rate ...
AUTO_BURST_SECONDS = 0.0021
#: ... and at least this many bytes (tbf's own probe above uses 32kb).
MIN_AUTO_BURST = 32 * 1024


RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$", re.I)
_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
          "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}


def rate_bytes_per_s(rate: str) -> float:
    """A ``tc`` rate (``1gbit``, ``200mbit``, ``50mbps``) in bytes per second."""
    match = RATE.match(rate.strip())
    if not match:
        raise ClusterError(f"--link {rate!r} is not a rate such as 1gbit, 200mbit or 100mbps")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def size_bytes(size: str) -> float:
    """A ``tc`` size (``256kb``, ``51kb``, ``2mbit``, ``1500``) in bytes."""
    match = BURST_RE.match(size.strip())
    if not match:
        raise ClusterError(f"{size!r} is not a size such as 256kb")
    scale = 1024 ** " kmg".index(match.group(2).lower() or " ")
    return float(match.group(1)) * scale / (8 if (match.group(3) or "").lower() == "bit" else 1)


def link_burst_bytes(rate: str, burst: str) -> float:
    """Bytes of the token bucket that shapes a link of ``rate`` (:func:`bucket`): what a
    message after an idle spell sends at once; 0 for an unshaped link (``rate`` "")."""
    return size_bytes(bucket(rate_bytes_per_s(rate), burst)) if rate else 0.0


def bucket(rate_bytes_per_s: float, burst: str) -> str:
    """The ``tc`` burst for a link of ``rate_bytes_per_s``: ``burst`` itself, or for
    ``auto`` :data:`AUTO_BURST_SECONDS` of the rate, at least :data:`MIN_AUTO_BURST`,
    in whole kilobytes (``256kb`` at 1 Gbit/s, ``51kb`` at 200 Mbit/s)."""
    if burst != "auto":
        return burst
    size = max(MIN_AUTO_BURST, rate_bytes_per_s * AUTO_BURST_SECONDS)
    return f"{int(size // 1024)}kb"


#: The stack's largest TCP segment on a link by default (Linux's ``GSO_MAX_SIZE``).
GSO_DEFAULT = 65536


def segment_limit(burst: str) -> int:
    """The ``gso_max_size`` of a link shaped with a bucket of ``burst``: the largest power
    of two at most 3/4 of the bucket (room for the headers of the packets a segment
    becomes: 23 of 66 bytes for 32 KB), at most :data:`GSO_DEFAULT`, at least 4 KB. A
    segment that fits passes the bucket whole; a larger one ``tbf`` cuts into packets on
    the host's CPU (the module docstring): 32 KB at 200 Mbit/s (51 KB), 64 KB at 1 Gbit/s."""
    room = size_bytes(burst) * 0.75
    limit = GSO_DEFAULT
    while limit > room and limit > 4096:
        limit //= 2
    return limit


def _set_segments(node: Node, size: int) -> None:
    """``gso_max_size`` of both ends of the node's link; where ``ip`` cannot set it (an
    older one) the link only costs more CPU, so that is no error."""
    for ip, dev in _link_ends(node, "ip"):
        sh([*ip, "link", "set", "dev", dev, "gso_max_size", str(size)],
           f"setting the TCP segments of {node.name}'s link to {size} bytes", check=False)


def shape(node: Node, rate: str, burst: str) -> None:
    """Shape both ends of the node's link to ``rate`` (``tc`` units: 1gbit, 200mbit)
    with a token bucket of ``burst`` (a ``tc`` size, not ``auto``: :func:`bucket`), its
    TCP segments no larger than the bucket passes whole (:func:`segment_limit`)."""
    for tc, dev in _link_ends(node):
        sh([*tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
            "burst", burst, "latency", "50ms"], f"shaping the link of {node.name} to {rate}")
    _set_segments(node, segment_limit(burst))


def unshape(node: Node) -> None:
    """Remove the shaping from both ends (nothing to remove is no error), and the cap on
    their TCP segments."""
    for tc, dev in _link_ends(node):
        sh([*tc, "qdisc", "del", "dev", dev, "root"], "unshaping", check=False)
    _set_segments(node, GSO_DEFAULT)


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
    """Remove one made object if it still exists (a veth removes its peer with it); the
    caller checked that it is the one ``up`` made (``command.teardown``)."""
    if kind == "link" and link_exists(name):
        sh(["ip", "link", "del", name], f"removing link {name}")
    elif kind == "netns" and netns_exists(name):
        sh(["ip", "netns", "del", name], f"removing namespace {name}")
