"""Where the micro-benchmarks write their figures: checked at setup, replaced atomically.

An output path (``syncbench comm --out``, ``syncbench ssgd-comm --json``) is
checked before any measurement, so that an unwritable folder is a setup error
on every rank rather than a failure after minutes of timing; the file is then
written under a temporary name beside it that nobody could predict (``mkstemp``),
synced, renamed over it (``os.replace``, atomic on POSIX) and its folder synced,
so a reader never sees half a file; on an error the temporary file is removed and
the previous file stays (``syncbench.bench.files.write_atomic``; an HDF5 file is
built in memory first, ``checkpoint.hdf5_image``, as run files are).
"""

from __future__ import annotations

from syncbench.analysis.output_paths import check_output_file


def check_writable_parent(flag: str, path: str) -> None:
    """``ValueError`` naming ``flag`` unless ``path`` can be written as a file: its folder
    exists and is writable, and it is no folder itself (:func:`check_output_file`)."""
    check_output_file(flag, path)
