"""``syncbench ssgd-comm``: SSGD's per-step MPI time against a bare Allreduce.

* the statistics (per-block last/mean, paired ratios) re-computed by hand;
* under MPI (pytest-mpi, 2 and 4 ranks): every training variant, the bare
  ``mpi`` reference included, performs SSGD's rule, so the interleaved
  benchmark is one SSGD trajectory equal to serial large-batch SGD, with
  replicas bit-identical; the figures are complete and the JSON round-trips;
* bad flags and a missing dataset end the job with one line and exit 2.

Split off ``tests/unit/test_ssgd_comm.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
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
