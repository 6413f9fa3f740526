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

from collections.abc import Sequence

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
