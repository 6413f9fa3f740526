"""Running the host's tools (``ip``, ``tc``, ``unshare``) as root, with one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


class ClusterError(RuntimeError):
    """A failure of the emulated cluster: its message is the one line the user sees."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (namespaces, links, cgroups): "
                           "run it with sudo")


def require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ClusterError(f"'{name}' not found: apt-get install {package}")
    return path


def complaint(proc: subprocess.CompletedProcess) -> str:
    """What a failed tool said: its stderr, else its stdout, stripped."""
    return (proc.stderr or proc.stdout).strip()


def sh(args: Sequence[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``args``; on failure raise :class:`ClusterError` naming ``what`` and the tool's
    own first line of complaint."""
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        said = complaint(proc).splitlines()
        raise ClusterError(f"{what} failed: {' '.join(args)}: "
                           f"{said[0] if said else f'exit {proc.returncode}'}")
    return proc


def works(args: Sequence[str]) -> bool:
    """Whether a probe command succeeds (a kernel feature is there)."""
    try:
        return subprocess.run(list(args), capture_output=True).returncode == 0
    except OSError:
        return False
