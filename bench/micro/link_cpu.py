"""The host CPU a node's traffic costs: interrupt and softirq seconds per byte sent.

Moving a byte through the kernel's network stack costs CPU time that no rank's clock
charges to MPI: the TCP/IP stack, and on the emulated cluster the veth pair, the bridge
and the ``tbf`` qdisc's dequeues, run in softirq context on whichever CPU raised them,
mostly the sender's (a veth transmits on the calling CPU and the peer's receive runs in
that CPU's backlog). While a rank waits in MPI the work takes only spin time; while it
computes it stretches the compute. D-PSGD, whose neighbour exchange is in flight during
the whole compute, showed it first: on 2 emulated nodes at 200 Mbit/s with a 51 KB
bucket (which made ``tbf`` cut every TCP segment into packets) lenet's compute took
8.3-10.6 ms a step against blocking SSGD's 3.7-4.1 with the same bytes on the
link (docs/RESULTS.md).

:class:`LinkCpu` reads ``/proc/stat``'s ``irq`` and ``softirq`` columns (the host's,
every CPU: ``/proc/stat`` is not namespaced) and the bytes this node's interfaces sent
(``/sys/class/net/*/statistics/tx_bytes`` of the rank's network namespace, loopback left
out: on the emulated cluster that is the node's veth) around a measurement;
``syncbench comm`` records the ratio, and ``simulate --calibrate`` hands it on. Both
files are Linux's (``proc(5)``, ``Documentation/ABI/testing/sysfs-class-net-statistics``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

#: Clock ticks per second of ``/proc/stat`` (``USER_HZ``).
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def interrupt_seconds(stat: str = "/proc/stat") -> float:
    """Seconds every CPU spent in hardware and software interrupts since boot (NaN where
    the file cannot be read): the ``irq`` and ``softirq`` fields of the ``cpu`` line."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        return (int(fields[6]) + int(fields[7])) / TICKS
    except (OSError, ValueError, IndexError):
        return math.nan


def sent_bytes(net: str = "/sys/class/net") -> float:
    """Bytes this network namespace's interfaces sent, loopback left out (NaN where none
    can be read)."""
    total, seen = 0, False
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return math.nan
    for name in names:
        if name == "lo":
            continue
        try:
            total += int(Path(net, name, "statistics", "tx_bytes").read_text())
            seen = True
        except (OSError, ValueError):
            continue
    return float(total) if seen else math.nan


def host_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """This kernel's boot id: the same in every network namespace of one host."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


class LinkCpu:
    """Interrupt seconds per byte the nodes sent, between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.seconds0 = self.bytes0 = math.nan

    def start(self) -> None:
        self.seconds0, self.bytes0 = interrupt_seconds(), sent_bytes()

    def stop(self, comm: Any, node_leader: bool) -> dict[str, float]:
        """Collective over ``comm``; on rank 0 ``{"interrupt_s", "link_tx_bytes",
        "link_cpu_s_per_byte"}`` (NaN where unreadable or nothing was sent), else ``{}``.
        Each node's ``node_leader`` rank reports the bytes its node sent and its host's
        interrupt seconds; a host (a kernel, however many emulated nodes share it) counts
        once."""
        seconds = interrupt_seconds() - self.seconds0
        mine = sent_bytes() - self.bytes0
        report = (host_id(), seconds, mine) if node_leader else None
        reports = [r for r in comm.gather(report, root=0) or [] if r is not None]
        if comm.Get_rank() != 0:
            return {}
        sent = float(sum(b for _, _, b in reports if math.isfinite(b)))
        hosts = {h: s for h, s, _ in reports}
        spent = float(sum(hosts.values())) if hosts else math.nan
        ratio = spent / sent if sent > 0 and math.isfinite(spent) else math.nan
        return {"interrupt_s": spent, "link_tx_bytes": sent, "link_cpu_s_per_byte": ratio}
