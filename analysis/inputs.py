"""What ``syncbench report`` and ``syncbench trace`` accept as runs: run files, results
files and folders, resolved to run files.

A results file is the runner's ``results.json`` or a sweep's ``manifest.json``
(``syncbench-results/1``; an older ``syncbench-sweep/1``); it names its run files
relative to its own folder (``bench/experiment/results_paths.py``). A folder stands
for its results file when it has one (the runs of the plan, not files left from
before), else for its run files (``*.h5``). Anything else is taken as a run file,
which :func:`~syncbench.analysis.runfile.read_run` then reads or refuses in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Results files read (the runner's and a scaling scenario's; an older sweep manifest).
RESULTS_SCHEMAS = ("syncbench-results/1", "syncbench-sweep/1")
#: The results file a folder stands for, in this order.
RESULTS_NAMES = ("results.json", "manifest.json")
#: A sweep's statuses of a run whose run file is there (it ran, or was kept from before).
RAN = ("ran", "skipped")


class InputError(ValueError):
    """An input that is neither a run file, a results file nor a folder of either; the
    message is one line naming it."""


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file as written (run-file paths relative to its folder); :class:`InputError`
    when it is not JSON or not of :data:`RESULTS_SCHEMAS`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a results file (not JSON: {exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in RESULTS_SCHEMAS or not isinstance(data.get("runs"), list):
        raise InputError(f"{path}: not a results file (schema {schema!r}; expected "
                         f"{' or '.join(RESULTS_SCHEMAS)} with runs)")
    return data


def record_path(record: dict[str, Any], results: Path) -> str:
    """A results record's run file as a path to open (relative to the results file's
    folder; an older file's path relative to where the runner started, tried second)."""
    path = Path(str(record.get("path") or ""))
    if not path.is_absolute() and (results.parent / path).exists():
        path = results.parent / path
    return str(path)


def results_runs(path: Path, data: dict[str, Any]) -> list[str]:
    """The run files of a results file's runs that have one (a sweep's failed or pending
    runs have none)."""
    return [record_path(r, path) for r in data["runs"]
            if isinstance(r, dict) and r.get("path") and r.get("status", "ran") in RAN]


@dataclass
class Inputs:
    """Run files to read, and the results files they came from (path, contents)."""

    paths: list[str] = field(default_factory=list)
    results: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)


def results_in(folder: Path) -> Path | None:
    """The results file a folder stands for (:data:`RESULTS_NAMES`), else None."""
    return next((folder / n for n in RESULTS_NAMES if (folder / n).is_file()), None)


def expand(specs: list[str]) -> Inputs:
    """Each of ``specs`` (run file, results file, folder) as run files (module docstring);
    :class:`InputError` for a folder with neither run files nor a results file, or a
    results file that is none."""
    out = Inputs()
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            results = results_in(path)
            if results is None:
                files = sorted(str(p) for p in path.glob("*.h5"))
                if not files:
                    raise InputError(f"{spec}: a folder with no run files (*.h5) and no "
                                     f"{' or '.join(RESULTS_NAMES)}")
                out.paths += files
                continue
            path = results
        elif not (path.is_file() and path.suffix == ".json"):
            out.paths.append(spec)
            continue
        data = load_results(path)
        out.results.append((path, data))
        out.paths += results_runs(path, data)
    return out


def first_run(spec: str) -> tuple[str, str | None]:
    """The run file ``syncbench trace`` traces for ``spec`` and, when ``spec`` is not
    that file, a note saying which it took: a results file's (or its folder's) baseline's
    first run, as the runner's closing lines suggest; a folder's only run file. A folder
    of several run files and no results file is an :class:`InputError`."""
    path = Path(spec)
    if path.is_dir():
        results = results_in(path)
        if results is None:
            files = sorted(str(p) for p in path.glob("*.h5"))
            if len(files) != 1:
                raise InputError(f"{spec}: a folder of {len(files)} run files and no results "
                                 "file: name the run file to trace")
            return files[0], f"tracing {files[0]}, the run file of {spec}"
        path = results
    elif not (path.is_file() and path.suffix == ".json"):
        return spec, None
    data = load_results(path)
    records = [r for r in data["runs"] if isinstance(r, dict) and r.get("path")
               and r.get("status", "ran") in RAN]
    if not records:
        raise InputError(f"{path}: no run with a run file to trace")
    scenario = data.get("scenario") if isinstance(data.get("scenario"), dict) else {}
    baseline = scenario.get("baseline")
    first = min(records, key=lambda r: (r.get("label") != baseline,
                                        r.get("condition") != "hom", r.get("repeat", 0)))
    run = record_path(first, path)
    which = "the baseline's first run" if first.get("label") == baseline else "its first run"
    return run, (f"tracing {run}, {which} of {path} ({len(records)} runs; name a run file "
                 "to trace another)")
