"""A simulated run as a ``syncbench/1`` run file, read by ``report`` and ``trace`` unchanged.

The rows go through the recorder's own :func:`write_run_file` (same
columns with the same units and descriptions, same summary, same packed rank
layout: a file of 16,384 ranks is ~13 MB, not the 160 MB of a group per rank; no
MPI library, so no ``mpi_library`` attribute), in one atomic write (a temporary name renamed into
place, so a run file that exists is complete) that also holds the
simulation's root attributes (``schema.SIMULATION_ATTRS``: ``simulated``,
the platform, the workload, SimGrid's version, the wall time and flow
count of the simulation) and the strategy's traits (``schema.TRAITS_ATTR``).
Ranks sit ``ranks_per_node`` to a simulated host,
as :meth:`.engine.Network.host_of` places them: rank k's ``hostname`` is
the name of host k // ranks_per_node (``node-<i>`` on the generated
platforms) and its ``node`` the index of that name in the sorted names; the
root attributes ``nodes`` and ``ranks_per_host`` count them, and
``hostnames`` / ``ranks_per_node`` list them as the recorder does
(:func:`syncbench.bench.train.driver.machine_attrs`) up to ``MAX_LISTED_NODES``
hosts: a root attribute lives in the object header, which holds 64 KiB
(16,384 names do not fit), so larger runs leave both lists empty and readers
count ``nodes`` (:func:`syncbench.analysis.context.machine_context`). There
is no accuracy: the eval group is empty, ``final_accuracy`` is NaN, and the
summary's ``diverged`` flag is False (the loss column is NaN because nothing
is trained, not because training failed).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import h5py
import numpy as np

from syncbench.algorithms.registry import get_algorithm
from syncbench.analysis import schema
from syncbench.bench.mpi.provenance import git_sha, package_version
from syncbench.bench.train.recorder import write_run_file

#: Most hosts whose names (and rank counts) a run file lists in root attributes.
MAX_LISTED_NODES = 2048


def node_attrs(world_size: int, ranks_per_node: int,
               host_names: Sequence[str] = ()) -> tuple[dict[str, Any], list[str]]:
    """(root attributes of the simulated hosts, each rank's host name).

    ``host_names``: the platform's hosts in rank order (default ``node-<i>``,
    the names of the generated platforms).
    """
    per_node = max(1, int(ranks_per_node))
    names = [host_names[k // per_node] if k // per_node < len(host_names)
             else f"node-{k // per_node}" for k in range(world_size)]
    per_host = Counter(names)
    listed = len(per_host) <= MAX_LISTED_NODES
    root = {"nodes": len(per_host), "ranks_per_host": max(per_host.values(), default=0),
            "hostnames": sorted(per_host) if listed else [],
            "ranks_per_node": [per_host[h] for h in sorted(per_host)] if listed else []}
    return root, names


def write_simulated_run(path: str, *, algorithm: str, world_size: int, config: dict[str, Any],
                        rows: dict[int, dict[str, np.ndarray]], wall_s: float,
                        platform: dict[str, Any], workload: dict[str, Any],
                        simulation: dict[str, Any], extra_root: dict[str, Any],
                        ranks_per_node: int = 1,
                        host_names: Sequence[str] = ()) -> dict[str, Any]:
    """Write the run file atomically; returns its summary.

    ``algorithm`` is a registered strategy's name: the file carries its traits
    (``schema.TRAITS_ATTR``), as a trained run's does.
    """
    hosts, names = node_attrs(world_size, ranks_per_node, host_names)
    root = {
        "algorithm": algorithm,
        "model": workload.get("name", ""),
        "dataset": workload.get("dataset", ""),
        "world_size": world_size,
        "config": json.dumps(config, sort_keys=True, default=str),
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "syncbench_version": package_version(),
        "git_sha": git_sha(),
        "numpy_version": np.__version__,
        "h5py_version": h5py.__version__,
        "backend": "simgrid",
        "devices": [],
        **hosts,
        **extra_root,
    }
    index = {name: i for i, name in enumerate(sorted(set(names)))}
    rank_attrs = {k: {"hostname": names[k], "node": index[names[k]], "device": "simulated"}
                  for k in rows}
    empty_eval = {name: np.zeros(0, dtype=dtype) for name, dtype in schema.EVAL_COLUMNS.items()}
    sim_attrs = {schema.SIMULATED_ATTR: True, schema.SIM_PLATFORM_ATTR: _json(platform),
                 schema.SIM_WORKLOAD_ATTR: _json(workload), schema.SIM_RUN_ATTR: _json(simulation),
                 schema.TRAITS_ATTR: get_algorithm(algorithm).traits
                 .to_json()}
    return dict(write_run_file(path, root, rows, rank_attrs, empty_eval, wall_s, None,
                               extra_attrs=sim_attrs, diverged=False))


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, default=str)
