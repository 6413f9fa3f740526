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

@dataclass(frozen=True)
class Throttle:
    """How the kernel realises a node's quota for a process that keeps the CPU busy:
    ``on_s`` of running, then ``off_s`` frozen, over and over (measured inside the node by
    ``syncbench cluster``: :func:`syncbench.bench.cluster.cpu.throttle_pattern`).

    CFS charges a quota at the scheduler tick (``CONFIG_HZ``: every 4 ms at 250 Hz), so a
    process that makes no system call runs past its quota to the next tick and is then
    frozen until the periods after have paid the debt (the kernel's
    Documentation/scheduler/sched-bwc.rst). Measured on the emulated cluster (speed 0.5, a 1
    ms quota every 2 ms, HZ 250): 3.1-3.3 ms on, 4.7-4.9 ms off, a share of 0.38-0.41, not
    0.5 (docs/RESULTS.md, "A quota in bursts, the links' token bucket and ASGD's crossed
    transfers")."""

    on_s: float
    off_s: float

    @property
    def share(self) -> float:
        """The share of a process that is never idle: on / (on + off)."""
        return self.on_s / (self.on_s + self.off_s)

    def busy_wall(self, busy: np.ndarray, idle: np.ndarray) -> float:
        """Wall seconds the CPU work ``busy[j]`` takes in all, each block followed by
        ``idle[j]`` seconds off the CPU (inside MPI waiting for the wire), from full credit.

        A fluid form of the bursts: the process holds up to ``on_s`` of credit; running
        spends it, and at zero the process is frozen ``off_s``, which restores it; idle
        time restores it at ``on_s / off_s`` per second. A never-idle process runs
        ``on_s`` in every ``on_s + off_s``; one idle for ``off_s`` or more starts its next
        block with a whole burst (the quota's debt paid while it waited)."""
        credit, wall = self.on_s, 0.0
        refill = self.on_s / self.off_s
        for work, rest in zip(np.asarray(busy, float).tolist(),
                              np.asarray(idle, float).tolist()):
            wall += work
            work -= credit
            if work > 0:  # frozen once per burst the block outlasts
                bursts = math.ceil(work / self.on_s)
                wall += bursts * self.off_s
                credit = bursts * self.on_s - work
            else:
                credit = -work
            credit = min(self.on_s, credit + rest * refill)
        return wall


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
    """``--node-throttle``: ``ON/OFF`` (milliseconds) for every rank at a quota, or one
    ``ON/OFF`` or ``-`` per rank, comma-separated; a rank at full speed (``speeds``,
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
    """One entry of ``--node-throttle``: ``ON/OFF`` milliseconds, or ``-`` (none)."""
    if part in ("-", ""):
        return None
    on, _, off = part.partition("/")
    try:
        on_ms, off_ms = float(on), float(off)
    except ValueError:
        raise ValueError(f"--node-throttle {spec!r}: {part!r} is not ON/OFF in "
                         "milliseconds (e.g. 3.3/4.7) or -") from None
    if not (on_ms > 0 and off_ms > 0 and math.isfinite(on_ms + off_ms)):
        raise ValueError(f"--node-throttle {spec!r}: {part!r}: both times must be > 0 ms")
    return Throttle(on_ms / 1e3, off_ms / 1e3)


def throttle_spec(throttles: Sequence[Throttle | None]) -> str:
    """The ``--node-throttle`` string of per-rank patterns (the inverse of the parser)."""
    return ",".join("-" if t is None else f"{1e3 * t.on_s:.4g}/{1e3 * t.off_s:.4g}"
                    for t in throttles)
