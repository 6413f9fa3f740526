"""A node at a CPU quota (``--node-speed``): every phase its ranks spend on the CPU is slowed.

The emulated cluster slows a node with a CFS bandwidth quota (``syncbench cluster up
--node-speed``, ``bench/cluster/cpu.py``; at speed 0.5 a 1 ms quota every 2 ms): its
processes run ``speed`` of each period and are frozen for the rest. ``--slowdown``
slows a rank's compute only (train's delay phase); a quota slows whatever the process
does on the CPU, so its data, update and codec phases too. Its time inside MPI is not
stretched: a wait for the wire goes on while the process is frozen (the kernel moves
the bytes), and measured on 2 emulated nodes (mlp, 1 Gbit/s, blocking SSGD, the second
node at speed 0.5) the throttled rank's comm was 7.2 ms per step against 6.1-6.7 ms on
free nodes, while its compute was 11.8 ms against 5.9 (docs/RESULTS.md, "The
simulator's validation on the emulated cluster"). Charging its MPI time at 1/speed as
well (a busy-polling wait draining the quota) predicted that run 24-29% too slow.

A wait in MPI polls on the CPU, though: the quota charges it, and a throttled rank that
waits gives its quota no rest (:data:`MPI_WAIT_CPU`, ``--node-wait-cpu``). Measured on a
throttled rank of the emulated cluster on an Intel Xeon guest (lenet, 1 Gbit/s, speed
0.5), a 5-6 ms wait held 0.7 ms of its CPU: it was frozen for most of it; and over 144
runs its CPU over its steps' wall was 0.47-0.50 (10th-90th percentile) whatever the
strategy, the quota's share of a process that is never idle (docs/RESULTS.md, "A wait in
MPI at a quota").

Model: with shares ``s_k`` per rank, compute is slowed by ``1 / s_k`` (a ``--slowdown``
factor) and each step's data and update add ``(1 / s_k - 1)`` times themselves to the
rank's delay (:func:`quota_delay`). A codec's encode and decode (``--compress``) are CPU
work on the host as well: they take ``1 / s_k`` times their seconds, in their own phase
(:func:`quota_codec`). A rank at speed 1 owes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def parse_node_speeds(spec: str | Sequence[float] | None, n: int) -> list[float] | None:
    """Per-rank CPU shares from ``"1,0.5"`` (or a list); None when every rank is at 1.

    Each share must be in (0, 1], one per rank, as the cluster's ``--node-speed``
    (which names nodes; the validation passes each rank its node's share)."""
    if spec is None or spec == "":
        return None
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    if len(parts) != n:
        raise ValueError(f"--node-speed {spec!r} has {len(parts)} shares but the job has "
                         f"{n} ranks")
    speeds = []
    for part in parts:
        try:
            value = float(part)
        except (TypeError, ValueError):
            raise ValueError(f"--node-speed {spec!r}: {part!r} is not a number") from None
        if not 0.0 < value <= 1.0:
            raise ValueError(f"--node-speed {spec!r}: each share must be in (0, 1], "
                             f"got {value:g}")
        speeds.append(value)
    return None if all(s == 1.0 for s in speeds) else speeds


def quota_delay(block: np.ndarray, speeds: Sequence[float]) -> np.ndarray:
    """Seconds a quota adds to each rank's steps of ``block`` (ranks x steps x (data,
    compute, update, delay)) beyond its compute: ``(1/s - 1) * (data + update)``."""
    extra = 1.0 / np.asarray(speeds, dtype=float) - 1.0
    return extra[:, None] * (block[..., 0] + block[..., 2])


def quota_codec(codec_s: float | np.ndarray, speeds: Sequence[float] | None,
                n: int) -> np.ndarray:
    """Each of ``n`` ranks' codec seconds of a step at its node's share: ``codec_s / s``
    (``codec_s`` per rank or one figure for all; ``speeds`` None: every rank at 1)."""
    codec = np.broadcast_to(np.asarray(codec_s, dtype=float), (n,))
    if speeds is None:
        return codec.copy()
    return codec / np.asarray(speeds, dtype=float)


# -- the kernel's bursts: a quota is not an even share --------------------------------

#: Points at which the first burst's spread is sampled (midpoints of equal slices).
FIRST_BURST_POINTS = 5


@dataclass(frozen=True)
class Throttle:
    """How the kernel realises a node's quota for a process that keeps the CPU busy:
    ``on_s`` of running, then ``off_s`` frozen, over and over (measured inside the node by
    ``syncbench cluster``: :func:`syncbench.bench.cluster.cpu.throttle_pattern`); and,
    where measured, the 10th and 90th percentiles of how long a process runs after an
    idle spell before its first freeze (``first_lo_s``, ``first_hi_s``).

    CFS charges a quota at the scheduler tick (``CONFIG_HZ``: every 4 ms at 250 Hz), so a
    process that makes no system call runs past its quota to the next tick and is then
    frozen until the periods after have paid the debt (the kernel's
    Documentation/scheduler/sched-bwc.rst). Measured on the emulated cluster (speed 0.5, a 1
    ms quota every 2 ms, HZ 250): 3.1-3.3 ms on, 4.7-4.9 ms off, a share of 0.38-0.41, not
    0.5 (docs/RESULTS.md, "A quota in bursts, the links' token bucket and ASGD's crossed
    transfers"). Where the tick falls against the period's refill differs from one wake
    to the next, so the first burst after an idle spell is spread: about 2 to 5 ms (10th
    to 90th percentile) at that quota, and so, about, was an MPI rank's compute after a
    wait in MPI (docs/RESULTS.md, "A quota's first burst").

    The kernel also checks the quota whenever the scheduler runs on the CPU, so a task
    that wakes there every few milliseconds gives a finer pattern (where the probe
    recorded 3.2/4.8 ms, 1.04 on and 0.96 off beside a 1 ms waker, 0.48 of the CPU
    against 0.40); a rank's sends do not (``syncbench.bench.micro.quota_wakes``;
    docs/RESULTS.md, "A quota's share and the wake-ups on its CPU"). The pattern here is
    the probe's, a busy process alone."""

    on_s: float
    off_s: float
    first_lo_s: float | None = None
    first_hi_s: float | None = None
    #: The share of a wait in MPI the process stays runnable (0: it sleeps and the quota
    #: refills; 1: it polls all along, as MPICH's waits do: :data:`MPI_WAIT_CPU`).
    wait_cpu: float = 0.0

    @property
    def share(self) -> float:
        """The share of a process that is never idle: on / (on + off)."""
        return self.on_s / (self.on_s + self.off_s)

    def first_bursts(self) -> list[float]:
        """Seconds of free running after an idle spell, as :data:`FIRST_BURST_POINTS`
        equally likely values: the midpoints of equal slices of the uniform spread whose
        10th and 90th percentiles are ``first_lo_s`` and ``first_hi_s``; ``[on_s]`` where
        the spread was not measured."""
        if self.first_lo_s is None or self.first_hi_s is None:
            return [self.on_s]
        width = (self.first_hi_s - self.first_lo_s) / 0.8
        start = self.first_lo_s - 0.1 * width
        return [max(0.0, start + width * (k + 0.5) / FIRST_BURST_POINTS)
                for k in range(FIRST_BURST_POINTS)]

    def busy_wall(self, busy: np.ndarray, idle: np.ndarray) -> float:
        """Wall seconds the CPU work ``busy[j]`` takes in all, each block followed by
        ``idle[j]`` seconds off the CPU (inside MPI waiting for the wire), from full credit:
        the mean over :meth:`first_bursts` of :meth:`busy_wall_from`."""
        busy, idle = np.asarray(busy, float).tolist(), np.asarray(idle, float).tolist()
        firsts = self.first_bursts()
        return sum(self.busy_wall_from(busy, idle, first) for first in firsts) / len(firsts)

    def busy_wall_from(self, busy: list[float], idle: list[float], first: float) -> float:
        """:meth:`busy_wall` where every first burst after an idle spell lasts ``first``.

        A fluid form of the bursts: the process holds up to ``first`` of credit; running
        spends it. A block that outlasts its credit is frozen ``off_s`` there and starts a
        burst of ``on_s``; a block that ends within that burst keeps the rest of it as
        credit. One that outlasts it too runs the rest at the never-idle share: ``off_s``
        frozen per ``on_s`` run in all, where the later freezes fall being spread as the
        first one's is, so their count is taken on average, not rounded up, and no credit
        is left (a whole count of freezes would leave half a burst on average). Idle time
        restores the credit at ``first / off_s`` per second: a process idle for ``off_s``
        or more starts its next block with a whole first burst (the quota's debt paid
        while it waited). A wait the process spends polling on the CPU is not idle to the
        quota: only its ``1 - wait_cpu`` idle part restores credit, so a process that
        polls through every wait (``wait_cpu`` 1) runs its work at its never-idle share."""
        credit, wall = first, 0.0
        refill = first / self.off_s * (1.0 - self.wait_cpu)
        for work, rest in zip(busy, idle):
            wall += work
            over = work - credit
            if over > 0:
                wall += self.off_s * max(1.0, over / self.on_s)
                credit = max(0.0, self.on_s - over)
            else:
                credit = -over
            # a wait refills up to a first burst and no further: the rest of a longer burst
            # is not kept through it (MPI polls while it waits)
            credit = min(first, credit + rest * refill)
        return wall


#: The share of a wait in MPI a rank stays on the CPU with this suite's MPI: MPICH's
#: waits poll (``sched_yield`` every idle turn). Measured over the comm and wait phases of
#: the free ranks of 432 runs on 2 emulated nodes (lenet and mlp at 1 Gbit/s and 200
#: Mbit/s, every strategy and configuration; their ``cpu_sync`` over ``t_comm +
#: t_wait``): 0.86-1.00, median 0.996, so a throttled rank's waits give its quota no rest
#: (docs/RESULTS.md, "A wait in MPI at a quota").
MPI_WAIT_CPU = 1.0


def parse_wait_cpu(value: float | str | None) -> float:
    """``--node-wait-cpu``: a share in [0, 1]; None gives :data:`MPI_WAIT_CPU`."""
    if value is None or value == "":
        return MPI_WAIT_CPU
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--node-wait-cpu {value!r} is not a number") from None
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--node-wait-cpu {value!r} must be a share in [0, 1]")
    return share


def realised_shares(rows: dict[int, dict[str, np.ndarray]], shares: Sequence[float],
                    throttles: Sequence[Throttle | None]) -> list[float]:
    """Each rank's share of the CPU as the bursts of its :class:`Throttle` give it, on the
    rows a timeline simulated at ``shares``: a rank's CPU work per step is its busy
    phases (data, compute, delay, update, codec) times the share they were simulated at,
    its idle time its comm and wait; the share is the work over the wall
    :meth:`Throttle.busy_wall` gives it. A rank without a throttle keeps its share."""
    out = []
    for k, (share, throttle) in enumerate(zip(shares, throttles)):
        cols = rows.get(k)
        if throttle is None or cols is None or not len(cols["step"]):
            out.append(share)
            continue
        busy = (cols["t_data"] + cols["t_compute"] + cols["t_delay"] + cols["t_update"]
                + cols["t_codec"]) * share
        idle = cols["t_comm"] + cols["t_wait"]
        work = float(busy.sum())
        wall = throttle.busy_wall(busy, idle)
        out.append(min(1.0, work / wall) if wall > 0 else share)
    return out


def parse_node_throttles(spec: str | None, speeds: Sequence[float] | None,
                         n: int) -> list[Throttle | None] | None:
    """``--node-throttle``: ``ON/OFF`` or ``ON/OFF/LO-HI`` (milliseconds) for every rank at
    a quota, or one such entry or ``-`` per rank, comma-separated; a rank at full speed (``speeds``,
    ``--node-speed``'s) takes none. None where no rank has one."""
    if not spec:
        return None
    parts = [_throttle_entry(part.strip(), spec) for part in spec.split(",")]
    if len(parts) == 1:  # one pattern: the ranks at a quota take it
        parts = parts * n
    if len(parts) != n:
        raise ValueError(f"--node-throttle {spec!r} has {len(parts)} entries but the job has "
                         f"{n} ranks")
    # a pattern is a quota's: a rank at full speed has none to realise
    parts = [t if s < 1.0 else None for t, s in zip(parts, speeds or [1.0] * n)]
    return parts if any(t is not None for t in parts) else None


def _throttle_entry(part: str, spec: str) -> Throttle | None:
    """One entry of ``--node-throttle``: ``ON/OFF`` or ``ON/OFF/LO-HI`` milliseconds, or
    ``-`` (none)."""
    if part in ("-", ""):
        return None
    on, _, rest = part.partition("/")
    off, slash, first = rest.partition("/")
    low, dash, high = first.partition("-")
    if slash and not dash:
        raise ValueError(f"--node-throttle {spec!r}: {part!r}: the first burst is LO-HI "
                         "milliseconds (e.g. 3.1/4.9/2.2-5.0)")
    try:
        times = [float(t) for t in ((on, off, low, high) if slash else (on, off))]
    except ValueError:
        raise ValueError(f"--node-throttle {spec!r}: {part!r} is not ON/OFF or ON/OFF/LO-HI "
                         "in milliseconds (e.g. 3.3/4.7 or 3.1/4.9/2.2-5.0) or -") from None
    if not all(t > 0 and math.isfinite(t) for t in times):
        raise ValueError(f"--node-throttle {spec!r}: {part!r}: every time must be > 0 ms")
    if slash and times[2] > times[3]:
        raise ValueError(f"--node-throttle {spec!r}: {part!r}: the first burst's LO exceeds "
                         "its HI")
    return Throttle(*(t / 1e3 for t in times))


def throttle_spec(throttles: Sequence[Throttle | None]) -> str:
    """The ``--node-throttle`` string of per-rank patterns (the inverse of the parser)."""
    def entry(t: Throttle | None) -> str:
        if t is None:
            return "-"
        pattern = f"{1e3 * t.on_s:.4g}/{1e3 * t.off_s:.4g}"
        if t.first_lo_s is None or t.first_hi_s is None:
            return pattern
        return f"{pattern}/{1e3 * t.first_lo_s:.4g}-{1e3 * t.first_hi_s:.4g}"
    return ",".join(entry(t) for t in throttles)
