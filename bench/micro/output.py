"""Where the micro-benchmarks write their figures: checked at setup, replaced atomically.

An output path (``syncbench comm --out``, ``syncbench ssgd-comm --json``) is
checked before any measurement, so that an unwritable folder is a setup error
on every rank rather than a failure after minutes of timing; the file is then
written under a temporary name beside it and renamed over it (``os.replace``,
atomic on POSIX), so a reader never sees half a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def check_writable_parent(flag: str, path: str) -> None:
    """``ValueError`` naming ``flag`` unless ``path``'s folder exists and is writable."""
    parent = Path(os.path.abspath(path)).parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: directory {parent} is not writable")


@contextmanager
def written_atomically(path: str) -> Iterator[str]:
    """A temporary name beside ``path`` to write; it replaces ``path`` when the block ends
    (and is left alone if the block raises)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    yield tmp
    os.replace(tmp, path)
