"""Whether a run consumed its sample budget, and why not.

A run is *incomplete* (``complete`` False) when a signal stopped it at a step
boundary (``stopped_by``: the signal's name) or when ``syncbench recover``
rebuilt it from the parts of a job that died (``stopped_by`` ""). Its figures
are not comparable with complete runs': the report and the runner leave it out
of every ratio to a baseline (see docs/USAGE.md).
"""

from __future__ import annotations

from typing import Any


def incomplete_reason(complete: Any, stopped_by: Any = "") -> str:
    """Why a run is incomplete: ``"stopped by SIGTERM"`` (a signal stopped it at a step
    boundary) or ``"partial (recovered)"`` (``syncbench recover`` rebuilt it from the
    parts of a job that died); "" for a complete run."""
    if complete is None or bool(complete):
        return ""
    return f"stopped by {stopped_by}" if stopped_by else "partial (recovered)"


def is_incomplete(row: dict[str, Any]) -> bool:
    """A row whose ``complete`` is False (a row without the key counts as complete)."""
    return row.get("complete") is False
