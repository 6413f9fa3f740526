"""BLAS and OpenMP threads per rank: the cores of the rank's node over the ranks there.

NumPy's BLAS (OpenBLAS in the PyPI wheels) starts one thread per CPU it may run on.
Every rank of a node does so, so N ranks on C cores run N x C threads, and
OpenBLAS's threads spin while they wait: the ranks then take turns on the cores
instead of computing. ``syncbench train`` therefore gives each rank
``max(1, cores // ranks on the node)`` threads, where the cores are those it may
run on (``os.sched_getaffinity``; under Slurm at most the CPUs the job was given on
the node, ``SLURM_CPUS_ON_NODE``, or exactly ``SLURM_CPUS_PER_TASK``), and the ranks
on the node come from the launcher (:data:`LOCAL_SIZE_VARIABLES`). The variables
must be set before NumPy loads (OpenBLAS and the OpenMP runtime read them once, when
loaded), so ``cli.main`` calls :func:`limit_threads` before it parses ``train``'s
flags. A user's own setting (any of :data:`USER_VARIABLES`) is left alone, which is
also how a rank bound to cores of its own by its launcher gets more threads than this
rule gives. The same rule as OpenBLAS's FAQ on multithreaded callers and NumPy's
advice for MPI programs (limit the BLAS threads per process).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass

from syncbench.bench.mpi.errors import launcher_rank

#: Variables through which a user sets the threads of the BLAS or OpenMP libraries:
#: any one of them set means the user chose, and nothing is changed.
USER_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                  "BLIS_NUM_THREADS", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                  "NUMEXPR_NUM_THREADS")
#: The variables :func:`limit_threads` sets.
SET_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "BLIS_NUM_THREADS")
#: Launcher variables that give the ranks on this node, the launcher closest to the
#: process first: MPICH's Hydra, Open MPI, PMIx, then a Slurm step and a Slurm job
#: (per-node lists such as ``2(x3),1``, indexed by ``SLURM_NODEID``).
LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE",
                        "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


@dataclass(frozen=True)
class ThreadSetting:
    """The BLAS/OpenMP threads of this rank and where that number came from."""

    #: Threads per rank (0: left to the libraries, which start one per CPU).
    threads: int
    #: How it was decided, in words (what the run file and ``syncbench env`` show).
    source: str
    #: True when syncbench set :data:`SET_VARIABLES` itself.
    limited: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def slurm_tasks_here(value: str, node_id: int) -> int | None:
    """This node's entry of a Slurm per-node list (``2(x3),1``: 2, 2, 2, 1)."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if not counts:
        return None
    return counts[node_id] if 0 <= node_id < len(counts) else max(counts)


def ranks_on_node(environ: Mapping[str, str]) -> tuple[int, str]:
    """The ranks on this node and the variable that said so; ``(1, "")`` without one."""
    node_id = environ.get("SLURM_NODEID", "0").strip()
    for name in LOCAL_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        count = (slurm_tasks_here(value, int(node_id) if node_id.isdigit() else 0)
                 if name.startswith("SLURM_") else int(value) if value.isdigit() else None)
        if count:
            return count, name
    return 1, ""


def _positive(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def cores_here(environ: Mapping[str, str]) -> tuple[int, str]:
    """The cores this rank's node gives the job, and how that was found: the CPUs this
    process may run on, at most the job's CPUs on the node under Slurm."""
    cores = len(os.sched_getaffinity(0))
    source = "sched_getaffinity"
    on_node = _positive(environ.get("SLURM_CPUS_ON_NODE"))
    if on_node is not None and on_node < cores:
        cores, source = on_node, "SLURM_CPUS_ON_NODE"
    return cores, source


def decide(environ: Mapping[str, str]) -> ThreadSetting:
    """What :func:`limit_threads` would do in ``environ`` (nothing is changed)."""
    chosen = [name for name in USER_VARIABLES if environ.get(name, "").strip()]
    if chosen:
        first = chosen[0]
        blas = next((n for n in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
                     if n in chosen), first)  # what NumPy's OpenBLAS reads, in its order
        threads = _positive(environ[blas]) or 0
        said = ", ".join(f"{n}={environ[n].strip()}" for n in chosen)
        return ThreadSetting(threads, f"{said} set before syncbench started")
    per_task = _positive(environ.get("SLURM_CPUS_PER_TASK"))
    affinity = len(os.sched_getaffinity(0))
    if per_task is not None:
        threads = min(per_task, affinity)
        return ThreadSetting(threads, f"SLURM_CPUS_PER_TASK={per_task} "
                             f"({affinity} CPUs in this rank's affinity)", limited=True)
    cores, how = cores_here(environ)
    ranks, variable = ranks_on_node(environ)
    threads = max(1, cores // ranks)
    where = variable or "no launcher variable"
    return ThreadSetting(threads, f"{cores} cores ({how}) / {ranks} "
                         f"rank{'s' if ranks != 1 else ''} on this node ({where})", limited=True)


_decided: ThreadSetting | None = None


def limit_threads(environ: MutableMapping[str, str] | None = None) -> ThreadSetting:
    """Set :data:`SET_VARIABLES` to :func:`decide`'s count unless the user set any of
    :data:`USER_VARIABLES`; returns the setting (also :func:`current`'s answer later).

    Call it before NumPy is imported: OpenBLAS and the OpenMP runtime read the
    variables once, when they load. Where NumPy is already loaded nothing is set
    (it would be too late) and the setting says so.
    """
    global _decided
    environ = os.environ if environ is None else environ
    setting = decide(environ)
    if setting.limited and "numpy" in sys.modules:
        setting = ThreadSetting(0, "NumPy was loaded before syncbench could limit its threads")
    elif setting.limited:
        for name in SET_VARIABLES:
            environ[name] = str(setting.threads)
    _decided = setting
    return setting


def current(environ: Mapping[str, str] | None = None) -> ThreadSetting:
    """The setting :func:`limit_threads` made in this process, else what the environment
    says (a run started by other means than ``cli.main``: the MPI tests)."""
    if _decided is not None:
        return _decided
    return decide(os.environ if environ is None else environ)


def announce(setting: ThreadSetting, prog: str = "syncbench train") -> None:
    """One line on stderr from the launcher's rank 0 when syncbench set the threads."""
    if setting.limited and launcher_rank() == 0:
        print(f"{prog}: {setting.threads} BLAS/OpenMP thread{'s' if setting.threads != 1 else ''}"
              f" per rank ({setting.source}); set OMP_NUM_THREADS to choose",
              file=sys.stderr, flush=True)
