"""Where the micro-benchmarks write their figures: checked at setup, replaced atomically.

An output path (``syncbench comm --out``, ``syncbench ssgd-comm --json``) is
checked before any measurement, so that an unwritable folder is a setup error
on every rank rather than a failure after minutes of timing; the file is then
written under a temporary name beside it that nobody could predict (``mkstemp``),
synced, renamed over it (``os.replace``, atomic on POSIX) and its folder synced,
so a reader never sees half a file; on an error the temporary file is removed and
the previous file stays. Writers that hold their bytes use
``syncbench.bench.files.write_atomic``; a library that writes to a path (HDF5)
writes through :func:`written_atomically`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from syncbench.analysis.output_paths import check_output_file
from syncbench.bench.files import fsync_dir


def check_writable_parent(flag: str, path: str) -> None:
    """``ValueError`` naming ``flag`` unless ``path`` can be written as a file: its folder
    exists and is writable, and it is no folder itself (:func:`check_output_file`)."""
    check_output_file(flag, path)


@contextmanager
def written_atomically(path: str, mode: int = 0o644) -> Iterator[str]:
    """A new temporary file beside ``path`` (an unpredictable name, ``mode``) to write by
    name; it replaces ``path`` when the block ends, synced with its folder. If the block
    raises, the temporary file is removed and ``path`` is left as it was."""
    final = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)  # the writer closed it: sync what it wrote
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(final.parent)
