"""Simulated clusters: SimGrid platform XML for a fat tree, a dragonfly, a torus.

Every kind is one SimGrid ``<cluster>`` (SimGrid's XML reference, "cluster"
with ``topology`` FAT_TREE, DRAGONFLY or TORUS), hosts named ``node-<i>``,
one private link per host of ``--bandwidth`` and ``--latency`` (each hop of a
route adds the latency), ``--gpus-per-node`` ranks per host talking through
a loopback link (NVLink-like by default). Sizes are chosen from the host
count:

* ``fat-tree``: one switch up to 32 hosts, else a 2-level tree with full
  bisection (``2;A,B;1,A;1,1``: B leaf switches of A hosts, A top switches);
* ``dragonfly``: 4 nodes per router, 8 routers per chassis, 4 chassis per
  group (128 nodes per group), as many groups as needed, one link between
  every pair of groups (SimGrid's ``groups,links;chassis,links;routers,links;nodes``);
* ``torus``: a 3-D torus of power-of-two sides as close to a cube as the host
  count allows;
* ``crossbar``: a flat cluster (a private link per host, no backbone): what
  ``--calibrate`` describes this machine with;
* ``--platform-xml FILE``: the user's own SimGrid description; its hosts, in
  natural name order, take ranks ``--gpus-per-node`` at a time.

``--calibrate COMM.h5`` fits latency and bandwidth to ``syncbench comm
--op allreduce`` results: each size's measured mean is modelled by the same
collective phases the simulator uses (:mod:`.collectives`) as
``k_L * L + k_B * S / B`` and (L, 1/B) are the relative least-squares fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

KINDS = ("fat-tree", "dragonfly", "torus", "crossbar")

#: Dragonfly shape: nodes per router, routers per chassis, chassis per group.
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
    per_group = _DF_NODES * _DF_ROUTERS * _DF_CHASSIS
    groups = max(1, math.ceil(hosts / per_group))
    return (f"{groups},1;{_DF_CHASSIS},1;{_DF_ROUTERS},1;{_DF_NODES}",
            groups * per_group)


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


def calibrate(path: str) -> tuple[float, float, dict[str, Any]]:
    """(route latency s, bandwidth B/s, details) fitted to ``syncbench comm`` results."""
    from syncbench.bench.commbench import read_results  # noqa: PLC0415
    from syncbench.bench.simulate.collectives import allreduce_cost_terms  # noqa: PLC0415

    try:
        data = read_results(path)
    except (OSError, KeyError) as exc:
        raise ValueError(f"--calibrate {path}: cannot be read ({exc})") from None
    attrs = data.get("attrs", {})
    if attrs.get("op") != "allreduce" or "size" not in data or "avg_us" not in data:
        raise ValueError(f"--calibrate {path}: expected `syncbench comm --op allreduce --out` "
                         f"results, got op {attrs.get('op')!r}")
    n = int(attrs.get("world_size", 2))
    sizes = np.asarray(data["size"], dtype=float)
    seconds = np.asarray(data["avg_us"], dtype=float) * 1e-6
    keep = (sizes > 0) & (seconds > 0)
    if n < 2 or keep.sum() < 2:
        raise ValueError(f"--calibrate {path}: needs >= 2 ranks and >= 2 message sizes")
    rows = [allreduce_cost_terms(int(s), n) for s in sizes[keep]]
    a = np.array([[k_l, k_b * s] for (k_l, k_b), s in zip(rows, sizes[keep])])
    t = seconds[keep]
    coef, *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    latency, inv_bw = float(coef[0]), float(coef[1])
    if inv_bw <= 0:
        raise ValueError(f"--calibrate {path}: the fit gives no positive bandwidth")
    latency = max(latency, 1e-9)
    fitted = a @ np.array([latency, inv_bw])
    details = {"world_size": n, "sizes": int(keep.sum()),
               "max_rel_error": float(np.max(np.abs(fitted / t - 1.0))),
               "mpi_library": attrs.get("mpi_library", "")}
    return latency, 1.0 / inv_bw, details


def calibrated_spec(path: str, gpus_per_node: int = 1) -> PlatformSpec:
    """This machine as a crossbar whose routes have the fitted latency and bandwidth."""
    latency, bandwidth, _ = calibrate(path)
    # A crossbar route crosses two private links: each gets half the route latency.
    return PlatformSpec(kind="crossbar", bandwidth=bandwidth, latency=latency / 2,
                        gpus_per_node=gpus_per_node, calibrated_from=path)
