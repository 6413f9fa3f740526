"""The Slurm job scripts on a real Slurm (``jobs/slurm/local-cluster.sh`` brings one up).

Skipped unless ``sinfo`` answers; with ``SYNCBENCH_REQUIRE_SLURM=1`` (``make
test-slurm``) a missing cluster fails instead. Jobs run the MPICH wheel's
ranks through ``srun --mpi=pmi2``; every wait is bounded (``WAIT_S``) and
cancels its jobs when it runs out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncbench.analysis.runfile import read_run

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent
SLURM_JOBS = ROOT / "jobs" / "slurm"
WAIT_S = 180
TRAIN = ["--dataset", "synthetic", "--synthetic-samples", "512", "--epochs", "1",
         "--eval-every", "0", "--progress", "never"]


def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    if not _slurm_answers():
        message = "no Slurm cluster answers sinfo (start one: sudo jobs/slurm/local-cluster.sh)"
        if os.environ.get("SYNCBENCH_REQUIRE_SLURM") == "1":
            pytest.fail(message)
        pytest.skip(message)


def job_env(**extra: str) -> dict[str, str]:
    """The submitting environment (sbatch exports it): this test's venv, one thread."""
    venv = sys.prefix if sys.prefix != sys.base_prefix else str(ROOT / ".venv")
    return {**os.environ, "SYNCBENCH_VENV": venv, "OMP_NUM_THREADS": "1", **extra}


def sbatch(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=30, env=env or job_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def wait_for(job_ids: list[str], outputs: Path) -> None:
    """Poll ``squeue`` until the jobs have left the queue; cancel them after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-o", "%A", "-j", ",".join(job_ids)],
                              capture_output=True, text=True, timeout=15)
        if proc.returncode == 0 and not proc.stdout.strip():
            return
        time.sleep(0.5)
    subprocess.run(["scancel", *job_ids], timeout=15, check=False)
    logs = "\n".join(f"--- {p}\n{p.read_text()}" for p in sorted(outputs.rglob("*.out")))
    pytest.fail(f"Slurm jobs {job_ids} did not finish in {WAIT_S} s\n{logs}")


def test_train_sbatch_two_tasks_records_the_job_id(tmp_path):
    job = sbatch(tmp_path, "-n", "2", str(SLURM_JOBS / "train.sbatch"), "--algorithm", "ssgd",
                 *TRAIN, "--batch-size", "32", "--out", "run.h5")
    wait_for([job], tmp_path)
    log = tmp_path / f"syncbench-train-{job}.out"  # --output=%x-%j.out
    assert log.exists(), list(tmp_path.iterdir())
    text = log.read_text()
    run_path = tmp_path / "run.h5"
    assert run_path.exists(), text
    run = read_run(run_path)
    assert run.complete and run.world_size == 2, text
    assert run.attrs["slurm_job_id"] == job
    assert run.attrs["mpi_library"].startswith("MPICH")
    assert run.steps == {0: 512 // 64, 1: 512 // 64}
    assert "ssgd mlp synthetic np=2: accuracy" in text


def activated_venv_env(**extra: str) -> dict[str, str]:
    """A shell after ``source VENV/bin/activate`` (this test's venv) and nothing else set."""
    venv = sys.prefix if sys.prefix != sys.base_prefix else str(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("SYNCBENCH_VENV", "SYNCBENCH_ROOT")}
    return {**env, "VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:{env.get('PATH', '')}",
            "OMP_NUM_THREADS": "1", **extra}


def test_train_sbatch_from_an_activated_venv_in_a_fresh_clone(tmp_path):
    # A checkout without .venv: only the activated venv can run the job.
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "jobs", clone / "jobs")
    env = activated_venv_env()
    job = sbatch(tmp_path, "-n", "2", str(clone / "jobs" / "slurm" / "train.sbatch"),
                 "--algorithm", "ssgd", *TRAIN, "--out", "run.h5", env=env)
    wait_for([job], tmp_path)
    text = (tmp_path / f"syncbench-train-{job}.out").read_text()
    first = text.splitlines()[0]
    assert first.startswith(f"syncbench job {job}: 2 tasks on "), text
    assert first.endswith(f", python {env['VIRTUAL_ENV']}/bin/python (from VIRTUAL_ENV)"), text
    run = read_run(tmp_path / "run.h5")
    assert run.complete and run.world_size == 2 and run.attrs["slurm_job_id"] == job


def test_bad_flag_under_srun_is_one_line_and_status_2(tmp_path):
    job = sbatch(tmp_path, "-n", "2", str(SLURM_JOBS / "train.sbatch"), "--model", "nosuch",
                 *TRAIN)
    wait_for([job], tmp_path)
    text = (tmp_path / f"syncbench-train-{job}.out").read_text()
    errors = [line for line in text.splitlines() if line.startswith("syncbench train")]
    assert len(errors) == 1, text
    assert errors[0].startswith("syncbench train: error: argument --model: ")
    assert errors[0].endswith(" (see 'syncbench train --help')")
    assert "usage:" not in text and "Traceback" not in text, text
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                           timeout=15).stdout
    assert "ExitCode=2:0" in state, state


def test_job_array_writes_one_run_per_repeat(tmp_path):
    env = job_env(OUT_DIR=str(tmp_path / "rep"), RUN_NAME="ssgd")
    job = sbatch(tmp_path, "-n", "1", "--array=0-1", str(SLURM_JOBS / "repeats.sbatch"),
                 *TRAIN, env=env)
    wait_for([job], tmp_path)
    runs = [read_run(tmp_path / "rep" / f"ssgd-r{k}.h5") for k in (0, 1)]
    ids = {r.attrs["slurm_job_id"] for r in runs}
    assert all(r.complete and r.world_size == 1 for r in runs)
    assert len(ids) == 2 and all(ids)  # each array task is its own job


def test_strong_scaling_sweep_through_slurm(tmp_path):
    out_dir = tmp_path / "sweep"
    env = job_env(NPS="1,2", MODE="strong", OUT_DIR=str(out_dir))
    proc = subprocess.run(["bash", str(SLURM_JOBS / "sweep.sh"), "--global-batch", "64",
                           *TRAIN], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    jobs = re.findall(r"job (\d+)", proc.stdout)
    assert len(jobs) == 3, proc.stdout  # np=1, np=2, report
    wait_for(jobs, out_dir)
    report_log = out_dir / f"syncbench-sweep-report-{jobs[-1]}.out"
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["mode"] == "strong" and manifest["np"] == [1, 2]
    # The report job collects what the task-count jobs ran.
    assert [(r["np"], r["batch_size"], r["status"]) for r in manifest["runs"]] == [
        (1, 64, "skipped"), (2, 32, "skipped")], report_log.read_text()
    for entry in manifest["runs"]:
        run = read_run(entry["path"])
        assert run.complete and run.world_size == entry["np"]
        assert run.config["batch_size"] == entry["batch_size"]
        assert run.attrs["slurm_job_id"] in jobs[:2]
    for n, job in zip((1, 2), jobs):
        part = json.loads((out_dir / f"manifest-np{n}-r0.json").read_text())
        assert [r["status"] for r in part["runs"]] == ["ran"]
        assert (out_dir / f"syncbench-sweep-np{n}-{job}_0.out").exists()
    report = (out_dir / "report.md").read_text()
    assert "# strong scaling" in report  # the report's tables, then the sweep's scaling table
    scaling = report.split("# strong scaling", 1)[1]
    assert scaling.count("| ssgd ") == 2 and "| ssgd-strong-np2-r0.h5 |" in report
    assert "2 of 2 runs complete" in report_log.read_text()
