"""A node at a CPU quota (``--node-speed``): its ranks' time inside MPI is slowed too.

The emulated cluster slows a node with a CFS bandwidth quota (``syncbench cluster up
--node-speed``, ``bench/cluster/cpu.py``): the node's processes may run ``speed`` of
each scheduler period and are frozen for the rest. ``--slowdown`` slows a rank's
compute only (train's delay phase); a quota slows everything its process does on the
CPU. That includes the time it spends inside MPI: MPICH's blocking waits poll the
progress engine without sleeping (CH4's ``MPIDI_progress_test`` loop under
``MPIR_Wait``), and over TCP the rank's own ``send``/``recv`` calls move its share of a
collective, so a rank of a throttled node drains its quota while it waits for the
wire and is frozen, holding up the collective, when the quota is spent. Over a period
its wall time is its CPU demand over ``speed``, whatever phase the freeze lands in.

Measured on 2 emulated nodes (mlp, 1 Gbit/s, the second node at speed 0.5): the
realised slowdown of the throttled rank (``slowdown_realised``) was 2.66, not the
nominal 2, and SSGD's prediction with compute alone slowed was 27% to 93% too fast
(docs/RESULTS.md, "The simulator on a slow node").

Model: with speeds ``s_k`` per rank, compute is slowed by ``1 / s_k`` (as a
``--slowdown`` factor) and each row's data, update and MPI time (``comm + wait``) add
``(1 / s_k - 1)`` times themselves to the rank's delay. The MPI time is known only
once the collectives are timed, so :func:`simulate_with_quota` runs the pattern again
with the debt of the previous pass as delay, until the predicted wall time moves by
less than :data:`CONVERGED` (a throttled rank that arrives later waits less, so the
passes converge; :data:`MAX_PASSES` bounds them). A rank at speed 1 owes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from syncbench.bench.simulate.timeline import LocalTimes, Timeline

#: Relative change of the predicted wall time below which the passes stop.
CONVERGED = 0.005
#: Passes at most (the first, without MPI debt, included).
MAX_PASSES = 6


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


def quota_debt(rows: dict[int, dict[str, np.ndarray]],
               speeds: Sequence[float]) -> dict[int, np.ndarray]:
    """Per rank, per row: the seconds a quota of ``speeds[k]`` adds to the row's data,
    update and time inside MPI (``(1/s - 1) * (data + update + comm + wait)``)."""
    debt = {}
    for k, s in enumerate(speeds):
        if s >= 1.0 or k not in rows:
            continue
        cols = rows[k]
        busy = sum(np.asarray(cols[f"t_{p}"], dtype=float)
                   for p in ("data", "update", "comm", "wait"))
        debt[k] = (1.0 / s - 1.0) * np.asarray(busy, dtype=float)
    return debt


def simulate_with_quota(make_local: Callable[[dict[int, np.ndarray] | None], LocalTimes],
                        run: Callable[[LocalTimes], Timeline],
                        speeds: Sequence[float] | None) -> Timeline:
    """The pattern's timeline with the quota's MPI debt charged (module docstring).

    ``make_local(extra)`` builds the rank's local times with ``extra[k][j]`` seconds
    added to rank k's delay at step j; ``run(local)`` times the pattern once."""
    timeline = run(make_local(None))
    if speeds is None:
        return timeline
    passes = 1
    while passes < MAX_PASSES:
        debt = quota_debt(timeline.rows.arrays(), speeds)
        before = timeline.wall_s
        timeline = run(make_local(debt))
        passes += 1
        if before > 0 and abs(timeline.wall_s - before) <= CONVERGED * before:
            break
    timeline.notes["quota_passes"] = passes
    return timeline
