"""The Slurm job scripts on a real Slurm (``jobs/slurm/local-cluster.sh`` brings one up).

Skipped unless ``sinfo`` answers; with ``SYNCBENCH_REQUIRE_SLURM=1`` (``make
test-slurm``) a missing cluster fails instead. Jobs run the MPICH wheel's
ranks through ``srun --mpi=pmi2``; every wait is bounded (``WAIT_S``) and
cancels its jobs when it runs out.

The end of the module checks, as root, that the local cluster (the script and
``syncbench cluster up --slurm``) leaves a site's Slurm alone: a hand-written
``/etc/slurm/slurm.conf`` stays byte-identical and a daemon in Debian's pid files
keeps running; a daemon is stopped only while its recorded pid is still the one
started. What is really in those host files is put back afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncbench.analysis.runfile import read_run
from syncbench.bench.cluster import slurm as cluster_slurm
from syncbench.bench.cluster.state import Cluster, Node
from syncbench.bench.experiment.results_paths import read_results

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.slow
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
    manifest = read_results(out_dir / "manifest.json")
    assert manifest["scenario"]["scaling"] == "strong" and manifest["scenario"]["np"] == [1, 2]
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


# --- train-requeue.sbatch: stopped by the warning signal, requeued, resumed -----------

#: 1,280 steps per rank: about 2.3 s of training on this machine when it is quiet (256
#: took 0.45 s), a minute when it is loaded; rows flushed every 50 ms, so the warning
#: sent after the first rows lands a fraction of a second into training.
REQUEUE_EPOCHS = 40
REQUEUE_TRAIN = ["--algorithm", "ssgd", "--model", "mlp", "--dataset", "synthetic",
                 "--synthetic-samples", "2048", "--epochs", str(REQUEUE_EPOCHS),
                 "--batch-size", "32", "--eval-every", "0", "--progress", "never",
                 "--flush-every", "0.05"]
REQUEUE_STEPS = REQUEUE_EPOCHS * (2048 // 2 // 32)  # per rank
REQUEUE_BUDGET = REQUEUE_STEPS * 32 * 2


def job_fields(job: str) -> dict[str, str]:
    """``scontrol show job``'s KEY=VALUE fields (empty once the job is forgotten)."""
    proc = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True,
                          text=True, timeout=15)
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}


def fail_job(job: str, log: Path, why: str) -> None:
    subprocess.run(["scancel", job], timeout=15, check=False)
    text = log.read_text() if log.exists() else "(no output file)"
    pytest.fail(f"job {job}: {why}\n{job_fields(job)}\n--- {log}\n{text}")


def rows_sizes(parts: Path) -> list[int]:
    """Bytes of each rank's rows file in ``parts`` (0 while there is none)."""
    sizes = []
    for rank in (0, 1):
        files = [p for p in parts.glob(f"rows-{rank:05d}.*") if ".tmp" not in p.name]
        try:
            sizes.append(max((p.stat().st_size for p in files), default=0))
        except OSError:  # replaced while we looked
            sizes.append(0)
    return sizes


def wait_training(job: str, out: Path, log: Path) -> None:
    """Until both ranks are training: each has rewritten its rows file in ``OUT.parts/``
    with more rows than its first one held (every ``--flush-every`` seconds)."""
    parts = out.with_name(out.name + ".parts")
    deadline = time.monotonic() + WAIT_S
    first: list[int] = [0, 0]
    polls = 0
    while time.monotonic() < deadline:
        sizes = rows_sizes(parts)
        first = [f or s for f, s in zip(first, sizes)]
        if all(f and s > f for f, s in zip(first, sizes)):
            return
        polls += 1
        if polls % 20 == 0 and job_fields(job).get("JobState") not in (
                "PENDING", "CONFIGURING", "RUNNING"):
            fail_job(job, log, "ended before training was seen")
        time.sleep(0.1)
    fail_job(job, log, f"no rows flushed into {parts} in {WAIT_S} s")


#: A requeued job waits out the credential lifetime (AuthInfo cred_expire, 120 s by
#: default, 10 s on local-cluster.sh's cluster; squeue's reason BeginTime), then for the
#: next scheduling pass. It cannot be hurried: started earlier (``scontrol update
#: StartTime=now``), the node refuses it ("Job credential revoked") and the job ends FAILED.
REQUEUE_DELAY_S = 180


def wait_done(job: str, log: Path, restarts: int) -> dict[str, str]:
    """Until the job has ``restarts`` restarts and has ended; its fields then."""
    deadline = time.monotonic() + WAIT_S + restarts * REQUEUE_DELAY_S
    while time.monotonic() < deadline:
        fields = job_fields(job)
        state, count = fields.get("JobState"), int(fields.get("Restarts", "0"))
        if count > restarts:
            fail_job(job, log, f"requeued {count} times, expected {restarts}")
        if count == restarts and state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                           "NODE_FAIL", "OUT_OF_MEMORY"):
            return fields
        time.sleep(0.5)
    fail_job(job, log, f"not ended with {restarts} restart(s) in "
             f"{WAIT_S + restarts * REQUEUE_DELAY_S} s")
    return {}


def assert_resumed_once(out: Path, job: str, text: str) -> None:
    run = read_run(out)
    assert run.complete and run.stopped_by == "" and run.resumes == 1, text
    assert not out.with_name(out.name + ".parts").exists()
    assert run.attrs["slurm_job_id"] == job
    for rank, rows in run.ranks.items():  # every step once, across the two runs
        assert sorted(rows["step"].tolist()) == list(range(REQUEUE_STEPS)), rank
    assert sum(int(rows["samples"].sum()) for rows in run.ranks.values()) == REQUEUE_BUDGET


def submit_and_warn(tmp_path: Path, *out_flags: str,
                    env: dict[str, str] | None = None) -> tuple[str, Path]:
    """Submit train-requeue.sbatch, wait until it trains, then send it the warning that
    ``--signal=USR1@60`` sends before the time limit (every task of the step gets it);
    (job id, its output file)."""
    job = sbatch(tmp_path, "-n", "2", str(SLURM_JOBS / "train-requeue.sbatch"),
                 *REQUEUE_TRAIN, *out_flags, env=env)
    log = tmp_path / f"syncbench-train-requeue-{job}.out"
    wait_training(job, tmp_path / "run.h5", log)
    subprocess.run(["scancel", "--signal=USR1", job], timeout=15, check=True)
    return job, log


def test_train_requeue_stops_on_the_warning_requeues_and_resumes(tmp_path):
    out = tmp_path / "run.h5"
    job, log = submit_and_warn(tmp_path, "--out", "run.h5")
    fields = wait_done(job, log, restarts=1)
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, text)
    assert fields["Restarts"] == "1", fields
    # both starts in one file (--open-mode=append), these lines in this order
    expected = [f"train-requeue: start 0 of job {job}: no checkpoint in run.h5.parts",
                "syncbench train: stopped by SIGUSR1 ",
                f"train-requeue: stopped (status 138): requeueing job {job} (1 of at most 5)",
                f"train-requeue: start 1 of job {job}: resuming run.h5 from "
                "run.h5.parts/checkpoint.json",
                "ssgd mlp synthetic np=2: accuracy",
                "train-requeue: run.h5 complete after 1 requeue(s)"]
    lines = iter(text.splitlines())
    missing = [e for e in expected if not any(line.startswith(e) for line in lines)]
    assert not missing, (missing, text)
    assert "Traceback" not in text, text
    assert_resumed_once(out, job, text)


@pytest.mark.slow
def test_train_requeue_stops_for_good_past_max_requeues_then_a_resubmit_resumes(tmp_path):
    out = tmp_path / "run.h5"
    env = job_env(SYNCBENCH_MAX_REQUEUES="0")
    job, log = submit_and_warn(tmp_path, "--out=run.h5", env=env)
    fields = wait_done(job, log, restarts=0)
    text = log.read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "138:0", (fields, text)
    assert "SYNCBENCH_MAX_REQUEUES=0: not requeueing" in text, text
    stopped = read_run(out)
    assert not stopped.complete and stopped.stopped_by == "SIGUSR1", text
    assert (tmp_path / "run.h5.parts" / "checkpoint.json").exists()
    # the same submission again continues the run
    again = sbatch(tmp_path, "-n", "2", str(SLURM_JOBS / "train-requeue.sbatch"),
                   *REQUEUE_TRAIN, "--out=run.h5", env=env)
    wait_for([again], tmp_path)
    text = (tmp_path / f"syncbench-train-requeue-{again}.out").read_text()
    assert f"train-requeue: start 0 of job {again}: resuming run.h5 from" in text, text
    assert job_fields(again).get("ExitCode") == "0:0", text
    assert_resumed_once(out, again, text)


def test_train_requeue_needs_out(tmp_path):
    job = sbatch(tmp_path, "-n", "1", str(SLURM_JOBS / "train-requeue.sbatch"), *TRAIN)
    wait_for([job], tmp_path)
    text = (tmp_path / f"syncbench-train-requeue-{job}.out").read_text()
    assert "train-requeue: error: needs --out RUN.h5" in text, text
    assert job_fields(job).get("ExitCode") == "2:0", text


# --- the local cluster beside a site's Slurm --------------------------------------------

LOCAL_CLUSTER = SLURM_JOBS / "local-cluster.sh"
SITE_CONF = Path("/etc/slurm/slurm.conf")
SITE_TEXT = b"# The site's own configuration, written by hand.\nClusterName=site\n" \
            b"SlurmctldHost=head\nNodeName=node[1-4] CPUs=64 State=UNKNOWN\n"
MUNGE_KEY = Path("/etc/munge/munge.key")


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster is started as root")


@contextlib.contextmanager
def host_files_kept(*paths: Path) -> Iterator[None]:
    """Whatever ``paths`` hold now (a file's bytes and mode, or nothing) is put back at
    the end, however the test ends."""
    saved = {p: (p.read_bytes(), p.stat().st_mode) if p.is_file() else None for p in paths}
    made = [d for d in {p.parent for p in paths} if not d.exists()]
    try:
        yield
    finally:
        for path, kept in saved.items():
            if kept is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(kept[0])
                path.chmod(kept[1])
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()


def dummy_daemon(folder: Path, name: str) -> subprocess.Popen:
    """A long-running process whose command name is ``name`` (a copy of sleep named so)."""
    exe = folder / name
    if not exe.exists():
        shutil.copy("/bin/sleep", exe)
    return subprocess.Popen([str(exe), "600"], start_new_session=True)


@contextlib.contextmanager
def site_slurm(tmp_path: Path, *node_pidfiles: str) -> Iterator[list[subprocess.Popen]]:
    """A site's Slurm as far as the local cluster could see it: a hand-written
    /etc/slurm/slurm.conf and a slurmctld and a slurmd named in Debian's pid files (and
    in ``/run/slurmd-NAME.pid`` for each of ``node_pidfiles``). At the end: the conf is
    byte-identical, the daemons still run and their pid files still name them."""
    pidfiles = {"slurmctld": [Path("/run/slurmctld.pid")],
                "slurmd": [Path("/run/slurmd.pid"),
                           *(Path(f"/run/slurmd-{n}.pid") for n in node_pidfiles)]}
    key = (MUNGE_KEY.read_bytes(), MUNGE_KEY.stat()) if MUNGE_KEY.is_file() else None
    with host_files_kept(SITE_CONF, *pidfiles["slurmctld"], *pidfiles["slurmd"]):
        SITE_CONF.parent.mkdir(exist_ok=True)
        SITE_CONF.write_bytes(SITE_TEXT)
        daemons = {name: dummy_daemon(tmp_path, name) for name in pidfiles}
        try:
            for name, paths in pidfiles.items():
                for path in paths:
                    path.write_text(f"{daemons[name].pid}\n")
            yield list(daemons.values())
            assert SITE_CONF.read_bytes() == SITE_TEXT, "the site's slurm.conf was rewritten"
            for name, daemon in daemons.items():
                assert daemon.poll() is None, f"the site's {name} was stopped"
                for path in pidfiles[name]:
                    assert path.read_text() == f"{daemon.pid}\n", path
            if key is not None:
                after = MUNGE_KEY.stat()
                assert MUNGE_KEY.read_bytes() == key[0]
                assert (after.st_mode, after.st_uid, after.st_gid) == \
                    (key[1].st_mode, key[1].st_uid, key[1].st_gid)
        finally:
            for daemon in daemons.values():
                daemon.kill()
                daemon.wait()


def local_cluster(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("SLURM_CONF", "SLURM_EXTRA_CONF", "SLURM_CTLD_ADDR")}
    return subprocess.run(["bash", str(LOCAL_CLUSTER), *args], capture_output=True, text=True,
                          timeout=120, env={**base, "SLURM_NO_INSTALL": "1", **env})


def test_local_cluster_start_and_stop_leave_the_site_slurm_alone(tmp_path):
    """A second local cluster in a folder of its own (its own ports), started and stopped
    beside the site's Slurm and beside the module's cluster."""
    _as_root()
    folder = Path(f"/run/syncbench-slurm-test-{os.getpid()}")
    env = {"SYNCBENCH_SLURM_DIR": str(folder), "SLURM_CTLD_PORT": "6927",
           "SLURM_NODE_PORT": "6928", "SLURM_CLUSTER": "sbtest", "SLURM_PARTITION": "sbtest",
           "SLURM_CPUS": "2", "SLURM_WAIT": "60"}
    conf = folder / "slurm.conf"
    with site_slurm(tmp_path, os.uname().nodename.split(".")[0]):
        try:
            start = local_cluster(**env)
            assert start.returncode == 0, start.stdout + start.stderr
            assert start.stdout.splitlines()[-1] == (
                "local-cluster: Slurm's commands reach this cluster with: "
                f"export SLURM_CONF={conf}"), start.stdout
            assert conf.read_text().splitlines()[0] == cluster_slurm.HEADER
            sinfo = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True,
                                   text=True, timeout=30,
                                   env={**os.environ, "SLURM_CONF": str(conf)})
            assert sinfo.stdout.split() == ["sbtest*", "idle"], sinfo.stdout + sinfo.stderr
            stop = local_cluster("stop", **env)
            assert stop.returncode == 0, stop.stderr
            said = stop.stdout.splitlines()
            assert [line.split(" (pid")[0] for line in said] == [
                "local-cluster: stopped slurmd", "local-cluster: stopped slurmctld",
                "local-cluster: stopped munged"], stop.stdout
            assert not list((folder / "run").glob("*.started"))
        finally:
            local_cluster("stop", **env)
            shutil.rmtree(folder, ignore_errors=True)


def test_local_cluster_refuses_a_slurm_conf_it_did_not_write(tmp_path):
    _as_root()
    with site_slurm(tmp_path):
        proc = local_cluster(SYNCBENCH_SLURM_DIR=str(SITE_CONF.parent))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"local-cluster: error: {SITE_CONF} was not written by "
                                      "local-cluster.sh"), proc.stderr
        assert not (SITE_CONF.parent / "run").exists()


def test_local_cluster_stops_a_recorded_pid_only_while_it_is_the_daemon_started(tmp_path):
    """Records whose pid now names another process (another command, or the same name
    started later: the pid was reused) stop nothing."""
    _as_root()
    folder = Path(f"/run/syncbench-slurm-test-{os.getpid()}")
    other = subprocess.Popen(["sleep", "600"])
    try:
        with site_slurm(tmp_path) as (ctld, _):
            (folder / "run").mkdir(parents=True)
            start = cluster_slurm.start_time(ctld.pid)
            (folder / "run" / "slurmctld.started").write_text(f"{ctld.pid} {start + 1}\n")
            host = os.uname().nodename.split(".")[0]
            (folder / "run" / f"slurmd-{host}.started").write_text(
                f"{other.pid} {cluster_slurm.start_time(other.pid)}\n")
            proc = local_cluster("stop", SYNCBENCH_SLURM_DIR=str(folder))
            assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
            assert other.poll() is None
            assert not list((folder / "run").glob("*.started"))  # forgotten
    finally:
        other.kill()
        other.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_remove_nodes_stops_only_the_slurmd_it_started(tmp_path, monkeypatch):
    """``cluster down``: node 1's recorded slurmd is gone and its pid now names another
    slurmd (the same pid in the old ``/run/slurmd-NODE.pid``): left alone. Node 2's is
    still the one started: stopped."""
    monkeypatch.setenv("SYNCBENCH_SLURM_DIR", str(tmp_path / "slurm"))
    run = tmp_path / "slurm" / "run"
    run.mkdir(parents=True)
    reused, mine = dummy_daemon(tmp_path, "slurmd"), dummy_daemon(tmp_path, "slurmd")
    old_pidfile = Path("/run/slurmd-zqnode1.pid")
    try:
        with host_files_kept(old_pidfile):
            if os.geteuid() == 0:
                old_pidfile.write_text(f"{reused.pid}\n")
            (run / "slurmd-zqnode1.pid").write_text(f"{reused.pid}\n")
            started = cluster_slurm.start_time(reused.pid) - 1  # an earlier process's
            (run / "slurmd-zqnode1.started").write_text(f"{reused.pid} {started}\n")
            (run / "slurmd-zqnode2.pid").write_text(f"{mine.pid}\n")
            assert cluster_slurm.record_daemon("slurmd-zqnode2", "slurmd",
                                               run / "slurmd-zqnode2.pid") == mine.pid
            nodes = [Node(index=i, name=f"zqnode{i}", address=f"10.88.0.{i}", veth=f"zqv{i}")
                     for i in (1, 2)]
            cluster = Cluster(nodes=nodes, slurm=True,
                              made=[{"kind": "slurmd", "name": n.name} for n in nodes])
            cluster_slurm.remove_nodes(cluster)
            assert reused.poll() is None, "a process that took a recorded pid was stopped"
            assert mine.wait(timeout=10) == -15
            assert not list(run.glob("*.started"))
    finally:
        for proc in (reused, mine):
            proc.kill()
            proc.wait()


@pytest.mark.cluster
def test_cluster_up_slurm_and_down_leave_the_site_slurm_alone(tmp_path):
    from cluster_helpers import TestCluster

    tq = TestCluster("tq", "10.87.0", nodes=1)
    with site_slurm(tmp_path, *tq.nodes):
        refused = tq.syncbench("cluster", "up", "--nodes", "1", "--slurm",
                               env={"SYNCBENCH_SLURM_DIR": str(SITE_CONF.parent)})
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert f"{SITE_CONF} was not written by local-cluster.sh" in refused.stderr
        assert not (tq.state_dir / "state.json").exists()  # what it made is gone
        with tq.up("--slurm"):
            sinfo = subprocess.run(["sinfo", "-h", "-N", "-p", "emulated", "-o", "%N %t"],
                                   capture_output=True, text=True, timeout=30,
                                   env=cluster_slurm.slurm_env())
            assert sinfo.stdout.split() == ["tqnode1", "idle"], sinfo.stdout + sinfo.stderr
        assert "tqnode1" not in cluster_slurm.slurm_conf().read_text()
