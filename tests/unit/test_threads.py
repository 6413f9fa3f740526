"""BLAS/OpenMP threads per rank: the node's cores over its ranks, unless the user chose.

The rule's parts on given environments, then two 2-rank ``syncbench train`` runs with
the real launcher and library: one without any thread variable (the Makefile's and
conftest's ``OMP_NUM_THREADS=1`` taken out, else the test would prove nothing), which
must set the threads before NumPy loads (the loaded OpenBLAS says how many it uses),
record them in the run file and say so in one line; one with ``OMP_NUM_THREADS=2``,
which must be left alone and silent.

Split off this module: ``tests/e2e/test_threads_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import os
import sys

import pytest

from syncbench.bench.mpi import threads

CORES = len(os.sched_getaffinity(0))


def test_slurm_per_node_lists_expand_and_index_by_node():
    assert threads.slurm_tasks_here("2(x3),1", 0) == 2
    assert threads.slurm_tasks_here("2(x3),1", 3) == 1
    assert threads.slurm_tasks_here("4", 0) == 4
    assert threads.slurm_tasks_here("2(x3", 0) is None


def test_a_users_setting_is_kept_whichever_variable_it_is():
    for name in threads.USER_VARIABLES:
        setting = threads.decide({name: "3", "MPI_LOCALNRANKS": "2"})
        assert not setting.limited and name in setting.source
    # NumPy's OpenBLAS reads OPENBLAS_NUM_THREADS before OMP_NUM_THREADS
    assert threads.decide({"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "2"}).threads == 2


@pytest.mark.parametrize("environ, ranks, variable", [
    ({"MPI_LOCALNRANKS": "2"}, 2, "MPI_LOCALNRANKS"),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ({"PMIX_LOCAL_SIZE": "2"}, 2, "PMIX_LOCAL_SIZE"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1,3", "SLURM_NODEID": "1"}, 3, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0"}, 2, "SLURM_TASKS_PER_NODE"),
    ({"MPI_LOCALNRANKS": "2", "SLURM_STEP_TASKS_PER_NODE": "4"}, 2, "MPI_LOCALNRANKS"),
    ({}, 1, ""),
])
def test_ranks_on_the_node_come_from_the_launcher(environ, ranks, variable):
    assert threads.ranks_on_node(environ) == (ranks, variable)
    setting = threads.decide(environ)
    assert setting.limited and setting.threads == max(1, CORES // ranks)


def test_slurm_limits_the_cores_to_the_jobs_cpus_on_the_node():
    assert threads.decide({"SLURM_CPUS_ON_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
                          ).threads == 1
    per_task = threads.decide({"SLURM_CPUS_PER_TASK": "1", "SLURM_STEP_TASKS_PER_NODE": "8"})
    assert per_task.threads == 1 and "SLURM_CPUS_PER_TASK" in per_task.source


def test_nothing_is_set_once_numpy_is_loaded():
    environ: dict[str, str] = {"MPI_LOCALNRANKS": "2"}
    assert "numpy" in sys.modules  # pytest's process has loaded it
    setting = threads.limit_threads(environ)
    assert setting.threads == 0 and "NumPy was loaded" in setting.source
    assert set(environ) == {"MPI_LOCALNRANKS"}
