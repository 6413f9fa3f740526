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
