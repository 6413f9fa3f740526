"""Whether an output path can be written, checked before any work: one line naming the flag.

Every command that writes a file or a folder (``train --out``, ``report --plots``,
``run --out-dir``, ``simulate --out``, ...) checks its output at its entry, so that
an unwritable path is a one-line error (exit 2) before minutes of work, never a
traceback after them, and the check itself writes nothing. It lives in
``analysis`` because ``report`` and ``trace`` use it and ``analysis`` imports none
of the other packages; ``bench`` imports it from here.

Caught: a file where a folder is on the way (``FILE/sub/out``), a folder where a
file is expected (and a file where a folder is), a missing folder for a file, and
a folder that is not writable (``os.access``: a read-only mount says so even to
root; permission bits do not stop root).
"""

from __future__ import annotations

import os
from pathlib import Path


class OutputError(ValueError):
    """An output path that cannot be written; ``str()`` is one line naming the flag."""


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s ancestors (``path`` itself included) that exists."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_output_file(flag: str, path: str | os.PathLike[str],
                      make_parent: bool = False) -> None:
    """:class:`OutputError` naming ``flag`` unless ``path`` can be written as a file:
    not a folder, and its folder exists, is a folder and is writable (``make_parent``:
    or can be made, as :func:`check_output_dir` checks it)."""
    shown = os.fspath(path)
    if os.path.isdir(path):
        raise OutputError(f"{flag} {shown} is a folder, not a file")
    parent = Path(os.path.abspath(path)).parent
    if make_parent and not parent.is_dir():
        found = _existing_ancestor(parent)
        if not found.is_dir():
            raise OutputError(f"{flag} {shown}: {found} is a file, not a folder")
        if not _writable(found):
            raise OutputError(f"{flag} {shown}: directory {found} is not writable")
        return
    if not parent.is_dir():
        found = _existing_ancestor(parent)
        if found.is_dir():
            raise OutputError(f"{flag} {shown}: directory {parent} is not writable: it does "
                              "not exist")
        raise OutputError(f"{flag} {shown}: {found} is a file, not a folder")
    if not _writable(parent):
        raise OutputError(f"{flag} {shown}: directory {parent} is not writable")


def check_new_file(flag: str, path: str | os.PathLike[str], overwrite: bool) -> None:
    """:func:`check_output_file`, and :class:`OutputError` where ``path`` exists and
    ``overwrite`` (``--overwrite``) was not given: a run's output never replaces a file
    unasked."""
    check_output_file(flag, path)
    if os.path.exists(path) and not overwrite:
        raise OutputError(f"{flag} {os.fspath(path)} exists; pass --overwrite to replace it")


def check_output_dir(flag: str, path: str | os.PathLike[str]) -> None:
    """:class:`OutputError` naming ``flag`` unless ``path`` is a writable folder or can
    be made: no file on its way, and the nearest folder that exists is writable.
    Nothing is created."""
    shown = os.fspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputError(f"{flag} {shown} is a file, not a folder")
    found = _existing_ancestor(Path(path))
    if not found.is_dir():
        raise OutputError(f"{flag} {shown}: {found} is a file, not a folder")
    if not _writable(found):
        raise OutputError(f"{flag} {shown}: directory {found} is not writable")
