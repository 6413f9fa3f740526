"""Every multi-node path on the emulated cluster (``syncbench cluster``, as root).

The module brings up its own 2-node cluster (prefix ``tc``, subnet 10.83.0; 1 Gbit/s
links; node 2's monotonic clock 1000 s ahead; its nodes in Slurm when the local Slurm
cluster answers) and takes it down at the end. It checks, under MPICH and Open MPI,
every registered strategy on 2 nodes x 1 rank (accuracy, the run file's nodes, the
transports, the clock offsets, the bytes that crossed the links), the clock alignment of
a synchronous run, a 2-node Slurm job, and the cluster's own one-line errors.

Without root (or without ``unshare --time``) the tests skip, unless
``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cluster_helpers import REPO, TestCluster, launchers

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.analysis.runfile import read_run
from syncbench.kernels.zoo import build_model

pytestmark = pytest.mark.cluster

TC = TestCluster("tc", "10.83.0")
NODES = TC.nodes
OFFSET_S = 1000
#: Flags that make each strategy do its characteristic thing within half an epoch.
QUICK = {"odsgd": ["--warmup-steps", "20"], "localsgd": ["--period", "4"],
         "oscars": ["--period", "4"]}
#: Fashion-MNIST after half an epoch: every strategy is far above chance (0.1).
MIN_ACCURACY = 0.6


def _slurm_answers() -> bool:
    return shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0


@pytest.fixture(scope="module")
def cluster():
    slurm = TestCluster.why_not() is None and _slurm_answers()
    with TC.up("--link", "1gbit", "--clock-offset", f"0,{OFFSET_S}",
               *(["--slurm"] if slurm else []), time_namespaces=True) as state:
        yield {"slurm": slurm, "state": state}


def _check_nodes_and_clocks(run) -> None:
    assert list(run.attrs["hostnames"]) == NODES
    assert int(run.attrs["nodes"]) == 2
    assert [run.rank_attrs[r]["hostname"] for r in (0, 1)] == NODES
    offset = float(run.rank_attrs[1]["clock_offset_s"])
    error = float(run.rank_attrs[1]["clock_uncertainty_s"])
    assert abs(offset - OFFSET_S) < 1e-4 and error < 1e-4, (offset, error)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("python,env,transport", launchers(with_transport=True))
def test_every_strategy_on_two_nodes(cluster, tmp_path, name, python, env, transport):
    out = tmp_path / f"{name}.h5"
    before = TC.link_bytes()
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", str(python), "-m",
                        "syncbench", "train", "--algorithm", name, "--model", "mlp",
                        "--dataset", "fashion-mnist", "--epochs", "0.5", "--eval-every", "0.5",
                        "--progress", "never", "--timeout", "60", *QUICK.get(name, []),
                        "--out", str(out), python=python, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crossed = [sum(b) - sum(a) for a, b in zip(before, TC.link_bytes())]
    run = read_run(out)
    assert run.summary["final_accuracy"] >= MIN_ACCURACY, run.summary["final_accuracy"]
    _check_nodes_and_clocks(run)
    assert transport in json.loads(run.attrs["mpi_transport_env"])
    # the model itself (float32 parameters) crossed each link more than once
    model_bytes = 4 * build_model("mlp", (784,), 10).params.size
    assert min(crossed) > 2 * model_bytes, (crossed, model_bytes)


def test_a_synchronous_run_is_on_one_clock(cluster, tmp_path):
    """SSGD's steps end at its allreduce: on one clock both ranks' step ends agree within
    a millisecond, though node 2's clock is 1000 s ahead."""
    out = tmp_path / "ssgd.h5"
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                        "syncbench", "train", "--algorithm", "ssgd", "--model", "mlp",
                        "--dataset", "synthetic", "--epochs", "1", "--progress", "never",
                        "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    ends = [run.ranks[r]["t_start"][1:] for r in (0, 1)]
    steps = min(len(e) for e in ends)
    gap = np.abs(ends[0][:steps] - ends[1][:steps])
    assert np.median(gap) < 1e-3 and gap.max() < 0.05, (np.median(gap), gap.max())


def test_a_slurm_job_across_two_nodes(cluster, tmp_path):
    if not cluster["slurm"]:
        if os.environ.get("SYNCBENCH_REQUIRE_SLURM") == "1":
            pytest.fail("SYNCBENCH_REQUIRE_SLURM=1 but no Slurm cluster answers")
        pytest.skip("no Slurm cluster answers (make slurm-up)")
    out = tmp_path / "slurm.h5"
    proc = subprocess.run(
        ["sbatch", "--wait", "-p", "emulated", "-N", "2", "-n", "2",
         "-o", str(tmp_path / "job.out"),
         str(REPO / "jobs" / "slurm" / "train.sbatch"), "--algorithm", "ssgd", "--model", "mlp",
         "--dataset", "fashion-mnist", "--epochs", "0.25", "--progress", "never",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, **TC.env, "SYNCBENCH_VENV": str(Path(sys.executable).parents[1])})
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + log
    assert f"on {TC.prefix}node[1-2]" in log, log
    run = read_run(out)
    _check_nodes_and_clocks(run)
    assert run.attrs["slurm_job_id"]
    assert "UCX_TLS" in json.loads(run.attrs["mpi_transport_env"])  # from the TaskProlog


def test_cluster_errors_are_one_line(cluster):
    again = TC.syncbench("cluster", "up", "--nodes", "3")
    assert again.returncode == 1
    assert again.stderr.strip().count("\n") == 0 and "other settings" in again.stderr
    bad = TC.syncbench("cluster", "up", "--nodes", "2", "--node-speed", "1,2")
    assert bad.returncode == 1 and "--node-speed" in bad.stderr
    node = TC.syncbench("cluster", "exec", "nonode", "--", "true")
    assert node.returncode == 1 and "no node 'nonode'" in node.stderr
    inside = TC.syncbench("cluster", "exec", NODES[1], "--", "hostname")
    assert inside.returncode == 0 and inside.stdout.strip() == NODES[1]


SPEED_SCENARIO = """
description = "live node speeds"
np = 2
repeats = 1
target_accuracy = 0.2
eval_every = 0
node_speeds = ["last:0.5"]
cluster = { link = "1gbit" }
flags = { dataset = "synthetic", synthetic_samples = 512, epochs = 1, batch_size = 64 }

[[run]]
label = "ssgd"
algorithm = "ssgd"
"""


def _quota(node: str) -> str:
    return Path(f"/sys/fs/cgroup/cpu/{node}/cpu.cfs_quota_us").read_text().strip()


def test_a_scenario_sets_each_configurations_node_speeds_live(cluster, tmp_path):
    """``node_speeds``: the runner gives node 2 a quota of half its core for that
    configuration's runs only (the run file records the speed on node 2's rank), lifts it
    for the homogeneous run, and leaves the cluster as it found it."""
    scenario = tmp_path / "speeds.toml"
    scenario.write_text(SPEED_SCENARIO)
    out = tmp_path / "runs"
    proc = TC.syncbench("run", str(scenario), "--cluster", "--out-dir", str(out),
                        timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    slow, hom = read_run(out / "ssgd-q1-0.5-r0.h5"), read_run(out / "ssgd-hom-r0.h5")
    assert float(slow.rank_attrs[1]["node_speed"]) == 0.5
    assert float(slow.rank_attrs[0]["node_speed"]) == 1.0
    assert float(hom.rank_attrs[1]["node_speed"]) == 1.0
    assert "node speed 1,0.5 (CPU quota) against homogeneous" in proc.stdout
    state = json.loads((TC.state_dir / "state.json").read_text())
    assert [n["speed"] for n in state["nodes"]] == [1.0, 1.0]
    if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():  # cgroup v1
        assert _quota(NODES[1]) == "-1"
    live = TC.syncbench("cluster", "speed", NODES[1], "0.25")
    assert live.returncode == 0, live.stderr
    if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists():
        period = Path(f"/sys/fs/cgroup/cpu/{NODES[1]}/cpu.cfs_period_us").read_text()
        assert int(_quota(NODES[1])) == int(period) // 4
    assert "SYNCBENCH_NODE_SPEED=0.25" in (TC.state_dir / "node-ssh").read_text()
    back = TC.syncbench("cluster", "speed", NODES[1], "1")
    assert back.returncode == 0 and "SYNCBENCH_NODE_SPEED" not in (
        TC.state_dir / "node-ssh").read_text()
    wrong = TC.syncbench("run", "cluster-overlap", "--cluster", "--np", "4")
    assert wrong.returncode == 2 and "needs 4 emulated nodes" in wrong.stderr


def test_no_cluster_is_one_line(tmp_path):
    env = {"SYNCBENCH_CLUSTER_DIR": str(tmp_path / "none")}
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", "true", env=env)
    assert proc.returncode == 1 and "no emulated cluster is up" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    run = TC.syncbench("run", "demo", "--cluster", "--dry-run", env=env)
    assert run.returncode == 2 and "no emulated cluster is up" in run.stderr
