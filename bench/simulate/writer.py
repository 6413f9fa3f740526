"""A simulated run as a ``syncbench/1`` run file, read by ``report`` and ``trace`` unchanged.

The rows go through the recorder's own :func:`write_run_file` (same
columns, same summary), in one atomic write (a temporary name renamed into
place, so a run file that exists is complete) that also holds the
simulation's root attributes (``schema.SIMULATION_ATTRS``: ``simulated``,
the platform, the workload, SimGrid's version, the wall time and flow
count of the simulation). There is no accuracy: the eval group is
empty, ``final_accuracy`` is NaN, and the summary's ``diverged`` flag is
False (the loss column is NaN because nothing is trained, not because
training failed).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import h5py
import numpy as np

from syncbench.analysis import schema
from syncbench.bench.cli import git_sha, package_version


def write_simulated_run(path: str, *, algorithm: str, world_size: int, config: dict[str, Any],
                        rows: dict[int, dict[str, np.ndarray]], wall_s: float,
                        platform: dict[str, Any], workload: dict[str, Any],
                        simulation: dict[str, Any], extra_root: dict[str, Any]) -> dict[str, Any]:
    """Write the run file atomically; returns its summary."""
    from syncbench.bench.recorder import write_run_file  # noqa: PLC0415

    root = {
        "algorithm": algorithm,
        "model": workload.get("name", ""),
        "dataset": workload.get("dataset", ""),
        "world_size": world_size,
        "config": json.dumps(config, sort_keys=True, default=str),
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "syncbench_version": package_version(),
        "git_sha": git_sha(),
        "mpi_library": "",
        "numpy_version": np.__version__,
        "h5py_version": h5py.__version__,
        "backend": "simgrid",
        "devices": [],
        "hostnames": [],
        **extra_root,
    }
    rank_attrs = {k: {"hostname": f"node-{k}", "device": "simulated"} for k in rows}
    empty_eval = {name: np.zeros(0, dtype=dtype) for name, dtype in schema.EVAL_COLUMNS.items()}
    sim_attrs = {schema.SIMULATED_ATTR: True, schema.SIM_PLATFORM_ATTR: _json(platform),
                 schema.SIM_WORKLOAD_ATTR: _json(workload), schema.SIM_RUN_ATTR: _json(simulation)}
    return dict(write_run_file(path, root, rows, rank_attrs, empty_eval, wall_s, None,
                               extra_attrs=sim_attrs, diverged=False))


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, default=str)
