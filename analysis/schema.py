"""Names of the ``syncbench/1`` run-file schema, defined once.

The recorder (``syncbench.bench.recorder``) writes these names and the
analysis readers read them; nothing else spells them out.
"""

from __future__ import annotations

SCHEMA = "syncbench/1"

#: Root attributes of every run file.
ROOT_ATTRS: tuple[str, ...] = (
    "schema",
    "algorithm",
    "model",
    "dataset",
    "world_size",
    "config",
    "started_utc",
    "syncbench_version",
    "git_sha",
    "mpi_library",
    "mpi4py_version",
    "numpy_version",
    "cupy_version",
    "h5py_version",
    "backend",
    "devices",
    "cuda_aware",
    "slurm_job_id",
    "hostnames",
    # machine context and scaling study (see CONTEXT_ATTRS, SCALING_MODE_ATTR)
    "host_cores",
    "host_cpus",
    "ranks_per_host",
    "oversubscribed",
    "t_begin_unix",
    "t_end_unix",
    "scaling_mode",
)

#: Root attributes that describe the machine a run saw and when it ran
#: (``syncbench.analysis.context``): physical cores and logical CPUs of rank 0's
#: host, the most ranks on one host, whether a host ran more ranks than physical
#: cores, and the run's wall-clock interval (Unix seconds, from the barrier that
#: starts the clock to the end of training) for overlap detection.
CONTEXT_ATTRS: tuple[str, ...] = (
    "host_cores", "host_cpus", "ranks_per_host", "oversubscribed", "t_begin_unix", "t_end_unix",
)

#: Root attribute: "strong" or "weak" when the run belongs to a scaling study
#: (``syncbench train --scaling-mode``, set by ``syncbench sweep``); absent or
#: "" otherwise, and the report then infers the kind from the sample counts.
SCALING_MODE_ATTR = "scaling_mode"

#: Group that holds one sub-group per rank, named by :func:`rank_group`.
RANKS_GROUP = "ranks"

#: Per-step timing phases (the column order of the run file). A step runs
#: ``delay`` right after ``compute``; ``syncbench.analysis.trace.step_order``
#: gives the order each strategy runs them in, for drawing.
PHASES: tuple[str, ...] = ("data", "compute", "comm", "wait", "update", "delay")

#: 1-D datasets of every rank group, one row per step of that rank, with dtype.
RANK_COLUMNS: dict[str, str] = {
    "step": "i8",
    "t_start": "f8",
    **{f"t_{p}": "f8" for p in PHASES},
    "loss": "f8",
    "samples": "i8",
    "staleness": "i8",
    "local_steps": "i8",
    "round": "i8",
}

#: Attributes of every rank group.
RANK_ATTRS: tuple[str, ...] = ("hostname", "device", "slowdown")

#: Group of evaluation rows (of the consensus model on the held-out split).
EVAL_GROUP = "eval"
EVAL_COLUMNS: dict[str, str] = {
    "t": "f8",
    "step": "i8",
    "samples_seen": "i8",
    "loss": "f8",
    "accuracy": "f8",
}

#: Group whose attributes summarise the run.
SUMMARY_GROUP = "summary"
SUMMARY_ATTRS: tuple[str, ...] = (
    "wall_s",
    "samples_per_s",
    "final_accuracy",
    "final_loss",
    "time_to_target_s",
    "comm_fraction",
    "wait_fraction",
)

#: Root attribute that is False on a run rebuilt from partial checkpoints.
COMPLETE_ATTR = "complete"

#: Keys of one ``syncbench report`` row, in column order (JSON adds ``path``).
REPORT_KEYS: tuple[str, ...] = (
    "algorithm",
    "world_size",
    "samples_per_s",
    "wall_s",
    "final_accuracy",
    "time_to_target_s",
    "comm_fraction",
    "wait_fraction",
)


def rank_group(rank: int) -> str:
    """Path of one rank's group, e.g. ``ranks/00003``."""
    return f"{RANKS_GROUP}/{rank:05d}"
