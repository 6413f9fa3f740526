"""``syncbench ssgd-comm``: SSGD's per-step MPI time against a bare Allreduce: the tests that
launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_ssgd_comm.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

from helpers import run_mpi


def test_missing_dataset_ends_the_job_with_one_line(tmp_path):
    proc = run_mpi(2, "ssgd-comm", "--dataset", "cifar10", "--data-dir", str(tmp_path),
                   "--blocks", "1", timeout=60, env={"SYNCBENCH_DATA": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("syncbench")]
    assert len(errors) == 1 and "cifar10" in errors[0], proc.stderr
    assert errors[0].startswith("syncbench ssgd-comm: error: ")
    assert errors[0].endswith(" (see 'syncbench ssgd-comm --help')")
