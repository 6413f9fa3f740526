"""Heterogeneity emulation: per-rank slowdown factors.

``--slowdown 1,1,1,4`` makes rank 3 four times slower: after each compute
phase the rank sleeps ``(f - 1)`` times the compute time it just measured.
The injected time is charged to the ``delay`` phase, apart from real compute.
"""

from __future__ import annotations

import time


def parse_slowdown(spec: str | None, world_size: int) -> list[float]:
    """Factors per rank from ``"1,1,1,4"`` (``None`` or empty: all 1)."""
    if not spec:
        return [1.0] * world_size
    try:
        factors = [float(v) for v in spec.split(",")]
    except ValueError:
        raise ValueError(f"--slowdown {spec!r}: expected comma-separated numbers") from None
    if len(factors) != world_size:
        raise ValueError(
            f"--slowdown {spec!r} has {len(factors)} factors but the job has {world_size} ranks"
        )
    for f in factors:
        if not f >= 1.0:
            raise ValueError(f"--slowdown {spec!r}: every factor must be >= 1, got {f}")
    return factors


class Slowdown:
    """Sleeps ``(factor - 1) * compute_seconds`` after each compute phase."""

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def __call__(self, compute_seconds: float) -> float:
        """Inject the delay for one compute phase; returns the seconds slept."""
        extra = (self.factor - 1.0) * compute_seconds
        if extra <= 0:
            return 0.0
        start = time.perf_counter()
        time.sleep(extra)
        return time.perf_counter() - start
