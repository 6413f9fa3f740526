"""Run-file paths in a results file (``results.json``, a sweep's ``manifest.json``).

A results file names its run files relative to its own folder, so the folder
can be moved or copied (to another machine, into an archive) and read or
resumed there: ``syncbench run SCENARIO --resume --out-dir MOVED`` keeps the
runs it finds in ``MOVED``. The paths are the plan's (``plan[i].path`` and the
value of ``--out`` in ``plan[i].args``) and the records' (``runs[i].path``).
:func:`relative_paths` is what the runner writes; :func:`resolved_paths` is how
a reader gets paths it can open, joining a relative path to the file's folder
and keeping an absolute one as it is (files written before paths were
relative). Notes and printed lines keep the paths as the runner was given them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The flag of a planned run's arguments that names its run file.
OUT_FLAG = "--out"


def _relative(path: str, folder: Path) -> str:
    """``path`` (absolute, or relative to the working directory) relative to ``folder``."""
    try:
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(folder))).as_posix()
    except ValueError:  # another drive (Windows): only an absolute path names it
        return os.path.abspath(path)


def _resolved(path: str, folder: Path) -> str:
    """``path`` as stored (relative to ``folder``, or absolute) as a path to open."""
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(folder, path))


def _map_paths(data: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """A copy of ``data`` with ``change`` applied to every run-file path it holds."""
    out = dict(data)
    if isinstance(data.get("plan"), list):
        out["plan"] = [_map_entry(e, change, args=True) for e in data["plan"]]
    if isinstance(data.get("runs"), list):
        out["runs"] = [_map_entry(e, change) for e in data["runs"]]
    return out


def _map_entry(entry: Any, change: Callable[[str], str], args: bool = False) -> Any:
    if not isinstance(entry, dict):
        return entry
    entry = dict(entry)
    if isinstance(entry.get("path"), str):
        entry["path"] = change(entry["path"])
    values = entry.get("args")
    if args and isinstance(values, list):
        entry["args"] = [change(v) if i and values[i - 1] == OUT_FLAG and isinstance(v, str)
                         else v for i, v in enumerate(values)]
    return entry


def relative_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` as a results file in ``folder`` stores it: run-file paths relative to it."""
    return _map_paths(data, lambda p: _relative(p, folder))


def resolved_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` read from a results file in ``folder``: run-file paths to open."""
    return _map_paths(data, lambda p: _resolved(p, folder))


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A results file, its run-file paths resolved (:func:`resolved_paths`); ``OSError``
    or ``ValueError`` when it cannot be read."""
    path = Path(path)
    return resolved_paths(json.loads(path.read_text()), path.parent)


def same_plan(recorded: Any, planned: list[dict[str, Any]], folder: Path) -> bool:
    """Whether a results file's ``plan`` (``recorded``, as read from ``folder``) is
    ``planned``: the same entries once both name their run files relative to ``folder``;
    a file written before paths were relative also matches with its paths as they are."""
    if recorded == planned:
        return True
    if not isinstance(recorded, list):
        return False
    stored = resolved_paths({"plan": recorded}, folder)
    return relative_paths(stored, folder) == relative_paths({"plan": planned}, folder)
