"""Provenance: which syncbench and which commit a run file or a simulation came from."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path


def package_version() -> str:
    """The installed distribution's version (what run files record), else ``unknown``."""
    try:
        return metadata.version("syncbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_sha() -> str:
    """The commit of the source tree this package runs from (what run files record), else ``""``."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
