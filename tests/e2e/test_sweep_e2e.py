"""``syncbench sweep``: strong and weak scaling at np 1,2 with tiny synthetic runs: the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_sweep.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_sweep import parse, run_sweep

from syncbench.analysis.runfile import read_run
from syncbench.bench.commands import sweep as sweep_command
from syncbench.bench.experiment.results_paths import read_results

SAMPLES = 512
TRAIN = ["--dataset", "synthetic", "--synthetic-samples", str(SAMPLES), "--epochs", "1",
         "--eval-every", "0", "--progress", "never"]


@pytest.fixture(scope="module")
def strong(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("strong")
    args, extra = parse("--mode", "strong", "--np", "1,2", "--global-batch", "64",
                        "--out-dir", str(out_dir), "--run-timeout", "60", *TRAIN)
    code = sweep_command.run(args, extra)
    return code, out_dir


def test_resume_skips_complete_files_and_reruns_broken_ones(strong, capsys, tmp_path):
    # a copy: the sweep's own folder stays as it ran for the other tests of the module
    # (a results folder resumes wherever it was moved)
    out_dir = tmp_path / "strong"
    shutil.copytree(strong[1], out_dir)
    np2 = out_dir / "ssgd-strong-np2-r0.h5"
    before = {p.name: p.stat().st_mtime_ns for p in out_dir.glob("*.h5")}
    np2.write_bytes(b"not an HDF5 file")  # a broken file is re-run
    code, out, manifest = run_sweep(capsys, "--mode", "strong", "--np", "1,2",
                                    "--global-batch", "64", "--out-dir", str(out_dir), *TRAIN)
    assert code == 0
    assert [r["status"] for r in manifest["runs"]] == ["skipped", "ran"]
    assert (out_dir / "ssgd-strong-np1-r0.h5").stat().st_mtime_ns == before[
        "ssgd-strong-np1-r0.h5"]
    assert "re-running" in out and read_run(np2).complete
    assert sorted(manifest["order"]) == ["ssgd-strong-np1-r0", "ssgd-strong-np2-r0"]
    assert manifest["scenario"]["scaling"] == "strong" and manifest["scenario"]["np"] == [1, 2]
    # Everything complete now: nothing is launched at all.
    code, out, manifest = run_sweep(capsys, "--mode", "strong", "--np", "1,2",
                                    "--global-batch", "64", "--out-dir", str(out_dir), *TRAIN)
    assert code == 0 and "running ->" not in out
    assert [r["status"] for r in manifest["runs"]] == ["skipped", "skipped"]
    table = out[out.index("# strong scaling"):out.index("\nsweep: ")]
    # the same points as a scenario file: syncbench run keeps the files, prints the table
    scenario = out_dir / "scaling.toml"
    scenario.write_text('np = [1, 2]\nscaling = "strong"\nglobal_batch = 64\nrepeats = 1\n'
                        '[[run]]\nlabel = "ssgd"\nalgorithm = "ssgd"\n')
    proc = subprocess.run([sys.executable, "-m", "syncbench", "run", str(scenario),
                           "--out-dir", str(out_dir), *TRAIN], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "running ->" not in proc.stdout and table in proc.stdout
    assert f"results {out_dir / 'results.json'}" in proc.stdout
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["status"] for r in results["runs"]] == ["skipped", "skipped"]


ROOT = Path(__file__).resolve().parents[2]


JOB_SCRIPTS = [p for d in ("mpirun", "slurm") for p in sorted((ROOT / "jobs" / d).iterdir())
               if p.suffix in (".sh", ".sbatch")]


@pytest.mark.parametrize("script", JOB_SCRIPTS, ids=lambda p: p.name)
def test_job_scripts_parse_and_document_their_variables(script):
    assert subprocess.run(["bash", "-n", str(script)], timeout=10).returncode == 0
    text = script.read_text()
    assert "# Variables" in text or "Variables (environment)" in text, script
    if script.suffix == ".sbatch":
        assert "#SBATCH --output=" in text and "SYNCBENCH_VENV" in text


@pytest.mark.slow
def test_mpirun_scripts_honour_np_mpiexec_and_extra_flags(tmp_path):
    env = {**os.environ, "NP": "2", "MPIEXEC": str(Path(sys.executable).parent / "mpiexec"),
           "MPIEXEC_FLAGS": "-launcher fork", "OUT_DIR": str(tmp_path / "sweep"),
           "SYNCBENCH_VENV": sys.prefix}
    train = subprocess.run(["bash", str(ROOT / "jobs/mpirun/train.sh"), *TRAIN,
                            "--out", str(tmp_path / "run.h5")], env=env, timeout=60,
                           capture_output=True, text=True)
    assert train.returncode == 0, train.stderr
    assert read_run(tmp_path / "run.h5").world_size == 2
    env["NP"] = "1,2"
    swept = subprocess.run(["bash", str(ROOT / "jobs/mpirun/sweep.sh"), "--mode", "weak",
                            "--batch-size", "16", *TRAIN], env=env, timeout=120,
                           capture_output=True, text=True)
    assert swept.returncode == 0, swept.stderr
    assert sorted(p.name for p in (tmp_path / "sweep").glob("*.h5")) == [
        "ssgd-weak-np1-r0.h5", "ssgd-weak-np2-r0.h5"]


@pytest.mark.parametrize("nodes, serial", [(["vm"], True), (["n1", "n2"], False)])
def test_slurm_sweep_is_serial_by_default_on_one_node(tmp_path, nodes, serial):
    """sweep.sh with stand-in sbatch/sinfo: one node chains the jobs and throttles arrays."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {log}\n'
        f'echo $(( $(wc -l < {log}) + 100 ))\n')
    (bin_dir / "sinfo").write_text("#!/usr/bin/env bash\n" + "".join(
        f"echo {n}\n" for n in nodes))
    for tool in ("sbatch", "sinfo"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NPS": "1,2",
           "OUT_DIR": str(tmp_path / "out")}
    env.pop("SERIAL", None)
    proc = subprocess.run(["bash", str(ROOT / "jobs/slurm/sweep.sh"), *TRAIN], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"SERIAL={int(serial)} by default ({len(nodes)} node(s)" in proc.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 3  # np=1, np=2, report
    assert ("--array=0-0%1" in calls[0]) is serial
    assert ("--dependency=afterany:101" in calls[1]) is serial
    assert "--dependency=afterany:101:102" in calls[2]
    # an explicit SERIAL wins
    log.unlink()
    proc = subprocess.run(["bash", str(ROOT / "jobs/slurm/sweep.sh"), *TRAIN],
                          env={**env, "SERIAL": "0"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "by default" not in proc.stdout
    assert "%1" not in log.read_text()


SAMPLES = 512


@pytest.mark.parametrize("mode", ["strong", pytest.param("weak", marks=pytest.mark.slow)])
def test_sweep_runs_every_point_with_the_planned_batch(mode, strong, tmp_path, capsys):
    if mode == "strong":
        code, out_dir = strong
        manifest = read_results(out_dir / "manifest.json")
    else:
        out_dir = tmp_path
        code, out, manifest = run_sweep(capsys, "--mode", "weak", "--np", "1,2",
                                        "--batch-size", "32", "--out-dir", str(out_dir), *TRAIN)
        # the order within a repeat is seeded and shuffled, as the runner's
        assert re.search(r"\[[12]/2\] ssgd np=2 repeat=0 batch/rank=32: ran", out)
        assert "| ssgd" in out and "efficiency" in out
    assert code == 0
    expected_batch = {1: 64, 2: 32} if mode == "strong" else {1: 32, 2: 32}
    assert [(r["algorithm"], r["np"], r["repeat"], r["batch_size"], r["status"])
            for r in manifest["runs"]] == [("ssgd", n, 0, expected_batch[n], "ran")
                                           for n in (1, 2)]
    for entry in manifest["runs"]:
        n = entry["np"]
        path = out_dir / f"ssgd-{mode}-np{n}-r0.h5"
        assert entry["path"] == str(path)
        run = read_run(path)
        assert run.complete and run.world_size == n
        assert run.config["batch_size"] == expected_batch[n]
        global_batch = n * expected_batch[n]
        assert run.attrs["scaling_mode"] == mode
        for rank in range(n):
            # strong: the same total work; weak: the same work per rank (budget x N)
            steps = SAMPLES // global_batch if mode == "strong" else SAMPLES // expected_batch[n]
            assert run.steps[rank] == steps
            assert set(run.ranks[rank]["samples"].tolist()) == {expected_batch[n]}
        assert run.config["epochs"] == (1.0 if mode == "strong" else 1.0 * n)
    report = (out_dir / "report.md").read_text()
    assert report.count("| ssgd ") >= 4
    assert f"# {mode} scaling (run files record scaling_mode={mode})" in report
    assert "# machine: " in report
