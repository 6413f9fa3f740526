"""Simulated clusters: SimGrid platform XML for a fat tree, a dragonfly, a torus.

Every kind is one SimGrid ``<cluster>`` (SimGrid's XML reference, "cluster"
with ``topology`` FAT_TREE, DRAGONFLY or TORUS), hosts named ``node-<i>``,
one private link per host of ``--bandwidth`` and ``--latency`` (each hop of a
route adds the latency), ``--gpus-per-node`` ranks per host talking through
a loopback link (NVLink-like by default), sized from the host count:

* ``fat-tree``: one switch up to 32 hosts, else a 2-level tree with full
  bisection (``2;A,B;1,A;1,1``: B leaf switches of A hosts, A top switches);
* ``dragonfly``: 4 nodes per router, 4 chassis per group, 8 routers per
  chassis (128 nodes per group) up to 8 groups (1,024 hosts), one link between
  every pair of groups (SimGrid's ``groups,links;chassis,links;routers,links;nodes``);
  above that as many routers per chassis R as make G <= R groups enough (16
  routers and 16 groups at 4,096 hosts, 32 and 32 at 16,384): SimGrid routes
  to group g through router g of the first chassis (:func:`dragonfly_parameters`);
* ``torus``: a 3-D torus of power-of-two sides as close to a cube as the host
  count allows;
* ``crossbar``: a flat cluster (a private link per host, no backbone): what
  ``--calibrate`` describes this machine with;
* ``--platform-xml FILE``: the user's own SimGrid description; its hosts, in
  natural name order, take ranks ``--gpus-per-node`` at a time.

``--calibrate COMM.h5`` fits latency and bandwidth to ``syncbench comm
--op allreduce`` results: each size is modelled by the same
collective phases the simulator uses (:mod:`.collectives`, MPICH 4-5's
choice of algorithm; with several ranks per node only the node roots'
allreduce crosses the links) as ``k_L * L + k_B * S / B``; L is fitted to the
latency-bound sizes and B to the bandwidth-bound ones (:func:`fit_link`).
B is payload bytes per second through one node's link, each way (TCP carries
1448 of every 1514 bytes of Ethernet frames).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from syncbench.bench.micro.comm import read_results
from syncbench.bench.simulate.collectives import allreduce_link_terms

KINDS = ("fat-tree", "dragonfly", "torus", "crossbar")

#: Dragonfly shape: nodes per router, routers per chassis (at least), chassis per group.
_DF_NODES, _DF_ROUTERS, _DF_CHASSIS = 4, 8, 4


@dataclass(frozen=True)
class PlatformSpec:
    """A simulated cluster: its kind and link parameters (bytes/s, seconds)."""

    kind: str = "fat-tree"
    hosts: int = 0  # 0: as many as the ranks need
    bandwidth: float = 12.5e9  # 100 Gb/s per host link
    latency: float = 1e-6  # per hop
    gpus_per_node: int = 1
    loopback_bandwidth: float = 150e9
    loopback_latency: float = 1e-6
    xml_file: str = ""
    calibrated_from: str = ""

    def describe(self) -> dict[str, Any]:
        """The attributes recorded in a simulated run file."""
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


def natural_key(name: str) -> list[Any]:
    """Sort key that puts ``node-2`` before ``node-10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def fat_tree_parameters(hosts: int) -> tuple[str, int]:
    """SimGrid FAT_TREE ``topo_parameters`` and the host count they give (>= hosts)."""
    if hosts <= 32:
        return f"1;{hosts};1;1", hosts
    leaf = 1 << (max(hosts - 1, 1).bit_length() // 2)
    leaves = math.ceil(hosts / leaf)
    return f"2;{leaf},{leaves};1,{leaf};1,1", leaf * leaves


def dragonfly_parameters(hosts: int) -> tuple[str, int]:
    """SimGrid DRAGONFLY ``topo_parameters`` and the host count they give (>= hosts).

    SimGrid 3.32 (``src/kernel/routing/DragonflyZone.cpp``) attaches the blue
    link between groups i and j to router j of group i's first chassis and
    routes a flow to group g through ``green_links_[g]`` of its router, a
    vector of one entry per router of the chassis: with more groups than
    routers per chassis a route reads past it (the segfault above 1,024 hosts
    with 8 routers). So the groups number at most the routers per chassis:
    the smallest R >= 8 routers per chassis for which ceil(hosts / (16 R)) <= R
    groups hold the hosts (R ~ sqrt(hosts / 16)).
    """
    routers = _DF_ROUTERS
    while math.ceil(hosts / (_DF_NODES * _DF_CHASSIS * routers)) > routers:
        routers += 1
    per_group = _DF_NODES * _DF_CHASSIS * routers
    groups = max(1, math.ceil(hosts / per_group))
    return (f"{groups},1;{_DF_CHASSIS},1;{routers},1;{_DF_NODES}", groups * per_group)


def torus_parameters(hosts: int) -> tuple[str, int]:
    bits = max(0, (max(hosts, 1) - 1).bit_length())
    dims = [1 << (bits // 3 + (1 if i < bits % 3 else 0)) for i in range(3)]
    return ",".join(str(d) for d in dims), dims[0] * dims[1] * dims[2]


def _gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s:.6g}Bps"


def platform_xml(spec: PlatformSpec, ranks: int) -> str:
    """The SimGrid XML of ``spec`` with room for ``ranks`` ranks."""
    needed = max(1, math.ceil(ranks / max(1, spec.gpus_per_node)))
    hosts = max(needed, spec.hosts)
    topo = ""
    if spec.kind == "fat-tree":
        params, hosts = fat_tree_parameters(hosts)
        topo = f' topology="FAT_TREE" topo_parameters="{params}"'
    elif spec.kind == "dragonfly":
        params, hosts = dragonfly_parameters(hosts)
        topo = f' topology="DRAGONFLY" topo_parameters="{params}"'
    elif spec.kind == "torus":
        params, hosts = torus_parameters(hosts)
        topo = f' topology="TORUS" topo_parameters="{params}"'
    elif spec.kind != "crossbar":
        raise ValueError(f"unknown platform {spec.kind!r}; choose one of {', '.join(KINDS)}")
    loopback = ""
    if spec.gpus_per_node > 1:
        loopback = (f' loopback_bw="{_gbps(spec.loopback_bandwidth)}"'
                    f' loopback_lat="{spec.loopback_latency:.9g}s"')
    return (
        "<?xml version='1.0'?>\n"
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
        '<platform version="4.1">\n'
        f'  <cluster id="cluster" prefix="node-" suffix="" radical="0-{hosts - 1}" '
        f'speed="1Gf" bw="{_gbps(spec.bandwidth)}" lat="{spec.latency:.9g}s"{topo}{loopback}/>\n'
        "</platform>\n"
    )


def read_platform_xml(path: str) -> str:
    """The text of a user's platform file (one-line ``ValueError`` if unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"--platform-xml {path}: {exc.strerror or exc}") from None
    if "<platform" not in text:
        raise ValueError(f"--platform-xml {path}: not a SimGrid platform file (no <platform>)")
    return text


#: A size is latency-bound when its bandwidth term is at most this share of its time,
LATENCY_SHARE = 0.05
#: and bandwidth-bound when its latency term is at most this share.
BANDWIDTH_SHARE = 0.10
#: Smallest latency a fit returns (seconds): a latency-bound size faster than the
#: bandwidth allows (a token bucket's burst) would otherwise give one <= 0.
MIN_LATENCY = 1e-9


def fit_link(sizes: Any, seconds: Any, terms: Any,
             latency_seconds: Any = None) -> tuple[float, float, dict[str, Any]]:
    """(latency s, bandwidth B/s, details) of ``t = k_L * L + k_B * S / B`` per size.

    ``terms`` are each size's (k_L, k_B), ``seconds`` its mean time and
    ``latency_seconds`` the time to take the latency from (its median, say;
    default ``seconds``). Latency is the median over the latency-bound sizes of
    (t - k_B S / B) / k_L, bandwidth the median over the bandwidth-bound sizes
    of their rates k_B S / (t - k_L L); each set is chosen with the other
    parameter's estimate, until the sets settle; a latency below ``MIN_LATENCY``
    is clipped to it, and the bandwidth refitted with the clipped value (not
    left at the one the negative estimate gave). A size is bandwidth-bound by
    both its times (a scheduling spike can lift a small size's mean; a token
    bucket's burst can carry most iterations of a mid size, and its median
    with them), and its rate comes from its mean: the burst is a fixed number
    of bytes per timed loop, a small share of a large size's. One relative
    least-squares fit of both parameters over every size fails on a shaped
    link: the many small sizes decide it, and what fits in the burst passes at
    the veth's speed, not the rate. Medians over sizes also keep out the few
    largest sizes where TCP falls below the rate.
    """
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    t_lat = t if latency_seconds is None else np.asarray(latency_seconds, dtype=float)
    k_l = np.array([k for k, _ in terms], dtype=float)
    k_b = np.array([k for _, k in terms], dtype=float) * s  # bytes through a link
    order = np.argsort(s)
    latency = t_lat[order[0]] / k_l[order[0]]
    inv_bw = max(t[order[-1]] - k_l[order[-1]] * latency, 0.5 * t[order[-1]]) / k_b[order[-1]]
    def inverse_bandwidth(latency: float, bw_set: Any) -> float:
        y = np.maximum(t[bw_set] - k_l[bw_set] * latency, 1e-12)
        return 1.0 / float(np.median(k_b[bw_set] / y))

    sets: tuple = ()
    for _ in range(50):
        bw_set = k_l * latency <= BANDWIDTH_SHARE * np.minimum(t, t_lat)
        bound = int(bw_set.sum()) >= 2
        if not bound:  # no size is bandwidth-bound: the largest two are the best there are
            bw_set = np.isin(np.arange(s.size), order[-2:])
        inv_bw = inverse_bandwidth(latency, bw_set)
        lat_set = k_b * inv_bw <= LATENCY_SHARE * t_lat
        if not lat_set.any():
            lat_set = np.isin(np.arange(s.size), order[:1])
        fitted = float(np.median((t_lat[lat_set] - k_b[lat_set] * inv_bw) / k_l[lat_set]))
        latency = max(fitted, MIN_LATENCY)
        if sets == (bw_set.tobytes(), lat_set.tobytes()):
            break
        sets = (bw_set.tobytes(), lat_set.tobytes())
    if fitted < MIN_LATENCY:  # clipped: the bandwidth was fitted with the unclipped latency
        inv_bw = inverse_bandwidth(latency, bw_set)
    if inv_bw <= 0:
        raise ValueError("the fit gives no positive bandwidth")
    model = k_l * latency + k_b * inv_bw
    error = np.where(lat_set, np.abs(model / t_lat - 1.0), np.abs(model / t - 1.0))
    details = {"latency_sizes": [int(x) for x in s[lat_set]],
               "bandwidth_sizes": [int(x) for x in s[bw_set]],
               "bandwidth_bound": bound,
               "max_rel_error": float(error[bw_set | lat_set].max()),
               "max_rel_error_all": float(error.max())}
    return latency, 1.0 / inv_bw, details


def comm_timings(path: str, op: str, flag: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray,
                                                         np.ndarray, str, np.ndarray]:
    """(attrs, sizes, mean s, P50 s, the statistic of the P50 column, usable sizes) of
    ``syncbench comm --op OP --out`` results; the P50 is the mean where the file has
    none. One-line ``ValueError`` naming ``flag`` if the file is not such results."""
    try:
        data = read_results(path)
    except (OSError, KeyError) as exc:
        raise ValueError(f"{flag} {path}: cannot be read ({exc})") from None
    attrs = data.get("attrs", {})
    if attrs.get("op") != op or "size" not in data or "avg_us" not in data:
        raise ValueError(f"{flag} {path}: expected `syncbench comm --op {op} --out` "
                         f"results, got op {attrs.get('op')!r}")
    statistic = "p50_us" if "p50_us" in data else "avg_us"
    sizes = np.asarray(data["size"], dtype=float)
    mean = np.asarray(data["avg_us"], dtype=float) * 1e-6
    median = np.asarray(data[statistic], dtype=float) * 1e-6
    keep = (sizes > 0) & (mean > 0) & (median > 0)
    return attrs, sizes, mean, median, statistic, keep


def calibrate(path: str) -> tuple[float, float, dict[str, Any]]:
    """(route latency s, bandwidth B/s, details) fitted to ``syncbench comm`` results.

    Each size is modelled as MPICH 4-5 run the allreduce on the ranks and
    nodes the file records (:func:`.collectives.allreduce_link_terms`) and
    fitted by :func:`fit_link`: the latency of one exchange from the small
    sizes' medians (P50: the means of back-to-back iterations on a busy host
    carry millisecond scheduling spikes; the means where the file has no
    P50), the bandwidth of one node's link (payload bytes per second, each
    way) from the large sizes' means.
    """
    attrs, sizes, seconds, small, statistic, keep = comm_timings(path, "allreduce",
                                                                 "--calibrate")
    n = int(attrs.get("world_size", 2))
    nodes = int(attrs.get("nodes", 0))
    if n < 2 or keep.sum() < 2:
        raise ValueError(f"--calibrate {path}: needs >= 2 ranks and >= 2 message sizes")
    terms = [allreduce_link_terms(s, n, nodes) for s in sizes[keep]]
    try:
        latency, bandwidth, details = fit_link(sizes[keep], seconds[keep], terms, small[keep])
    except ValueError as exc:
        raise ValueError(f"--calibrate {path}: {exc}") from None
    details.update({"world_size": n, "nodes": nodes, "statistic": statistic,
                    "sizes": int(keep.sum()), "mpi_library": attrs.get("mpi_library", "")})
    return latency, bandwidth, details


def describe_fit(path: str, fit: tuple[float, float, dict[str, Any]]) -> str:
    """One line: what ``--calibrate`` fitted, from which sizes, how well."""
    latency, bandwidth, d = fit

    def span(values: list[int]) -> str:
        return f"{len(values)} sizes {min(values)}-{max(values)} B" if values else "no size"

    where = f"{d['world_size']} ranks" + (f" on {d['nodes']} nodes" if d.get("nodes") else "")
    note = "" if d["bandwidth_bound"] else (" (no size was bandwidth-bound: measure larger "
                                            "sizes, syncbench comm --max-size)")
    return (f"calibrated from {path} ({where}): latency {latency * 1e6:.2f} us per exchange "
            f"from {span(d['latency_sizes'])} ({d['statistic'].removesuffix('_us')}), bandwidth "
            f"{bandwidth / 1e6:.2f} MB/s from {span(d['bandwidth_sizes'])}{note}; the model is "
            f"within {100 * d['max_rel_error']:.0f}% of those sizes, "
            f"{100 * d['max_rel_error_all']:.0f}% of all")


def calibrated_spec(path: str, gpus_per_node: int = 1,
                    fit: tuple[float, float, dict[str, Any]] | None = None) -> PlatformSpec:
    """This machine as a crossbar whose routes have the fitted latency and bandwidth."""
    latency, bandwidth, _ = fit or calibrate(path)
    # A crossbar route crosses two private links: each gets half the route latency.
    return PlatformSpec(kind="crossbar", bandwidth=bandwidth, latency=latency / 2,
                        gpus_per_node=gpus_per_node, calibrated_from=path)
