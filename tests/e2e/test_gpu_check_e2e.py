"""``jobs/gpu_check.sh``: the budget first, a plan that fits it, independent steps, and: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_gpu_check.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
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


def _python_wrapper(folder: Path) -> None:
    """``folder/bin/python``: this interpreter (the check's venv, as far as the report is
    concerned)."""
    (folder / "bin").mkdir(parents=True)
    wrapper = folder / "bin" / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)


def test_steps_are_independent_and_at_most_eight_files_come_back(tmp_path, monkeypatch):
    """A failed step, a timed-out command and a step that needs the missing GPU are each
    reported; the steps after them run, and the report still writes its files."""
    ran: list[str] = []

    def fails(check, step):
        raise gpu_check.StepFailed("on purpose")

    def hangs(check, step):
        check.run(step, [sys.executable, "-c", "import time; time.sleep(60)"], 1, "sleeper")

    def no_gpu(check, step):
        check.gpu, check.gpu_reason = False, "none in this test"

    def runs(check, step):
        ran.append(step.name)
        check.run(step, [sys.executable, "-c", "print('still measuring')"], 10, "echo")

    steps = [gpu_check.Step("broken", 5, False, "fails", fails),
             gpu_check.Step("hang", 5, False, "times out", hangs),
             gpu_check.Step("probe", 5, False, "finds no GPU", no_gpu),
             gpu_check.Step("on-gpu", 5, True, "needs a GPU", runs),
             gpu_check.Step("after", 5, False, "runs anyway", runs),
             gpu_check.Step("report", 15, False, "the report", gpu_check.step_report)]
    monkeypatch.setattr(gpu_check, "plan", lambda with_bodies=True: steps)
    _python_wrapper(tmp_path / "venv")
    out = tmp_path / "out"
    rc = gpu_check.main(["--out", str(out), "--work", str(tmp_path / "w"), "--venv",
                         str(tmp_path / "venv"), "--wheels", str(tmp_path / "wheels")])
    assert rc == 1  # a step failed
    status = {s.name: s.status for s in steps}
    assert status == {"broken": "failed", "hang": "failed", "probe": "passed",
                      "on-gpu": "skipped", "after": "passed", "report": "passed"}
    assert "timed out: sleeper" in steps[1].detail and ran == ["after"]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu-check.log", "figures.json", "report.md"} <= set(files)
    log = (out / "gpu-check.log").read_text()
    assert log.startswith("gpu_check: budget ") and "still measuring" in log
    assert "THE GPU PATH DID NOT RUN" in log
    report = (out / "report.md").read_text()
    assert "| on-gpu | skipped |" in report and "none in this test" in report


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run in a venv")
@pytest.mark.slow
def test_setup_builds_a_venv_over_this_one_without_an_index(tmp_path):
    """This test environment stands in for the GPU machine's Python (itself a venv, as
    there): the check's venv sees its packages through the path file, mpi4py's library
    is found (the machine's: MPI4PY_LIBMPI when the venv does not find it), this
    repository is installed without an index, and nothing is carried when nothing lacks."""
    if not list(Path(sys.prefix, "lib").glob("libmpi.so*")):
        pytest.skip("the MPI library of these tests is not a wheel in this venv")
    config = gpu_check.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "w"),
                                          venv=str(tmp_path / "venv"),
                                          wheels=str(tmp_path / "no-wheels"), budget=420)
    check = gpu_check.Check(config)
    check.out.mkdir(parents=True)
    step = gpu_check.Step("setup", 120, False, "setup", gpu_check.step_setup)
    gpu_check.run_step(check, step)
    assert step.status == "passed", (step.detail, [r["output"][-2000:] for r in step.runs])
    assert check.env["PIP_NO_INDEX"] == "1" and check.env["PIP_CONFIG_FILE"] == os.devnull
    assert check.used["numpy"] != "missing" and check.used["syncbench"] != "missing"
    assert "libmpi" in check.used["MPI library"]
    assert check.used["carried wheels installed"] == "none"
    bridge = gpu_check.site_packages(check.venv) / "_gpu_check_machine_site.pth"
    assert "site.addsitedir" in bridge.read_text()
    pip_runs = [r["cmd"] for r in step.runs if "pip" in r["cmd"]]
    assert pip_runs and all("--no-index" in cmd for cmd in pip_runs)
