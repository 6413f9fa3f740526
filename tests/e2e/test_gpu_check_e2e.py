"""``jobs/gpu_check.sh``: the budget first, a plan that fits it, independent steps, and
at most 8 files back (the full log one of them), tested on the CPU.

The check itself (``jobs/gpu_check.py``) is loaded from its file. Its measuring runs are
parsed with the command line they are for (no bad flag waits for the GPU machine to be
found), OD-SGD's run takes delayed steps, a failed or timed-out step does not stop the
next one, and the setup builds its venv over an existing environment without a
package index.

Split off ``tests/unit/test_gpu_check.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import re
import subprocess

from test_gpu_check import ROOT, gpu_check

SCRIPT = ROOT / "jobs" / "gpu_check.sh"


def test_dry_run_prints_the_budget_first_and_runs_nothing(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    budget, worst = map(int, re.match(r"gpu_check: budget (\d+) s .* add up to (\d+) s",
                                      lines[0]).groups())
    assert worst <= budget <= 7 * 60
    for step in gpu_check.plan(with_bodies=False):
        assert any(line.split()[:2] == [step.name, str(step.limit)] for line in lines[1:12])
    assert "dry run: nothing is run" in proc.stdout and not (tmp_path / "w").exists()
    files = re.search(r"files back in --out: (.*) \((\d+) of at most (\d+)\)", proc.stdout)
    assert int(files.group(2)) <= int(files.group(3)) == 8
    assert "gpu-check.log" in files.group(1)


def test_budget_line_and_limits_fit_seven_minutes():
    proc = subprocess.run(["bash", str(SCRIPT), "--budget"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    worst, budget = map(int, re.findall(r"(\d+) s", proc.stdout))
    assert worst <= budget == gpu_check.BUDGET_S <= 420
    steps = gpu_check.plan()
    # every step but the report gets its whole limit even after all before it used theirs
    measuring = sum(s.limit for s in steps if s.name != "report")
    assert measuring + gpu_check.REPORT_RESERVE_S <= gpu_check.BUDGET_S
    assert steps[-1].name == "report" and steps[-1].limit <= gpu_check.REPORT_RESERVE_S
    assert len(gpu_check.OUT_FILES) <= gpu_check.MAX_OUT_FILES == 8
