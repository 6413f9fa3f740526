"""Run files built by hand with h5py: summarize, read_run, report_rows, format_report.

Split off ``tests/unit/test_report.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

#: The one module of the strategies analysis reads (the traits and phases, declared once;
#: no MPI in it), and its package.
SHARED_CODE = "SHARED = {'syncbench.algorithms', 'syncbench.algorithms.traits'}\n"


def test_analysis_imports_no_mpi():
    import subprocess
    import sys

    code = (
        "import sys, syncbench.analysis.report, syncbench.analysis.runfile, "
        "syncbench.analysis.summary\n" + SHARED_CODE +
        "bad = [m for m in sys.modules if m == 'mpi4py' or m.startswith('mpi4py.') "
        "or m.split('.')[:2] in (['syncbench', 'bench'], ['syncbench', 'algorithms'], "
        "['syncbench', 'kernels']) and m not in SHARED]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_new_analysis_modules_import_no_mpi_nor_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys, syncbench.analysis.tables, syncbench.analysis.trace, "
        "syncbench.analysis.plots, syncbench.analysis.report, syncbench.analysis.columns, "
        "syncbench.analysis.repeats, syncbench.analysis.scaling, "
        "syncbench.analysis.hidden_comm, syncbench.analysis.run_metrics\n" + SHARED_CODE +
        "bad = [m for m in sys.modules if m == 'mpi4py' or m.startswith('mpi4py.') "
        "or m.split('.')[0] == 'matplotlib' "
        "or m.split('.')[:2] in (['syncbench', 'bench'], ['syncbench', 'algorithms'], "
        "['syncbench', 'kernels']) and m not in SHARED]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_machine_attrs_count_ranks_per_host_against_physical_cores():
    from syncbench.bench.train.driver import machine_attrs

    info = {"host_cores": 2, "host_cpus": 4}
    two = machine_attrs(["a", "a"], [info, info], "weak")
    assert two == {"host_cores": 2, "host_cpus": 4, "ranks_per_host": 2, "nodes": 1,
                   "ranks_per_node": [2], "oversubscribed": False, "scaling_mode": "weak",
                   "ranks_per_machine": 2, "gpu_count": 0, "ranks_per_gpu": 0,
                   "gpu_shared": False}
    four = machine_attrs(["a", "a", "a", "b"], [info] * 4, None)
    assert four["ranks_per_host"] == 3 and four["oversubscribed"] is True
    assert four["nodes"] == 2 and four["ranks_per_node"] == [3, 1]  # sorted host names
    assert four["scaling_mode"] == ""
    # per node against that node's own cores, not rank 0's: node a (2 cores) runs 3
    big = {"host_cores": 4, "host_cpus": 4}
    mixed = machine_attrs(["b", "a", "a", "a", "b", "b"], [big, info, info, info, big, big],
                          None)
    assert mixed["host_cores"] == 4 and mixed["ranks_per_host"] == 3
    assert mixed["oversubscribed"] is True and mixed["ranks_per_node"] == [3, 3]
    assert machine_attrs(["b", "a", "b", "b"], [big, info, big, big],
                         None)["oversubscribed"] is False
    unknown = machine_attrs(["a"] * 3, [{"host_cores": None, "host_cpus": 2}] * 3, None)
    assert unknown["host_cores"] == 0 and unknown["oversubscribed"] is None


def test_machine_attrs_nodes_of_one_kernel_share_its_cores():
    """Emulated nodes (namespaces of one 2-core host): 2 nodes x 2 ranks oversubscribe it."""
    from syncbench.bench.train.driver import machine_attrs

    info = {"host_cores": 2, "host_cpus": 2, "machine": "boot-1"}
    four = machine_attrs(["n1", "n1", "n2", "n2"], [info] * 4, None)
    assert four["nodes"] == 2 and four["ranks_per_node"] == [2, 2]
    assert four["oversubscribed"] is True
    two = machine_attrs(["n1", "n2"], [info] * 2, None)
    assert two["oversubscribed"] is False
    apart = [{**info, "machine": m} for m in ("boot-1", "boot-1", "boot-2", "boot-2")]
    assert machine_attrs(["n1", "n1", "n2", "n2"], apart, None)["oversubscribed"] is False
    # the machine line counts ranks per core per machine, and says the nodes share it
    from syncbench.analysis.context import format_context, machine_context

    one_each = machine_attrs([f"n{i}" for i in range(4)], [info] * 4, None)
    assert one_each["ranks_per_machine"] == 4 and one_each["oversubscribed"] is True
    line = format_context(machine_context({**one_each, "world_size": 4}))
    assert "2 cores (2 CPUs) per machine, shared by the nodes" in line
    assert "4 ranks on 4 nodes (1 rank/node), 2.0 ranks/core, oversubscribed" in line
